"""A CloudEvent as the Functions worker hands it over, as the plain mapping the entry points take."""

from typing import Any

import azure.functions as func


def as_dict(event: func.CloudEvent) -> dict[str, Any]:
    """The CloudEvents 1.0 attributes the core reads, and the data as JSON (the core trusts none of it)."""
    return {
        "id": event.id,
        "source": event.source,
        "type": event.type,
        "subject": event.subject,
        "time": event.time.isoformat() if event.time else None,
        "data": event.get_json(),
    }
