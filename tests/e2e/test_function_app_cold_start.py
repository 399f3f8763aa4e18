"""A cold start pays only for what it runs: importing the app must not import the heavy SDKs.

The Functions worker imports ``function_app`` and indexes its functions before the first
invocation; on Flex Consumption that is on the cold-start path of every new instance. The ARM,
Kubernetes, identity, Event Grid and Table SDKs take seconds and tens of MiB to import, so the
entry points import them on first use (shared/entrypoints.py). This is checked structurally, in a
fresh interpreter, by looking at ``sys.modules``; timing is measured and reported elsewhere, never
asserted (it depends on the machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("azure.mgmt", "kubernetes", "azure.identity", "azure.eventgrid", "azure.data.tables")

PROBE = """
import json, sys
import function_app
{after}
heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in {heavy!r}))
print(json.dumps(heavy))
"""


def _heavy_modules_after(after: str) -> list[str]:
    code = PROBE.format(after=after, heavy=HEAVY)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("after", [
    pytest.param("", id="importing-function-app"),
    pytest.param("function_app.app.get_functions()", id="indexing-its-functions-as-the-worker-does"),
])
def test_importing_the_function_app_imports_none_of_the_heavy_sdks(after: str) -> None:
    assert _heavy_modules_after(after) == []


def test_the_probe_sees_a_heavy_sdk_once_something_imports_it() -> None:
    assert "azure.data.tables" in _heavy_modules_after("import azure.data.tables")
