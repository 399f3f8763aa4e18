"""The DCGM signal's part of ``make demo``: the signal as AKS really delivers it, and forgeries it refuses.

Why a module of its own: issue 18 made the DCGM signal match AKS managed Prometheus (the managed
exporter's series carry only ``cluster|instance|gpu|job|__name__``, the node in ``instance``, no
``Hostname``) and unforgeable. The demo has to show both halves, on the same workspace:

- ml-serve's XID 79 arrives in that real shape (the demo reads it back through the app's own PromQL
  adapter and prints its labels) and the node is repaired (row ``xid:79``);
- three forgeries are played (:data:`FORGERIES`) and must be refused, never acted on:

  1. a tenant pod scraped through pod annotations, labelled ``job=dcgm-exporter`` and
     ``instance=<a healthy vision node>`` (ama-metrics' ``kubernetes-pods`` job labelmaps pod labels,
     but also adds ``kubernetes_namespace``/``kubernetes_pod_name``): refused ``foreign-labels``;
  2. a tenant PodMonitor with ``honorLabels`` and a ``labeldrop`` of everything else: exactly the
     managed exporter's labels, naming the other healthy vision node. No label check can tell it
     apart; the node's own exporter keeps writing 0 into the same series, so the admission re-check over
     the window (``min_over_time``) never confirms it (the sweep's instant reads may catch only forged
     samples when sweeps are more than 15 fleet seconds apart, and then publish Unhealthy events: said);
  3. ml-eval's admin sets ``cluster_alias`` to ``ml-serve`` on the shared workspace, and ml-eval's own
     XID 79 then arrives under ml-serve's name: refused ``phantom-node`` (no such node in ml-serve).

The report section (:func:`report_lines`) is built from what the app said (its
``Steward.Signal.SeriesRefused`` / ``Steward.Signal.CountersInactive`` events, its sweep log, its
ledger) and from what really happened (the simulator's oracles): the victims never repaired, evicted,
removed or cordoned.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

XID = "DCGM_FI_DEV_XID_ERRORS"
SERIES_REFUSED = "Steward.Signal.SeriesRefused"
COUNTERS_INACTIVE = "Steward.Signal.CountersInactive"
UNHEALTHY = "Steward.GpuNode.Unhealthy"
SAFETY = ("pdb_violations", "pods_killed_without_eviction", "workload_pods_lost")

#: The Azure Monitor workspace ml-serve, ml-eval and research-lab send their metrics to (the simulator
#: serves any workspace name at /prometheus/<name>; clusters are told apart by the ``cluster`` label).
WORKSPACE = "ml-observability"
DCGM_CLUSTERS = ("ml-serve", "ml-eval", "research-lab")
VICTIM_POOL = ("ml-serve", "vision")
_MANAGED_SHAPE_DROPS = ["namespace", "pod", "container", "endpoint"]  # what the PodMonitor's labeldrop removes

#: Played by the demo's SignalPlayer like the other fault signals (``{node}`` in ``body`` and ``say`` is
#: the ``index``-th node of ``pool``); ``forgery`` names the story each belongs to.
FORGERIES: tuple[dict[str, Any], ...] = (
    {"at": 210, "path": "/dcgm/tenant-series", "cluster": "ml-serve", "pool": "vision", "index": 0,
     "forgery": "pod-annotations",
     "body": {"scrape": "annotations", "namespace": "serve", "pod": "embedder-metrics-0", "metric": XID, "value": 79,
              "pod_labels": {"job": "dcgm-exporter", "instance": "{node}"}, "labels": {"gpu": "0"}},
     "say": "a pod of the embeddings team (scraped through pod annotations) labels itself job=dcgm-exporter, "
            "instance={node} (a healthy node of the vision team) and exports XID 79"},
    {"at": 210, "path": "/dcgm/tenant-series", "cluster": "ml-serve", "pool": "vision", "index": 1,
     "forgery": "podmonitor",
     "body": {"scrape": "podmonitor", "namespace": "serve", "pod": "embedder-metrics-1", "monitor": "gpu-metrics",
              "honor_labels": True, "drop_labels": _MANAGED_SHAPE_DROPS, "metric": XID, "value": 79,
              "labels": {"job": "dcgm-exporter", "instance": "{node}", "gpu": "0"}},
     "say": "the same team's PodMonitor (honorLabels, labeldrop) writes XID 79 for {node} in exactly the "
            "managed exporter's labels"},
    {"at": 220, "path": "/dcgm/cluster-alias", "cluster": "ml-eval", "pool": "eval", "index": 0,
     "forgery": "cluster-alias", "body": {"alias": "ml-serve"},
     "say": "ml-eval's admin sets cluster_alias=ml-serve (ama-metrics-settings-configmap) on the shared workspace"},
    {"at": 225, "path": "/dcgm/xid", "cluster": "ml-eval", "pool": "eval", "index": 0, "forgery": "cluster-alias",
     "body": {"gpu": 0, "xid": 79},
     "say": "XID 79 on {node} of ml-eval: it reaches the workspace labelled cluster=\"ml-serve\""},
)
#: What each forgery must be refused with (Steward.Signal.SeriesRefused ``code``); None: no label check
#: can refuse it, the node's own exporter contradicts it.
EXPECTED_CODE: dict[str, str | None] = {"pod-annotations": "foreign-labels", "podmonitor": None,
                                        "cluster-alias": "phantom-node"}
TITLES = {"pod-annotations": "tenant pod, scraped through pod annotations",
          "podmonitor": "tenant PodMonitor, honorLabels + labeldrop: the exporter's exact labels",
          "cluster-alias": "cluster_alias: ml-eval's admin names its cluster ml-serve"}
#: Fleet seconds after the last forgery before the story counts as told: a threshold (60), the re-check
#: window (90) and a few sweeps (10 each), so the exact-shape forgery had every chance to be acted on.
JUDGED_AFTER_S = 60 + 90 + 40


def signal_settings(endpoints: dict[str, Any]) -> dict[str, str]:
    """SIGNALS_PROMETHEUS for the demo (docs/signals-dcgm.md): the managed default, the workspace's endpoint
    only (job ``dcgm-exporter``, the node in ``instance``), for every cluster sending to it; research-lab is
    configured too, to show that scope, not the setting, decides which nodes are acted on. Known only once
    the simulator listens (the endpoint carries its port)."""
    endpoint = f"{str(endpoints['arm_endpoint']).rstrip('/')}/prometheus/{WORKSPACE}"
    clusters = {str(c["name"]): str(c["id"]) for c in endpoints["clusters"]}
    return {"SIGNALS_PROMETHEUS": json.dumps({clusters[name]: {"endpoint": endpoint} for name in DCGM_CLUSTERS})}


def _show(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class DcgmStory:
    """What the demo did to the workspace, and what it read back; the report section from it."""

    def __init__(self, ctx: Any, endpoints: dict[str, Any]) -> None:
        self.ctx = ctx
        self.ids = {str(c["name"]): str(c["id"]) for c in endpoints["clusters"]}
        self.played: list[dict[str, Any]] = []  # {forgery, node, answer, at, path}
        self.xid: dict[str, Any] = {}  # ml-serve's XID 79: node, then labels and value once read back
        self.last_at = 0.0
        self.log_offset = 0  # where this run's part of the host log starts (devstack appends to it)

    # ------------------------------------------------------------------ while the demo runs
    def on_played(self, signal: dict[str, Any], node: str, answer: Any, *, at: float) -> None:
        if signal.get("forgery"):
            self.played.append({"forgery": signal["forgery"], "node": node, "answer": answer, "at": at,
                                "path": signal["path"]})
            self.last_at = max(self.last_at, at)
        elif signal.get("path") == "/dcgm/xid" and signal.get("cluster") == "ml-serve":
            self.xid = {"node": node, "cluster": "ml-serve"}

    def _target(self, cluster: str) -> Any:
        return self.ctx.settings.signals_prometheus[self.ids[cluster].lower()]

    def _query(self, cluster: str, promql: str) -> list[Any]:
        return list(self.ctx.access.metrics(self._target(cluster).endpoint).query(promql))

    def watch(self) -> None:
        """Read ml-serve's XID 79 back from the workspace, as the app's adapter sees it, until it shows."""
        if not self.xid or self.xid.get("labels"):
            return
        try:
            samples = self._query("ml-serve", f'{{__name__="{XID}", instance="{self.xid["node"]}", gpu="0"}}')
        except Exception as exc:  # the workspace may be busy; the next turn of the loop asks again
            self.xid["error"] = str(exc)
            return
        for s in samples:
            if s.value:
                self.xid.update(labels=dict(s.labels), value=s.value)

    def missing(self, events: list[dict[str, Any]], *, now: float) -> list[str]:
        """What the DCGM story still waits for (empty when it is told)."""
        out = []
        if len(self.played) < len(FORGERIES):
            out.append(f"{len(FORGERIES) - len(self.played)} forgery step(s) still to play")
        codes = {str((e.get("data") or {}).get("code")) for e in events if e.get("type") == SERIES_REFUSED}
        out += [f"no SeriesRefused {code} yet" for code in EXPECTED_CODE.values() if code and code not in codes]
        if self.played and now < self.last_at + JUDGED_AFTER_S:
            out.append(f"forgeries judged for {now - self.last_at:.0f} of {JUDGED_AFTER_S} fleet seconds")
        if self.xid and not self.xid.get("labels"):
            out.append("ml-serve's XID 79 not yet read back from the workspace")
        return out

    # ------------------------------------------------------------------ the report
    def victims(self) -> dict[str, str]:
        """Forgery -> the node it names (the alias forgery: ml-eval's own node)."""
        return {p["forgery"]: p["node"] for p in self.played}

    def _refusal(self, events: list[dict[str, Any]], code: str, node: str) -> tuple[str, int] | None:
        """The SeriesRefused event's example about ``node`` (else its first), and its count."""
        for e in events:
            d = e.get("data") or {}
            if e.get("type") != SERIES_REFUSED or d.get("code") != code:
                continue
            examples = [str(x) for x in d.get("examples") or []]
            about = next((x for x in examples if node in x), examples[0] if examples else "")
            return about, int(d.get("count") or 0)
        return None

    def _read_back(self, node: str) -> str:
        """The node's XID series as the workspace holds it (through ml-serve's configured endpoint)."""
        try:
            samples = self._query("ml-serve", f'{{__name__="{XID}", instance="{node}"}}')
        except Exception as exc:
            return f"(query failed: {exc})"
        return "; ".join(f"{_show(dict(s.labels))} = {s.value:g}" for s in samples) or "(no series)"

    def _window(self, node: str) -> str:
        """min and max of the node's XID series over the app's re-check window, read through the app's adapter."""
        from shared.remediation import dcgm_provenance as prov

        target = self._target("ml-serve")
        query = prov.window_query(target, XID, node)
        try:
            lo = self._query("ml-serve", query)
            hi = self._query("ml-serve", query.replace("min_over_time", "max_over_time", 1))
        except Exception as exc:
            return f"(window query failed: {exc})"
        low = min((s.value for s in lo), default=None)
        high = max((s.value for s in hi), default=None)
        return (f"the app's window query {query} reads {low:g} (max over the same window: {high:g})"
                if low is not None and high is not None else f"the window query {query} found no series")

    def report_lines(self, *, records: list[Any], events: list[dict[str, Any]], oracles: dict[str, Any],
                     host_log: Path | None, setting: str) -> tuple[list[str], bool]:
        """The report's DCGM section, and whether everything the story claims held."""
        ok = True
        out = ["DCGM signal (AKS managed Prometheus, issue 18):"]
        configured = json.loads(setting or "{}")
        shown = json.dumps(next(iter(configured.values()))) if configured else "(not set)"
        out.append(f"  SIGNALS_PROMETHEUS for {', '.join(DCGM_CLUSTERS)}: {shown} (the managed default: job "
                   "dcgm-exporter, the node in instance; no nodeLabel)")
        ok &= self._xid_lines(out, records, oracles)
        ok &= self._forgery_lines(out, events)
        ok &= self._victim_lines(out, records, events, oracles)
        self._sweep_lines(out, host_log)
        inactive = [e.get("data") or {} for e in events if e.get("type") == COUNTERS_INACTIVE]
        out.append("  Counters the managed exporter does not export (Steward.Signal.CountersInactive, once per cluster):")
        for d in sorted(inactive, key=lambda d: str(d.get("cluster"))):
            out.append(f"    - {str(d.get('cluster', '?')).rsplit('/', 1)[-1]} ({d.get('exporter')} exporter): rows for "
                       f"{', '.join(d.get('inactive') or [])} inactive; exported: {', '.join(d.get('exported') or [])}")
            out.append(f"      remedy: {d.get('remedy', '')}")
        if not inactive:
            out.append("    (none reported)")
            ok = False
        unsafe = {k: len(oracles.get(k) or []) for k in SAFETY}
        out.append("  Safety oracles: " + ", ".join(f"{k} {n}" for k, n in unsafe.items()))
        return out, ok and not any(unsafe.values())

    def _xid_lines(self, out: list[str], records: list[Any], oracles: dict[str, Any]) -> bool:
        node = str(self.xid.get("node") or "")
        labels = self.xid.get("labels") or {}
        out.append(f"  XID 79 on ml-serve, as the workspace delivered it: {_show(labels)} = {self.xid.get('value', '?'):g}"
                   if labels else f"  XID 79 on ml-serve: not read back ({self.xid.get('error', 'no sample')})")
        shape_ok = bool(labels) and labels.get("instance") == node and "Hostname" not in labels \
            and "hostname" not in labels
        out.append(f"    node in instance: {'yes' if labels.get('instance') == node else 'NO'}; "
                   f"Hostname label: {'absent' if shape_ok or not labels else 'PRESENT'}")
        mine = [r for r in records if r.kind == "remediation" and (r.data or {}).get("node") == node]
        for r in mine:
            d = r.data or {}
            out.append(f"    -> remediation of {node}: {r.state.upper()}; signal {d.get('signal')}, condition "
                       f"{d.get('condition')}, policy row {d.get('policy_row')}")
        rungs = [x["rung"] for x in oracles.get("repairs") or [] if x.get("node") == node]
        out.append(f"    simulator: repairs of {node}: {', '.join(rungs) or 'none'}")
        repaired = any(r.state == "done" and (r.data or {}).get("policy_row") == "xid:79" for r in mine)
        return shape_ok and repaired and bool(rungs)

    def _forgery_lines(self, out: list[str], events: list[dict[str, Any]]) -> bool:
        ok = True
        out.append("  Forgeries (each refused, never acted on):")
        seen: set[str] = set()
        for p in self.played:
            kind = str(p["forgery"])
            if kind in seen:
                continue
            seen.add(kind)
            node = str(p["node"])
            answer = p.get("answer") or {}
            written = _show(answer["labels"]) if isinstance(answer, dict) and answer.get("labels") else ""
            out.append(f"    {len(seen)}. {TITLES[kind]}: names {node}")
            if written:
                out.append(f"       written to the workspace as {written}")
            code = EXPECTED_CODE[kind]
            if kind == "cluster-alias":
                out.append(f"       read back from the workspace as {self._read_back(node)}")
            if code is None:
                out.append("       refusal code: none (the labels are the managed exporter's own, so no label check can "
                           "refuse it); the node's exporter keeps writing 0 into the same series:")
                unhealthy = [e for e in events if e.get("type") == UNHEALTHY and (e.get("data") or {}).get("node") == node]
                if unhealthy:
                    out.append(f"       the sweep's instant reads caught only the forged samples long enough to publish "
                               f"{len(unhealthy)} {UNHEALTHY} event(s) about it (sweeps more than 15 fleet seconds apart "
                               "can miss every exporter sample); admission re-read the window for each and admitted "
                               "nothing:")
                else:
                    out.append("       the sweep never saw the XID hold for its 60 s threshold (0 and 79 alternate), and "
                               "the re-check window reads 0:")
                out.append(f"       {self._window(node)}")
                continue
            found = self._refusal(events, code, node)
            if found is None:
                out.append(f"       NOT REFUSED: no Steward.Signal.SeriesRefused with code {code}")
                ok = False
                continue
            example, count = found
            why = example.partition("}: ")[2] or example
            cut = " [the event cuts its examples at 1000 characters]" if len(example) >= 1000 else ""
            named = "" if node in example else " [the event's examples do not name this node]"
            out.append(f"       refused: {code} (Steward.Signal.SeriesRefused, {count} series in its first sweep)")
            out.append(f"       why: {why.strip()}{cut}{named}")
        return ok and len(seen) == len(EXPECTED_CODE)

    def _victim_lines(self, out: list[str], records: list[Any], events: list[dict[str, Any]],
                      oracles: dict[str, Any]) -> bool:
        ok = True
        out.append("  The nodes the forgeries name (the simulator's oracles, the app's ledger and events):")
        for kind, node in self.victims().items():
            cluster = "ml-eval" if kind == "cluster-alias" else VICTIM_POOL[0]
            repairs = [x for x in oracles.get("repairs") or [] if x.get("node") == node]
            removed = [x for x in oracles.get("nodes_removed") or [] if x.get("node") == node]
            evicted = [x for x in oracles.get("terminations") or [] if x.get("node") == node
                       and x.get("cause") == "eviction"]
            remediations = [r for r in records if r.kind == "remediation" and (r.data or {}).get("node") == node]
            unhealthy = [e for e in events if e.get("type") == UNHEALTHY and (e.get("data") or {}).get("node") == node]
            view = self.ctx.access.kube(self.ids[cluster]).get_node(node)
            cordoned = view is None or bool(view.unschedulable)
            out.append(f"    - {cluster}/{node}: repairs {len(repairs)}, evictions {len(evicted)}, removed "
                       f"{'yes' if removed else 'no'}, cordoned now {'yes' if cordoned else 'no'}; remediations "
                       f"{len(remediations)}, Unhealthy events {len(unhealthy)}")
            ok &= not (repairs or removed or evicted or remediations or cordoned)  # an event alone disrupts nothing
        label = "/".join(VICTIM_POOL)
        cordons = int((oracles.get("max_cordoned_per_pool") or {}).get(label, 0))
        disrupted = int((oracles.get("max_disrupted_per_pool") or {}).get(label, 0))
        out.append(f"    - pool {label} over the whole run: at most {cordons} node(s) cordoned, {disrupted} disrupted")
        return ok and cordons == 0 and disrupted == 0

    def _sweep_lines(self, out: list[str], host_log: Path | None) -> None:
        per_code: dict[str, list[int]] = {}
        contested = sweeps = 0
        try:
            with open(host_log or "", "rb") as f:
                f.seek(self.log_offset)
                lines = f.read().decode("utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            _, sep, text = line.partition("steward.sweep: sweep: ")
            if not sep:
                continue
            try:
                summary = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                continue
            dcgm = summary.get("dcgm") or {}
            sweeps += 1
            contested += int(dcgm.get("contested") or 0)
            for code, n in (dcgm.get("refused") or {}).items():
                per_code.setdefault(str(code), []).append(int(n))
        if not sweeps:
            out.append("  Sweeps: (no sweep summary in the host log)")
            return
        counts = "; ".join(f"{code} in {len(ns)} sweeps (up to {max(ns)} series each)"
                           for code, ns in sorted(per_code.items())) or "none"
        out.append(f"  Sweeps (host log, {sweeps} sweeps): series refused: {counts}; contested copies: {contested}")
