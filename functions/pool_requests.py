"""Queue trigger: a team's GPU pool request arrives.

Validation, the ledger and the Azure calls are in ``shared``; an invalid request is answered once
and never retried, a transient failure raises so that the queue redelivers (and, after
maxDequeueCount, moves the message to the poison queue with its last error).
"""

import azure.functions as func

from shared import entrypoints

bp = func.Blueprint()


@bp.function_name("pool_requests")
@bp.queue_trigger(arg_name="msg", queue_name="%POOL_REQUEST_QUEUE%", connection="AzureWebJobsStorage")
@bp.queue_output(arg_name="nudge", queue_name="%NUDGE_QUEUE%", connection="AzureWebJobsStorage")
def pool_requests(msg: func.QueueMessage, nudge: func.Out[str]) -> None:
    outcome = entrypoints.handle_pool_request(
        msg.get_body(), message_id=msg.id or "", dequeue_count=getattr(msg, "dequeue_count", None) or 1
    )
    if outcome.nudge:
        nudge.set(outcome.nudge)
