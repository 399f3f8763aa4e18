"""``fleetctl timeline``: every remediation and migration on one time axis, as a self-contained HTML page.

One row per story (a node's remediation, a pool's migration), from the ledger's own history of each record:
the fault (its ``since``), then every step the record took (admitted, cordoned, each drain round, each rung,
the verification, the outcome), each a mark on the row at its time, coloured by what kind of step it is,
with the step's note as its tooltip. Inline SVG and CSS, no script and nothing fetched: the page opens from
a file, in a browser with no network, years later. The demo writes one at its end (.state/demo/timeline.html).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetctl import records

#: Step kinds and their colours (the legend, in this order).
KINDS: dict[str, str] = {
    "fault": "#c0392b", "admit": "#7f8c8d", "cordon": "#e67e22", "drain": "#f1c40f", "repair": "#2980b9",
    "verify": "#8e44ad", "done": "#27ae60", "stopped": "#6e1a1a", "migrate": "#16a085",
}
_STATE_KIND = {
    "admitted": "admit", "cordoned": "cordon", "cordoning": "cordon", "draining": "drain", "drained": "drain",
    "restarting": "repair", "reimaging": "repair", "replacing": "repair", "repairing": "repair",
    "verifying": "verify", "validating": "verify", "done": "done", "released": "done", "recovered": "done",
    "gave_up": "stopped", "failed": "stopped", "blocked": "stopped", "refused": "stopped", "rolled_back": "stopped",
    "rolling_back": "stopped",
}

ROW_H, LABEL_W, PLOT_W, TOP = 28, 560, 820, 46


@dataclass
class Story:
    kind: str  # remediation | migration
    id: str
    label: str
    outcome: str
    marks: list[tuple[float, str, str, str]] = field(default_factory=list)  # (at, step kind, state, note)


def kind_of(state: str, story: str) -> str:
    return _STATE_KIND.get(state, "migrate" if story == "migration" else "repair")


def stories(ledger: Any) -> list[Story]:
    """The remediations and migrations of the ledger, oldest first."""
    kinds = (records.REMEDIATION, records.MIGRATION)
    return stories_of((kind, record) for kind in kinds for record in records.list_records(ledger, kind))


def stories_of(kinds_and_records: Iterable[tuple[str, Any]]) -> list[Story]:
    """The stories of records already read, oldest first (so a page can show exactly what a report told)."""
    out = [story_of(kind, record) for kind, record in kinds_and_records]
    return sorted(out, key=lambda s: (s.marks[0][0] if s.marks else 0.0, s.id))


def story_of(kind: str, record: Any) -> Story:
    d = record.data or {}
    if kind == records.REMEDIATION:
        cluster = str(d.get("cluster") or "").rstrip("/").rsplit("/", 1)[-1]
        label = f"{d.get('node')} ({cluster}/{d.get('pool')}, {d.get('condition')})"
    else:
        label = f"{d.get('cluster_name')}/{d.get('pool')} -> {d.get('replacement')}"
    story = Story(kind=kind, id=record.id, label=label, outcome=str(record.state))
    since = d.get("since_ts") or d.get("since")
    if kind == records.REMEDIATION and isinstance(since, int | float) and since > 0:
        story.marks.append((float(since), "fault", "fault", f"{d.get('condition')} since then"))
    for line in record.history or []:
        at = line.get("at")
        if isinstance(at, int | float):
            state = str(line.get("state") or "")
            story.marks.append((float(at), kind_of(state, kind), state, str(line.get("note") or "")))
    story.marks.sort(key=lambda m: m[0])
    return story


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(all_stories: Sequence[Story], *, title: str = "GPU fleet steward: timeline") -> str:
    """The page (UTF-8 HTML, self-contained)."""
    marks = [m[0] for s in all_stories for m in s.marks]
    start, end = (min(marks), max(marks)) if marks else (0.0, 1.0)
    span = max(end - start, 1.0)

    def x(at: float) -> float:
        return LABEL_W + (at - start) / span * PLOT_W

    height = TOP + ROW_H * max(len(all_stories), 1) + 30
    width = LABEL_W + PLOT_W + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">']
    for i in range(5):
        at = start + span * i / 4
        parts.append(f'<line x1="{x(at):.1f}" y1="{TOP - 8}" x2="{x(at):.1f}" y2="{height - 24}" class="grid"/>'
                     f'<text x="{x(at):.1f}" y="{TOP - 14}" class="tick">{_iso(at)[11:19]}</text>')
    for row, story in enumerate(all_stories):
        y = TOP + ROW_H * row + ROW_H / 2
        parts.append(f'<g class="story {story.kind}" data-story="{html.escape(story.id)}" '
                     f'data-outcome="{html.escape(story.outcome)}">')
        parts.append(f'<text x="6" y="{y + 4:.1f}" class="label">{html.escape(story.label)} '
                     f'[{html.escape(story.outcome)}]</text>')
        if story.marks:
            parts.append(f'<line x1="{x(story.marks[0][0]):.1f}" y1="{y:.1f}" x2="{x(story.marks[-1][0]):.1f}" '
                         f'y2="{y:.1f}" class="span"/>')
        for at, kind, state, note in story.marks:
            parts.append(f'<circle cx="{x(at):.1f}" cy="{y:.1f}" r="6" fill="{KINDS[kind]}" class="mark {kind}">'
                         f'<title>{_iso(at)} {html.escape(state)}: {html.escape(note)}</title></circle>')
        parts.append("</g>")
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{colour}"></i>{name}</span>'
                     for name, colour in KINDS.items())
    window = f"{_iso(start)} to {_iso(end)}" if marks else "no steps recorded"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 18px; margin: 0 0 4px; }}
.key {{ margin-right: 14px; }} .key i {{ display: inline-block; width: 10px; height: 10px; border-radius: 50%;
  margin-right: 4px; }}
.grid {{ stroke: #ddd; }} .tick {{ font-size: 11px; fill: #666; text-anchor: middle; }}
.label {{ font-size: 12px; fill: #222; }} .span {{ stroke: #999; stroke-width: 2; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{len(all_stories)} stories, {window} (UTC). Hover a mark for its step and note.</p>
<p class="legend">{legend}</p>
{"".join(parts)}
</body></html>
"""


def write(chosen: Sequence[Story], path: Any) -> int:
    """Write the page of ``chosen`` to ``path``; returns how many stories it shows."""
    from pathlib import Path

    Path(path).write_text(render(chosen), encoding="utf-8")
    return len(chosen)


def summary(all_stories: Sequence[Story]) -> list[Mapping[str, Any]]:
    return [{"kind": s.kind, "id": s.id, "label": s.label, "outcome": s.outcome, "steps": len(s.marks)}
            for s in all_stories]
