"""AgentPools generated from the AKS REST definitions, with every writable property set (hypothesis).

The properties, their types and enum values come from the definition of an api-version
(shared.kernel.definitions, derived from the SDK's generated models), so a property a newer SDK adds is
generated too, with no change here. A few properties need values the resource provider accepts, not
just values of the right JSON type; each override below says why. What a test then checks is that
whatever the definition allows survives the app's writes.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from shared.kernel.definitions import POOL_PROPERTIES, Definitions

LINKED_RG = "/subscriptions/8f2d4c1e-5a3b-4c7d-9e0f-00000000c10e/resourceGroups/rg-linked"
"""Where the generated pools' linked resources live (subnets, prefixes, groups): the app's linked-resources
role is assigned there in the scenarios that use these pools (infra/main.bicep ``linkedResourceGroupIds``)."""

_NAME = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=1, max_size=8).map(lambda s: "a" + s)
_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "-._", min_size=1, max_size=12)


def _resource_id(provider_type: str) -> st.SearchStrategy[str]:
    return _NAME.map(lambda name: f"{LINKED_RG}/providers/{provider_type}/{name}")


_SUBNET = st.tuples(_NAME, _NAME).map(
    lambda t: f"{LINKED_RG}/providers/Microsoft.Network/virtualNetworks/{t[0]}/subnets/{t[1]}")
_TAINT = st.tuples(_NAME, _NAME, st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])).map(
    lambda t: f"{t[0]}={t[1]}:{t[2]}")
_LABEL_KEY = st.tuples(_NAME, _NAME).map(lambda t: f"{t[0]}.example.com/{t[1]}")

# Overrides by path (``[]`` array items, ``{}`` map values): values AKS accepts, not only well-typed ones.
OVERRIDES: dict[str, st.SearchStrategy[Any]] = {
    # A migration candidate: an unmanaged, non-MIG, Linux, User, VMSS pool (shared.migration.plan.pool_ineligibility).
    "osType": st.just("Linux"),
    "osSKU": st.sampled_from(["Ubuntu", "AzureLinux", "Ubuntu2204"]),
    "mode": st.just("User"),
    "type": st.just("VirtualMachineScaleSets"),
    "gpuProfile": st.sampled_from([{"driver": "Install"}, {"driver": "Install", "nvidia": {"managementMode": "Unmanaged"}},
                                   {"driver": "None"}]),
    "gpuInstanceProfile": st.none(),  # MIG pools are not migrated
    # Resource ids ARM checks the caller may join (linked access), in the group where the app may.
    "vnetSubnetID": _SUBNET,
    "podSubnetID": _SUBNET,
    "networkProfile.secondaryNetworkInterfaces[].vnetSubnetId": _SUBNET,
    "nodePublicIPPrefixID": _resource_id("Microsoft.Network/publicIPPrefixes"),
    "networkProfile.nodePublicIPPrefixIDs[]": _resource_id("Microsoft.Network/publicIPPrefixes"),
    "networkProfile.secondaryNetworkInterfaces[].publicIPAddressConfiguration.publicIPPrefixID":
        _resource_id("Microsoft.Network/publicIPPrefixes"),
    "networkProfile.applicationSecurityGroups[]": _resource_id("Microsoft.Network/applicationSecurityGroups"),
    "proximityPlacementGroupID": _resource_id("Microsoft.Compute/proximityPlacementGroups"),
    "capacityReservationGroupID": _resource_id("Microsoft.Compute/capacityReservationGroups"),
    "hostGroupID": _resource_id("Microsoft.Compute/hostGroups"),
    "creationData.sourceResourceId": _resource_id("Microsoft.ContainerService/snapshots"),
    "preparedImageSpecificationProfile.preparedImageSpecificationId":
        _resource_id("Microsoft.ContainerService/preparedImageSpecifications"),
    # Kubernetes metadata: valid label keys and taints (the nodes carry them), no reserved prefix.
    "nodeLabels": st.dictionaries(_LABEL_KEY, _NAME, min_size=1, max_size=3),
    "nodeTaints": st.lists(_TAINT, min_size=1, max_size=2, unique=True),
    "nodeInitializationTaints": st.lists(_TAINT, min_size=1, max_size=2, unique=True),
    "tags": st.dictionaries(_NAME, _TEXT, min_size=1, max_size=3),
    "availabilityZones": st.lists(st.sampled_from(["1", "2", "3"]), min_size=1, max_size=3, unique=True).map(sorted),
    "orchestratorVersion": st.none(),  # the cluster's version, chosen by AKS when not given
    "powerState": st.just({"code": "Running"}),
}


def writable(defs: Definitions, t: Mapping[str, Any], path: str) -> st.SearchStrategy[Any]:
    """A value of type ``t`` (a definition's type description) at ``path``, every writable property set."""
    if path in OVERRIDES:
        return OVERRIDES[path]
    kind = t["kind"]
    if kind == "model":
        return model(defs, t["name"], path + ".")
    if kind == "array":
        return st.lists(writable(defs, t["items"], path + "[]"), min_size=1, max_size=2)
    if kind == "map":
        return st.dictionaries(_NAME, writable(defs, t["values"], path + "{}"), min_size=1, max_size=2)
    if kind == "enum":
        return st.sampled_from(list(t["values"]))
    if kind == "integer":
        return st.integers(1, 64)
    if kind == "number":
        return st.integers(1, 400).map(lambda n: n / 4)
    if kind == "boolean":
        return st.booleans()
    if kind == "duration":
        return st.integers(1, 59).map(lambda n: f"PT{n}M")
    if kind == "datetime":
        return st.just("2026-12-01T00:00:00Z")
    return _TEXT


def model(defs: Definitions, name: str, prefix: str = "") -> st.SearchStrategy[dict[str, Any]]:
    """An object of model ``name`` with every property a create may carry (read-only ones left to ARM)."""
    fields = {key: writable(defs, prop.type, prefix + key) for key, prop in defs.model(name).items()
              if not prop.read_only and "create" in prop.visibility}
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not None})


@st.composite
def pools(draw: st.DrawFn, defs: Definitions, *, sizes: list[str]) -> dict[str, Any]:
    """The ``properties`` of an unmanaged GPU pool with every writable property of ``defs`` set.

    Cross-property rules AKS enforces are applied after the draw: a count within the autoscaler's
    bounds (or no bounds when it is off), spot settings only on spot pools (a Regular pool leaves them out)."""
    props = draw(model(defs, POOL_PROPERTIES))
    props["vmSize"] = draw(st.sampled_from(sizes))
    count = draw(st.integers(1, 2))
    props["count"] = count
    if props.get("enableAutoScaling"):
        props["minCount"] = draw(st.integers(0, count))
        props["maxCount"] = draw(st.integers(count, count + 3))
    else:
        props.pop("minCount", None)
        props.pop("maxCount", None)
    if props.get("scaleSetPriority") != "Spot":
        # Regular is the default, and AKS does not echo it nor the spot settings on a Regular pool
        # (tests/replay/recordings/test_aks_create_gpu_driver_flow.json put_agentpool_create_gpu_driver_none)
        for key in ("scaleSetPriority", "scaleSetEvictionPolicy", "spotMaxPrice"):
            props.pop(key, None)
    else:
        props["spotMaxPrice"] = draw(st.sampled_from([-1, 0.5, 2.25]))
    return props
