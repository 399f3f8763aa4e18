"""When a migration may take a step: the cluster's AKS maintenance windows, or a configured one.

Moving workloads off a GPU pool disrupts them, so the migration only writes while the owner of
the cluster said disruption is acceptable. AKS already has a place for that, the cluster's
``maintenanceConfigurations``; when a cluster has none, ``MIGRATION_WINDOW`` gives one, and
``MIGRATION_WINDOW_PRECEDENCE`` says which wins when both exist. Everything here is pure: the
answer is computed from the configurations and ``now``, as a list of open intervals.

Supported AKS shapes (the resource as ARM returns it, ``{"name", "properties"}``, or bare properties):

- ``aksManagedNodeOSUpgradeSchedule`` (preferred: it governs node disruptions), then ``default``,
  then ``aksManagedAutoUpgradeSchedule``; the first one present decides.
- ``default``: ``timeInWeek`` ``[{"day": "Saturday", "hourSlots": [1, 2]}]`` (UTC hours, one hour
  each) minus ``notAllowedTime`` ``[{"start", "end"}]`` (ISO 8601 date-times).
- ``aksManaged*``: ``maintenanceWindow`` with ``schedule`` one of ``daily {intervalDays}``,
  ``weekly {intervalWeeks, dayOfWeek}``, ``absoluteMonthly {intervalMonths, dayOfMonth}``,
  ``relativeMonthly {intervalMonths, weekIndex: First|Second|Third|Fourth|Last, dayOfWeek}``;
  ``startTime`` ``HH:MM``, ``durationHours``, ``utcOffset`` ``+HH:MM`` (default +00:00),
  ``startDate`` ``YYYY-MM-DD`` (intervals are counted from it; without it every interval is 1),
  ``notAllowedDates`` ``[{"start": date, "end": date}]`` (inclusive, in the window's offset).

``MIGRATION_WINDOW`` format: one or more windows separated by ``;``, each
``<days> HH:MM-HH:MM [UTC|+HH:MM|-HH:MM]`` where ``<days>`` is ``daily`` or a comma list of
``Mon..Sun`` (ranges like ``Mon-Fri`` allowed). An end at or before the start crosses midnight:
``Sat 22:00-04:00 UTC`` runs Saturday 22:00 to Sunday 04:00. Example: ``Sat,Sun 01:00-06:00 UTC``.

No window anywhere means always open (the reason says so); a cluster configuration that cannot be
read means closed (the reason says so too): disruption needs a clear yes.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.migration_policy import MigrationPolicy

LOOKAHEAD_DAYS = 400  # long enough for relativeMonthly with intervalMonths up to 12
SHORT_LOOKAHEAD_DAYS = 15  # enough for every weekly window; the common case stays cheap
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_NAMES = {name: i for i, name in enumerate(calendar.day_name)}  # "Monday" -> 0
_WEEK_INDEX = {"first": 0, "second": 1, "third": 2, "fourth": 3, "last": -1}
_PREFERENCE = ("aksmanagednodeosupgradeschedule", "default", "aksmanagedautoupgradeschedule")

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


def _spec_intervals(spec: WindowSpec, start: float, end: float) -> list[Interval]:
    out: list[Interval] = []
    for slot in spec.slots:
        for day in _local_days(start, end, slot.offset_s):
            if day.weekday() not in slot.days:
                continue
            length = (slot.end_min - slot.start_min) % (24 * 60) or 24 * 60
            begin = _epoch(day, slot.start_min, slot.offset_s)
            out.append((begin, begin + length * 60))
    return out


# --------------------------------------------------------------------------- AKS configurations


def _local_days(start: float, end: float, offset_s: int) -> Iterable[date]:
    first = datetime.fromtimestamp(start + offset_s, UTC).date() - timedelta(days=2)
    last = datetime.fromtimestamp(end + offset_s, UTC).date()
    day = first
    while day <= last:
        yield day
        day += timedelta(days=1)


def _epoch(day: date, minutes: int, offset_s: int) -> float:
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
    return midnight + minutes * 60 - offset_s


def _iso(text: str) -> float:
    parsed = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _default_intervals(props: Mapping[str, Any], start: float, end: float) -> tuple[list[Interval], list[Interval]]:
    opens: list[Interval] = []
    for entry in props.get("timeInWeek") or []:
        weekday = _DAY_NAMES.get(str(entry.get("day", "")).capitalize())
        if weekday is None:
            continue
        for day in _local_days(start, end, 0):
            if day.weekday() != weekday:
                continue
            for hour in entry.get("hourSlots") or []:
                begin = _epoch(day, int(hour) * 60, 0)
                opens.append((begin, begin + 3600))
    blocked = [(_iso(b["start"]), _iso(b["end"])) for b in props.get("notAllowedTime") or [] if b.get("start") and b.get("end")]
    return opens, blocked


def _months_between(a: date, b: date) -> int:
    return (b.year - a.year) * 12 + (b.month - a.month)


def _relative_day(day: date, week_index: int, weekday: int) -> bool:
    if day.weekday() != weekday:
        return False
    if week_index == -1:
        return day.month != (day + timedelta(days=7)).month
    return (day.day - 1) // 7 == week_index


def _schedule_matches(schedule: Mapping[str, Any], day: date, start_date: date | None) -> bool:
    if start_date is not None and day < start_date:
        return False
    if "daily" in schedule:
        every = int((schedule["daily"] or {}).get("intervalDays") or 1)
        return start_date is None or (day - start_date).days % every == 0
    if "weekly" in schedule:
        weekly = schedule["weekly"] or {}
        if day.weekday() != _DAY_NAMES.get(str(weekly.get("dayOfWeek", "")).capitalize(), -1):
            return False
        every = int(weekly.get("intervalWeeks") or 1)
        return start_date is None or ((day - start_date).days // 7) % every == 0
    if "absoluteMonthly" in schedule:
        monthly = schedule["absoluteMonthly"] or {}
        wanted = int(monthly.get("dayOfMonth") or 1)
        # A day past the month's end (31 in April) falls on the month's last day.
        last = calendar.monthrange(day.year, day.month)[1]
        if day.day != min(wanted, last):
            return False
        every = int(monthly.get("intervalMonths") or 1)
        return start_date is None or _months_between(start_date, day) % every == 0
    if "relativeMonthly" in schedule:
        monthly = schedule["relativeMonthly"] or {}
        week_index = _WEEK_INDEX.get(str(monthly.get("weekIndex", "")).lower())
        weekday = _DAY_NAMES.get(str(monthly.get("dayOfWeek", "")).capitalize())
        if week_index is None or weekday is None or not _relative_day(day, week_index, weekday):
            return False
        every = int(monthly.get("intervalMonths") or 1)
        return start_date is None or _months_between(start_date, day) % every == 0
    return False


def _managed_intervals(props: Mapping[str, Any], start: float, end: float) -> tuple[list[Interval], list[Interval]]:
    window = props.get("maintenanceWindow") or {}
    schedule = window.get("schedule") or {}
    offset = _offset(window.get("utcOffset"))
    start_min = _hhmm(str(window.get("startTime") or "00:00"))
    duration = float(window.get("durationHours") or 4) * 3600
    start_date = date.fromisoformat(window["startDate"]) if window.get("startDate") else None
    opens = [(b, b + duration) for day in _local_days(start, end, offset)
             if _schedule_matches(schedule, day, start_date)
             for b in [_epoch(day, start_min, offset)]]
    blocked: list[Interval] = []
    for entry in window.get("notAllowedDates") or []:
        first, last = date.fromisoformat(entry["start"]), date.fromisoformat(entry["end"])
        blocked.append((_epoch(first, 0, offset), _epoch(last + timedelta(days=1), 0, offset)))
    return opens, blocked


def _by_name(configs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for config in configs:
        name = str(config.get("name", "")).lower()
        props = config.get("properties") if isinstance(config.get("properties"), Mapping) else config
        if name:
            out[name] = props
    return out


def _cluster_source(configs: Sequence[Mapping[str, Any]]) -> str | None:
    named = _by_name(configs)
    for name in _PREFERENCE:
        props = named.get(name)
        if props is None:
            continue
        if name == "default" and props.get("timeInWeek"):
            return name
        if name != "default" and (props.get("maintenanceWindow") or {}).get("schedule"):
            return name
    return None


# --------------------------------------------------------------------------- the answer


def _merge(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _subtract(opens: list[Interval], blocked: list[Interval]) -> list[Interval]:
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


def _answer(opens: list[Interval], blocked: list[Interval], now: float, source: str) -> tuple[bool, float | None, str]:
    intervals = _subtract(_merge(opens), blocked)
    for s, e in intervals:
        if s <= now < e:
            return True, None, f"inside {source} until {_fmt(e)}"
    future = [s for s, _ in intervals if s > now]
    if not future:
        return False, None, f"outside {source}: no opening in the next {LOOKAHEAD_DAYS} days"
    return False, min(future), f"outside {source}: waiting for window at {_fmt(min(future))}"


def _fmt(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%MZ")


def window_open(configs: Sequence[Mapping[str, Any]], *, now: float,
                policy: MigrationPolicy) -> tuple[bool, float | None, str]:
    """(open now, next opening when closed, reason) for one cluster's maintenance configurations.

    ``next_open`` is None when the window is open, or when no opening exists within the lookahead.
    The intervals are computed for two weeks first and for the whole lookahead only when needed.
    """
    answer: tuple[bool, float | None, str] = (False, None, "")
    for days in (SHORT_LOOKAHEAD_DAYS, LOOKAHEAD_DAYS):
        answer = _window_open(configs, now=now, policy=policy, end=now + days * 86400)
        if answer[0] or answer[1] is not None:
            return answer
    return answer


def _window_open(configs: Sequence[Mapping[str, Any]], *, now: float, policy: MigrationPolicy,
                 end: float) -> tuple[bool, float | None, str]:
    spec = policy.window_spec
    source = _cluster_source(configs)
    if spec is not None and (policy.window_precedence == "configured" or source is None):
        return _answer(_spec_intervals(spec, now, end), [], now, f"MIGRATION_WINDOW {spec.text!r}")
    if source is None:
        return True, None, "no maintenance window configured (cluster or MIGRATION_WINDOW): always open"
    props = _by_name(configs)[source]
    try:
        if source == "default":
            opens, blocked = _default_intervals(props, now, end)
        else:
            opens, blocked = _managed_intervals(props, now, end)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # A configuration we cannot read is not permission to disrupt: closed, and say why.
        return False, None, f"maintenance configuration {source!r} could not be read ({exc}): treated as closed"
    return _answer(opens, blocked, now, f"maintenance configuration {source!r}")
