"""Event Grid trigger (CloudEvents 1.0): an unhealthy GPU node was reported; admit or refuse it.

An admission nudges the reconciler through the nudge queue, so the cordon follows at once.
"""

import azure.functions as func

from functions import cloudevents
from shared import entrypoints

bp = func.Blueprint()


@bp.function_name("remediation_events")
@bp.event_grid_trigger(arg_name="event")
@bp.queue_output(arg_name="nudge", queue_name="%NUDGE_QUEUE%", connection="AzureWebJobsStorage")
def remediation_events(event: func.CloudEvent, nudge: func.Out[str]) -> None:
    result = entrypoints.handle_gpu_event(cloudevents.as_dict(event))
    if result.nudge:
        nudge.set(result.nudge)
