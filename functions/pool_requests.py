"""Queue triggers: a team's GPU pool request arrives, one function per team (POOL_REQUEST_TEAMS).

A queue trigger names one fixed queue, so each team in the setting gets its own function
(``pool_requests_<team>``), registered here at import time, listening on that team's queue in the
team-facing storage account (connection ``TeamRequestsStorage``). The team of the queue is passed
to the entry point: it is who asked, whatever the message says. No team, no function.

Validation, the ledger and the Azure calls are in ``shared``; an invalid request is answered once
and never retried, a transient failure raises so that the queue redelivers (and, after
maxDequeueCount, moves the message to the poison queue with its last error).
"""

from collections.abc import Callable, Iterable

import azure.functions as func

from shared import entrypoints

bp = func.Blueprint()


def _handler(team: str) -> Callable[[func.QueueMessage, func.Out[str]], None]:
    def pool_requests(msg: func.QueueMessage, nudge: func.Out[str]) -> None:
        outcome = entrypoints.handle_pool_request(
            msg.get_body(), team=team, message_id=msg.id or "",
            dequeue_count=getattr(msg, "dequeue_count", None) or 1)
        if outcome.nudge:
            nudge.set(outcome.nudge)

    return pool_requests


def register(blueprint: func.Blueprint, queues: Iterable[entrypoints.TeamQueue]) -> None:
    """One queue-trigger function per team on ``blueprint``."""
    for queue in queues:
        handler = _handler(queue.team)
        handler = blueprint.queue_output(arg_name="nudge", queue_name="%NUDGE_QUEUE%",
                                         connection="AzureWebJobsStorage")(handler)
        handler = blueprint.queue_trigger(arg_name="msg", queue_name=queue.queue, connection=queue.connection)(handler)
        blueprint.function_name(queue.function_name)(handler)


register(bp, entrypoints.pool_request_queues())
