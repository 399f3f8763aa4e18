"""azd 1.23.4 or later is required, in azure.yaml (enforced by azd) and in the deploy guide.

infra/main.parameters.json hands JSON arrays from the azd environment to Bicep ``array``
parameters; that needs azd 1.23.4 or later (issue 11). azure.yaml's ``requiredVersions.azd`` (a
semver range in the azure.yaml v1.0 schema) makes an older azd stop before deploying.
"""

from __future__ import annotations

import json
import re

import yaml
from infra_facts import INFRA, REPO
from packaging.specifiers import SpecifierSet
from packaging.version import Version

MINIMUM = Version("1.23.4")


def required_range() -> SpecifierSet:
    azure = yaml.safe_load((REPO / "azure.yaml").read_text(encoding="utf-8"))
    return SpecifierSet(azure["requiredVersions"]["azd"].replace(" ", ""))


def array_parameters_filled_by_azd() -> list[str]:
    parameters = json.loads((INFRA / "main.parameters.json").read_text(encoding="utf-8"))["parameters"]
    return [name for name, spec in parameters.items() if re.search(r"\$\{[A-Z_]+=\[\]\}", str(spec.get("value")))]


def test_azd_fills_array_parameters() -> None:
    assert array_parameters_filled_by_azd(), "no array parameter comes from azd: the version floor may be relaxed"


def test_azure_yaml_requires_azd_1_23_4_or_later() -> None:
    allowed = required_range()
    assert MINIMUM in allowed
    assert Version("1.23.3") not in allowed and Version("1.11.0") not in allowed


def test_the_guide_states_the_same_azd_version() -> None:
    guide = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "1.23.4" in guide
    assert "1.11 or later" not in guide
