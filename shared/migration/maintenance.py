"""When a migration may take a step: the cluster's AKS maintenance windows, or a configured one.

Moving workloads off a GPU pool disrupts them, so the migration only writes while the owner of
the cluster said disruption is acceptable. AKS already has a place for that, the cluster's
``maintenanceConfigurations``; when a cluster has none, ``MIGRATION_WINDOW`` gives one, and
``MIGRATION_WINDOW_PRECEDENCE`` says which wins when both exist. Everything here is pure: the
answer is computed from the configurations and ``now``, as a list of open intervals.

Supported AKS shapes (the resource as ARM returns it, ``{"name", "properties"}``, or bare properties;
azure-rest-api-specs ``managedClusters.json`` MaintenanceConfigurationProperties / MaintenanceWindow):

- ``aksManagedNodeOSUpgradeSchedule`` (preferred: it governs node disruptions), then ``default``,
  then ``aksManagedAutoUpgradeSchedule``; the first one the cluster has decides, readable or not.
- ``maintenanceWindow`` (every ``aksManaged*``, and ``default`` from api-version 2023-05-01):
  ``schedule`` exactly one of ``daily {intervalDays}``, ``weekly {intervalWeeks, dayOfWeek}``,
  ``absoluteMonthly {intervalMonths, dayOfMonth}``,
  ``relativeMonthly {intervalMonths, weekIndex: First|Second|Third|Fourth|Last, dayOfWeek}``;
  ``startTime`` ``HH:MM`` (required), ``durationHours`` 4..24 (24 when absent: the spec's default),
  ``utcOffset`` ``+HH:MM`` (default +00:00), ``startDate`` ``YYYY-MM-DD`` (nothing opens before it;
  intervals above 1 are counted from it and need it), ``notAllowedDates``
  ``[{"start": date, "end": date}]`` (inclusive, in the window's offset).
- ``default`` in the deprecated shape: ``timeInWeek`` ``[{"day": "Saturday", "hourSlots": [1, 2]}]``
  (UTC hours, one hour each) minus ``notAllowedTime`` ``[{"start", "end"}]`` (ISO 8601 date-times).
  AKS migrates it to ``maintenanceWindow``; while a ``default`` shows both, it is open only where both
  are.

Where AKS leaves a reading open (how intervals count from ``startDate``, a ``dayOfMonth`` the month
lacks), a moment is open only if it is open under every reading.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from shared.kernel.timefmt import rfc3339_seconds
from shared.migration.window import Interval, epoch, intersect, local_days, merge, spec_intervals, subtract

if TYPE_CHECKING:
    from shared.migration.policy import MigrationPolicy

LOOKAHEAD_DAYS = 400  # long enough for relativeMonthly with intervalMonths up to 12
SHORT_LOOKAHEAD_DAYS = 15  # enough for every weekly window; the common case stays cheap
_DAY_NAMES = {name: i for i, name in enumerate(calendar.day_name)}  # "Monday" -> 0
_WEEK_INDEX = {"first": 0, "second": 1, "third": 2, "fourth": 3, "last": -1}
_PREFERENCE = ("aksmanagednodeosupgradeschedule", "default", "aksmanagedautoupgradeschedule")


# --------------------------------------------------------------------------- AKS configurations
# The shapes, as Azure/azure-rest-api-specs specification/containerservice/resource-manager/
# Microsoft.ContainerService/aks/stable/2025-10-01/managedClusters.json defines them
# (MaintenanceConfigurationProperties, MaintenanceWindow, Schedule, TimeInWeek, TimeSpan, DateSpan), and
# https://learn.microsoft.com/azure/aks/planned-maintenance ("Create a maintenance window", "Deprecated
# properties", "Schedule types"). Anything that does not fit them is Unreadable: closed, and said.


class Unreadable(ValueError):
    """A maintenance configuration that cannot be read with certainty (the window counts as closed)."""


_SCHEDULE_KINDS = ("daily", "weekly", "absoluteMonthly", "relativeMonthly")
_HHMM = re.compile(r"^(\d{2}):(\d{2})$")
_UTC_OFFSET = re.compile(r"^([+-])(\d{2}):(\d{2})$")
DEFAULT_DURATION_HOURS = 24  # MaintenanceWindow.durationHours: "default": 24, "minimum": 4, "maximum": 24


def _iso(text: Any, field: str) -> float:
    """An RFC 3339 date-time (``TimeSpan.start``/``end``: ``"format": "date-time"``); Unreadable otherwise."""
    value = rfc3339_seconds(str(text))
    if value is None:
        raise Unreadable(f"{field} {text!r} is not a date-time")
    return value


def _date(text: Any, field: str) -> date:
    try:
        return date.fromisoformat(str(text))
    except ValueError:
        raise Unreadable(f"{field} {text!r} is not a date (YYYY-MM-DD)") from None


def _weekday(value: Any, field: str) -> int:
    day = _DAY_NAMES.get(str(value or "").capitalize())
    if day is None:
        raise Unreadable(f"{field} {value!r} is not a day of the week")
    return day


def _count(value: Any, field: str, *, default: int | None = None, low: int = 1, high: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise Unreadable(f"{field} {value!r} is not a whole number")
    number = int(value)
    if number < low or (high is not None and number > high):
        raise Unreadable(f"{field} {number} is outside {low}..{high if high is not None else 'any'}")
    return number


def _start_minutes(value: Any) -> int:
    match = _HHMM.match(str(value)) if value is not None else None
    if not match or int(match.group(1)) > 23 or int(match.group(2)) > 59:
        raise Unreadable(f"maintenanceWindow.startTime {value!r} is not a time from 00:00 to 23:59")
    return int(match.group(1)) * 60 + int(match.group(2))


def _utc_offset(value: Any) -> int:
    if value is None or value == "":
        return 0  # "If not specified, the default is '+00:00'."
    match = _UTC_OFFSET.match(str(value))
    if not match or int(match.group(2)) > 14 or int(match.group(3)) > 59:
        raise Unreadable(f"maintenanceWindow.utcOffset {value!r} is not an offset like +05:30")
    seconds = int(match.group(2)) * 3600 + int(match.group(3)) * 60
    return seconds if match.group(1) == "+" else -seconds


@dataclass(frozen=True)
class _Schedule:
    kind: str
    every: int
    weekday: int | None = None
    day_of_month: int | None = None
    week_index: int | None = None


def _schedule(raw: Any) -> _Schedule:
    if not isinstance(raw, Mapping):
        raise Unreadable("maintenanceWindow.schedule is missing")
    present = [k for k, v in raw.items() if v is not None]
    unknown = [k for k in present if k not in _SCHEDULE_KINDS]
    if unknown:
        raise Unreadable(f"maintenanceWindow.schedule has an unknown type {unknown[0]!r}")
    if len(present) != 1:
        # Schedule: "One and only one of the schedule types should be specified."
        raise Unreadable(f"maintenanceWindow.schedule must have exactly one of {', '.join(_SCHEDULE_KINDS)}, "
                         f"not {len(present)}")
    kind = present[0]
    body = raw[kind]
    if not isinstance(body, Mapping):
        raise Unreadable(f"maintenanceWindow.schedule.{kind} is not an object")
    field = f"maintenanceWindow.schedule.{kind}"
    if kind == "daily":
        return _Schedule(kind, _count(body.get("intervalDays"), f"{field}.intervalDays", default=1))
    if kind == "weekly":
        return _Schedule(kind, _count(body.get("intervalWeeks"), f"{field}.intervalWeeks", default=1),
                         weekday=_weekday(body.get("dayOfWeek"), f"{field}.dayOfWeek"))
    every = _count(body.get("intervalMonths"), f"{field}.intervalMonths", default=1)
    if kind == "absoluteMonthly":
        return _Schedule(kind, every, day_of_month=_count(body.get("dayOfMonth"), f"{field}.dayOfMonth", low=1,
                                                          high=31))
    week_index = _WEEK_INDEX.get(str(body.get("weekIndex") or "").lower())
    if week_index is None:
        raise Unreadable(f"{field}.weekIndex {body.get('weekIndex')!r} is not First, Second, Third, Fourth or Last")
    return _Schedule(kind, every, weekday=_weekday(body.get("dayOfWeek"), f"{field}.dayOfWeek"), week_index=week_index)


def _months_between(a: date, b: date) -> int:
    return (b.year - a.year) * 12 + (b.month - a.month)


def _occurrence_in_month(schedule: _Schedule, year: int, month: int) -> date | None:
    """The day a monthly schedule falls on in this month, or None.

    A ``dayOfMonth`` the month does not have (31 in April) gives None: whether AKS skips that month or
    uses its last day is not documented, and skipping is the reading that never opens a window the
    other reading keeps closed.
    """
    last = calendar.monthrange(year, month)[1]
    if schedule.kind == "absoluteMonthly":
        assert schedule.day_of_month is not None
        return date(year, month, schedule.day_of_month) if schedule.day_of_month <= last else None
    assert schedule.weekday is not None and schedule.week_index is not None
    days = [date(year, month, d) for d in range(1, last + 1) if date(year, month, d).weekday() == schedule.weekday]
    return days[-1] if schedule.week_index == -1 else days[schedule.week_index]


def _week_start(day: date, first_weekday: int) -> date:
    return day - timedelta(days=(day.weekday() - first_weekday) % 7)


def _schedule_matches(schedule: _Schedule, day: date, start_date: date | None) -> bool:
    """Whether a window of ``schedule`` starts on local ``day``.

    Every interval above one is counted from ``startDate``; AKS does not document how, so a day
    counts only when every plausible counting agrees (weeks as 7-day blocks from startDate, or as
    calendar weeks from Monday or from Sunday; months from startDate's month or from the first
    occurrence on or after it). Where the readings disagree the window stays closed.
    """
    if start_date is not None and day < start_date:
        return False  # "If the current date is before this date, the maintenance window is inactive"
    if schedule.kind == "daily":
        return schedule.every == 1 or (start_date is not None and (day - start_date).days % schedule.every == 0)
    if schedule.kind == "weekly":
        if day.weekday() != schedule.weekday:
            return False
        if schedule.every == 1:
            return True
        assert start_date is not None
        blocks = (day - start_date).days // 7
        monday = (_week_start(day, 0) - _week_start(start_date, 0)).days // 7
        sunday = (_week_start(day, 6) - _week_start(start_date, 6)).days // 7
        return all(n % schedule.every == 0 for n in (blocks, monday, sunday))
    if _occurrence_in_month(schedule, day.year, day.month) != day:
        return False
    if schedule.every == 1:
        return True
    assert start_date is not None
    first = _occurrence_in_month(schedule, start_date.year, start_date.month)
    first_month = start_date if first is not None and first >= start_date else \
        (start_date.replace(day=1) + timedelta(days=32)).replace(day=1)
    return all(_months_between(anchor, day) % schedule.every == 0 for anchor in (start_date, first_month))


def _managed_intervals(window: Any, start: float, end: float) -> tuple[list[Interval], list[Interval]]:
    """Open intervals and blocked intervals of one ``maintenanceWindow``."""
    if not isinstance(window, Mapping):
        raise Unreadable("maintenanceWindow is missing")
    schedule = _schedule(window.get("schedule"))
    offset = _utc_offset(window.get("utcOffset"))
    start_min = _start_minutes(window.get("startTime"))
    duration = _count(window.get("durationHours"), "maintenanceWindow.durationHours",
                      default=DEFAULT_DURATION_HOURS, low=4, high=24) * 3600
    start_date = _date(window["startDate"], "maintenanceWindow.startDate") if window.get("startDate") else None
    if schedule.every > 1 and start_date is None:
        raise Unreadable(f"maintenanceWindow.schedule.{schedule.kind} repeats every {schedule.every} but there is no "
                         "startDate to count from, so which occurrences are open cannot be told")
    opens = [(b, b + duration) for day in local_days(start, end, offset)
             if _schedule_matches(schedule, day, start_date)
             for b in [epoch(day, start_min, offset)]]
    blocked: list[Interval] = []
    for entry in window.get("notAllowedDates") or []:
        if not isinstance(entry, Mapping) or not entry.get("start") or not entry.get("end"):
            raise Unreadable(f"maintenanceWindow.notAllowedDates entry {entry!r} needs start and end dates")
        first = _date(entry["start"], "notAllowedDates.start")
        last = _date(entry["end"], "notAllowedDates.end")
        if last < first:
            raise Unreadable(f"maintenanceWindow.notAllowedDates {first}..{last} ends before it starts")
        # DateSpan: "'utcOffset' applies to this field", both days included.
        blocked.append((epoch(first, 0, offset), epoch(last + timedelta(days=1), 0, offset)))
    return opens, blocked


def _legacy_intervals(time_in_week: Any, start: float, end: float) -> list[Interval]:
    """The deprecated ``timeInWeek`` of a ``default``: UTC hour slots, one hour each."""
    if not isinstance(time_in_week, Sequence) or isinstance(time_in_week, (str, bytes)):
        raise Unreadable("timeInWeek is not a list")
    opens: list[Interval] = []
    for entry in time_in_week:
        if not isinstance(entry, Mapping):
            raise Unreadable(f"timeInWeek entry {entry!r} is not an object")
        weekday = _weekday(entry.get("day"), "timeInWeek.day")
        hours = [_count(h, "timeInWeek.hourSlots", low=0, high=23) for h in entry.get("hourSlots") or []]
        for day in local_days(start, end, 0):
            if day.weekday() == weekday:
                opens.extend((b, b + 3600) for b in (epoch(day, h * 60, 0) for h in hours))
    return opens


def _not_allowed_time(props: Mapping[str, Any]) -> list[Interval]:
    blocked: list[Interval] = []
    for entry in props.get("notAllowedTime") or []:
        if not isinstance(entry, Mapping) or not entry.get("start") or not entry.get("end"):
            raise Unreadable(f"notAllowedTime entry {entry!r} needs start and end")
        blocked.append((_iso(entry["start"], "notAllowedTime.start"), _iso(entry["end"], "notAllowedTime.end")))
    return blocked


def _config_intervals(name: str, props: Mapping[str, Any], start: float,
                      end: float) -> tuple[list[Interval], list[Interval]]:
    """Open and blocked intervals of one configuration.

    ``default`` may carry the current ``maintenanceWindow`` (api-version 2023-05-01 on), the
    deprecated ``timeInWeek`` (AKS migrates it to ``maintenanceWindow``), or, while a migration is
    presented, both: then it is open only where both are, whichever of them AKS follows.
    """
    window = props.get("maintenanceWindow")
    legacy = props.get("timeInWeek")
    blocked = _not_allowed_time(props)
    parts: list[list[Interval]] = []
    if window is not None:
        opens, window_blocked = _managed_intervals(window, start, end)
        parts.append(opens)
        blocked += window_blocked
    if legacy and name == "default":
        parts.append(_legacy_intervals(legacy, start, end))
    if not parts:
        wanted = "maintenanceWindow or timeInWeek" if name == "default" else "maintenanceWindow"
        raise Unreadable(f"it has no {wanted}")
    opens = merge(parts[0])
    for other in parts[1:]:
        opens = intersect(opens, merge(other))
    return opens, blocked


def _by_name(configs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for config in configs:
        name = str(config.get("name", "")).lower()
        raw = config.get("properties")
        props = raw if isinstance(raw, Mapping) else config
        if name:
            out[name] = props
    return out


def _cluster_source(configs: Sequence[Mapping[str, Any]]) -> str | None:
    """The configuration that decides: the first of _PREFERENCE the cluster has, readable or not."""
    named = _by_name(configs)
    return next((name for name in _PREFERENCE if name in named), None)


# --------------------------------------------------------------------------- the answer


def _answer(opens: list[Interval], blocked: list[Interval], now: float, source: str) -> tuple[bool, float | None, str]:
    intervals = subtract(merge(opens), blocked)
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
        return _answer(spec_intervals(spec, now, end), [], now, f"MIGRATION_WINDOW {spec.text!r}")
    if source is None:
        return True, None, "no maintenance window configured (cluster or MIGRATION_WINDOW): always open"
    props = _by_name(configs)[source]
    shown = next((str(c.get("name")) for c in configs if str(c.get("name", "")).lower() == source), source)
    try:
        opens, blocked = _config_intervals(source, props, now, end)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        # A configuration we cannot read is not permission to disrupt: closed, and say why.
        return False, None, f"maintenance configuration {shown!r} could not be read ({exc}): treated as closed"
    answer = _answer(opens, blocked, now, f"maintenance configuration {shown!r}")
    if not answer[0] and answer[1] is None:
        return answer[0], answer[1], answer[2] + _interval_hint(props)
    return answer


def _interval_hint(props: Mapping[str, Any]) -> str:
    """Why a repeating window may never open here: the countings of its interval disagree."""
    window = props.get("maintenanceWindow")
    if not isinstance(window, Mapping):
        return ""
    try:
        schedule = _schedule(window.get("schedule"))
    except Unreadable:
        return ""
    if schedule.every == 1 or schedule.kind == "daily":
        return ""
    return (f" (it repeats every {schedule.every} from startDate {window.get('startDate')}: AKS does not document "
            "how it counts, and the possible countings never agree here; a startDate on a day the window "
            "falls on makes them agree)")
