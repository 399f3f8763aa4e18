"""The unit of output: one named figure, its baseline and their ratio, or why it was not measured.

Every benchmark returns :class:`Figure` values; the runner prints them as a table and writes them to
``bench-results.json`` unchanged, so the table and the JSON can never disagree. ``ratio`` is always
``value / baseline`` (so "20x less CPU" is a ratio of at most 0.05); the optional ``target`` says
which ratio or value the issues ask for, and ``met`` whether this run reached it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    value: float | None = None
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""
    not_measured: str = ""  # why there is no value; empty when measured

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    def as_json(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "baseline_value": self.baseline,
            "baseline": self.baseline_name or None,
            "ratio": None if ratio is None else round(ratio, 6),
            "target": self.target or None,
            "met": self.met,
            "note": self.note or None,
            "not_measured": self.not_measured or None,
        }


def measured(name: str, value: float, unit: str, *, baseline: float | None = None, baseline_name: str = "",
             target: str = "", check: Callable[[Figure], bool] | None = None, note: str = "") -> Figure:
    """A measured figure; ``check`` (given the figure) decides ``met`` for figures with a target."""
    figure = Figure(name=name, unit=unit, value=float(value), baseline=None if baseline is None else float(baseline),
                    baseline_name=baseline_name, target=target, note=note)
    if check is None:
        return figure
    return Figure(**{**figure.__dict__, "met": bool(check(figure))})


def not_measured(name: str, unit: str, why: str, *, baseline_name: str = "", target: str = "") -> Figure:
    """A figure this run could not measure, with the reason (never a made-up number)."""
    return Figure(name=name, unit=unit, baseline_name=baseline_name, target=target, not_measured=why.strip() or "unknown")


def ratio_at_most(limit: float) -> Callable[[Figure], bool]:
    def check(figure: Figure) -> bool:
        ratio = figure.ratio
        return ratio is not None and ratio <= limit

    return check
