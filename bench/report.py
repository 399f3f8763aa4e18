"""The table on the terminal and ``bench-results.json``: the same figures, two renderings."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.figures import Figure


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2e}"


def _ratio(figure: Figure) -> str:
    ratio = figure.ratio
    if ratio is None:
        return "-"
    text = f"{ratio:.3f}"
    if 0 < ratio < 1:
        text += f" ({1 / ratio:.1f}x less)"
    return text


def table(figures: Sequence[Figure]) -> str:
    """A plain-text table: name, value, unit, baseline, ratio, target (met?)."""
    rows = [("figure", "value", "unit", "baseline", "ratio", "target")]
    notes: list[str] = []
    for f in figures:
        if f.not_measured:
            rows.append((f.name, "not measured", f.unit, f.baseline_name or "-", "-", f.target or "-"))
            notes.append(f"  {f.name}: not measured: {f.not_measured}")
            continue
        baseline = "-" if f.baseline is None else f"{_num(f.baseline)} ({f.baseline_name})" if f.baseline_name else _num(
            f.baseline)
        target = f.target or "-"
        if f.met is not None:
            target += " [met]" if f.met else " [NOT met]"
        rows.append((f.name, _num(f.value), f.unit, baseline, _ratio(f), target))
        if f.note:
            notes.append(f"  {f.name}: {f.note}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def document(figures: Sequence[Figure], *, scale: str, elapsed_s: float) -> dict[str, Any]:
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scale": scale,
        "elapsed_s": round(elapsed_s, 1),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": _cpus(), "load_average_at_end": _load()},
        "figures": [f.as_json() for f in figures],
    }


def _load() -> list[float] | None:
    """1, 5 and 15 minute load averages: wall-clock and simulated-second figures depend on them."""
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def write(path: Path, figures: Sequence[Figure], *, scale: str, elapsed_s: float) -> None:
    path.write_text(json.dumps(document(figures, scale=scale, elapsed_s=elapsed_s), indent=2) + "\n", encoding="utf-8")
