"""The replacement of an unmanaged GPU pool: the same pool, property by property, with a managed GPU profile.

The migration creates a new pool that must be indistinguishable from the old one for the workloads:
same size, placement, network, spot settings, labels, taints, kubelet and OS configuration, eviction
thresholds, reserved resources. What "every property" means is not a list of ours: it is the AgentPool
definition of every api-version the app speaks (:mod:`shared.kernel.definitions`, derived from the Azure
SDK's generated models, themselves generated from Azure/azure-rest-api-specs
specification/containerservice/resource-manager/Microsoft.ContainerService/aks). :data:`CLONE_TABLE` has one
row per property of those definitions, saying whether the clone copies it or why not;
tests/unit/test_pool_clone_table.py fails when a definition has a property without a row (a newer SDK
adds one), and the round-trip property test (tests/integration/test_clone_round_trip_sim.py) fails when a
row is removed. A pool that carries a property with no row, or one no api-version can carry, is not
cloned at all (:func:`clone_problems`; the plan and every migration step refuse it, naming the fields):
a migration that quietly dropped a team's settings would be data loss.

Copied values leave out what the definition marks read-only at any depth (``localDNSProfile.state``,
``status.provisioningError``...). The replacement is sent on the api-version that carries every property
of its body (:func:`shared.kernel.definitions.api_version_for`): a property sent on a version that lacks it
is not written. docs/migration.md shows the table (tests/unit/test_pool_clone_table.py keeps the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from shared.kernel import definitions as defs
from shared.kernel.ports import PoolInfo

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,11}$")
MANAGED_GPU_PROFILE: Mapping[str, Any] = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
RESERVED_LABEL_PREFIXES: tuple[str, ...] = ("kubernetes.azure.com/", "kubernetes.io/")
TAG_MIGRATED_FROM = "gpu-fleet-steward-migrated-from"
TAG_AUTOSCALER = "gpu-fleet-steward-autoscaler-was"

COPY, SET, OMIT = "copy", "set", "omit"


@dataclass(frozen=True)
class Rule:
    """What the clone does with one AgentPool property: ``copy`` it as read (read-only parts left out),
    ``set`` it to a value of the migration's own, or ``omit`` it; ``why`` is said in the plan and the docs."""

    action: str
    why: str


_COPIED = "copied as read"
_AUTOSCALER_OFF = "the cluster autoscaler is not supported on managed GPU pools during the preview: off on the replacement"

CLONE_TABLE: Mapping[str, Rule] = {
    # compute and OS
    "vmSize": Rule(COPY, _COPIED),
    "osType": Rule(COPY, _COPIED),
    "osSKU": Rule(COPY, _COPIED),
    "osDiskSizeGB": Rule(COPY, _COPIED),
    "osDiskType": Rule(COPY, _COPIED),
    "kubeletDiskType": Rule(COPY, _COPIED),
    "enableOSDiskFullCaching": Rule(COPY, _COPIED),
    "maxPods": Rule(COPY, _COPIED),
    "mode": Rule(COPY, _COPIED),
    "type": Rule(COPY, _COPIED),
    "orchestratorVersion": Rule(COPY, _COPIED),
    "workloadRuntime": Rule(COPY, _COPIED),
    "messageOfTheDay": Rule(COPY, _COPIED),
    "windowsProfile": Rule(COPY, _COPIED),
    "virtualMachinesProfile": Rule(COPY, _COPIED),
    "preparedImageSpecificationProfile": Rule(COPY, _COPIED),
    "artifactStreamingProfile": Rule(COPY, _COPIED),
    # placement and networking
    "availabilityZones": Rule(COPY, _COPIED),
    "vnetSubnetID": Rule(COPY, _COPIED),
    "podSubnetID": Rule(COPY, _COPIED),
    "podIPAllocationMode": Rule(COPY, _COPIED),
    "enableNodePublicIP": Rule(COPY, _COPIED),
    "nodePublicIPPrefixID": Rule(COPY, _COPIED),
    "proximityPlacementGroupID": Rule(COPY, _COPIED),
    "capacityReservationGroupID": Rule(COPY, _COPIED),
    "hostGroupID": Rule(COPY, _COPIED),
    "networkProfile": Rule(COPY, _COPIED),
    "gatewayProfile": Rule(COPY, _COPIED),
    "localDNSProfile": Rule(COPY, _COPIED),
    # spot
    "scaleSetPriority": Rule(COPY, _COPIED),
    "scaleSetEvictionPolicy": Rule(COPY, _COPIED),
    "spotMaxPrice": Rule(COPY, _COPIED),
    "scaleDownMode": Rule(COPY, _COPIED),
    # Kubernetes metadata
    "nodeTaints": Rule(COPY, _COPIED),
    "nodeInitializationTaints": Rule(COPY, _COPIED),
    "nodeLabels": Rule(SET, "copied without the labels under kubernetes.azure.com/ and kubernetes.io/, which AKS "
                            "sets itself and refuses in a request"),
    "tags": Rule(SET, f"copied, plus {TAG_MIGRATED_FROM}=<old pool> (and {TAG_AUTOSCALER}=<min>-<max> when the old "
                      "pool autoscaled, so an operator can turn the autoscaler back on)"),
    # node configuration and security
    "kubeletConfig": Rule(COPY, _COPIED),
    "linuxOSConfig": Rule(COPY, _COPIED),
    "securityProfile": Rule(COPY, _COPIED),
    "enableEncryptionAtHost": Rule(COPY, _COPIED),
    "enableUltraSSD": Rule(COPY, _COPIED),
    "enableFIPS": Rule(COPY, _COPIED),
    "upgradeSettings": Rule(COPY, _COPIED),
    "upgradeSettingsBlueGreen": Rule(COPY, _COPIED),
    "upgradeStrategy": Rule(COPY, _COPIED),
    # GPU
    "gpuProfile": Rule(SET, 'set to {"driver": "Install", "nvidia": {"managementMode": "Managed"}}: the point of the '
                            "migration"),
    "gpuInstanceProfile": Rule(OMIT, "MIG pools are not migrated (an existing MIG pool cannot become a managed one)"),
    # scaling
    "count": Rule(SET, "the old pool's current count, clamped into its autoscaler bounds when it autoscales "
                       "(one batch first when rolling)"),
    "enableAutoScaling": Rule(SET, _AUTOSCALER_OFF),
    "minCount": Rule(OMIT, _AUTOSCALER_OFF),
    "maxCount": Rule(OMIT, _AUTOSCALER_OFF),
    # state and what ARM owns
    "nodeImageVersion": Rule(OMIT, "writing it pins the replacement to the old pool's node image (writable since "
                                   "2026-08-01, it rolls a pool to that image); AKS picks the current one"),
    "creationData": Rule(OMIT, "a snapshot source applies to the old pool's creation only and pins its node image"),
    "powerState": Rule(OMIT, "state, not configuration: a new pool starts Running"),
    "status": Rule(OMIT, "information ARM reports"),
    "virtualMachineNodesStatus": Rule(OMIT, "state, not configuration"),
    "provisioningState": Rule(OMIT, "read-only"),
    "currentOrchestratorVersion": Rule(OMIT, "read-only"),
    "eTag": Rule(OMIT, "read-only"),
}
"""One row per AgentPool property of every api-version the app speaks (:func:`shared.kernel.definitions.pool_property_names`)."""


class CloneRefused(ValueError):
    """The old pool carries properties the clone cannot carry over: ``fields`` names them."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


def clone_problems(old: Mapping[str, Any]) -> str:
    """Why the pool with these ``properties`` (as ARM shows them) cannot be cloned ("" = it can). Pure.

    A property without a row in :data:`CLONE_TABLE` (a newer api-version's, one this app has never seen)
    or one that no api-version the app speaks can write would be lost by the migration."""
    present = {k for k, v in old.items() if v is not None}
    no_rule = sorted(present - set(CLONE_TABLE))
    if no_rule:
        return (f"the pool carries {', '.join(no_rule)}, which the migration has no rule for (shared.fleet.pool_clone "
                "CLONE_TABLE): it would not be copied; nothing is written")
    body = {k: v for k, v in old.items() if k in present and CLONE_TABLE[k].action == COPY}
    lost = defs.unrepresentable(body)
    if lost:
        return (f"no api-version the app speaks ({', '.join(defs.API_VERSIONS)}) can write {', '.join(lost)}: the "
                "replacement would not carry them; nothing is written")
    return ""


def _reserved(label: str) -> bool:
    return any(label.startswith(prefix) for prefix in RESERVED_LABEL_PREFIXES)


def replacement_count(old: Mapping[str, Any]) -> int:
    """The old pool's current count, clamped into its autoscaler bounds when it autoscales."""
    count = int(old.get("count") or 0)
    if old.get("enableAutoScaling"):
        low, high = old.get("minCount"), old.get("maxCount")
        if low is not None:
            count = max(count, int(low))
        if high is not None:
            count = min(count, int(high))
    return count


def clone_for_managed(old: PoolInfo, *, new_name: str, count: int | None = None) -> dict[str, Any]:
    """The ``properties`` of the replacement pool (the PUT body is ``{"properties": ...}``).

    ``count`` overrides the node count (the rolling strategy starts the replacement with one batch).
    Raises :class:`CloneRefused` when :func:`clone_problems` finds a property that would be lost.
    """
    if not NAME_PATTERN.match(new_name):
        raise ValueError(f"replacement name {new_name!r} does not match {NAME_PATTERN.pattern}")
    props = old.properties
    problem = clone_problems(props)
    if problem:
        raise CloneRefused(problem, [k for k in props if k not in CLONE_TABLE] or defs.unrepresentable(props))
    copied = {k: _copy(v) for k, v in props.items() if v is not None and CLONE_TABLE[k].action == COPY}
    body = _without_read_only(copied)
    if props.get("nodeLabels") is not None:
        body["nodeLabels"] = {k: v for k, v in props["nodeLabels"].items() if not _reserved(k)}
    body["enableAutoScaling"] = False
    body["count"] = replacement_count(props) if count is None else count
    body["gpuProfile"] = _copy(MANAGED_GPU_PROFILE)
    tags = dict(props.get("tags") or {})
    tags[TAG_MIGRATED_FROM] = old.name
    if props.get("enableAutoScaling"):
        tags[TAG_AUTOSCALER] = f"{props.get('minCount', '')}-{props.get('maxCount', '')}"
    body["tags"] = tags
    return body


def _without_read_only(props: Mapping[str, Any]) -> dict[str, Any]:
    """``props`` without what the definition marks read-only, at every depth, judged by the api-version that
    carries them all (the newest when none does: :func:`clone_problems` has refused that case already)."""
    version = defs.api_version_for(props) or defs.API_VERSIONS[-1]
    return defs.definitions(version).writable(props)


# What a write to an *existing* pool leaves out of the pool's own GET body besides what the definition
# marks read-only (which :func:`update_properties` leaves out at every depth): ``nodeImageVersion`` is
# writable since 2026-08-01 but writing it rolls the pool back to that image (the AgentPool schema's
# nodeImageVersion, api-version 2026-08-01), and leaving it out keeps the current one; ``status`` and
# ``virtualMachineNodesStatus`` are information ARM reports. Everything else is sent back as read, known
# to this app or not: the PUT is create-or-replace, and a field left out is reset
# (Azure/azure-resource-manager-rpc v1.0/version-change.md, "the GET-PUT pipeline").
NOT_WRITTEN_BACK: frozenset[str] = frozenset({"nodeImageVersion", "status", "virtualMachineNodesStatus"} | {
    name for version in defs.API_VERSIONS
    for name, prop in defs.definitions(version).pool_properties().items() if prop.read_only})


def update_properties(old: PoolInfo, **changes: Any) -> dict[str, Any]:
    """The properties of a PUT that changes only ``changes`` of the existing pool ``old``.

    ``old`` must be the pool as read on the api-version that shows all its fields (shared.adapters.aks reads
    pools on the preview one); AksClient.begin_put_pool sends the body on the first api-version that
    carries every property of it (:func:`shared.kernel.definitions.api_version_for`), and refuses to send
    one no api-version carries. A change whose value is ``None`` removes the field.
    """
    body = _without_read_only({k: _copy(v) for k, v in old.properties.items()
                               if k not in NOT_WRITTEN_BACK and v is not None})
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = _copy(value)
    return body


def frozen_old_pool(old: PoolInfo, *, enable_autoscaling: bool, min_count: int | None = None,
                    max_count: int | None = None) -> dict[str, Any]:
    """The old pool's own body with its autoscaler switched off (or back on), for a PUT.

    The migration stops the autoscaler on the old pool while it drains it, so that it neither adds
    old nodes for pending pods nor fights the rolling strategy's machine deletions. Everything else
    is the old pool's own GET body (:func:`update_properties`: every field, known to this module or
    not, its immutable GPU fields included), so the PUT changes nothing but the scaling. Turning the
    autoscaler off also clears its bounds, as ``az aks nodepool update --disable-cluster-autoscaler``
    does; ``count`` stays what runs now.
    """
    count = int(old.properties.get("count") or 0)
    if enable_autoscaling:
        return update_properties(old, count=count, enableAutoScaling=True, minCount=min_count, maxCount=max_count)
    return update_properties(old, count=count, enableAutoScaling=False, minCount=None, maxCount=None)


def clone_differences(old: PoolInfo, body: Mapping[str, Any]) -> dict[str, str]:
    """Every property of the old pool that the replacement does not carry unchanged, with the reason
    (:data:`CLONE_TABLE`'s, or "changed" for a copied property that differs: never expected)."""
    props = old.properties
    out: dict[str, str] = {}
    for key in sorted(set(props) | set(body)):
        before, after = props.get(key), body.get(key)
        rule = CLONE_TABLE.get(key)
        if rule is None:
            out[key] = "no rule in the clone table"
        elif rule.action == OMIT:
            if before is not None:
                out[key] = rule.why
        elif rule.action == SET:
            if before != after:
                out[key] = rule.why
        elif before is not None and before != after:
            out[key] = ("read-only parts left out" if after == _without_read_only({key: before}).get(key)
                        else "changed")
    return out


def replacement_name(old_name: str, existing_names: Collection[str]) -> str:
    """A valid, deterministic pool name for the replacement that collides with none of ``existing_names``.

    The old name cut to fit, ``m`` and the smallest number that is free: ``gpu`` -> ``gpum1``,
    ``verylongname1`` -> ``verylongnam1``... (``^[a-z][a-z0-9]{0,11}$``, Linux limit 12).
    """
    taken = {n.lower() for n in existing_names} | {old_name.lower()}
    number = 1
    while (candidate := candidate_name(old_name, number)) in taken:
        number += 1
    return candidate


def candidate_name(old_name: str, number: int) -> str:
    """The replacement name with ``number`` (:func:`replacement_name` takes the first one that is free)."""
    base = re.sub(r"[^a-z0-9]", "", old_name.lower()) or "gpu"
    if not base[0].isalpha():
        base = "p" + base
    suffix = f"m{number}"
    return base[: 12 - len(suffix)] + suffix


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def clone_table_markdown() -> str:
    """:data:`CLONE_TABLE` as the Markdown table docs/migration.md shows (a test keeps the two equal)."""
    versions = {v: set(defs.definitions(v).pool_properties()) for v in defs.API_VERSIONS}
    lines = ["| property | api-versions | the replacement | why |", "|---|---|---|---|"]
    order = {COPY: 0, SET: 1, OMIT: 2}
    for name, rule in sorted(CLONE_TABLE.items(), key=lambda kv: (order[kv[1].action], kv[0].lower())):
        where = ", ".join(v for v, names in versions.items() if name in names) or "none"
        lines.append(f"| `{name}` | {where} | {rule.action} | {rule.why} |")
    return "\n".join(lines) + "\n"
