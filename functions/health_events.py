"""Event Grid trigger (CloudEvents 1.0): Azure Resource Health says something about a fleet VM.

Delivered by the subscription on each fleet subscription's HealthResources system topic
(infra/app/health-events-subscription.bicep). Nothing in the event is trusted: the entry point maps
the VM to its node through ARM and re-reads its availability before anything is admitted. An
admission nudges the reconciler, as for the steward's own Unhealthy events.
"""

import azure.functions as func

from functions import cloudevents
from shared import entrypoints

bp = func.Blueprint()


@bp.function_name("health_events")
@bp.event_grid_trigger(arg_name="event")
@bp.queue_output(arg_name="nudge", queue_name="%NUDGE_QUEUE%", connection="AzureWebJobsStorage")
def health_events(event: func.CloudEvent, nudge: func.Out[str]) -> None:
    result = entrypoints.handle_health_event(cloudevents.as_dict(event))
    if result.nudge:
        nudge.set(result.nudge)
