"""The demo's running story, told from the events the steward published (not by polling its ledger).

Every event becomes one sentence: who (the node, the pool, the request), what happened, and why in the
steward's own words (a rejection's problems with their fixes, a refusal's reason and code, a migration's
step). A polled ledger shows only the states it happens to catch; the events are every step, in order,
including the ones a poll misses (an admission, a restart started, a verification that failed). Nothing is
cut mid-word: long reasons are wrapped at words under the line they belong to.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

WIDTH = 110


def _who(d: Mapping[str, Any]) -> str:
    cluster = str(d.get("cluster") or "").rstrip("/").rsplit("/", 1)[-1]
    return cluster


def _problems(d: Mapping[str, Any]) -> str:
    problems = d.get("problems") or []
    if problems:
        return "; ".join(f"{p.get('field')}: {p.get('problem')}" + (f" (fix: {p.get('fix')})" if p.get("fix") else "")
                         for p in problems)
    return "; ".join(str(r) for r in d.get("reasons") or [])


def sentence(event: Mapping[str, Any]) -> str | None:
    """One event as a sentence (None: an event the story does not tell, e.g. a duplicate step)."""
    type_ = str(event.get("type") or "")
    d: Mapping[str, Any] = event.get("data") or {}
    family, _, what = type_.removeprefix("Steward.").partition(".")
    if family == "PoolRequest":
        pool = f"pool {d.get('poolName')} on " if d.get("poolName") else "on "
        who = f"request {d.get('requestId')} ({d.get('requester') or 'unknown team'}, {pool}{_who(d)})"
        if what == "Rejected":
            return f"{who} rejected: {_problems(d)}"
        if what == "Accepted":
            return f"{who} accepted: {d.get('vmSize')}, install profile {d.get('installProfile')}"
        if what == "Created":
            return f"{who} created and its GPU stack proven"
        return f"{who} {what.lower()}: {d.get('message') or d.get('error') or d.get('reason') or ''}".rstrip(": ")
    if family == "Remediation":
        who = f"node {d.get('node')} ({_who(d)}/{d.get('pool')}, {d.get('condition')})"
        if what == "Refused":
            return f"{who} refused [{d.get('reason_code')}]: {d.get('reason') or d.get('note')}"
        if what == "SignalRecorded":
            return f"{who} signal recorded, no action: {d.get('note')}"
        return f"{who} {_words(what)}: {d.get('note') or ''}".rstrip(": ")
    if family == "Migration":
        who = f"pool {_who(d)}/{d.get('pool')}"
        if what == "Step":
            return f"{who} {d.get('previous')} -> {d.get('state')}: {d.get('note') or ''}".rstrip(": ")
        if what == "Planned" or what == "Started":
            return f"{who} migration {what.lower()} to {d.get('replacement')} ({d.get('strategy')})"
        return f"{who} migration {_words(what)}: {d.get('reason') or d.get('note') or ''}".rstrip(": ")
    if family == "Breaker":
        return f"the fleet breaker {what.lower()}: {d.get('reason') or d.get('note') or ''}".rstrip(": ")
    if family == "GpuNode":
        return None  # the sweep's fault report: the Remediation events tell what became of it
    if family == "Signal" and what == "SeriesRefused":
        return (f"{d.get('count')} DCGM series from workspace {d.get('workspace')} refused [{d.get('code')}], never "
                f"acted on" + (f"; e.g. {d['examples'][0]}" if d.get("examples") else ""))
    if family == "Signal" and what == "CountersInactive":
        return (f"DCGM on {_who(d)}: the {d.get('exporter')} exporter does not export "
                f"{', '.join(d.get('inactive') or [])}: those policy rows cannot fire there")
    if family == "Signal":
        return f"signal {_words(what)}: {d.get('reason') or d.get('note') or d.get('message') or ''}".rstrip(": ")
    return None


def _words(camel: str) -> str:
    """``GaveUp`` -> ``gave up``."""
    return "".join(f" {c.lower()}" if c.isupper() else c for c in camel).strip()


def wrapped(stamp: str, text: str, *, width: int = WIDTH) -> list[str]:
    """``[stamp] text`` wrapped at words; continuation lines indented under the text."""
    lead = f"  [{stamp}] "
    return textwrap.wrap(text, width=width, initial_indent=lead, subsequent_indent=" " * len(lead),
                         break_long_words=False, break_on_hyphens=False) or [lead.rstrip()]


class Narrator:
    """Tells each event once, in the order the topic received them."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    def new_lines(self, events: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str]]:
        out = []
        for event in events:
            key = str(event.get("id") or "") or repr(sorted(event.items()))
            if key in self._told:
                continue
            self._told.add(key)
            text = sentence(event)
            if text:
                out.append((event, text))
        return out
