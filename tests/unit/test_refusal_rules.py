"""Every refusal code the steward can produce has a rule an operator can read (shared.remediation.refusals).

Derived, not listed: the codes are found in the code itself, as the first argument of every
``Admission.refuse`` / ``Verdict.refuse`` call and the code argument of every admission ``refuse(ctx, info, CODE,
...)`` call under shared/, resolved to their values. A new refusal without a rule fails here.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from shared.remediation import health
from shared.remediation.refusals import RULES, SKIP_RULES, explain

ROOT = Path(__file__).resolve().parents[2]


def _value(node: ast.expr, module: str) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = {"budget": "shared.remediation.budget", "node_truth": "shared.fleet.node_truth"}.get(node.value.id)
        return getattr(importlib.import_module(owner), node.attr) if owner else None
    if isinstance(node, ast.Name):
        mod = importlib.import_module(module)
        found = getattr(mod, node.id, None)
        return found if isinstance(found, str) else None
    return None


def produced_codes() -> dict[str, str]:
    """code -> where it is produced."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "shared").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            arg = None
            if isinstance(func, ast.Attribute) and func.attr == "refuse" and isinstance(func.value, ast.Name) \
                    and func.value.id in ("Admission", "Verdict", "cls") and node.args:
                arg = node.args[0]
            elif isinstance(func, ast.Name) and func.id == "refuse" and len(node.args) >= 3:
                arg = node.args[2]
            if arg is None:
                continue
            value = _value(arg, module)
            if value is not None:
                found[value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_every_refusal_code_in_the_code_has_a_rule() -> None:
    codes = produced_codes()
    assert len(codes) >= 10, codes  # the scan finds the budget's and the trust checks' codes
    missing = {code: where for code, where in codes.items() if code not in RULES}
    assert missing == {}, "add a RefusalRule to shared.remediation.refusals.RULES for each"


def test_every_skip_of_the_sweep_has_a_rule_and_no_other() -> None:
    skips = {value for name, value in vars(health).items() if name.startswith("SKIP_") and isinstance(value, str)}
    assert len(skips) >= 7, skips
    assert set(SKIP_RULES) == skips


def test_a_skip_code_and_a_refusal_code_never_share_a_name() -> None:
    assert set(SKIP_RULES).isdisjoint(RULES)


def test_every_rule_says_what_would_have_to_change() -> None:
    assert all(rule.rule and rule.to_repair for rule in [*RULES.values(), *SKIP_RULES.values()])


def test_an_unknown_code_is_said_to_be_unknown_not_guessed() -> None:
    rule = explain("SomethingNew")
    assert "'SomethingNew'" in rule.rule and rule.passes is False
