"""With the timer a year away, a record due in N seconds is advanced about N seconds later: by its delayed nudge.

The app's own reconcile functions (functions/reconcile.py) run under the local host against Azurite;
the nudge goes through the real queue adapter (shared.adapters.nudge_queue.QueueNudger) with a visibility timeout,
and the host's queue listener delivers it once Azurite makes it visible. The record kind is a probe
(a -> b, wait WAIT_S, -> done), so the test measures the wake-up, not a state machine.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devhost.host import Host
from shared import entrypoints, wiring
from shared.adapters.nudge_queue import QueueNudger
from shared.kernel.clock import SystemClock
from shared.kernel.context import Context
from shared.kernel.ports import Record
from tests.fakes.ledger import InMemoryLedger
from tests.waiting import poll

NUDGE_APP = Path(__file__).resolve().parent / "nudge_app"
WAIT_S = 8.0  # longer than reconciler.HOLD_S, so the record is released and nudged rather than held
POLL_S = 1.0  # maxPollingInterval of nudge_app/host.json
NEVER = "0 0 0 1 1 *"  # the safety-net timer: once a year


def _probe_kind() -> types.ModuleType:
    def advance(record: Record, ctx: Context) -> Record:
        now = ctx.clock.now()
        if record.state == "a":
            return record.moved("b", at=now, next_at=now + WAIT_S)
        return record.moved("done", at=now)

    module = types.ModuleType("probe_kind_for_delayed_nudge")
    module.ACTIVE_STATES = ("a", "b")  # type: ignore[attr-defined]
    module.advance = advance  # type: ignore[attr-defined]
    return module


@pytest.fixture
def ledger(storage_connection_string: str, names: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[InMemoryLedger, str]]:
    queue = names.queue("nudge")
    module = _probe_kind()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(entrypoints, "record_kinds", lambda: {"probe": module})
    store = InMemoryLedger()
    settings = SimpleNamespace(storage_connection_string=storage_connection_string, nudge_queue=queue,
                               storage_queue_uri="", storage_client_id="", azure_client_id="",
                               managed_identity_available=False)
    clock = SystemClock()
    ctx = Context(settings=settings, clock=clock, ledger=store, access=None, events=None,  # type: ignore[arg-type]
                  telemetry=None, instance="host-nudge",  # type: ignore[arg-type]
                  nudge=QueueNudger.from_settings(settings, clock=clock))  # type: ignore[arg-type]
    monkeypatch.setattr(wiring, "_context", ctx)  # the process-wide Context the app's functions use
    yield store, queue


def _times(record: Record) -> dict[str, float]:
    return {str(h["state"]): float(h["at"]) for h in record.history}


def test_a_record_due_in_n_seconds_is_advanced_n_seconds_later_with_the_timer_a_year_away(
        storage_connection_string: str, ledger: tuple[InMemoryLedger, str]) -> None:
    store, queue = ledger
    store.create(Record(kind="probe", id="r1", state="a", created_at=time.time(), next_at=time.time()))
    host = Host("function_app", {"AzureWebJobsStorage": storage_connection_string, "NUDGE_QUEUE": queue,
                                 "RECONCILE_SCHEDULE": NEVER}, app_dir=NUDGE_APP, host_json=NUDGE_APP / "host.json")
    host.start()
    try:
        wiring.get_context().nudge.nudge_at(time.time(), hint="probe:r1")  # type: ignore[union-attr]  # the first wake-up
        poll(lambda: (found := store.get("probe", "r1")) is not None and found.state == "done", timeout=WAIT_S + 15,
             interval=0.2)
        record = store.get("probe", "r1")
        stats = host.stats()["functions"]
    finally:
        host.stop(timeout=10)
    assert record is not None and record.state == "done", f"not advanced after its wait: {record}"
    times = _times(record)
    late = times["done"] - times["b"] - WAIT_S
    assert 0.0 <= late <= POLL_S + 2.5, f"woken {late:.1f}s after it was due"
    assert stats["reconcile_timer"]["invocations"] == 0
    assert stats["reconcile_nudge"]["invocations"] == 2  # the first wake-up and the delayed one, nothing else
