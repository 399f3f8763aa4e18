"""Pool request validation: every bad message is rejected with the specific problem named, all at once."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args, get_type_hints

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.fleet import gpu_sizes
from shared.kernel.env import SettingError
from shared.pools.policy import PoolRequestPolicy
from shared.pools.request import PoolRequest
from shared.pools.validation import Rejection, ValidatedRequest, parse_and_validate
from tests.unit.fakes_pool import CLUSTER, OTHER_SUB, cluster_id, message, request

POLICY = PoolRequestPolicy()
FOREIGN = cluster_id("c9", sub=OTHER_SUB)


def in_scope(cluster: str) -> bool:
    return cluster.lower() != FOREIGN.lower() and not cluster.lower().endswith("/managedclusters/outside")


def validate(raw: bytes | str, policy: PoolRequestPolicy = POLICY) -> ValidatedRequest | Rejection:
    return parse_and_validate(raw, policy=policy, in_scope=in_scope)


def rejected(raw: bytes | str, policy: PoolRequestPolicy = POLICY) -> Rejection:
    result = validate(raw, policy)
    assert isinstance(result, Rejection), f"expected a rejection, got {result}"
    return result


def accepted(raw: bytes | str) -> ValidatedRequest:
    result = validate(raw)
    assert isinstance(result, ValidatedRequest), result.message if isinstance(result, Rejection) else result
    return result


A100 = "Standard_NC24ads_A100_v4"

# (id, raw message, field path named, words in the problem)
BAD: list[tuple[str, bytes | str, str, str]] = [
    ("not JSON at all", "make me a gpu pool please", "$", "not valid JSON"),
    ("truncated JSON", message()[:-5], "$", "not valid JSON"),
    ("empty message", "", "$", "not valid JSON"),
    ("not UTF-8", b"\xff\xfe{\x00", "$", "not UTF-8"),
    ("a JSON array instead of an object", "[1, 2, 3]", "$", "not an object"),
    ("a JSON string instead of an object", '"hello"', "$", "not an object"),
    ("deeply nested JSON bomb", "[" * 5000 + "]" * 5000, "$", "not valid JSON"),
    ("a huge payload", json.dumps(request(tags={"k": "v" * 70000})), "$", "over the limit"),
    ("schema version missing", message(schemaVersion=...), "schemaVersion", "missing"),
    ("unknown schema version", message(schemaVersion="2"), "schemaVersion", "not a schema version"),
    ("schema version as a number", message(schemaVersion=1), "schemaVersion", "not a schema version"),
    ("request id missing", message(requestId=...), "requestId", "missing"),
    ("cluster missing", message(cluster=...), "cluster", "missing"),
    ("vm size missing", message(vmSize=...), "vmSize", "missing"),
    ("neither count nor autoscale", message(count=...), "count", "missing"),
    ("count as a string", message(count="3"), "count", "wrong type"),
    ("count as a float", message(count=1.5), "count", "wrong type"),
    ("count as a boolean", message(count=True), "count", "wrong type"),
    ("count of zero", message(count=0), "count", "out of range"),
    ("count over the AKS limit", message(count=1001), "count", "out of range"),
    ("negative count", message(count=-1), "count", "out of range"),
    ("unknown field", message(gpuCount=2), "gpuCount", "not a field"),
    ("misspelled field", message(vmsize="Standard_NC4as_T4_v3"), "vmsize", "not a field"),
    ("unknown nested field", message(mig={"strategy": "Single", "profile": "MIG1g", "slices": 7}, vmSize=A100),
     "mig.slices", "not a field"),
    ("unknown size", message(vmSize="Standard_NC999_future_v9"), "vmSize", "not a known NVIDIA GPU size"),
    ("non-GPU size", message(vmSize="Standard_D4s_v5"), "vmSize", "not a GPU size"),
    ("AMD NVv4 size", message(vmSize="Standard_NV4as_v4"), "vmSize", "AMD GPU size"),
    ("AMD MI300X size", message(vmSize="Standard_ND96isr_MI300X_v5"), "vmSize", "AMD GPU size"),
    ("size as a number", message(vmSize=4), "vmSize", "wrong type"),
    ("pool name too long", message(poolName="gpupoolnumber1"), "poolName", "not a valid AKS node pool name"),
    ("pool name in upper case", message(poolName="GPUNP"), "poolName", "not a valid AKS node pool name"),
    ("pool name starting with a digit", message(poolName="1gpu"), "poolName", "not a valid AKS node pool name"),
    ("pool name with a dash", message(poolName="gpu-np"), "poolName", "not a valid AKS node pool name"),
    ("pool name empty", message(poolName=""), "poolName", "not a valid AKS node pool name"),
    ("shell injection in the pool name", message(poolName="gpu;rm -rf /"), "poolName", "not a valid AKS node pool name"),
    ("request id with spaces", message(requestId="my request"), "requestId", "not a valid request id"),
    ("request id too long", message(requestId="r" * 65), "requestId", "not a valid request id"),
    ("request id with a path", message(requestId="../../etc/passwd"), "requestId", "not a valid request id"),
    ("HTML injection in the requester", message(requester="<script>alert(1)</script>"), "requester",
     "not a valid requester"),
    ("SQL injection in the requester", message(requester="x' OR '1'='1"), "requester", "not a valid requester"),
    ("cluster not an ARM id", message(cluster="c1"), "cluster", "not an AKS cluster ARM id"),
    ("cluster of another resource type", message(cluster=CLUSTER.replace("managedClusters", "virtualMachines")),
     "cluster", "not an AKS cluster ARM id"),
    ("cluster id with a bad subscription", message(cluster=CLUSTER.replace("00000000-0000", "not-a-guid")),
     "cluster", "not an AKS cluster ARM id"),
    ("cluster in a foreign subscription", message(cluster=FOREIGN), "cluster", "not in the fleet"),
    ("cluster outside the scope", message(cluster=cluster_id("outside")), "cluster", "not in the fleet"),
    ("driver None with managed", message(gpuDriver="None"), "gpuDriver", "needs the driver"),
    ("driver None with driverOnly", message(gpuDriver="None", installProfile="driverOnly"), "gpuDriver",
     "contradicts"),
    ("driver Install with none", message(gpuDriver="Install", installProfile="none"), "gpuDriver", "contradicts"),
    ("unknown install profile", message(installProfile="full"), "installProfile", "wrong type"),
    ("MIG on a T4", message(mig={"strategy": "Single", "profile": "MIG1g"}), "mig", "cannot be partitioned"),
    ("MIG strategy without a profile", message(vmSize=A100, mig={"strategy": "Mixed"}), "mig.profile", "required"),
    ("MIG profile that does not exist", message(vmSize=A100, mig={"strategy": "Single", "profile": "MIG5g"}),
     "mig.profile", "wrong type"),
    ("MIG profile without a strategy on managed", message(vmSize=A100, mig={"profile": "MIG1g"}), "mig.strategy",
     "'None' but a MIG profile"),
    ("MIG strategy on driverOnly", message(vmSize=A100, installProfile="driverOnly",
                                           mig={"strategy": "Single", "profile": "MIG1g"}), "mig.strategy",
     "does not install"),
    ("Windows", message(osType="Windows"), "osType", "Windows node pools are not supported"),
    ("unknown OS SKU", message(osSku="CBLMariner"), "osSku", "wrong type"),
    ("autoscaler on a managed pool", message(count=..., autoscale={"min": 1, "max": 3}), "autoscale", "preview"),
    ("autoscale min above max", message(count=..., installProfile="driverOnly", autoscale={"min": 4, "max": 2}),
     "autoscale", "larger than max"),
    ("count and autoscale together", message(installProfile="driverOnly", autoscale={"min": 1, "max": 2}),
     "autoscale", "cannot be combined"),
    ("reserved label prefix kubernetes.azure.com", message(labels={"kubernetes.azure.com/accelerator": "x"}),
     'labels[\'kubernetes.azure.com/accelerator\']', "reserved prefix"),
    ("reserved label prefix kubernetes.io", message(labels={"node.kubernetes.io/role": "gpu"}),
     "labels['node.kubernetes.io/role']", "reserved prefix"),
    ("reserved label prefix k8s.io", message(labels={"k8s.io/team": "a"}), "labels['k8s.io/team']", "reserved prefix"),
    ("label value with spaces", message(labels={"team": "computer vision"}), "labels['team']", "not a valid label value"),
    ("label value with command substitution", message(labels={"team": "$(curl evil)"}), "labels['team']",
     "not a valid label value"),
    ("label key with a bad prefix", message(labels={"Team.Example/x": "a"}), "labels['Team.Example/x']",
     "not a valid label key"),
    ("labels not an object", message(labels=["team=a"]), "labels", "wrong type"),
    ("label value not a string", message(labels={"replicas": 3}), "labels", "wrong type"),
    ("taint without an effect", message(taints=["sku=gpu"]), "taints[0]", "not a valid taint"),
    ("taint with an unknown effect", message(taints=["sku=gpu:Never"]), "taints[0]", "not a valid taint"),
    ("taint with a reserved key", message(taints=["kubernetes.io/x=y:NoSchedule"]), "taints[0]", "reserved prefix"),
    ("taints as a string", message(taints="sku=gpu:NoSchedule"), "taints", "wrong type"),
    ("zone 4", message(zones=["4"]), "zones[0]", "not an availability zone"),
    ("zone as a number", message(zones=[1]), "zones", "wrong type"),
    ("repeated zone", message(zones=["1", "1"]), "zones", "more than once"),
    ("max pods too low", message(maxPods=5), "maxPods", "out of range"),
    ("max pods too high", message(maxPods=500), "maxPods", "out of range"),
    ("negative spot price", message(spot={"enabled": True, "maxPrice": -5}), "spot.maxPrice", "not a valid spot price"),
    ("unknown spot eviction policy", message(spot={"evictionPolicy": "Hibernate"}), "spot.evictionPolicy", "wrong type"),
    ("too many tags", message(tags={f"t{i}": "v" for i in range(60)}), "tags", "has 60 tags"),
    ("tag name with a slash", message(tags={"cost/center": "1"}), "tags['cost/center']", "not a valid Azure tag name"),
    ("tag name too long", message(tags={"k" * 513: "v"}), "tags[", "not a valid Azure tag name"),
    ("tag value too long", message(tags={"owner": "v" * 257}), "tags['owner']", "not a valid Azure tag value"),
    ("reserved tag prefix", message(tags={"microsoft.owner": "x"}), "tags['microsoft.owner']", "reserved tag prefix"),
    ("tag value with control characters", message(tags={"owner": "a\u0000b"}), "tags['owner']",
     "not a valid Azure tag value"),
    ("validateWorkload as a string", message(validateWorkload="yes"), "validateWorkload", "wrong type"),
]


@pytest.mark.parametrize(("raw", "field", "words"), [pytest.param(raw, f, w, id=i) for i, raw, f, w in BAD])
def test_a_bad_message_is_rejected_naming_the_specific_problem(raw: bytes | str, field: str, words: str) -> None:
    rejection = rejected(raw)
    matching = [p for p in rejection.problems if p.field.startswith(field) and words in p.problem]
    assert matching, f"no problem on {field!r} mentioning {words!r} in:\n{rejection.message}"
    assert all(p.fix for p in rejection.problems), "every problem says what to do"


def test_the_table_of_bad_messages_is_large_enough() -> None:
    assert len(BAD) >= 40


def test_all_problems_are_reported_in_one_message() -> None:
    rejection = rejected(message(poolName="GPU-NP", vmSize="Standard_D4s_v5", osType="Windows", zones=["7"],
                                 labels={"kubernetes.io/x": "y"}, maxPods=1, gpuDriver="None"))
    fields = {p.field for p in rejection.problems}
    assert {"poolName", "vmSize", "osType", "zones[0]", "labels['kubernetes.io/x']", "maxPods", "gpuDriver"} <= fields
    assert rejection.message.startswith(f"pool request rejected: {len(rejection.problems)} problems")
    for field in ("poolName", "vmSize", "osType", "maxPods", "gpuDriver"):
        assert f"\n- {field}: " in rejection.message


def test_a_rejection_keeps_the_identifiers_it_could_read_for_the_ledger() -> None:
    rejection = rejected(message(vmSize="Standard_D4s_v5"))
    assert (rejection.request_id, rejection.pool_name, rejection.cluster) == ("req-0001", "gpunp", CLUSTER)
    assert len(rejection.digest) == 64


def test_a_rejection_of_an_unreadable_id_keeps_none_of_it() -> None:
    rejection = rejected(message(requestId="<img src=x>", vmSize="Standard_D4s_v5"))
    assert rejection.request_id is None


def test_echoed_values_are_shortened_so_a_huge_string_never_floods_the_message() -> None:
    rejection = rejected(message(poolName="x" * 5000))
    assert len(rejection.message) < 1000


def test_the_scope_is_not_consulted_for_a_malformed_cluster_id() -> None:
    calls: list[str] = []

    def spy(cluster: str) -> bool:
        calls.append(cluster)
        return True

    parse_and_validate(message(cluster="/subscriptions/x; DROP TABLE"), policy=POLICY, in_scope=spy)
    assert calls == []


def test_a_size_outside_the_fleet_allow_list_is_refused() -> None:
    policy = PoolRequestPolicy(allowed_sizes=("Standard_NC24ads_A100_v4",))
    rejection = rejected(message(), policy)
    assert any(p.field == "vmSize" and "not among the sizes this fleet allows" in p.problem for p in rejection.problems)


def test_the_payload_limit_comes_from_the_policy() -> None:
    small = PoolRequestPolicy(max_payload_bytes=1024)
    big = message(tags={f"k{i}": "v" * 40 for i in range(30)})
    assert isinstance(validate(big), ValidatedRequest)
    assert "over the limit of 1024" in rejected(big, small).message


# ----------------------------------------------------------------------------- valid requests


GOOD: list[tuple[str, dict[str, Any]]] = [
    ("the seed's minimal managed T4 request", {}),
    ("managed spelled out", {"installProfile": "managed", "gpuDriver": "Install"}),
    ("driver only", {"installProfile": "driverOnly"}),
    ("driver only with autoscale", {"installProfile": "driverOnly", "count": ..., "autoscale": {"min": 1, "max": 4}}),
    ("bring your own driver", {"installProfile": "none", "gpuDriver": "None"}),
    ("none without naming the driver", {"installProfile": "none"}),
    ("MIG single on A100", {"vmSize": A100, "mig": {"strategy": "Single", "profile": "MIG3g"}}),
    ("MIG mixed on H100", {"vmSize": "Standard_ND96isr_H100_v5", "mig": {"strategy": "Mixed", "profile": "MIG1g"}}),
    ("MIG mixed on H200", {"vmSize": "Standard_ND96isr_H200_v5", "mig": {"strategy": "Mixed", "profile": "MIG7g"}}),
    ("classic MIG profile with driver only", {"vmSize": A100, "installProfile": "driverOnly",
                                              "mig": {"profile": "MIG2g"}}),
    ("Azure Linux", {"osSku": "AzureLinux"}),
    ("spot with a price", {"spot": {"enabled": True, "maxPrice": 0.75, "evictionPolicy": "Deallocate"}}),
    ("spot at the on-demand price", {"spot": {}}),
    ("three zones", {"zones": ["1", "2", "3"]}),
    ("everything", {"labels": {"team": "vision", "team.example.com/cost-center": "cv-01"},
                    "taints": ["sku=gpu:NoSchedule", "dedicated:NoExecute"], "maxPods": 110, "count": 3,
                    "tags": {"costCenter": "1234", "note": "'; DROP TABLE pools; --"}, "validateWorkload": True,
                    "osType": "Linux"}),
    ("no taints at all", {"taints": []}),
    ("a UUID request id", {"requestId": "3f2504e0-4f89-11d3-9a0c-0305e82c3301"}),
    ("a lowercase size", {"vmSize": "standard_nc8as_t4_v3"}),
]


@pytest.mark.parametrize("overrides", [pytest.param(o, id=i) for i, o in GOOD])
def test_a_valid_request_is_accepted(overrides: dict[str, Any]) -> None:
    result = accepted(message(**overrides))
    assert result.request.schema_version == "1" and len(result.fingerprint) == 64


def test_defaults_are_applied_taints_driver_and_the_canonical_size_spelling() -> None:
    result = accepted(message(vmSize="standard_nc8as_t4_v3"))
    req = result.request
    assert req.taints == ("sku=gpu:NoSchedule",)
    assert (req.install_profile, req.gpu_driver, req.vm_size) == ("managed", "Install", "Standard_NC8as_T4_v3")
    assert accepted(message(installProfile="none")).request.gpu_driver == "None"


def test_default_taints_come_from_the_policy() -> None:
    result = parse_and_validate(message(), policy=PoolRequestPolicy(default_taints=("gpu=true:NoSchedule",)),
                                in_scope=in_scope)
    assert isinstance(result, ValidatedRequest) and result.request.taints == ("gpu=true:NoSchedule",)


def test_an_injection_looking_tag_value_is_kept_verbatim_as_data() -> None:
    result = accepted(message(tags={"note": "'; DROP TABLE pools; --"}))
    assert result.request.tags["note"] == "'; DROP TABLE pools; --"


def test_the_same_request_has_the_same_fingerprint_and_a_different_one_does_not() -> None:
    a = accepted(message()).fingerprint
    assert accepted(json.dumps(request(), indent=2, sort_keys=True)).fingerprint == a
    assert accepted(message(count=2)).fingerprint != a


def test_bytes_and_text_are_both_accepted() -> None:
    assert accepted(message().encode()).request_id == accepted(message()).request_id


# ----------------------------------------------------------------------------- schema file, docs and policy

ROOT = Path(__file__).resolve().parents[2]


def test_the_json_schema_lists_exactly_the_fields_of_the_struct() -> None:
    schema = json.loads((ROOT / "schemas" / "pool-request.v1.json").read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    fields = msgspec.structs.fields(PoolRequest)
    assert set(schema["properties"]) == {f.encode_name for f in fields}
    assert set(schema["required"]) == {f.encode_name for f in fields if f.required}
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(("path", "struct_field"), [
    pytest.param(("installProfile",), "install_profile", id="install profiles"),
    pytest.param(("osSku",), "os_sku", id="OS SKUs"),
    pytest.param(("osType",), "os_type", id="OS types"),
])
def test_the_json_schema_enums_match_the_struct(path: tuple[str, ...], struct_field: str) -> None:
    schema = json.loads((ROOT / "schemas" / "pool-request.v1.json").read_text())
    hint = get_type_hints(PoolRequest)[struct_field]
    assert schema["properties"][path[0]]["enum"] == list(get_args(hint))


def test_the_json_schema_mig_enums_match_the_catalogue() -> None:
    mig = json.loads((ROOT / "schemas" / "pool-request.v1.json").read_text())["properties"]["mig"]["properties"]
    assert mig["profile"]["enum"] == list(gpu_sizes.MIG_PROFILE_NAMES)
    assert mig["strategy"]["enum"] == ["None", "Single", "Mixed"]


def doc_examples() -> list[str]:
    text = (ROOT / "docs" / "pool-requests.md").read_text()
    return re.findall(r"```json\n(.*?)```", text, flags=re.S)


def test_the_docs_show_at_least_seven_examples() -> None:
    assert len(doc_examples()) >= 7


@pytest.mark.parametrize("index", range(7))
def test_every_example_in_the_docs_is_a_valid_request(index: int) -> None:
    accepted(doc_examples()[index])


def test_the_schema_example_is_a_valid_request() -> None:
    schema = json.loads((ROOT / "schemas" / "pool-request.v1.json").read_text())
    for example in schema["examples"]:
        accepted(json.dumps(example))


def test_the_policy_reads_its_settings_by_name() -> None:
    policy = PoolRequestPolicy.from_env({"POOL_REQUEST_MAX_BYTES": "2048", "POOL_REQUEST_CREATE_TIMEOUT_S": "600",
                                         "POOL_REQUEST_DEFAULT_TAINTS": "gpu=true:NoSchedule,dedicated:NoExecute",
                                         "POOL_REQUEST_ALLOWED_SIZES": "Standard_NC4as_T4_v3",
                                         "POOL_REQUEST_SAMPLE_JOB_IMAGE": "nvcr.io/nvidia/cuda@sha256:" + "0" * 64})
    assert (policy.max_payload_bytes, policy.create_timeout_s) == (2048, 600)
    assert policy.default_taints == ("gpu=true:NoSchedule", "dedicated:NoExecute")
    assert policy.allowed_sizes == ("Standard_NC4as_T4_v3",)
    assert policy.sample_job_image.startswith("nvcr.io/")
    assert PoolRequestPolicy.from_env({}) == PoolRequestPolicy()


@pytest.mark.parametrize(("env", "setting"), [
    pytest.param({"POOL_REQUEST_DEFAULT_TAINTS": "gpu"}, "POOL_REQUEST_DEFAULT_TAINTS", id="a taint without an effect"),
    pytest.param({"POOL_REQUEST_ALLOWED_SIZES": "Standard_D4s_v5"}, "POOL_REQUEST_ALLOWED_SIZES", id="a non-GPU size"),
    pytest.param({"POOL_REQUEST_MAX_BYTES": "10"}, "POOL_REQUEST_MAX_BYTES", id="a tiny payload limit"),
    pytest.param({"POOL_REQUEST_MAX_COUNT": "5000"}, "POOL_REQUEST_MAX_COUNT", id="more nodes than AKS allows"),
])
def test_a_bad_policy_setting_is_named(env: dict[str, str], setting: str) -> None:
    with pytest.raises(SettingError, match=setting):
        PoolRequestPolicy.from_env(env)


# ----------------------------------------------------------------------------- never raises

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                        max_size=4), max_leaves=20)


@settings(max_examples=80, deadline=None)
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_are_answered_never_raised(raw: bytes) -> None:
    assert isinstance(validate(raw), Rejection | ValidatedRequest)


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from([*sorted(request()), "mig", "spot", "labels", "tags", "zones", "taints", "autoscale"]),
       value=JSON_VALUES)
def test_any_value_in_any_field_is_answered_never_raised(field: str, value: Any) -> None:
    result = validate(json.dumps(request(**{field: value})))
    if isinstance(result, Rejection):
        assert result.problems and len(result.message) < 20000
