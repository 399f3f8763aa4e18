"""Facts about the code and the infrastructure, read from the files as they are now.

The infrastructure tests compare two sides that must agree: what the code reads, calls and
subscribes to, and what infra/ sets, grants and creates. Both sides are derived here from the
sources (an AST scan of the Python, pycep's parse of the Bicep, YAML/JSON loads), never from a
second hand-kept list, so that a new setting, ARM call or Kubernetes verb in the code fails CI
until the deployment grants or sets it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
SHARED = REPO / "shared"
FUNCTIONS = REPO / "functions"

# Azurite's published, well-known development key: the only key allowed in the repo (devhost/, tests/).
AZURITE_ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

ENV_READERS = frozenset({"env_str", "env_int", "env_float", "env_bool", "env_list", "env_choice"})
_PERCENT_SETTING = re.compile(r"^%([A-Za-z_][A-Za-z0-9_]*)%$")


class FactError(AssertionError):
    """A source could not be read the way the tests need (says which file and why)."""


# ---------------------------------------------------------------------------------------------
# The code side: settings read, defaults, bindings
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingRead:
    """One ``env_*("NAME", default, ...)`` call."""

    name: str
    reader: str
    default: str | None  # rendered the way an app setting would spell it; None = no default given
    where: str


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv, ast.Pow: operator.pow}


def _evaluate(node: ast.AST, names: dict[str, Any]) -> Any:
    """Evaluate a constant expression (literals, module constants, arithmetic); raise KeyError otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_evaluate(e, names) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {_evaluate(k, names): _evaluate(v, names) for k, v in zip(node.keys, node.values, strict=True)
                if k is not None}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, names)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_evaluate(node.left, names), _evaluate(node.right, names))
    raise KeyError(ast.dump(node))


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for stmt in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = list(stmt.targets), stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                with contextlib.suppress(KeyError, TypeError, ValueError, ZeroDivisionError):
                    names[target.id] = _evaluate(value, names)
    return names


def render_setting(value: Any) -> str:
    """How a Python default is written as an app setting (the readers in shared/kernel/env.py invert this)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(render_setting(v) for v in value)
    return str(value)


def _reader_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id in ENV_READERS:
        return func.id
    if isinstance(func, ast.Attribute) and func.attr in ENV_READERS:
        return func.attr
    return None


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def settings_read_by_code() -> dict[str, list[SettingRead]]:
    """Every ``env_*`` call in shared/ (the only place settings are read), by setting name.

    A call whose name is not a string literal is an error: the list could not be derived.
    """
    found: dict[str, list[SettingRead]] = {}
    for path in python_files(SHARED):
        if path.name == "env.py":
            continue  # the readers themselves
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        constants = _module_constants(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            reader = _reader_name(node)
            if reader is None:
                continue
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
                raise FactError(f"{where}: {reader} must be called with a literal setting name")
            name = node.args[0].value
            default_node: ast.expr | None = node.args[1] if len(node.args) > 1 else None
            for kw in node.keywords:
                if kw.arg == "default":
                    default_node = kw.value
            required = any(kw.arg == "required" and isinstance(kw.value, ast.Constant) and kw.value.value
                           for kw in node.keywords)
            default: str | None
            if default_node is None or required:
                default = None
            else:
                try:
                    default = render_setting(_evaluate(default_node, constants))
                except (KeyError, TypeError, ValueError, ZeroDivisionError):
                    raise FactError(f"{where}: the default of {name} is not a constant expression "
                                    f"(a literal or a module-level constant)") from None
            found.setdefault(name, []).append(SettingRead(name, reader, default, where))
    return found


def code_setting_names() -> set[str]:
    return set(settings_read_by_code())


def code_default(name: str) -> str | None:
    """The one default the code uses for ``name``; different defaults in two places is an error."""
    reads = settings_read_by_code()[name]
    defaults = {r.default for r in reads}
    if len(defaults) > 1:
        raise FactError(f"setting {name} is read with different defaults: "
                        + ", ".join(f"{r.where}={r.default!r}" for r in reads))
    return defaults.pop()


@dataclass(frozen=True)
class Binding:
    function_file: str
    decorator: str
    arguments: dict[str, str]


def _decorator_calls() -> Iterator[tuple[Path, ast.Call]]:
    for path in [*python_files(FUNCTIONS), REPO / "function_app.py"]:
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute):
                        yield path, dec


@functools.cache
def bindings() -> list[Binding]:
    """Every trigger/binding decorator in functions/ with its literal string arguments."""
    out = []
    for path, call in _decorator_calls():
        assert isinstance(call.func, ast.Attribute)
        args = {kw.arg: kw.value.value for kw in call.keywords
                if kw.arg and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)}
        out.append(Binding(str(path.relative_to(REPO)), call.func.attr, args))
    return out


def binding_setting_names() -> set[str]:
    """``%SETTING%`` names used in binding arguments (queue names, schedules)."""
    names = set()
    for binding in bindings():
        for value in binding.arguments.values():
            match = _PERCENT_SETTING.match(value)
            if match:
                names.add(match.group(1))
    return names


def binding_connections() -> dict[str, set[str]]:
    """Connection prefix -> the binding kinds that use it (``queue``, ``blob``, ``table``, ...)."""
    out: dict[str, set[str]] = {}
    for binding in bindings():
        connection = binding.arguments.get("connection")
        if connection:
            kind = binding.decorator.split("_")[0]
            out.setdefault(connection, set()).add(kind)
    return out


def function_names() -> dict[str, str]:
    """Function name -> trigger decorator (``queue_trigger``, ``event_grid_trigger``, ...)."""
    out: dict[str, str] = {}
    for path in python_files(FUNCTIONS):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            name, trigger = node.name, None
            for dec in node.decorator_list:
                if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)):
                    continue
                if dec.func.attr == "function_name" and dec.args and isinstance(dec.args[0], ast.Constant):
                    name = str(dec.args[0].value)
                elif dec.func.attr.endswith("_trigger"):
                    trigger = dec.func.attr
            if trigger:
                out[name] = trigger
    return out


# ---------------------------------------------------------------------------------------------
# The infrastructure side: Bicep (pycep), manifests
# ---------------------------------------------------------------------------------------------


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


@functools.cache
def parse_bicep(path: Path) -> dict[str, Any]:
    from pycep import BicepParser

    result: dict[str, Any] = BicepParser().parse(file_path=path)
    return result


def bicep(relative: str) -> dict[str, Any]:
    path = INFRA / relative
    if not path.exists():
        raise FactError(f"infra/{relative} does not exist")
    return parse_bicep(path)


def variable(doc: dict[str, Any], name: str) -> Any:
    try:
        return doc["variables"][name]["value"]
    except KeyError:
        raise FactError(f"the Bicep file has no variable {name!r}") from None


def resource(doc: dict[str, Any], name: str) -> dict[str, Any]:
    try:
        res: dict[str, Any] = doc["resources"][name]
    except KeyError:
        raise FactError(f"the Bicep file has no resource {name!r}") from None
    return res


def resources_of_type(doc: dict[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in doc.get("resources", {}).items() if v["type"].lower() == type_.lower()}


def resource_body(res: dict[str, Any]) -> dict[str, Any]:
    """A resource's properties, looking through pycep's wrapping of loops and conditions."""
    config: dict[str, Any] = res["config"]
    while "loop_type" in config or ("condition" in config and "config" in config):
        config = config["config"]
    return config


def resolve(doc: dict[str, Any], value: Any) -> Any:
    """Resolve a bare identifier to the parameter default or variable value it names.

    pycep spells an identifier reference as a plain string, like a literal; an identifier that
    names a parameter (with a default) or a variable of ``doc`` is taken as the reference.
    """
    seen = set()
    while isinstance(value, str) and value not in seen:
        seen.add(value)
        params = doc.get("parameters", {})
        variables = doc.get("variables", {})
        if value in params and params[value].get("default") is not None:
            value = params[value]["default"]
        elif value in variables:
            value = variables[value]["value"]
        else:
            break
    return value


def is_literal(value: Any) -> bool:
    """A plain value, not a pycep function/operator node and without interpolation."""
    if isinstance(value, dict):
        return not ({"function", "operator"} & set(value)) and all(is_literal(v) for v in value.values())
    if isinstance(value, list):
        return all(is_literal(v) for v in value)
    if isinstance(value, str):
        return "${" not in value
    return True


@functools.cache
def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    import yaml

    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def read_json(path: Path) -> Any:
    if not path.exists():
        raise FactError(f"{path.relative_to(REPO)} does not exist (it is needed to check the infrastructure)")
    return json.loads(path.read_text(encoding="utf-8"))
