"""Long-running operations the way ARM runs them, so the SDKs' pollers work unchanged.

An ARM write that takes time answers at once (201 for a create, 200 for an update, 202 for a
delete or an action) with an ``Azure-AsyncOperation`` header (the operation status resource) and,
for 202, a ``Location`` header (the operation result). The poller reads the status resource
(``{"status": "InProgress|Succeeded|Failed|Canceled", ...}``) after each ``Retry-After`` until it is
terminal, then does its final GET (the resource for PUT, the ``Location`` for POST). This module
keeps those operations, schedules their completion on the fleet's sim clock and answers the
status/result URLs. What an operation *does* is a callback supplied by :mod:`sim.arm.api`.

What the AKS provider's operations look like is recorded (tests/replay/recordings/README.md, findings 2, 4 and
7): the ``Azure-AsyncOperation``/``Location`` URLs carry ``api-version=2016-03-30`` whatever the request's
api-version; a PUT's 201 carries only ``Azure-AsyncOperation``, a DELETE's or an action's 202 both; the status
body is exactly ``{"name", "status", "startTime"}`` plus ``endTime`` when done (no ``id``); ``operationresults``
answers 204 with a fresh ``Location`` when done; **no response carries ``Retry-After``**. The simulator sends
``Retry-After`` on AKS operations only when the scenario sets ``timings.lro_retry_after_s``: a harness
convenience (SDK pollers without it sleep their default 30 s of wall-clock time), not AKS behaviour. Compute's
operations (VMSS VM restart/reimage) are not covered by those recordings and keep their previous shape.

``Retry-After`` is in wall-clock seconds (the client sleeps in real time): see
:meth:`Operations.retry_after`.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.core.http import Response

AKS_PROVIDER = "Microsoft.ContainerService"
COMPUTE_PROVIDER = "Microsoft.Compute"
TERMINAL = ("Succeeded", "Failed", "Canceled")
# The api-version of every recorded AKS operation URL (tests/replay/recordings/*.json: the azure-asyncoperation
# and location headers of put_cluster_create, delete_agentpool, abort_cluster, delete_machines), whatever the
# api-version of the request that started the operation.
AKS_OPERATION_API_VERSION = "2016-03-30"


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat().replace("+00:00", "Z")


class OperationFailure(Exception):
    """Raised by an operation's work callback: the operation ends Failed with this ARM error
    (an ErrorDetail: ``code``, ``message`` and, for a wrapped error, ``details``)."""

    def __init__(self, code: str, message: str, *, http_status: int = 400,
                 details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.http_status = http_status
        self.details = details or []

    def error(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            err["details"] = [dict(d) for d in self.details]
        return err


def deployment_failure(resource: str, code: str, message: str, *, deployment: str) -> OperationFailure:
    """Compute's refusal as AKS reports it at the end of a pool operation: inside a template deployment
    error whose ``details[]`` carry Compute's own code.

    The shape AKS users see for a quota refused while the VM scale set is deployed (MicrosoftDocs/
    azure-docs#62378: "Provisioning of resource(s) for Agent Pool npwin failed. Error: {"code":
    "InvalidTemplateDeployment", ..., "details": [{"code": "QuotaExceeded", "message": "Operation could not
    be completed as it results in exceeding approved Total Regional Cores quota..."}]}"; mspnp/aks-baseline#377).
    """
    return OperationFailure(
        "InvalidTemplateDeployment",
        f"Provisioning of resource(s) for {resource} failed. Error: The template deployment '{deployment}' is not "
        "valid according to the validation procedure. See inner errors for details.",
        http_status=400, details=[{"code": code, "message": message}])


@dataclass
class Operation:
    id: str
    subscription: str
    location: str
    provider: str
    api_version: str
    started: float
    due: float
    resource_id: str = ""
    kind: str = ""  # create | update | scale | delete | deleteMachines | restart | reimage
    status: str = "InProgress"
    ended: float | None = None
    error: dict[str, Any] | None = None
    error_http_status: int = 400
    on_cancel: Callable[[], None] | None = field(default=None, repr=False)
    # set by an abort (sim.arm.aborts): the operation's work must not happen; the abort ends it Canceled
    aborting: bool = False

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def status_path(self) -> str:
        return f"/subscriptions/{self.subscription}/providers/{self.provider}/locations/{self.location}/operations/{self.id}"

    def result_path(self) -> str:
        if self.provider == COMPUTE_PROVIDER:
            return self.status_path()  # compute's Location is the same URL with monitor=true
        return (f"/subscriptions/{self.subscription}/providers/{self.provider}/locations/{self.location}"
                f"/operationresults/{self.id}")

    @property
    def url_api_version(self) -> str:
        """The api-version in this operation's status/result URLs."""
        return AKS_OPERATION_API_VERSION if self.provider == AKS_PROVIDER else self.api_version

    def status_body(self) -> dict[str, Any]:
        # AKS: exactly name, status, startTime (+ endTime, + error) (recorded: test_aks_abort.json
        # poll_operation_inprogress / poll_operation_succeeded). Compute's keeps the id it had (out of scope).
        body: dict[str, Any] = {} if self.provider == AKS_PROVIDER else {"id": self.status_path()}
        body.update({"name": self.id, "status": self.status, "startTime": iso(self.started)})
        if self.ended is not None:
            body["endTime"] = iso(self.ended)
        if self.error:
            body["error"] = dict(self.error)
        return body


class Operations:
    """The fleet's operations by id (one registry per fleet, shared by every ARM handler)."""

    def __init__(self, fleet: Any) -> None:
        self._fleet = fleet
        self._lock = threading.RLock()
        self._ops: dict[str, Operation] = {}
        # Own stream: drawing from fleet.rng would make the model's random choices depend on when
        # requests arrive.
        self._rng = random.Random(f"lro:{getattr(fleet, 'seed', 0)}")

    @classmethod
    def of(cls, fleet: Any) -> Operations:
        """The registry attached to ``fleet`` (created on first use)."""
        ops = getattr(fleet, "operations", None)
        if not isinstance(ops, Operations):
            ops = cls(fleet)
            fleet.operations = ops
        return ops

    def _now(self) -> float:
        return float(self._fleet.clock.now())

    def _new_id(self) -> str:
        with self._lock:
            return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def start(self, *, subscription: str, location: str, provider: str, api_version: str, duration_s: float,
              work: Callable[[Operation], None], resource_id: str = "", kind: str = "",
              fail: tuple[str, str] | None = None, on_failed: Callable[[Operation], None] | None = None,
              on_cancel: Callable[[], None] | None = None) -> Operation:
        """Start an operation that completes ``duration_s`` sim seconds from now.

        At completion ``work(op)`` runs under the fleet lock; raising :class:`OperationFailure` (or
        any exception) ends the operation Failed, and ``on_failed(op)`` runs. ``fail`` (from a fault
        rule) makes it fail without running ``work``.
        """
        now = self._now()
        op = Operation(id=self._new_id(), subscription=subscription, location=location.replace(" ", "").lower(),
                       provider=provider, api_version=api_version, started=now, due=now + max(0.0, duration_s),
                       resource_id=resource_id, kind=kind, on_cancel=on_cancel)
        with self._lock:
            self._ops[op.id] = op

        def complete() -> None:
            if op.done or op.aborting:  # an aborted operation's work never happens: the abort ends it Canceled
                return
            try:
                if fail is not None and fail[0] == "QuotaExceeded" and provider == AKS_PROVIDER:
                    # A quota refused by Compute while AKS deploys the scale set: wrapped, as AKS reports it.
                    raise deployment_failure(f"Agent Pool {resource_id.rsplit('/', 1)[-1]}", fail[0], fail[1],
                                             deployment=op.id)
                if fail is not None:
                    raise OperationFailure(fail[0], fail[1], http_status=500)
                work(op)
            except OperationFailure as exc:
                op.error = exc.error()
                op.error_http_status = exc.http_status
            except Exception as exc:  # a bug in a callback must fail the operation, not the simulator
                op.error = {"code": "InternalOperationError", "message": f"{type(exc).__name__}: {exc}"}
                op.error_http_status = 500
            op.ended = self._now()
            if op.error:
                op.status = "Failed"
                if on_failed is not None:
                    try:
                        on_failed(op)
                    except Exception as exc:  # keep the fleet running; surface it on the operation
                        op.error["message"] += f" (and cleanup failed: {exc})"
            else:
                op.status = "Succeeded"

        self._fleet.at(op.due, complete)
        return op

    def cancel(self, op: Operation, reason: str) -> None:
        """End ``op`` as Canceled (a delete that preempts a create/update does this)."""
        if op.done:
            return
        op.status = "Canceled"
        op.ended = self._now()
        op.error = {"code": "OperationCanceled", "message": reason}
        if op.on_cancel is not None:
            op.on_cancel()

    def get(self, op_id: str) -> Operation | None:
        with self._lock:
            return self._ops.get(op_id.lower())

    def active_for_prefix(self, prefix: str) -> list[Operation]:
        """Running operations whose resource id starts with ``prefix`` (case-insensitive), oldest first."""
        low = prefix.lower()
        with self._lock:
            return sorted((o for o in self._ops.values() if not o.done and o.resource_id.lower().startswith(low)),
                          key=lambda o: (o.started, o.id))

    def active_for(self, resource_id: str) -> list[Operation]:
        rid = resource_id.lower()
        with self._lock:
            return [o for o in self._ops.values() if not o.done and o.resource_id.lower() == rid]

    # ---- HTTP ----

    def retry_after(self, op: Operation) -> dict[str, str]:
        """When the client should poll again, as headers (wall-clock time); none for an AKS operation unless
        the scenario sets ``timings.lro_retry_after_s``.

        AKS sends no ``Retry-After`` on its operations (recorded: no response in tests/replay/recordings has
        one, README finding 4), so by default neither does the simulator. A harness that polls with SDK pollers
        (which then sleep their default 30 s of wall-clock time) either passes ``polling_interval=`` to the client
        or sets ``timings.lro_retry_after_s`` in its scenario: a harness convenience, not AKS behaviour.
        Compute's operations keep sending it (default 5 sim seconds; not covered by the recordings).

        ARM advertises ``timings["lro_retry_after_s"]`` (sim seconds); the client sleeps in real
        time, so the value is divided by the clock speed and shortened to the time the operation
        still needs. ARM sends whole seconds in ``Retry-After`` (the SDKs parse it as an int); a
        sped-up simulator that wants a poll sooner than a second sends ``retry-after-ms`` instead,
        which azure-core honours too (at least 50 ms: azure-core treats 0 as "no header").
        """
        speed = float(getattr(self._fleet.clock, "speed", 1.0) or 1.0)
        timings = getattr(self._fleet, "timings", {}) or {}
        if op.provider == AKS_PROVIDER and "lro_retry_after_s" not in timings:
            return {}
        advertised = float(timings.get("lro_retry_after_s", 5.0)) / speed
        remaining = max(0.0, op.due - self._now()) / speed
        wait = max(0.05, min(advertised, remaining))
        if wait >= 1:
            return {"Retry-After": str(math.ceil(wait))}
        return {"retry-after-ms": str(math.ceil(wait * 1000))}

    def accepted_headers(self, op: Operation, base_url: str, *, location: bool) -> dict[str, str]:
        """PUT 201/200: ``Azure-AsyncOperation`` only; DELETE and POST actions 202 (``location=True``): both
        (recorded: put_cluster_create, put_agentpool_create*, delete_agentpool, abort_cluster, delete_machines)."""
        query = f"?api-version={op.url_api_version}"
        headers = {"Azure-AsyncOperation": f"{base_url}{op.status_path()}{query}", **self.retry_after(op)}
        if location:
            monitor = "&monitor=true" if op.provider == COMPUTE_PROVIDER else ""
            headers["Location"] = f"{base_url}{op.result_path()}{query}{monitor}"
        return headers

    def status_response(self, op: Operation, base_url: str) -> Response:
        headers = {} if op.done else self.retry_after(op)
        return Response.json(200, op.status_body(), headers)

    def result_response(self, op: Operation, base_url: str) -> Response:
        """The ``Location`` URL: 202 while running, 204/200 when done, the error when it failed.

        AKS's answer when done is 204 with an empty body and a fresh ``Location`` (recorded: test_aks_abort.json
        and test_aks_nodepool_delete_machines.json get_operationresult_204)."""
        location = (f"{base_url}{op.result_path()}?api-version={op.url_api_version}"
                    + ("&monitor=true" if op.provider == COMPUTE_PROVIDER else ""))
        if not op.done:
            return Response(status=202, headers={"Location": location, **self.retry_after(op)})
        if op.status == "Succeeded":
            if op.provider == AKS_PROVIDER:
                return Response(status=204, headers={"Location": location})
            return Response.json(200, op.status_body())
        err = op.error or {"code": "OperationFailed", "message": "The operation failed."}
        if err.get("details"):
            return Response.json(op.error_http_status, {"error": dict(err)})
        return Response.arm_error(op.error_http_status, err["code"], err["message"])
