"""Derive the REST definitions the app writes against from the Azure SDK's generated models.

The SDK's models are generated from Azure/azure-rest-api-specs (TypeSpec for Microsoft.ContainerService:
specification/containerservice/resource-manager/Microsoft.ContainerService/aks), one api-version per
package version, and carry what a request needs to know of each property: its wire name, its JSON
type, its enum values, its visibility (``["read"]`` is the spec's read-only, ``["read", "create"]`` its
create-only) and whether it is required. Walking them gives one JSON file per api-version
(``containerservice-<api-version>.json`` beside this module), which the app loads at run time:
the deployed app carries one SDK version (requirements.txt), the preview api-version's models come
from the SDK's beta release of that api-version (requirements-sdk-preview.txt), and
tests/unit/test_aks_definitions.py derives both again and fails when a file is stale.

Run: ``python -m shared.kernel.definitions.derive [--out-dir DIR]`` with the SDK to walk on ``sys.path``
(the Makefile's ``aks-definitions`` target runs it once per SDK). Only ever run at development and test
time; nothing in the app imports this module.
"""

from __future__ import annotations

import argparse
import datetime
import enum
import importlib
import json
import sys
import typing
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# The models the app sends or reads on Microsoft.ContainerService (the AgentPool resource and its
# properties; deleteMachines' body; maintenance configurations and machines, which the app reads).
CONTAINERSERVICE_ROOTS: tuple[str, ...] = (
    "AgentPool", "AgentPoolDeleteMachinesParameter", "MaintenanceConfiguration", "Machine",
)


def _scalar(t: Any) -> dict[str, Any] | None:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", bytes: "bytes",
             datetime.datetime: "datetime", datetime.timedelta: "duration", datetime.date: "date",
             datetime.time: "time"}
    if t is Any or t is object:
        return {"kind": "any"}
    if t in names:
        return {"kind": names[t]}
    return None


class _Walker:
    """Turns SDK model classes into plain type descriptions, one entry per model (recursion by name)."""

    def __init__(self, module: Any) -> None:
        from importlib import import_module

        self.models_module = module
        base = import_module(module.__name__.rsplit(".models", 1)[0] + "._utils.model_base")
        self.model_base = base.Model
        self.rest_field = base._RestField
        self.namespace = dict(vars(module))
        self.namespace["_models"] = module
        self.namespace.update({"Optional": typing.Optional, "Union": typing.Union, "Any": Any,
                               "List": list, "Dict": dict, "Literal": typing.Literal})
        self.models: dict[str, Any] = {}

    def _resolve(self, t: Any) -> Any:
        if isinstance(t, str):
            t = eval(t, self.namespace)
        if isinstance(t, typing.ForwardRef):
            t = eval(t.__forward_arg__, self.namespace)
        return t

    def type_of(self, t: Any) -> tuple[dict[str, Any], bool]:
        """(the type description, whether None is allowed)."""
        t = self._resolve(t)
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is typing.Union:
            members = [self._resolve(a) for a in args]
            optional = type(None) in members
            members = [a for a in members if a is not type(None)]
            enums = [a for a in members if isinstance(a, type) and issubclass(a, enum.Enum)]
            if enums:
                # Union[str, SomeEnum]: an extensible enum (the spec's x-ms-enum modelAsString); its known values.
                return {"kind": "enum", "values": sorted(str(e.value) for e in enums[0])}, optional
            if len(members) == 1:
                return self.type_of(members[0])[0], optional
            return {"kind": "union", "of": [self.type_of(a)[0] for a in members]}, optional
        if origin is typing.Literal:
            return {"kind": "enum", "values": sorted(str(a) for a in args)}, False
        if origin in (list, typing.List):  # noqa: UP006
            return {"kind": "array", "items": self.type_of(args[0])[0]}, False
        if origin in (dict, typing.Dict):  # noqa: UP006
            return {"kind": "map", "values": self.type_of(args[1])[0]}, False
        if isinstance(t, type) and issubclass(t, enum.Enum):
            return {"kind": "enum", "values": sorted(str(e.value) for e in t)}, False
        if isinstance(t, type) and issubclass(t, self.model_base):
            self.model(t)
            return {"kind": "model", "name": t.__name__}, False
        scalar = _scalar(t)
        if scalar is None:
            raise TypeError(f"no JSON type for SDK annotation {t!r}")
        return scalar, False

    def model(self, cls: type) -> None:
        name = cls.__name__
        if name in self.models:
            return
        self.models[name] = None  # recursion guard (ErrorDetail.details is a list of ErrorDetail)
        mros = [c for c in cls.__mro__ if isinstance(c, type) and issubclass(c, self.model_base)
                and c is not self.model_base][::-1]
        fields: dict[str, Any] = {}
        annotations: dict[str, Any] = {}
        for c in mros:
            annotations.update(getattr(c, "__annotations__", {}))
            for attr, value in vars(c).items():
                if not attr.startswith("_") and isinstance(value, self.rest_field):
                    fields[attr] = value
        properties: dict[str, Any] = {}
        for attr, rf in fields.items():
            if getattr(rf, "_is_discriminator", False):
                continue
            description, optional = self.type_of(annotations[attr])
            wire = rf._rest_name_input or attr
            properties[wire] = {"type": description, "visibility": list(rf._visibility or []),
                                "required": not optional}
        self.models[name] = {"properties": dict(sorted(properties.items()))}


def derive(package: str, roots: tuple[str, ...]) -> dict[str, Any]:
    """The definitions of ``roots`` (model names) in the installed SDK ``package`` (``azure.mgmt.x``)."""
    models = importlib.import_module(package + ".models")
    config = importlib.import_module(package + "._configuration")
    version = importlib.import_module(package + "._version").VERSION
    walker = _Walker(models)
    for root in roots:
        walker.model(getattr(models, root))
    return {
        "apiVersion": _default_api_version(config),
        "derivedFrom": f"{package.replace('.', '-')}=={version} (models generated from Azure/azure-rest-api-specs)",
        "roots": list(roots),
        "models": dict(sorted(walker.models.items())),
    }


def _default_api_version(config: Any) -> str:
    """The api-version the SDK sends unless told otherwise (its configuration's default)."""
    import inspect

    source = inspect.getsource(config)
    marker = 'kwargs.pop("api_version", "'
    if marker not in source:
        return ""  # an SDK of several api-versions (azure-mgmt-compute): each operation sends its own
    start = source.index(marker) + len(marker)
    return source[start: source.index('"', start)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--stdout", action="store_true", help="print instead of writing the file")
    args = parser.parse_args(argv)
    data = derive("azure.mgmt.containerservice", CONTAINERSERVICE_ROOTS)
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    if args.stdout:
        sys.stdout.write(text)
        return 0
    path = args.out_dir / f"containerservice-{data['apiVersion']}.json"
    path.write_text(text)
    print(f"wrote {path} ({len(data['models'])} models, {data['derivedFrom']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
