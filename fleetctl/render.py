"""Plain-text tables and times for the terminal (no colours, fixed width, pipes cleanly)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def when(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def short(text: Any, limit: int = 60) -> str:
    value = "" if text is None else str(text).replace("\n", " ")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header], *[[("-" if c in (None, "") else str(c)) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)
