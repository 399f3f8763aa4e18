"""The simulated API server is as strict as a real one: dry runs, selectors, strategic merge of lists,
and continue tokens that expire with etcd compaction.

Sources (cited next to each behaviour in sim/kube/*.py and sim/kube/selectors.py): kubernetes/kubernetes
staging/src/k8s.io/apiserver/pkg/registry/generic/registry/dryrun.go and store.go (dry runs),
staging/src/k8s.io/apimachinery/pkg/labels/selector.go and pkg/fields/selector.go (selectors),
staging/src/k8s.io/api/core/v1/types.go (patch merge keys), staging/src/k8s.io/apiserver/pkg/storage/etcd3/
compact.go and errors.go (compaction and the 410 Expired answer).
The clock is manual: time moves only through ``/_sim/advance``, so "nothing happened later" is exact.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from sim.testing import SimHandle, start_sim

SCENARIO: dict[str, Any] = {
    "seed": 5,
    "clock": {"manual": True},
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000f5", "clusters": [{
        "name": "strict", "resource_group": "rg-strict",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "work", "mode": "User", "vmSize": "Standard_D4s_v5", "count": 5}],
        "workloads": [{"kind": "Pod", "name": "p1", "namespace": "default"}]}]}],
}
EXPIRED_MESSAGE = ("The provided continue parameter is too old to display a consistent list result. You can start a "
                   "new list without the continue parameter, or use the continue token in this response to retrieve "
                   "the remainder of the results. Continuing with the provided token results in an inconsistent list "
                   "- objects that were created, modified, or deleted between the time the first chunk was returned "
                   "and now may show up in the list.")


class Raw:
    def __init__(self, sim: SimHandle) -> None:
        url = urlsplit(sim.cluster("strict")["kube_server"])
        self.host, self.port, self.prefix = url.hostname or "", url.port or 443, url.path
        self.ctx = ssl.create_default_context(cafile=sim.ca_bundle)
        self.token = sim.endpoints["kube_token"]

    def call(self, method: str, path: str, body: Any = None, *,
             content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=20)
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        conn.request(method, self.prefix + path, body=data, headers={
            "Content-Type": content_type, "Accept": "application/json", "Authorization": f"Bearer {self.token}"})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        return resp.status, (json.loads(raw) if raw else {})

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        status, doc = self.call(method, path, body, **kw)
        assert 200 <= status < 300, (status, doc)
        return doc

    def rv(self) -> str:
        """The cluster's current resourceVersion (a list's)."""
        return str(self.ok("GET", "/api/v1/namespaces?limit=1")["metadata"]["resourceVersion"])


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=5) as handle:
        handle.control("POST", "/advance", {"seconds": 30})  # nodes Ready, p1 Running
        yield handle


@pytest.fixture(scope="module")
def raw(sim: SimHandle) -> Raw:
    return Raw(sim)


def advance(sim: SimHandle, seconds: float) -> None:
    sim.control("POST", "/advance", {"seconds": seconds})


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dry", "labels": {"app": "dry"}},
       "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


# --------------------------------------------------------------------------- dryRun=All


def test_a_dry_run_create_answers_the_object_as_it_would_be_and_stores_nothing(sim: SimHandle, raw: Raw) -> None:
    before = raw.rv()
    status, pod = raw.call("POST", "/api/v1/namespaces/default/pods?dryRun=All", POD)
    assert status == 201, pod
    assert pod["metadata"]["uid"] and pod["metadata"]["creationTimestamp"]
    assert "resourceVersion" not in pod["metadata"], "a dry run takes no resourceVersion"
    assert pod["status"]["phase"] == "Pending" and pod["spec"]["restartPolicy"] == "Always"  # defaulted
    cm = raw.ok("POST", "/api/v1/namespaces/default/configmaps?dryRun=All",
                {"metadata": {"name": "dry-cm"}, "data": {"a": "b"}})
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["uid"]
    ns = raw.ok("POST", "/api/v1/namespaces?dryRun=All", {"metadata": {"name": "dry-ns"}})
    assert ns["status"]["phase"] == "Active"
    advance(sim, 30)  # a stored pod would have been scheduled and started by now
    assert raw.call("GET", "/api/v1/namespaces/default/pods/dry")[0] == 404
    assert raw.call("GET", "/api/v1/namespaces/default/configmaps/dry-cm")[0] == 404
    assert raw.call("GET", "/api/v1/namespaces/dry-ns")[0] == 404
    assert raw.rv() == before
    # validation and conflicts still run on a dry run
    assert raw.call("POST", "/api/v1/namespaces/default/pods?dryRun=All",
                    {**POD, "metadata": {"name": "p1"}})[0] == 409
    assert raw.call("POST", "/api/v1/namespaces/default/pods?dryRun=All",
                    {**POD, "spec": {"containers": []}})[0] == 422


def test_a_dry_run_patch_answers_the_patched_object_with_the_old_resource_version(raw: Raw) -> None:
    node = raw.ok("GET", "/api/v1/nodes?labelSelector=agentpool%3Dwork&limit=1")["items"][0]
    name, rv = node["metadata"]["name"], node["metadata"]["resourceVersion"]
    before = raw.rv()
    patched = raw.ok("PATCH", f"/api/v1/nodes/{name}?dryRun=All",
                     {"spec": {"unschedulable": True}, "metadata": {"labels": {"dry": "yes"}}},
                     content_type="application/strategic-merge-patch+json")
    assert patched["spec"]["unschedulable"] is True and patched["metadata"]["labels"]["dry"] == "yes"
    assert patched["metadata"]["resourceVersion"] == rv
    stored = raw.ok("GET", f"/api/v1/nodes/{name}")
    assert not stored["spec"].get("unschedulable") and "dry" not in stored["metadata"]["labels"]
    assert stored["metadata"]["resourceVersion"] == rv and raw.rv() == before
    # a dry-run update (PUT) likewise
    stored["metadata"]["labels"]["dry"] = "put"
    put = raw.ok("PUT", f"/api/v1/nodes/{name}?dryRun=All", stored)
    assert put["metadata"]["labels"]["dry"] == "put" and put["metadata"]["resourceVersion"] == rv
    assert "dry" not in raw.ok("GET", f"/api/v1/nodes/{name}")["metadata"]["labels"]


def test_a_dry_run_delete_marks_the_pod_in_the_answer_only_and_starts_no_grace_period(sim: SimHandle,
                                                                                       raw: Raw) -> None:
    before = raw.rv()
    # kubectl sends the dry run in the DeleteOptions body; clients may also use the query parameter
    answer = raw.ok("DELETE", "/api/v1/namespaces/default/pods/p1", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                                      "dryRun": ["All"]})
    assert answer["kind"] == "Pod" and answer["metadata"]["deletionTimestamp"]
    assert answer["metadata"]["deletionGracePeriodSeconds"] == 30
    advance(sim, 60)  # past the grace period a real delete would have started
    pod = raw.ok("GET", "/api/v1/namespaces/default/pods/p1")
    assert "deletionTimestamp" not in pod["metadata"] and pod["status"]["phase"] == "Running"
    raw.ok("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "keep"}})
    gone = raw.ok("DELETE", "/api/v1/namespaces/default/configmaps/keep?dryRun=All")
    assert gone["kind"] == "Status" and gone["status"] == "Success"
    assert raw.call("GET", "/api/v1/namespaces/default/configmaps/keep")[0] == 200
    ns = raw.ok("DELETE", "/api/v1/namespaces/default?dryRun=All")
    assert ns["status"]["phase"] == "Terminating"
    assert raw.ok("GET", "/api/v1/namespaces/default")["status"]["phase"] == "Active"
    listed = raw.ok("DELETE", "/api/v1/namespaces/default/pods?dryRun=All")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["p1"]
    assert raw.call("GET", "/api/v1/namespaces/default/pods/p1")[0] == 200
    assert int(raw.rv()) == int(before) + 1  # only the configmap's real create moved it


def test_a_dry_run_sends_no_watch_event(raw: Raw) -> None:
    events: list[dict[str, Any]] = []
    rv = raw.rv()

    def watch() -> None:
        conn = http.client.HTTPSConnection(raw.host, raw.port, context=raw.ctx, timeout=20)
        conn.request("GET", f"{raw.prefix}/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"
                            "&timeoutSeconds=2", headers={"Authorization": f"Bearer {raw.token}"})
        resp = conn.getresponse()
        events.extend(json.loads(line) for line in resp.read().splitlines() if line.strip())
        conn.close()

    t = threading.Thread(target=watch)
    t.start()
    raw.ok("POST", "/api/v1/namespaces/default/configmaps?dryRun=All", {"metadata": {"name": "w-dry"}})
    raw.ok("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "w-real"}})
    raw.ok("PATCH", "/api/v1/namespaces/default/configmaps/w-real?dryRun=All", {"data": {"x": "y"}},
           content_type="application/merge-patch+json")
    raw.ok("DELETE", "/api/v1/namespaces/default/configmaps/w-real?dryRun=All")
    t.join(30)
    # the real create shows (ADDED live, or MODIFIED in the catch-up from ``rv`` if the watch began after it);
    # none of the dry runs does
    assert [e["object"]["metadata"]["name"] for e in events] == ["w-real"]
    assert events[0]["type"] in ("ADDED", "MODIFIED")


@pytest.mark.parametrize("value", ["all", "foo", ""])
def test_a_dry_run_value_other_than_all_is_refused(raw: Raw, value: str) -> None:
    status, body = raw.call("POST", f"/api/v1/namespaces/default/pods?dryRun={value}", POD)
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"] == (f'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: '
                               f'[]string{{"{value}"}}: supported values: "All"')
    assert raw.call("GET", "/api/v1/namespaces/default/pods/dry")[0] == 404


# --------------------------------------------------------------------------- selectors


@pytest.mark.parametrize(("selector", "message"), [
    ("a=b=c", "found '=', expected: ',' or 'end of string'"),
    ("=x", "found '=', expected: !, identifier, or 'end of string'"),
    ("a in (b", "unable to parse requirement: found '', expected: ',' or ')'"),
    ("a,", "found '', expected: identifier after ','"),
    ("app:monolith", "unable to parse requirement: <nil>: Invalid value: \"app:monolith\": name part must consist of "
     "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',"
     "  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
    ("a=b/c", "unable to parse requirement: values[0][a]: Invalid value: \"b/c\": a valid label must be an empty "
     "string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
     "character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is "
     "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
    ("n>x", "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must "
     "be an integer"),
], ids=["a=b=c", "=x", "unclosed-set", "trailing-comma", "colon-in-key", "slash-in-value", "gt-not-integer"])
def test_a_malformed_label_selector_is_a_400_with_the_parsers_message(raw: Raw, selector: str, message: str) -> None:
    for path in ("/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces/default/pods"):
        status, body = raw.call("GET", f"{path}?labelSelector={quote(selector)}")
        assert status == 400 and body["reason"] == "BadRequest", body
        assert body["message"] == message


@pytest.mark.parametrize(("selector", "count"), [
    ("agentpool=work", 5), ("agentpool==work", 5), ("agentpool in (work, system)", 6),
    ("agentpool notin (work)", 1), ("!agentpool", 0), ("agentpool,agentpool!=system", 5), ("in=x", 0),
    ("x in (foo,,baz),agentpool", 0),
])
def test_well_formed_label_selectors_still_select(raw: Raw, selector: str, count: int) -> None:
    assert len(raw.ok("GET", f"/api/v1/nodes?labelSelector={quote(selector)}")["items"]) == count


@pytest.mark.parametrize(("path", "selector", "message"), [
    ("/api/v1/pods", "spec.nodeName", "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"),
    ("/api/v1/pods", "spec.nodeName=a=b", "invalid field selector: unescaped character in value: 61"),
    ("/api/v1/pods", "spec.foo=bar", "field label not supported: spec.foo"),
    # kinds without a conversion func of their own: DefaultMetaV1FieldSelectorConversion's text
    ("/api/v1/configmaps", "spec.foo=bar",
     '"spec.foo" is not a known field selector: only "metadata.name", "metadata.namespace"'),
    # Node's conversion func (pkg/apis/core/v1/conversion.go) accepts only metadata.name and spec.unschedulable
    ("/api/v1/nodes", "spec.foo=bar", "field label not supported: spec.foo"),
    ("/api/v1/nodes", "metadata.namespace=default", "field label not supported: metadata.namespace"),
], ids=["no-operator", "unescaped-equals", "unknown-pod-field", "unknown-configmap-field", "unknown-node-field",
        "node-namespace-field"])
def test_a_malformed_field_selector_is_a_400_with_the_real_message(raw: Raw, path: str, selector: str,
                                                                   message: str) -> None:
    status, body = raw.call("GET", f"{path}?fieldSelector={quote(selector)}")
    assert status == 400 and body["reason"] == "BadRequest" and body["message"] == message


# --------------------------------------------------------------------------- strategic merge patch


def test_a_strategic_merge_patch_replaces_taints_and_merges_finalizers(raw: Raw) -> None:
    name = raw.ok("GET", "/api/v1/nodes?labelSelector=agentpool%3Dwork")["items"][1]["metadata"]["name"]
    raw.ok("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"},
                                                                  {"key": "b", "effect": "NoSchedule"}]}},
           content_type="application/strategic-merge-patch+json")
    node = raw.ok("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}},
                  content_type="application/strategic-merge-patch+json")
    assert [t["key"] for t in node["spec"]["taints"]] == ["c"], "taints have no patchMergeKey: the list is replaced"
    raw.ok("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "fin", "finalizers": ["x/a"]}})
    cm = raw.ok("PATCH", "/api/v1/namespaces/default/configmaps/fin", {"metadata": {"finalizers": ["x/b"]}},
                content_type="application/strategic-merge-patch+json")
    assert cm["metadata"]["finalizers"] == ["x/a", "x/b"], "finalizers have patchStrategy merge"
    cm = raw.ok("PATCH", "/api/v1/namespaces/default/configmaps/fin",
                {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/a", "x/b"]}},
                content_type="application/strategic-merge-patch+json")
    assert not cm["metadata"].get("finalizers")


# --------------------------------------------------------------------------- continue tokens and compaction


def _first_page(raw: Raw, limit: int = 2) -> dict[str, Any]:
    page = raw.ok("GET", f"/api/v1/nodes?limit={limit}")
    assert page["metadata"].get("continue"), page["metadata"]
    return page


def test_a_continue_token_outlives_one_compaction_interval_at_least(sim: SimHandle, raw: Raw) -> None:
    first = _first_page(raw)
    advance(sim, 299)  # less than the 5 minute compaction interval: at most one tick
    page = raw.ok("GET", f"/api/v1/nodes?limit=2&continue={quote(first['metadata']['continue'])}")
    assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_a_continue_token_older_than_two_compactions_is_410_expired_with_an_inconsistent_token(
        sim: SimHandle, raw: Raw) -> None:
    first = _first_page(raw)
    names = [n["metadata"]["name"] for n in first["items"]]
    advance(sim, 601)  # two compaction ticks: etcd no longer has the list's revision
    status, body = raw.call("GET", f"/api/v1/nodes?limit=2&continue={quote(first['metadata']['continue'])}")
    assert status == 410 and body["reason"] == "Expired" and body["code"] == 410
    assert body["message"] == EXPIRED_MESSAGE
    # the token in the Status continues after the last key at the current revision (ResourceVersion -1)
    token = body["metadata"]["continue"]
    assert json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))["rv"] == -1
    rest: list[str] = []
    while token:
        page = raw.ok("GET", f"/api/v1/nodes?limit=2&continue={quote(token)}")
        rest += [n["metadata"]["name"] for n in page["items"]]
        token = page["metadata"].get("continue", "")
    assert sorted(names + rest) == sorted(n["metadata"]["name"] for n in raw.ok("GET", "/api/v1/nodes")["items"])
    assert min(rest) > max(names)


def test_a_fault_rule_expires_the_tokens_on_demand_with_the_real_answer(sim: SimHandle, raw: Raw) -> None:
    first = _first_page(raw)
    sim.control("POST", "/faults", {"target": "kube", "method": "GET", "path": "/api/v1/nodes$", "status": 410,
                                    "count": 1})
    status, body = raw.call("GET", f"/api/v1/nodes?limit=2&continue={quote(first['metadata']['continue'])}")
    assert status == 410 and body["reason"] == "Expired" and body["message"] == EXPIRED_MESSAGE
    assert body["metadata"]["continue"]
    fresh = raw.ok("GET", "/api/v1/nodes?limit=2")  # a new list works, and so does its token
    assert raw.call("GET", f"/api/v1/nodes?limit=2&continue={quote(fresh['metadata']['continue'])}")[0] == 200
