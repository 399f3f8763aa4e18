"""fleetctl timeline: each remediation and migration a row, each recorded step a mark on one time axis (issue 22,
item 5). The page itself is opened in headless Chromium by tests/browser."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from fleetctl import cli, timeline
from shared.kernel.ports import Record

AT = 1_764_684_000.0


def remediation(node: str, steps: list[tuple[float, str, str]], state: str) -> Record:
    return Record(kind="remediation", id=f"r-{node}", state=state, created_at=AT, updated_at=AT + 900,
                  data={"node": node, "pool": "gpu1", "condition": "XID79", "since_ts": AT - 120,
                        "cluster": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/"
                                   "managedClusters/ml-train"},
                  history=[{"at": AT + dt, "state": st, "note": note} for dt, st, note in steps])


STORIES = [
    remediation("aks-gpu1-0", [(0, "admitted", "pool gpu1: 1 of 1 allowed"), (5, "cordoned", "cordoned"),
                               (30, "draining", "evicted 3 pods"), (60, "repairing", "restart started"),
                               (120, "verifying", "Ready again"), (180, "done", "restart <repaired> & verified")],
                "done"),
    remediation("aks-gpu1-2", [(400, "admitted", "slot freed"), (900, "gave_up", "every rung failed")], "gave_up"),
    Record(kind="migration", id="m1", state="done", created_at=AT, updated_at=AT + 800,
           data={"cluster_name": "ml-legacy", "pool": "t4old", "replacement": "t4oldm1"},
           history=[{"at": AT + 10, "state": "planned", "note": "surge"}, {"at": AT + 800, "state": "done", "note": "ok"}]),
]


def test_each_story_is_a_row_with_a_mark_per_step_and_the_fault_first() -> None:
    page = timeline.render([timeline.story_of(r.kind, r) for r in STORIES])
    assert page.count('<g class="story ') == 3
    rows = re.findall(r'<g class="story (\w+)" data-story="([^"]+)" data-outcome="(\w+)">(.*?)</g>', page, re.S)
    marks = {story: len(re.findall(r"<circle ", body)) for _, story, _, body in rows}
    assert marks == {"r-aks-gpu1-0": 7, "r-aks-gpu1-2": 3, "m1": 2}  # the fault, then each recorded step
    assert "fault" in rows[0][3].split('class="mark ', 1)[1][:6]
    assert "restart &lt;repaired&gt; &amp; verified" in page  # notes are escaped, never markup
    assert "<script" not in page and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_fleetctl_timeline_writes_the_page_from_the_ledger(ledger_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "t.html"
    code, text = run("timeline", "--out", str(out))
    assert code == 0 and f"wrote {out}: 3 stories" in text
    assert out.read_text().count('<g class="story ') == 3
    code, text = run("timeline", "--out", str(tmp_path / "r.html"), "--kind", "remediation")
    assert "2 stories" in text


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


@pytest.fixture
def ledger_env(storage_connection_string: str, names: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    from azure.data.tables import TableClient

    from shared.adapters.ledger import TableLedger

    env = {"AzureWebJobsStorage": storage_connection_string, "LEDGER_TABLE": names.table("ledger")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ledger = TableLedger(TableClient.from_connection_string(storage_connection_string, table_name=env["LEDGER_TABLE"]))
    for record in STORIES:
        ledger.create(record)
    return env
