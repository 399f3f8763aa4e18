"""The local Functions host: index the app, then run its triggers until stopped.

One :class:`Host` is one Functions host instance: it puts the settings into the environment,
imports the app, reads its bindings (:mod:`devhost.indexing`), and runs queue listeners, the timer
scheduler and Event Grid listeners that hand invocations to a small thread pool (the Python
worker's thread pool). Several hosts may run at once against the same Azurite and simulator, in
one process or several, exactly like scaled-out instances: they compete for queue messages and
deliveries, and any exactly-once behaviour is the app's (its ledger), never the host's.

``functionTimeout`` is enforced as a logged warning and a counter: Python cannot kill a thread,
and in Azure the host would restart the worker, which the local host does not do.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from devhost import hostjson, indexing, invoke
from devhost import settings as host_settings
from devhost.endpoints import endpoint_settings, read_endpoints
from devhost.eventgrid import DeliveriesFeed, EventGridListener, load_subscriptions
from devhost.indexing import EVENT_GRID_TRIGGER, QUEUE_TRIGGER, TIMER_TRIGGER, FunctionSpec
from devhost.queues import LEASE_S, InFlight, QueueListener, encode_body
from devhost.storage import QueueClients
from devhost.timers import TimerScheduler

log = logging.getLogger("devhost")

WATCHDOG_INTERVAL_S = 0.25


class HostError(RuntimeError):
    """The host cannot start (bad settings, app, host.json or subscriptions)."""


@dataclass
class FunctionStats:
    invocations: int = 0
    succeeded: int = 0
    failed: int = 0
    timeouts: int = 0
    poisoned: int = 0
    settled: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    last_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"invocations": self.invocations, "succeeded": self.succeeded, "failed": self.failed,
                "timeouts": self.timeouts, "poisoned": self.poisoned, "settled": dict(self.settled),
                "last_error": self.last_error}


@dataclass
class _Running:
    function: str
    invocation_id: str
    started: float
    lease: InFlight | None = None
    listener: QueueListener | None = None
    warned: bool = False


class Host:
    """A local Functions host for one app (see devhost/README.md)."""

    def __init__(self, app_module: str = "function_app", settings: Mapping[str, str] | None = None,
                 endpoints: Mapping[str, Any] | str | Path | None = None, host_json: str | Path | None = None, *,
                 app_dir: str | Path | None = None, eventgrid_subscriptions: str | Path | None = None,
                 max_workers: int | None = None, clock: Any = None, queue_lease_s: float = LEASE_S,
                 name: str | None = None) -> None:
        self.app_module_name = app_module
        self.app_dir = Path(app_dir) if app_dir else None
        self.endpoints = read_endpoints(endpoints)
        given = dict(settings or {})
        self.settings: dict[str, str] = {}
        if self.endpoints is not None:
            platform, defaults = endpoint_settings(self.endpoints)
            self.settings.update(defaults)
            self.settings.update(given)
            self.settings.update(platform)
        else:
            self.settings.update(given)
        if host_json is None:
            candidate = (self.app_dir or Path.cwd()) / "host.json"
            host_json = candidate if candidate.exists() else None
        self.config = hostjson.load(host_json)
        self.eventgrid_subscriptions_path = eventgrid_subscriptions
        self.max_workers = max_workers
        self.queue_lease_s = queue_lease_s
        self.name = name or f"devhost-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._given_clock = clock
        self._previous_clock: Any = None
        self.clock: Any = None
        self.module: ModuleType | None = None
        self.functions: dict[str, FunctionSpec] = {}
        self.queues = QueueClients(self.settings)
        self._queue_listeners: list[QueueListener] = []
        self._eventgrid_listeners: list[EventGridListener] = []
        self._timers: TimerScheduler | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stats: dict[str, FunctionStats] = defaultdict(FunctionStats)
        self._stats_lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._pending = 0
        self._idle = threading.Condition()
        self._last_activity = time.monotonic()
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._started = False
        self._stopped = False
        self._watchdog: threading.Thread | None = None

    # ------------------------------------------------------------------ indexing

    def load(self) -> list[FunctionSpec]:
        """Apply the settings, import the app and index its functions (done by :meth:`start`)."""
        if self.module is not None:
            return list(self.functions.values())
        host_settings.apply(self.settings)
        try:
            self.module = indexing.import_app_module(self.app_module_name, app_dir=self.app_dir)
            app = indexing.find_app(self.module)
            specs = indexing.index(app, {**os.environ, **self.settings})
        except (indexing.IndexingError, host_settings.SettingsError) as error:
            raise HostError(str(error)) from error
        except ValueError as error:  # shared.kernel.env.SettingError: a setting the app reads at import is malformed
            if type(error).__name__ != "SettingError":
                raise
            raise HostError(f"the app could not be indexed: {error}") from error
        self.functions = {spec.name: spec for spec in specs}
        return specs

    # ------------------------------------------------------------------ lifecycle

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _install_clock(self) -> None:
        from shared.kernel import clock as clocks

        chosen = self._given_clock
        if chosen is None and self.endpoints is not None and self.endpoints.get("clock"):
            c = self.endpoints["clock"]
            if c.get("manual"):
                # The simulator's clock moves only on /_sim/advance: whoever advances it advances this too.
                log.warning("the simulator's clock is manual; the host runs on a ManualClock at its epoch "
                            "(advance host.clock together with the simulator)")
                chosen = clocks.ManualClock(float(c["epoch_sim"]))
            else:
                chosen = clocks.ScaledClock(epoch_real=float(c["epoch_real"]), epoch_sim=float(c["epoch_sim"]),
                                            speed=float(c.get("speed", 1.0)))
        if chosen is not None:
            self._previous_clock = clocks.use(chosen)
        self.clock = clocks.current()

    def start(self) -> Host:
        if self._started:
            return self
        self._install_clock()
        try:
            return self._start()
        except BaseException:
            self._restore_clock()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            raise

    def _restore_clock(self) -> None:
        if self._previous_clock is not None:
            from shared.kernel import clock as clocks

            clocks.use(self._previous_clock)
            self._previous_clock = None

    def _start(self) -> Host:
        specs = self.load()
        workers = self.max_workers or int(self.settings.get("PYTHON_THREADPOOL_THREAD_COUNT") or 0) \
            or min(32, (os.cpu_count() or 1) + 4)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{self.name}-worker")
        subscriptions = None
        for spec in specs:
            if spec.kind == QUEUE_TRIGGER:
                self._queue_listeners.append(QueueListener(self, spec, self.config.queues, lease_s=self.queue_lease_s))
            elif spec.kind == EVENT_GRID_TRIGGER:
                subscriptions = subscriptions or load_subscriptions(self.eventgrid_subscriptions_path)
                subscription = subscriptions.get(spec.name)
                if subscription is None:
                    raise HostError(f"function {spec.name} has an Event Grid trigger but no subscription in "
                                    f"{self.eventgrid_subscriptions_path or 'devhost/eventgrid_subscriptions.json'}")
                url = (self.endpoints or {}).get("eventgrid_deliveries")
                if url:
                    feed = DeliveriesFeed(str(url), ca_bundle=(self.endpoints or {}).get("ca_bundle"))
                    self._eventgrid_listeners.append(EventGridListener(self, spec, subscription, feed))
                else:
                    log.warning("%s: no eventgrid_deliveries endpoint; it runs only on demand", spec.name)
            elif spec.kind != TIMER_TRIGGER:
                log.warning("%s: trigger %s is not served by the local host; it runs only on demand",
                            spec.name, spec.kind)
        timer_specs = [s for s in specs if s.kind == TIMER_TRIGGER]
        try:
            self._timers = TimerScheduler(self, timer_specs) if timer_specs else None
        except ValueError as error:
            raise HostError(str(error)) from error
        self._started = True
        self._watchdog = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
        self._watchdog.start()
        for listener in self._queue_listeners:
            listener.start()
        for eg in self._eventgrid_listeners:
            eg.start()
        if self._timers is not None:
            self._timers.start()
        log.info("host %s started: %s", self.name, ", ".join(f"{s.name} ({s.kind})" for s in specs))
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop polling, let running invocations finish (up to ``timeout``), hand back the rest."""
        if not self._started or self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        for listener in self._queue_listeners:
            listener.stop_polling()
        for eg in self._eventgrid_listeners:
            eg.stop_polling()
        if self._timers is not None:
            self._timers.stop()
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending and time.monotonic() < deadline:
                self._idle.wait(0.1)
        if self._pending:
            log.warning("host %s: %d invocation(s) still running after %.0f s; leaving them", self.name,
                        self._pending, timeout)
        assert self._pool is not None
        self._pool.shutdown(wait=False, cancel_futures=True)
        for thread_owner in [*self._queue_listeners, *self._eventgrid_listeners]:
            thread_owner.join(max(0.1, deadline - time.monotonic()))
        if self._timers is not None:
            self._timers.join(1.0)
        self._restore_clock()
        log.info("host %s stopped: %s", self.name, json.dumps(self.stats()["functions"]))

    def request_stop(self) -> None:
        """Ask :meth:`run_forever` / :meth:`run_for` to stop (safe from a signal handler)."""
        self._stop_requested.set()

    def __enter__(self) -> Host:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_for(self, seconds: float) -> dict[str, Any]:
        """Start (if needed), run for ``seconds`` of wall time, stop; returns the stats."""
        self.start()
        try:
            self._stop_requested.wait(seconds)
        finally:
            self.stop()
        return self.stats()

    def run_forever(self) -> None:
        self.start()
        try:
            while not self._stop_requested.is_set():
                self._stop_requested.wait(1.0)
        finally:
            self.stop()

    # ------------------------------------------------------------------ invocations

    def activity(self) -> None:
        with self._idle:
            self._last_activity = time.monotonic()
            self._idle.notify_all()

    def submit(self, function: str, work: Callable[[], Any], *, on_done: Callable[[], None] | None = None,
               swallow: bool = False) -> Future[Any]:
        """Queue ``work`` on the worker pool; RuntimeError when the host is stopping."""
        if self._pool is None:
            raise RuntimeError("host is not started")
        with self._idle:
            self._pending += 1

        def run() -> Any:
            try:
                return work()
            except Exception:
                if swallow:
                    return None
                raise
            finally:
                if on_done is not None:
                    on_done()
                with self._idle:
                    self._pending -= 1
                    self._last_activity = time.monotonic()
                    self._idle.notify_all()

        try:
            return self._pool.submit(run)
        except RuntimeError:
            with self._idle:
                self._pending -= 1
            raise

    def run_invocation(self, spec: FunctionSpec, trigger_value: Any, *, lease: InFlight | None = None,
                       listener: QueueListener | None = None) -> dict[str, Any]:
        """Invoke the function now, on this thread; send its outputs; raise what it raised."""
        invocation_id = str(uuid.uuid4())
        running = _Running(function=spec.name, invocation_id=invocation_id, started=time.monotonic(),
                           lease=lease, listener=listener)
        with self._stats_lock:
            self._running[invocation_id] = running
            self._stats[spec.name].invocations += 1
        log.info("Executing 'Functions.%s' (Id=%s)", spec.name, invocation_id)
        try:
            values = invoke.call(spec, trigger_value)
            self._send_outputs(spec, values)
        except Exception as error:
            elapsed = time.monotonic() - running.started
            with self._stats_lock:
                self._stats[spec.name].failed += 1
                self._stats[spec.name].last_error = f"{type(error).__name__}: {error}"
            log.error("Executed 'Functions.%s' (Failed, Id=%s, Duration=%dms): %s: %s", spec.name, invocation_id,
                      elapsed * 1000, type(error).__name__, error, exc_info=log.isEnabledFor(logging.DEBUG))
            raise
        finally:
            with self._stats_lock:
                self._running.pop(invocation_id, None)
        with self._stats_lock:
            self._stats[spec.name].succeeded += 1
        log.info("Executed 'Functions.%s' (Succeeded, Id=%s, Duration=%dms)", spec.name, invocation_id,
                 (time.monotonic() - running.started) * 1000)
        return values

    def _send_outputs(self, spec: FunctionSpec, values: Mapping[str, Any]) -> None:
        encoding = self.config.queues.message_encoding
        for queue_name, connection, text in invoke.output_queue_messages(spec, values):
            self.queues.ensure(connection, queue_name).send_message(encode_body(text, encoding))
            for listener in self._queue_listeners:
                if listener.queue_name == queue_name and listener.connection == connection:
                    listener.wake()

    def trigger(self, name: str, payload: Any = None) -> Future[dict[str, Any]]:
        """Run a function now, as the admin API does (``POST /admin/functions/<name>``).

        Timer: a TimerRequest (not past due). Queue: ``payload`` (str, bytes or JSON-able) as the
        message body, dequeue count 1, not taken from the queue. Event Grid: ``payload`` is the
        CloudEvent as a dict. The Future holds the outputs set, or the function's exception.
        """
        spec = self.functions.get(name)
        if spec is None:
            raise KeyError(f"no function named {name!r}; the app has {sorted(self.functions)}")
        if spec.kind == TIMER_TRIGGER:
            now = self.clock.now() if self.clock else time.time()
            value = invoke.timer_request(past_due=False, last=None, next_=None,
                                         last_updated=datetime.fromtimestamp(now, tz=UTC),
                                         use_monitor=spec.trigger.properties.get("useMonitor") is not False)
        elif spec.kind == QUEUE_TRIGGER:
            body = payload if isinstance(payload, bytes) else (
                payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
            value = invoke.queue_message(id_=str(uuid.uuid4()), body=body, dequeue_count=1, insertion_time=None,
                                         expiration_time=None, next_visible_time=None, pop_receipt="")
        elif spec.kind == EVENT_GRID_TRIGGER:
            if not isinstance(payload, Mapping):
                raise TypeError(f"{name} is an Event Grid function: pass the event as a dict")
            value = invoke.event_grid_event(payload)
        else:
            raise HostError(f"{name}: trigger {spec.kind} cannot be run by the local host")
        return self.submit(name, lambda: self.run_invocation(spec, value))

    # ------------------------------------------------------------------ bookkeeping

    def record_poison(self, function: str, *, message_id: str, reason: str) -> None:
        with self._stats_lock:
            self._stats[function].poisoned += 1
            self._stats[function].last_error = reason

    def record_settlement(self, function: str, outcome: str) -> None:
        with self._stats_lock:
            self._stats[function].settled[outcome] += 1

    def stats(self) -> dict[str, Any]:
        """Per function: invocations, succeeded, failed, timeouts, poisoned, Event Grid settlements."""
        with self._stats_lock:
            functions = {name: self._stats[name].as_dict() for name in self.functions}
        return {"host": self.name, "functions": functions,
                "invocations": sum(f["invocations"] for f in functions.values()),
                "failures": sum(f["failed"] for f in functions.values()),
                "poisoned": sum(f["poisoned"] for f in functions.values()),
                "running": self._pending}

    def wait_idle(self, timeout: float = 30.0, *, quiet_s: float = 0.3) -> bool:
        """True once nothing runs or waits, and every listener has polled empty since this call and since the
        last invocation ended, with ``quiet_s`` of quiet; False after ``timeout``."""
        called = time.monotonic()
        deadline = called + timeout
        while time.monotonic() < deadline:
            with self._idle:
                pending, last = self._pending, self._last_activity
            since = max(last, called)
            listeners = [*self._queue_listeners, *self._eventgrid_listeners]
            polled_empty = all(listener.last_empty_poll > since for listener in listeners)
            if pending == 0 and polled_empty and time.monotonic() - last >= quiet_s:
                return True
            for listener in self._queue_listeners:
                listener.wake()
            time.sleep(0.05)
        return False

    def _watch(self) -> None:
        limit = self.config.function_timeout_s
        while not self._stopping.wait(WATCHDOG_INTERVAL_S):
            now = time.monotonic()
            with self._stats_lock:
                running = list(self._running.values())
            for item in running:
                if limit is not None and not item.warned and now - item.started > limit:
                    item.warned = True
                    with self._stats_lock:
                        self._stats[item.function].timeouts += 1
                    log.warning("Timeout value of %ss exceeded by function 'Functions.%s' (Id: '%s'). The local host "
                                "cannot stop a Python thread; the invocation keeps running (Azure would recycle "
                                "the worker).", limit, item.function, item.invocation_id)
                if item.lease is not None and item.listener is not None \
                        and now - item.lease.renewed_at > item.listener.lease_s / 2:
                    item.listener.renew(item.lease)
