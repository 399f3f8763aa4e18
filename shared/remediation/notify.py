"""How a remediation tells people: outcome CloudEvents, Kubernetes events on the node, its state annotation,
and metrics. Every one is best effort: the ledger is the truth, these are notifications.

A step does not publish itself: it adds its events to its :class:`~shared.kernel.steps.Transition`
with :func:`announce`, and :func:`publisher` sends them when the step is settled (before the save).
Each event's id is sha256 of the remediation, the event and a key (the end state for an ending, the
dry-run step for a dry run), so a step repeated after a crash publishes the same ids and consumers
de-duplicate them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.kernel.errors import StewardError
from shared.kernel.ports import KubePort, NodeView, Record
from shared.kernel.steps import Publication, Transition
from shared.remediation import health
from shared.remediation.records import EVENT_PREFIX, Event, load, subject

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation")


@dataclass(frozen=True)
class Announcement(Publication):
    """A remediation's event: a :class:`Publication` with the key its id is made from."""

    key: str = ""


def payload(record: Record, note: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The data of a remediation's outcome event (docs/remediation.md, "Events")."""
    d = record.data
    return {"remediation": record.id, "cluster": d.get("cluster"), "node": d.get("node"), "pool": d.get("pool"),
            "condition": d.get("condition"), "since": d.get("since"), "attempt": d.get("attempt"),
            "state": record.state, "note": note, "dry_run": bool(d.get("dry_run")), **(extra or {})}


def announcement(about: Record, event: Event, note: str, *, key: str = "",
                 extra: Mapping[str, Any] | None = None) -> Announcement:
    """An event about ``about`` (the record as the step found it, or as it ended)."""
    d = about.data
    return Announcement(EVENT_PREFIX + event, subject(str(d.get("cluster")), str(d.get("pool")), str(d.get("node"))),
                        payload(about, note, extra), key=f"{about.id}|{event}|{key}")


def announce(transition: Transition, about: Record, event: Event, note: str, *, key: str = "",
             extra: Mapping[str, Any] | None = None) -> Transition:
    """``transition`` with one more event to publish when it is settled."""
    return Transition(transition.record, transition.outcome,
                      (*transition.events, announcement(about, event, note, key=key, extra=extra)))


def publisher(ctx: Context) -> Callable[[Publication], None]:
    """What :func:`shared.kernel.steps.settle` calls for each event of a remediation's transition."""

    def send(event: Publication) -> None:
        key = event.key if isinstance(event, Announcement) else f"{event.event_type}|{event.subject}"
        try:
            ctx.events.publish(type_=event.event_type, subject=event.subject, data=event.data,
                               id_=hashlib.sha256(key.encode()).hexdigest())
        except StewardError as exc:
            log.warning("could not publish %s for %s: %s", event.event_type, event.data.get("remediation"), exc)

    return send


def publish_now(ctx: Context, about: Record, event: Event, note: str, *, key: str = "",
                extra: Mapping[str, Any] | None = None) -> None:
    """Publish at once, outside a step: admission's Admitted and Refused."""
    publisher(ctx)(announcement(about, event, note, key=key, extra=extra))


def metric(ctx: Context, name: str, value: float, **attrs: Any) -> None:
    """The one place remediation talks to telemetry; absent or failing telemetry is ignored."""
    telemetry = getattr(ctx, "telemetry", None)
    fn = getattr(telemetry, "record", None)
    if callable(fn):
        try:
            fn(name, value, **attrs)
        except Exception as exc:  # metrics never fail a step
            log.debug("metric %s not recorded: %s", name, exc)


def kube_event(kube: KubePort, node: NodeView | str, record: Record, reason: str, message: str,
               type_: str = "Normal") -> None:
    kube.create_event(node=node, reason=reason, message=message, type_=type_, action=record.state,
                      correlation_id=record.id)


def annotate(kube: KubePort, node: NodeView, record: Record, note: str) -> None:
    """Best effort: the node's annotation mirrors the ledger state (attempt, rung, when)."""
    d = load(record)
    value = json.dumps({"v": 1, "id": record.id, "state": record.state, "attempt": record.data.get("attempt"),
                        "rung": str(d.rung or ""), "at": record.updated_at, "note": note[:200]}, separators=(",", ":"))
    try:
        kube.patch_node(node.name, {"metadata": {"annotations": {health.STATE_ANNOTATION: value}}})
    except StewardError as exc:
        log.info("state annotation on %s not written: %s", node.name, exc)
