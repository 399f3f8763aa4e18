"""Windows of time as intervals, and the migration's own window (``MIGRATION_WINDOW``).

Every window -- an AKS maintenance configuration (shared.migration.maintenance) or the configured
one -- becomes a list of open intervals in epoch seconds over the lookahead, which merge, subtract
and intersect here. Pure.

``MIGRATION_WINDOW`` format: one or more windows separated by ``;``, each
``<days> HH:MM-HH:MM [UTC|+HH:MM|-HH:MM]`` where ``<days>`` is ``daily`` or a comma list of
``Mon..Sun`` (ranges like ``Mon-Fri`` allowed). An end at or before the start crosses midnight:
``Sat 22:00-04:00 UTC`` runs Saturday 22:00 to Sunday 04:00. Example: ``Sat,Sun 01:00-06:00 UTC``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

Interval = tuple[float, float]


# --------------------------------------------------------------------------- configured window


@dataclass(frozen=True)
class Slot:
    days: frozenset[int]  # 0 = Monday
    start_min: int  # minutes after local midnight
    end_min: int  # <= start_min: the slot crosses midnight
    offset_s: int


@dataclass(frozen=True)
class WindowSpec:
    slots: tuple[Slot, ...]
    text: str


_SLOT = re.compile(
    r"^(?P<days>[A-Za-z,\-]+)\s+(?P<start>\d{1,2}:\d{2})\s*-\s*(?P<end>\d{1,2}:\d{2})(?:\s+(?P<tz>UTC|Z|[+-]\d{2}:\d{2}))?$",
    re.IGNORECASE)


def _hhmm(text: str) -> int:
    hours, minutes = (int(x) for x in text.split(":"))
    if hours == 24 and minutes == 0:
        return 24 * 60
    if not (0 <= hours < 24 and 0 <= minutes < 60):
        raise ValueError(f"{text!r} is not a time of day (HH:MM)")
    return hours * 60 + minutes


def _offset(text: str | None) -> int:
    if not text or text.upper() in ("UTC", "Z"):
        return 0
    match = re.fullmatch(r"([+-])(\d{2}):(\d{2})", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a UTC offset (+HH:MM)")
    seconds = int(match.group(2)) * 3600 + int(match.group(3)) * 60
    return seconds if match.group(1) == "+" else -seconds


def _days(text: str) -> frozenset[int]:
    if text.lower() == "daily":
        return frozenset(range(7))
    out: set[int] = set()
    for part in text.lower().split(","):
        first, _, last = part.partition("-")
        if first[:3] not in _DAYS or (last and last[:3] not in _DAYS):
            raise ValueError(f"{part!r} is not a day (Mon..Sun, a range like Mon-Fri, or daily)")
        a = _DAYS.index(first[:3])
        b = _DAYS.index(last[:3]) if last else a
        i = a
        while True:
            out.add(i)
            if i == b:
                break
            i = (i + 1) % 7
    return frozenset(out)


def parse_window(text: str) -> WindowSpec:
    """Parse MIGRATION_WINDOW; ValueError says what is wrong."""
    slots: list[Slot] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        match = _SLOT.match(part)
        if not match:
            raise ValueError(f"{part!r} must look like 'Sat 01:00-06:00 UTC' (days HH:MM-HH:MM [UTC|+HH:MM])")
        start, end = _hhmm(match.group("start")), _hhmm(match.group("end"))
        slots.append(Slot(_days(match.group("days")), start, end, _offset(match.group("tz"))))
    if not slots:
        raise ValueError("no window given")
    return WindowSpec(tuple(slots), text)


def spec_intervals(spec: WindowSpec, start: float, end: float) -> list[Interval]:
    out: list[Interval] = []
    for slot in spec.slots:
        for day in local_days(start, end, slot.offset_s):
            if day.weekday() not in slot.days:
                continue
            length = (slot.end_min - slot.start_min) % (24 * 60) or 24 * 60
            begin = epoch(day, slot.start_min, slot.offset_s)
            out.append((begin, begin + length * 60))
    return out


def local_days(start: float, end: float, offset_s: int) -> Iterable[date]:
    first = datetime.fromtimestamp(start + offset_s, UTC).date() - timedelta(days=2)
    last = datetime.fromtimestamp(end + offset_s, UTC).date()
    day = first
    while day <= last:
        yield day
        day += timedelta(days=1)


def epoch(day: date, minutes: int, offset_s: int) -> float:
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
    return midnight + minutes * 60 - offset_s




def merge(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def subtract(opens: list[Interval], blocked: list[Interval]) -> list[Interval]:
    result = opens
    for bs, be in blocked:
        nxt: list[Interval] = []
        for s, e in result:
            if be <= s or bs >= e:
                nxt.append((s, e))
                continue
            if s < bs:
                nxt.append((s, bs))
            if be < e:
                nxt.append((be, e))
        result = nxt
    return result


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Where both merged interval lists are open."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out
