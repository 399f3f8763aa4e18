"""One in-memory fake per port that has no cheaper stand-in, outside the product.

``ledger.InMemoryLedger`` (LedgerPort), ``events.RecordingEvents`` (EventsPort) and ``nudge.RecordingNudger``
(NudgePort). The unit tests use them, and so does the soak (``soak.inprocess``), a test harness run from the
repository root (``python -m soak``), where ``tests`` is importable as a namespace package. Nothing under
``shared/`` or ``functions/`` may import them.
"""
