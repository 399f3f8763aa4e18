"""Every Bicep file parses, and the files hang together (modules, parameters, names).

The Bicep compiler cannot be installed here, so pycep-parser stands in for `bicep build`: a syntax
error, a module path that does not exist, or an azd parameter that main.bicep does not declare
would otherwise only show up at `azd up`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from infra_facts import INFRA, REPO, bicep, bicep_files, parse_bicep

BICEP_FILES = bicep_files()


def test_the_infrastructure_has_the_files_azd_needs() -> None:
    for relative in ("main.bicep", "main.parameters.json", "abbreviations.json"):
        assert (INFRA / relative).is_file(), f"infra/{relative} is missing"
    assert (REPO / "azure.yaml").is_file(), "azure.yaml is missing at the top level"
    assert len(BICEP_FILES) >= 8


@pytest.mark.parametrize("path", BICEP_FILES, ids=[str(p.relative_to(INFRA)) for p in BICEP_FILES])
def test_every_bicep_file_parses(path: Path) -> None:
    doc = parse_bicep(path)
    assert doc.get("resources") or doc.get("modules"), f"{path.name} declares nothing"


@pytest.mark.parametrize("path", BICEP_FILES, ids=[str(p.relative_to(INFRA)) for p in BICEP_FILES])
def test_every_module_a_bicep_file_uses_exists(path: Path) -> None:
    for name, module in parse_bicep(path).get("modules", {}).items():
        assert module["type"] == "local", f"{path.name}: module {name} is not a local file (registries are unreachable offline)"
        target = (path.parent / module["detail"]["path"]).resolve()
        assert target.is_file(), f"{path.name}: module {name} points at {module['detail']['path']}, which does not exist"


@pytest.mark.parametrize("path", BICEP_FILES, ids=[str(p.relative_to(INFRA)) for p in BICEP_FILES])
def test_every_module_is_given_the_parameters_it_requires_and_no_others(path: Path) -> None:
    for name, module in parse_bicep(path).get("modules", {}).items():
        target = parse_bicep((path.parent / module["detail"]["path"]).resolve())
        config = module["config"]
        while "loop_type" in config or ("condition" in config and "config" in config):
            config = config["config"]
        given = set(config.get("params", {}))
        declared = target.get("parameters", {})
        required = {p for p, spec in declared.items() if spec.get("default") is None}
        assert required <= given, f"{path.name}: module {name} misses {sorted(required - given)}"
        assert given <= set(declared), f"{path.name}: module {name} passes unknown {sorted(given - set(declared))}"


def test_azd_parameters_name_parameters_of_main_bicep() -> None:
    parameters = json.loads((INFRA / "main.parameters.json").read_text(encoding="utf-8"))["parameters"]
    declared = bicep("main.bicep")["parameters"]
    assert set(parameters) <= set(declared), sorted(set(parameters) - set(declared))
    required = {p for p, spec in declared.items() if spec.get("default") is None}
    assert required <= set(parameters), f"azd cannot fill {sorted(required - set(parameters))}"


def test_main_bicep_deploys_at_subscription_scope_with_a_resource_group() -> None:
    doc = bicep("main.bicep")
    assert doc["globals"]["scope"]["value"] == "subscription"
    groups = [r for r in doc["resources"].values() if r["type"] == "Microsoft.Resources/resourceGroups"]
    assert len(groups) == 1


def test_every_abbreviation_main_bicep_uses_is_defined() -> None:
    abbreviations = json.loads((INFRA / "abbreviations.json").read_text(encoding="utf-8"))
    used = set(re.findall(r"abbrs\.([A-Za-z]+)", (INFRA / "main.bicep").read_text(encoding="utf-8")))
    assert used, "main.bicep names no resource with an abbreviation"
    assert used <= set(abbreviations), sorted(used - set(abbreviations))


def test_a_malformed_bicep_file_is_rejected_by_the_parser(tmp_path: Path) -> None:
    broken = tmp_path / "broken.bicep"
    broken.write_text("resource x 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: 'a'\n", encoding="utf-8")
    with pytest.raises(Exception):  # noqa: B017 - lark's error type is an implementation detail
        parse_bicep(broken)
