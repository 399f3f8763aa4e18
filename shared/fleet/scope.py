"""The fleet scope: which clusters this app may touch, and finding them.

The scope is the subscriptions (FLEET_SUBSCRIPTIONS) and, within them, either exactly the listed
clusters (FLEET_CLUSTERS) or the clusters carrying the tag (FLEET_CLUSTER_TAG). It is checked in
one place, :func:`in_scope`, used both to discover the fleet and to refuse any per-cluster access
outside it (``shared.wiring``), so that a request naming a foreign cluster can never reach it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from shared.kernel.errors import Forbidden, NotFound
from shared.kernel.ports import AksPort, ClusterInfo

if TYPE_CHECKING:
    from shared.settings import Settings

log = logging.getLogger("steward.scope")

PAUSED_TAG = "gpu-fleet-steward/paused"
"""The cluster tag that pauses every job of the steward on that cluster (remediation, migration, pool requests)."""


def subscription_of(resource_id: str) -> str:
    """The subscription id of an ARM resource id ("" when it is not one)."""
    parts = resource_id.strip("/").split("/")
    if len(parts) >= 2 and parts[0].lower() == "subscriptions":
        return parts[1].lower()
    return ""


def in_scope(cluster: ClusterInfo, *, subscriptions: Iterable[str], cluster_tag: tuple[str, str] | None,
             cluster_ids: Iterable[str] = ()) -> tuple[bool, str]:
    """Whether ``cluster`` is in the fleet, and why (or why not), for logs and refusals.

    Ids and tag keys compare case-insensitively (as ARM does); tag values exactly. An empty tag
    value in the setting (``key=``) accepts any value of the key.
    """
    subs = {s.lower() for s in subscriptions}
    sub = (cluster.subscription or subscription_of(cluster.id)).lower()
    if sub not in subs or subscription_of(cluster.id) != sub:
        return False, f"subscription {sub or '?'} is not in FLEET_SUBSCRIPTIONS"
    listed = {c.lower() for c in cluster_ids}
    if listed:
        if cluster.id.lower() in listed:
            return True, "listed in FLEET_CLUSTERS"
        return False, "not listed in FLEET_CLUSTERS"
    if cluster_tag is None:
        return False, "no FLEET_CLUSTER_TAG and no FLEET_CLUSTERS: nothing is in scope"
    key, value = cluster_tag
    for tag_key, tag_value in (cluster.tags or {}).items():
        if tag_key.lower() == key.lower():
            if not value or tag_value == value:
                return True, f"tagged {key}={tag_value}"
            return False, f"tag {key} is {tag_value!r}, not {value!r}"
    return False, f"not tagged {key}={value}"


def cluster_in_scope(cluster: ClusterInfo, settings: Settings) -> tuple[bool, str]:
    return in_scope(cluster, subscriptions=settings.subscriptions, cluster_tag=settings.cluster_tag,
                    cluster_ids=settings.cluster_ids)


def discover(aks: AksPort, settings: Settings) -> list[ClusterInfo]:
    """The clusters in scope, as ARM describes them now.

    With FLEET_CLUSTERS, each listed cluster is read directly (a role assigned on the clusters alone
    is enough); otherwise every subscription is listed and filtered by tag. A listed cluster that is
    missing or unreadable is logged and skipped, never fatal for the rest of the fleet.
    """
    found: list[ClusterInfo] = []
    if settings.cluster_ids:
        candidates: list[ClusterInfo] = []
        for cluster_id in settings.cluster_ids:
            try:
                candidates.append(aks.get_cluster(cluster_id))
            except (NotFound, Forbidden) as error:
                log.warning("listed cluster unavailable", extra={"cluster": cluster_id, "error": str(error)})
    else:
        candidates = [c for sub in settings.subscriptions for c in aks.list_clusters(sub)]
    for cluster in candidates:
        ok, reason = cluster_in_scope(cluster, settings)
        if ok:
            found.append(cluster)
        else:
            log.debug("cluster out of scope", extra={"cluster": cluster.id, "reason": reason})
    return sorted(found, key=lambda c: c.id.lower())


def paused_reason(tags: Mapping[str, str] | None, *, tag: str = PAUSED_TAG) -> str:
    """Why a cluster with these (ARM) tags is paused ("" = it is not): the tag ``gpu-fleet-steward/paused``
    with the value ``true`` (key any case, as ARM compares tag names; value case-insensitive).

    The pause holds every write of the app on that cluster: remediation, migration and pool creation.
    Detection and reporting go on."""
    for key, value in (tags or {}).items():
        if key.lower() == tag.lower() and str(value).strip().lower() == "true":
            return f"the cluster is paused (tag {tag}=true)"
    return ""


def cluster_paused(aks: AksPort, cluster_id: str, *, tag: str = PAUSED_TAG) -> str:
    """:func:`paused_reason` of the cluster as ARM describes it now (read at the step, never cached).

    A cluster ARM cannot find is not paused (the step that needs it reports that). Every other error
    propagates: a step that cannot read the tag writes nothing (``Forbidden`` is a permanent error for
    the reconciler, which ends the record through its kind's ``give_up`` after a few tries)."""
    try:
        cluster = aks.get_cluster(cluster_id)
    except NotFound:
        return ""
    return paused_reason(cluster.tags, tag=tag)
