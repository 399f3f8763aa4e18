"""The demo's timeline page, opened in a real headless browser (Debian's Chromium; issue 22, item 5).

``make test-browser`` (run by .ci/run after the other lanes) installs Chromium from Debian's packages when it is
missing, runs the demo, and opens the page it wrote: the page must render with no script and no network, every
remediation and migration the demo's report names must have its row, and a screenshot is kept under
.state/timeline/ for a person to look at. This lane never skips: without Chromium it fails, saying how to get it.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEEP = ROOT / ".state" / "timeline"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is not installed: make test-browser installs Debian's chromium package (apt-get)"
    return found


def headless(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", "--hide-scrollbars", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    state = tmp_path_factory.mktemp("demo")
    run = subprocess.run([sys.executable, "-m", "demo", "--state-dir", str(state)], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    yield state / "timeline.html", run.stdout


def reported(report: str, section: str) -> list[str]:
    """The node or pool of each line of one section of the demo's report."""
    block = report.split(f"\n{section}:\n", 1)[1].split("\n\n", 1)[0]
    if section == "Remediations":
        return re.findall(r"^  - node (\S+) \(", block, re.M)
    return [m.split("/")[-1] for m in re.findall(r"^  - pool (\S+):", block, re.M)]


def test_the_page_renders_in_chromium_with_a_row_for_every_story_of_the_demo(demo: tuple[Path, str]) -> None:
    page, report = demo
    assert page.is_file(), report[-2000:]
    dom = headless("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    rows = re.findall(r'<g class="story (\w+)" data-story="[^"]+" data-outcome="\w+"><text[^>]*>([^<]+)</text>', dom.stdout)
    assert rows, dom.stdout[:2000]
    labels = " ".join(html.unescape(label) for _, label in rows)
    nodes, pools = reported(report, "Remediations"), reported(report, "Migrations")
    assert nodes and pools
    assert [n for n in nodes if n not in labels] == []
    assert [p for p in pools if f"/{p} ->" not in labels] == []
    assert sum(1 for kind, _ in rows if kind == "remediation") == len(nodes)
    assert sum(1 for kind, _ in rows if kind == "migration") == len(pools)


def test_a_screenshot_is_kept_for_a_person_to_look_at(demo: tuple[Path, str]) -> None:
    page, _ = demo
    KEEP.mkdir(parents=True, exist_ok=True)
    shot = KEEP / "demo-timeline.png"
    shot.unlink(missing_ok=True)
    done = headless(f"--screenshot={shot}", "--window-size=1480,900", page.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a blank page compresses to far less
    shutil.copy(page, KEEP / "demo-timeline.html")
