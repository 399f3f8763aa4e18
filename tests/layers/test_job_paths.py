"""Each job's path from its trigger to its first ARM or Kubernetes call, as docs/architecture.md draws it.

The page lists, per job, the files a reader crosses (``path <job>:`` then one ``N. file `symbol` ...``
line each). These tests hold the page to the code: every file exists and defines the symbol named
on its line; each file reaches the next either by importing it (at module level or lazily inside a
function) or, where the core reaches an adapter through a port (the jobs never import adapters), by
calling the next line's symbol; the path ends in an adapter (the code that makes the call); and no
path crosses more than :data:`MAX_FILES` files (issue 12: a job readable in one sitting).
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
MAX_FILES = 8
JOBS = ("pool-request", "remediation", "health-events", "health-sweep", "migration", "reconcile")


def _paths() -> dict[str, list[tuple[str, str]]]:
    """job -> [(file, symbol)] in the order a reader follows them."""
    paths: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in PAGE.read_text().splitlines():
        head = re.match(r"^path (?P<job>[\w-]+):", line.strip())
        if head:
            current = paths.setdefault(head["job"], [])
            continue
        step = re.match(r"^\s*\d+\.\s+(?P<file>[\w/]+\.py)\s+`(?P<symbol>[\w.]+)`", line)
        if current is not None and step:
            current.append((step["file"], step["symbol"]))
        elif current is not None and line.strip() and not step:
            current = None
    return paths


def _module_of(path: str) -> str:
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imported_modules(path: str) -> set[str]:
    """Every module the file imports, anywhere in it (lazy imports inside functions count)."""
    tree = ast.parse((REPO / path).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_page_draws_a_path_for_every_job() -> None:
    assert set(_paths()) >= set(JOBS), f"docs/architecture.md lacks a path for {sorted(set(JOBS) - set(_paths()))}"


def _defines(path: str, symbol: str) -> bool:
    name = symbol.rsplit(".", 1)[-1]
    tree = ast.parse((REPO / path).read_text())
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == name
               for n in ast.walk(tree))


def _calls(path: str, symbol: str) -> bool:
    name = symbol.rsplit(".", 1)[-1]
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == name) or (isinstance(func, ast.Name) and func.id == name):
                return True
    return False


@pytest.mark.parametrize("job", JOBS)
def test_a_jobs_path_is_short_real_and_ends_in_an_adapter(job: str) -> None:
    steps = _paths().get(job, [])
    assert steps, f"no path drawn for {job}"
    files = [f for f, _ in steps]
    assert len(files) <= MAX_FILES, f"{job} crosses {len(files)} files (at most {MAX_FILES}): {files}"
    assert files[0].startswith("functions/"), f"{job}'s path starts at its trigger, not {files[0]}"
    assert files[-1].startswith("shared/adapters/"), f"{job}'s path ends where the call is made, not {files[-1]}"
    for path, symbol in steps:
        assert (REPO / path).is_file(), f"{job}: {path} does not exist"
        assert path.startswith("functions/") or _defines(path, symbol), f"{job}: {path} defines no {symbol}"
    for (here, _), (there, symbol) in itertools.pairwise(steps):
        imports = _module_of(there) in _imported_modules(here)
        assert imports or _calls(here, symbol), f"{job}: {here} neither imports {_module_of(there)} nor calls {symbol}"
