"""What `azd deploy` packages is the function app and only the function app.

azure.yaml deploys the repository root; Flex Consumption builds requirements.txt remotely. The
simulator, the local host, the tests, local settings and virtualenvs must stay out of the package
(.funcignore), both for size and because local.settings.json may hold a developer's values.
"""

from __future__ import annotations

import fnmatch

import pytest
import yaml
from infra_facts import REPO, FactError

MUST_NOT_SHIP = [".venv/", "tests/", "sim/", "devhost/", "devstack/", "local.settings.json", "infra/"]


def funcignore_patterns() -> list[str]:
    path = REPO / ".funcignore"
    if not path.exists():
        raise FactError(".funcignore does not exist: azd would ship the simulator, the tests and local settings")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        bare = pattern.strip("/")
        if fnmatch.fnmatch(relative.rstrip("/"), bare) or relative.startswith(bare + "/") \
                or fnmatch.fnmatch(relative.split("/")[0], bare):
            return True
    return False


def test_the_service_azd_deploys_is_the_function_app_at_the_top_level() -> None:
    azure = yaml.safe_load((REPO / "azure.yaml").read_text(encoding="utf-8"))
    root = REPO / azure["services"]["api"]["project"]
    for name in ("function_app.py", "host.json", "requirements.txt"):
        assert (root / name).is_file(), f"{name} is missing from the deployed folder"


@pytest.mark.parametrize("path", MUST_NOT_SHIP)
def test_funcignore_keeps_local_only_files_out_of_the_package(path: str) -> None:
    assert ignored(path, funcignore_patterns()), f".funcignore does not exclude {path}"


@pytest.mark.parametrize("path", ["function_app.py", "host.json", "requirements.txt", "constraints.txt",
                                  "shared/settings.py", "functions/remediation.py"])
def test_funcignore_ships_the_app(path: str) -> None:
    assert not ignored(path, funcignore_patterns()), f".funcignore excludes {path}, which the app needs"


def test_the_deployed_requirements_are_pinned() -> None:
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    requirements = [line for line in lines if line and not line.startswith("-")]
    assert requirements
    assert all("==" in line for line in requirements), [r for r in requirements if "==" not in r]
    assert any(r.startswith("azure-functions==") for r in requirements)
