"""`make lint` runs ruff, import-linter and mypy, CI runs it, and the tools are pinned as the other dev tools are.

Dev tools are pinned in requirements-dev.txt and kept out of constraints.txt, which locks only what the
function app deploys (tests/infra/test_infra_requirements_lock.py); `make venv` installs
requirements-dev.txt, so a fresh CI machine has the tools before `make lint` runs them.
"""

from __future__ import annotations

import configparser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
TOOLS = ["import-linter", "mypy"]


def dev_requirements() -> dict[str, Requirement]:
    out: dict[str, Requirement] = {}
    for line in (REPO / "requirements-dev.txt").read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text and not text.startswith("-"):
            requirement = Requirement(text)
            out[canonicalize_name(requirement.name)] = requirement
    return out


def deployed_lock() -> set[str]:
    lines = (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines()
    return {canonicalize_name(line.split("==")[0]) for line in lines if line.strip() and not line.startswith("#")}


def make_recipe(target: str) -> list[str]:
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


@pytest.mark.parametrize("tool", TOOLS)
def test_the_tool_is_pinned_for_development_and_installed_at_that_version(tool: str) -> None:
    requirement = dev_requirements().get(tool)
    assert requirement is not None, f"{tool} is not in requirements-dev.txt"
    [spec] = list(requirement.specifier)
    assert spec.operator == "==", f"{requirement} is not pinned"
    assert metadata.version(tool) == spec.version, f"the venv has {tool} {metadata.version(tool)}, not {spec.version}"
    assert canonicalize_name(tool) not in deployed_lock(), f"{tool} is a dev tool: it does not belong in constraints.txt"


def test_make_lint_runs_ruff_the_import_contracts_and_mypy_on_shared_and_realkube() -> None:
    assert make_recipe("lint") == [
        "$(PY) -m ruff check .",
        "$(VENV)/bin/lint-imports --no-cache",
        "$(PY) -m mypy shared realkube",
    ]
    assert (REPO / "Makefile").read_text(encoding="utf-8").count("\nlint: $(STAMP)\n") == 1


def test_ci_lints_before_it_tests() -> None:
    commands = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert "make lint" in commands
    assert commands.index("make lint") < commands.index("make test")


def test_ci_runs_the_real_control_plane_lane_after_the_tests() -> None:
    commands = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands.index("make test") < commands.index("make test-realkube")


def test_mypy_is_configured_for_python_3_11_with_unused_ignores_reported() -> None:
    parser = configparser.ConfigParser()
    parser.read(REPO / "mypy.ini", encoding="utf-8")
    assert parser["mypy"]["python_version"] == "3.11"
    assert parser.getboolean("mypy", "check_untyped_defs")
    assert parser.getboolean("mypy", "warn_unused_ignores")
    assert not parser.getboolean("mypy", "ignore_missing_imports", fallback=False), "only per SDK, never global"
    assert {section for section in parser.sections() if parser.getboolean(section, "ignore_missing_imports",
                                                                           fallback=False)} == {"mypy-yaml"}


def test_ci_runs_the_browser_lane_after_the_tests() -> None:
    commands = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands.index("make test") < commands.index("make test-browser")
    assert "tests/browser" in (REPO / "Makefile").read_text(encoding="utf-8")
