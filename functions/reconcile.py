"""The reconciler: advances every durable record one short, idempotent step.

Runs when a nudge message arrives -- at once (a request accepted, a remediation admitted) or delayed
until a waiting record is due (shared.kernel.nudge) -- and on a slow safety-net timer for a lost nudge.
A nudge the sweep asked for runs a sweep instead (shared.remediation.due_sweep).
"""

import azure.functions as func

from shared import entrypoints

bp = func.Blueprint()


@bp.function_name("reconcile_timer")
@bp.timer_trigger(arg_name="timer", schedule="%RECONCILE_SCHEDULE%", run_on_startup=False, use_monitor=True)
def reconcile_timer(timer: func.TimerRequest) -> None:
    entrypoints.run_reconcile(reason="timer")


@bp.function_name("reconcile_nudge")
@bp.queue_trigger(arg_name="msg", queue_name="%NUDGE_QUEUE%", connection="AzureWebJobsStorage")
def reconcile_nudge(msg: func.QueueMessage) -> None:
    entrypoints.run_nudge(msg.get_body().decode("utf-8", "replace"))
