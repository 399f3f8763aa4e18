"""The deployed dependencies are complete and pinned all the way down, as the tests ran them.

requirements.txt must name every third-party package the deployed code imports (PyYAML was
missing: it only arrived through kubernetes), and constraints.txt (``-c`` from requirements.txt)
must pin the whole dependency closure at the versions installed in the venv, so the Flex
Consumption remote build installs what CI tested. The closure is recomputed here from the installed
distributions (tests/infra/requirements_lock.py), never from a second hand-kept list.
"""

from __future__ import annotations

import ast
import sys
from importlib import metadata

import pytest
from infra_facts import FUNCTIONS, REPO, SHARED, python_files
from packaging.utils import canonicalize_name
from requirements_lock import CONSTRAINTS, closure, read_constraints, render, top_level

DEPLOYED_CODE = [*python_files(SHARED), *python_files(FUNCTIONS), REPO / "function_app.py"]
FIRST_PARTY = {"shared", "functions", "function_app"}


def imported_top_level_modules() -> dict[str, str]:
    """Top-level module -> the first file importing it, over the deployed code (lazy imports included)."""
    out: dict[str, str] = {}
    for path in DEPLOYED_CODE:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                out.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return out


def distributions_of(module: str) -> set[str]:
    return {canonicalize_name(d) for d in metadata.packages_distributions().get(module, [])}


def test_every_third_party_module_the_deployed_code_imports_is_a_direct_requirement() -> None:
    declared = set(top_level())
    missing = {}
    for module, where in imported_top_level_modules().items():
        if module in FIRST_PARTY or module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = distributions_of(module)
        assert dists, f"{module} (imported by {where}) is not installed"
        if not dists & declared:
            missing[module] = (where, sorted(dists))
    assert not missing, f"imported by the app but not in requirements.txt: {missing}"


def test_requirements_txt_applies_the_constraints_file() -> None:
    lines = [line.strip() for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    assert "-c constraints.txt" in lines
    assert CONSTRAINTS.is_file()


def test_every_requirement_is_pinned_in_the_lock_at_the_same_version() -> None:
    pins = read_constraints()
    for name, requirement in top_level().items():
        [spec] = list(requirement.specifier)
        assert spec.operator == "==", f"{requirement} is not pinned"
        assert pins.get(name) == spec.version, f"{name}: requirements.txt {spec.version}, constraints.txt {pins.get(name)}"


def test_the_lock_pins_exactly_the_installed_closure_of_the_deployed_requirements() -> None:
    pins = read_constraints()
    installed = closure()
    assert set(pins) == set(installed), (f"in the lock but not needed: {sorted(set(pins) - set(installed))}; "
                                         f"needed but not locked: {sorted(set(installed) - set(pins))}")
    stale = {name: (pins[name], version) for name, version in installed.items() if pins[name] != version}
    assert not stale, f"lock version != installed version: {stale} (regenerate: tests/infra/requirements_lock.py)"
    assert CONSTRAINTS.read_text(encoding="utf-8") == render(installed)


@pytest.mark.parametrize("name", ["pip", "setuptools", "wheel", "pytest", "ruff", "hypothesis", "croniter"])
def test_tools_and_test_only_packages_are_not_in_the_deployed_lock(name: str) -> None:
    assert canonicalize_name(name) not in read_constraints()


def test_the_venv_is_rebuilt_when_the_lock_changes() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    [rule] = [line for line in makefile.splitlines() if line.startswith("$(STAMP):")]
    assert {"requirements.txt", "requirements-dev.txt", "constraints.txt"} <= set(rule.split(":", 1)[1].split())
