"""The deploy guide covers what the deployment actually reads and runs.

docs/deploy.md is the newcomer's path from an empty subscription to a running app; it must
explain every azd environment value the Bicep parameters read, and every script it tells people to
run must exist.
"""

from __future__ import annotations

import re

import pytest
from infra_facts import INFRA, REPO

GUIDE = REPO / "docs" / "deploy.md"
SET_BY_AZD = {"AZURE_ENV_NAME", "AZURE_LOCATION"}


def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def azd_environment_values() -> set[str]:
    text = (INFRA / "main.parameters.json").read_text(encoding="utf-8")
    return set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))


@pytest.mark.parametrize("name", sorted(azd_environment_values() - SET_BY_AZD))
def test_the_guide_explains_each_azd_environment_value(name: str) -> None:
    assert f"`{name}`" in guide(), f"docs/deploy.md does not explain {name}"


@pytest.mark.parametrize("script", sorted(set(re.findall(r"scripts/[a-z0-9-]+\.(?:sh|ps1)",
                                                           GUIDE.read_text(encoding="utf-8")))))
def test_every_script_the_guide_mentions_exists(script: str) -> None:
    assert (REPO / script).is_file()


@pytest.mark.parametrize("topic", ["azd up", "Adding a cluster to the fleet", "Pausing the app",
                                   "Rolling back a deployment", "func start", "azd down"])
def test_the_guide_covers_each_step_of_the_issue(topic: str) -> None:
    assert topic in guide()
