"""The import contracts of .importlinter fail on a forbidden import, and the real tree keeps them.

Issue 12, item 5: functions -> app layer (entrypoints, wiring, settings) -> jobs (independent) ->
drain, fleet -> kernel; adapters import only the kernel and only the app layer imports them;
azure.functions never appears under shared.

Each forbidden import is injected into an emptied copy of the real module layout (layers_lint.copy_layout),
so the test shows the one contract it breaks, and that the others stay kept, whatever state the real code
is in; one more run injects into a full copy of the real code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from layers_lint import (
    CONFIG,
    REPO,
    contract_names,
    copy_layout,
    copy_tree,
    ensure_module,
    inject,
    lint,
    type_only_imports_counted,
)

CONFIG_TEXT = CONFIG.read_text(encoding="utf-8")
TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    {statement}"


@dataclass(frozen=True)
class Forbidden:
    module: str  # where the import is injected
    statement: str
    contract: str  # the contract id it must break
    imported: str  # the module the report must name


CASES = {
    "kernel imports a job": Forbidden("shared.kernel.clock", "import shared.remediation", "layers", "shared.remediation"),
    "a job imports another job": Forbidden(
        "shared.pools.nap", "from shared.migration import policy", "layers", "shared.migration.policy"),
    "operator commands import another job": Forbidden(
        "shared.remediation.commands", "from shared.pools import teams", "layers", "shared.pools.teams"),
    "a job imports the app layer at run time": Forbidden(
        "shared.remediation.health", "from shared.settings import Settings", "layers", "shared.settings"),
    "drain imports fleet": Forbidden("shared.drain.runner", "from shared.fleet import scope", "layers", "shared.fleet.scope"),
    "fleet imports a job": Forbidden("shared.fleet.gpu_sizes", "import shared.pools.teams", "layers", "shared.pools.teams"),
    "kernel imports the app layer": Forbidden("shared.kernel.steps", "import shared.wiring", "layers", "shared.wiring"),
    "an adapter imports a job": Forbidden(
        "shared.adapters.aks", "import shared.pools", "adapters-import-only-the-kernel", "shared.pools"),
    "an adapter imports fleet": Forbidden(
        "shared.adapters.compute", "from shared.fleet import node_fate", "adapters-import-only-the-kernel",
        "shared.fleet.node_fate"),
    "an adapter imports settings": Forbidden(
        "shared.adapters.storage", "from shared.settings import Settings", "adapters-import-only-the-kernel",
        "shared.settings"),
    "a job imports an adapter": Forbidden(
        "shared.migration.plan", "from shared.adapters import aks", "adapters-only-through-ports", "shared.adapters.aks"),
    "the kernel imports an adapter": Forbidden(
        "shared.kernel.nudge", "from shared.adapters.storage import storage_client", "adapters-only-through-ports",
        "shared.adapters.storage"),
    "azure.functions under shared": Forbidden(
        "shared.fleet.scope", "import azure.functions as func", "no-azure-functions-in-shared", "azure.functions"),
    "azure.functions under shared, from-form": Forbidden(
        "shared.entrypoints", "from azure import functions", "no-azure-functions-in-shared", "azure.functions"),
    "a trigger imports a job directly": Forbidden(
        "functions.reconcile", "from shared.remediation import steps", "triggers-are-thin", "shared.remediation.steps"),
}


def _explain(report: object) -> str:
    return f"\n--- lint-imports said ---\n{getattr(report, 'output', report)}"


def test_every_contract_has_a_forbidden_import_case() -> None:
    assert set(contract_names(CONFIG_TEXT)) == {case.contract for case in CASES.values()}


def test_the_emptied_layout_keeps_every_contract(tmp_path: Path) -> None:
    copy_layout(tmp_path)
    report = lint(tmp_path, CONFIG_TEXT)
    assert report.exit_code == 0, _explain(report)
    assert report.status == dict.fromkeys(contract_names(CONFIG_TEXT), "KEPT"), _explain(report)


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, case: Forbidden) -> None:
    copy_layout(tmp_path)
    ensure_module(tmp_path, case.imported)
    line = inject(tmp_path, case.module, case.statement)
    report = lint(tmp_path, CONFIG_TEXT)
    assert report.exit_code == 1, _explain(report)
    assert report.broken() == {case.contract}, _explain(report)
    assert report.reports_import(case.contract, case.module, case.imported, line), _explain(report)


def test_a_type_only_import_of_another_job_passes_lint_but_not_the_type_only_check(tmp_path: Path) -> None:
    copy_layout(tmp_path)
    ensure_module(tmp_path, "shared.migration.policy")
    line = inject(tmp_path, "shared.pools.policy",
                  TYPE_ONLY.format(statement="from shared.migration.policy import MigrationPolicy"))
    lenient = lint(tmp_path, CONFIG_TEXT)
    assert lenient.exit_code == 0, _explain(lenient)
    strict = lint(tmp_path, type_only_imports_counted(CONFIG_TEXT))
    assert strict.broken() == {"layers"}, _explain(strict)
    assert strict.reports_import("layers", "shared.pools.policy", "shared.migration.policy", line), _explain(strict)


def test_settings_may_be_named_in_type_hints_below_the_app_layer(tmp_path: Path) -> None:
    copy_layout(tmp_path)
    for module in ("shared.kernel.context", "shared.remediation.steps", "shared.drain.runner", "shared.adapters.aks"):
        inject(tmp_path, module, TYPE_ONLY.format(statement="from shared.settings import Settings"))
    for config in (CONFIG_TEXT, type_only_imports_counted(CONFIG_TEXT)):
        report = lint(tmp_path, config)
        assert report.exit_code == 0, _explain(report)
        assert set(report.status.values()) == {"KEPT"}, _explain(report)


def test_a_forbidden_import_injected_into_the_real_code_is_reported(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    kernel_line = inject(tmp_path, "shared.kernel.clock", "import shared.remediation")
    adapter_line = inject(tmp_path, "shared.adapters.identity", "import shared.pools")
    report = lint(tmp_path, CONFIG_TEXT)
    assert report.exit_code == 1, _explain(report)
    assert {"layers", "adapters-import-only-the-kernel"} <= report.broken(), _explain(report)
    assert report.reports_import("layers", "shared.kernel.clock", "shared.remediation", kernel_line), _explain(report)
    assert report.reports_import("adapters-import-only-the-kernel", "shared.adapters.identity", "shared.pools",
                                 adapter_line), _explain(report)


# The goal of issue 12: the real tree keeps every contract, with type-only imports counted too
# (except those of shared.settings). These fail until the refactor is done; the report says which import.

def test_the_real_tree_keeps_every_contract() -> None:
    report = lint(REPO, CONFIG_TEXT)
    assert report.status == dict.fromkeys(contract_names(CONFIG_TEXT), "KEPT"), _explain(report)
    assert report.exit_code == 0, _explain(report)


def test_the_real_tree_keeps_every_contract_with_type_only_imports_counted() -> None:
    report = lint(REPO, type_only_imports_counted(CONFIG_TEXT))
    assert report.status == dict.fromkeys(contract_names(CONFIG_TEXT), "KEPT"), _explain(report)
    assert report.exit_code == 0, _explain(report)
