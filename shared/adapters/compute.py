"""Microsoft.Compute: restart or reimage one VMSS VM of a node pool (the ComputePort).

The repair ladder's first two rungs act on the node's VM in the cluster's node resource group,
found from the machine's ``resourceId`` (or the node's ``providerID``). Same client conventions as
:mod:`shared.adapters.aks` (:mod:`shared.adapters.arm`): ARM_ENDPOINT and ARM_AUDIENCE from the settings, SDK
retries off, errors mapped at the edge, and ``begin_*`` return as soon as ARM accepted the operation. Two answers
get their own error types (shared.kernel.errors), decided by ARM's error code: a denied action (403, e.g. node
resource group lockdown) is :class:`VmActionDenied`, an action the VM cannot take now (409 ``OperationNotAllowed``, e.g. a
deallocated spot VM) is :class:`VmActionImpossible`. The ladder escalates a denied action to the AKS
API; an impossible one only when the node shows its VM cannot act (shut down, or not registered),
otherwise it waits as for a busy VM (shared/remediation/vm_actions.py ``_issue``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from shared.adapters.arm import arm_client_options, arm_error_code_and_message, call_arm, map_arm_error
from shared.adapters.permissions import requires_arm
from shared.kernel import retry
from shared.kernel.errors import Invalid, VmActionDenied, VmActionImpossible
from shared.kernel.ports import AvailabilityView

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

    from shared.kernel.clock import Clock
    from shared.settings import Settings

T = TypeVar("T")

_VMSS_VM_ID = re.compile(
    r"^(?:azure://)?/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)"
    r"/providers/microsoft\.compute/virtualmachinescalesets/(?P<vmss>[^/]+)/virtualmachines/(?P<instance>[^/]+)/?$",
    re.IGNORECASE,
)

# A VMSS VM or a standalone VM (node auto-provisioning): what Resource Health is asked about.
_ANY_VM_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"(?:virtualmachinescalesets/[^/]+/virtualmachines/[^/]+|virtualmachines/[^/]+)/?$",
    re.IGNORECASE,
)
RESOURCE_HEALTH_API_VERSION = "2025-05-01"
"""Microsoft.ResourceHealth's stable api-version (azure-rest-api-specs .../ResourceHealth/examples/2025-05-01)."""


# 403 codes meaning "this identity may not act on this VM": missing RBAC (AuthorizationFailed), a deny
# assignment such as AKS node resource group lockdown (DenyAssignmentAuthorizationFailed: the body
# names the deny assignment; seen e.g. in Azure/migAz#266), or an Azure Policy deny
# (RequestDisallowedByPolicy). https://learn.microsoft.com/azure/aks/node-resource-group-lockdown
DENIED_CODES = frozenset({"AuthorizationFailed", "DenyAssignmentAuthorizationFailed", "RequestDisallowedByPolicy",
                          "LinkedAuthorizationFailed"})
# 409 codes meaning "this VM cannot take this action in its current state", e.g. restart of a
# deallocated (evicted spot) VM: Compute answers 409 OperationNotAllowed.
IMPOSSIBLE_CODES = frozenset({"OperationNotAllowed"})


def _call_compute(fn: Callable[[], T], *, what: str) -> T:
    """Like :func:`shared.adapters.arm.call_arm`, but a denied (403) or impossible (409) VM action becomes its own
    error type, decided by ARM's error code (never by message text), so the ladder can escalate."""
    from azure.core.exceptions import HttpResponseError

    try:
        return fn()
    except Exception as error:
        status = getattr(error, "status_code", None) if isinstance(error, HttpResponseError) else None
        if status is not None:
            code, message = arm_error_code_and_message(error)
            label = f"{what}: {status} {code or ''} {message}".replace("  ", " ")
            if status == 403 or code in DENIED_CODES:
                raise VmActionDenied(label, code=code) from error
            if status == 409 and code in IMPOSSIBLE_CODES:
                raise VmActionImpossible(message or label, code=code) from error
        mapped = map_arm_error(error, what=what)
        if mapped is None or mapped is error:
            raise
        raise mapped from error


def parse_vmss_vm_id(resource_id: str) -> tuple[str, str, str, str]:
    """``(subscription, resource group, scale set, instance id)`` of a VMSS VM id or Azure providerID."""
    match = _VMSS_VM_ID.match(resource_id.strip())
    if not match:
        raise Invalid(f"not a VMSS VM resource id: {resource_id!r}", code="InvalidResourceId")
    return match["sub"], match["rg"], match["vmss"], match["instance"]


class ComputeClient:
    """ComputePort over azure-mgmt-compute's ``virtual_machine_scale_set_vms``."""

    def __init__(self, credential: TokenCredential, settings: Settings, *, clock: Clock | None = None,
                 retry_attempts: int = 4, retry_max_delay: float = 30.0) -> None:
        self._credential = credential
        self._settings = settings
        self._clock = clock
        self._attempts = retry_attempts
        self._max_delay = retry_max_delay
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _client(self, subscription: str) -> Any:
        with self._lock:
            client = self._clients.get(subscription.lower())
            if client is None:
                from azure.mgmt.compute import ComputeManagementClient

                client = ComputeManagementClient(self._credential, subscription, **arm_client_options(self._settings))
                self._clients[subscription.lower()] = client
            return client

    def _run(self, fn: Callable[[], T], *, what: str) -> T:
        from shared.kernel import clock as clocks

        return retry.call(_call_compute, fn, what=what, clock=self._clock or clocks.current(),
                          attempts=self._attempts, max_delay=self._max_delay)

    @requires_arm("Microsoft.Compute/virtualMachineScaleSets/virtualMachines/restart/action")
    def begin_restart(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        """``cluster_id`` is the gate's (shared.fleet.gate.GatedCompute checks the VM belongs to it)."""
        sub, rg, vmss, instance = parse_vmss_vm_id(vm_resource_id)
        client = self._client(sub)
        self._run(lambda: client.virtual_machine_scale_set_vms.begin_restart(rg, vmss, instance, polling=False),
                  what=f"restart {vm_resource_id}")

    @requires_arm("Microsoft.ResourceHealth/availabilityStatuses/read")
    def get_availability(self, vm_resource_id: str) -> AvailabilityView:
        """``GET {vm}/providers/Microsoft.ResourceHealth/availabilityStatuses/current`` (AvailabilityStatuses_GetByResource:
        Azure/azure-rest-api-specs specification/resourcehealth/resource-manager/Microsoft.ResourceHealth/ResourceHealth/
        AvailabilityStatus.tsp; https://learn.microsoft.com/rest/api/resourcehealth/availability-statuses/get-by-resource).

        No SDK of ours covers Microsoft.ResourceHealth, so the request goes through the Compute client's
        pipeline (same endpoint, credential, CA bundle and no retries of its own); a read, so a 403 is
        Forbidden (shared.adapters.arm), not a VmActionDenied.
        """
        from azure.core.rest import HttpRequest

        match = _ANY_VM_ID.match(vm_resource_id.strip())
        if not match:
            raise Invalid(f"not a VM resource id: {vm_resource_id!r}", code="InvalidResourceId")
        client = self._client(match["sub"])
        url = f"{vm_resource_id.strip().rstrip('/')}/providers/Microsoft.ResourceHealth/availabilityStatuses/current"

        def read() -> Any:
            response = client.send_request(HttpRequest("GET", url, params={"api-version": RESOURCE_HEALTH_API_VERSION}))
            response.raise_for_status()
            return response.json()

        from shared.kernel import clock as clocks

        body = retry.call(call_arm, read, what=f"availability of {vm_resource_id}", clock=self._clock or clocks.current(),
                          attempts=self._attempts, max_delay=self._max_delay)
        props = (body or {}).get("properties") or {}

        def text(name: str) -> str:
            value = props.get(name)
            return value.strip() if isinstance(value, str) else ""

        # AvailabilityStatusProperties (models.tsp): the class of the current state is ``context`` / ``category``
        # (and ``healthEventCause`` / ``healthEventCategory`` for an availability impacting event).
        return AvailabilityView(state=text("availabilityState") or "Unknown", summary=text("summary"),
                                reason_type=text("reasonType"), occurred=text("occuredTime") or text("occurredTime"),
                                context=text("context"), category=text("category"),
                                health_event_cause=text("healthEventCause"),
                                health_event_category=text("healthEventCategory"), title=text("title"))

    @requires_arm("Microsoft.Compute/virtualMachineScaleSets/virtualMachines/reimage/action")
    def begin_reimage(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        sub, rg, vmss, instance = parse_vmss_vm_id(vm_resource_id)
        client = self._client(sub)
        self._run(lambda: client.virtual_machine_scale_set_vms.begin_reimage(rg, vmss, instance, polling=False),
                  what=f"reimage {vm_resource_id}")
