"""What each Microsoft.ContainerService api-version the app speaks says an AgentPool (and the other
bodies it sends or reads) may carry: property names at every depth, JSON types, enum values,
read-only and create-only properties, required ones.

The files beside this module are derived from the Azure SDK's generated models
(:mod:`shared.kernel.definitions.derive`; tests/unit/test_aks_definitions.py derives them again and fails
when one is stale), which are generated from Azure/azure-rest-api-specs
specification/containerservice/resource-manager/Microsoft.ContainerService/aks. They answer the questions
a write must ask before it is sent: which api-version can carry every property of this body
(:func:`api_version_for`; a PUT on a version that lacks a property does not write it), and is this body
valid for that version (:meth:`Definitions.problems`: unknown names, wrong types, unknown enum values,
read-only properties sent, required ones missing).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

STABLE_API_VERSION = "2026-08-01"
"""The api-version of the installed azure-mgmt-containerservice (requirements.txt); the app's default."""

PREVIEW_API_VERSION = "2026-08-02-preview"
"""The newest preview api-version (azure-mgmt-containerservice 41.9.0b1, requirements-sdk-preview.txt): it has
``gpuProfile.nvidia.migStrategy``/``migProfiles``/``driverMode``, ``gpuProfile.driverType``, kubelet eviction
thresholds and reserved resources, ``nodeInitializationTaints``, ``preparedImageSpecificationProfile``..."""

API_VERSIONS: tuple[str, ...] = (STABLE_API_VERSION, PREVIEW_API_VERSION)
"""Every api-version the app may write on, in order of preference (a stable version first)."""

POOL_PROPERTIES = "AgentPoolManagedClusterAgentPoolProfileProperties"
"""The model of an AgentPool's ``properties``."""


@dataclass(frozen=True)
class Prop:
    """One property of a model: its wire name, JSON type, visibility and whether it is required."""

    name: str
    type: Mapping[str, Any]
    visibility: tuple[str, ...]
    required: bool

    @property
    def read_only(self) -> bool:
        """The spec's ``readOnly`` (TypeSpec ``@visibility(Lifecycle.Read)``): ARM sets it, a request never carries it."""
        return tuple(self.visibility) == ("read",)

    @property
    def create_only(self) -> bool:
        """Written at creation and never changed after (``x-ms-mutability: [read, create]``)."""
        return "create" in self.visibility and "update" not in self.visibility


class Definitions:
    """The models of one api-version."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.api_version: str = str(data["apiVersion"])
        self.derived_from: str = str(data.get("derivedFrom", ""))
        self._models: dict[str, dict[str, Prop]] = {
            name: {k: Prop(k, p["type"], tuple(p["visibility"]), bool(p["required"]))
                   for k, p in model["properties"].items()}
            for name, model in data["models"].items()
        }

    def model(self, name: str) -> dict[str, Prop]:
        return self._models[name]

    def has_model(self, name: str) -> bool:
        return name in self._models

    def pool_properties(self) -> dict[str, Prop]:
        """The properties of an AgentPool's ``properties`` object (top level only)."""
        return self._models[POOL_PROPERTIES]

    # ---------------------------------------------------------------- paths

    def paths(self, model: str = POOL_PROPERTIES) -> Iterator[tuple[str, Prop]]:
        """Every property reachable from ``model``, by dotted path (``[]`` for array items, ``{}`` for map values);
        a model met again below itself is not entered twice."""
        yield from self._paths(model, "", frozenset())

    def _paths(self, model: str, prefix: str, seen: frozenset[str]) -> Iterator[tuple[str, Prop]]:
        for name, prop in self._models[model].items():
            path = prefix + name
            yield path, prop
            yield from self._type_paths(prop.type, path, seen | {model})

    def _type_paths(self, t: Mapping[str, Any], path: str, seen: frozenset[str]) -> Iterator[tuple[str, Prop]]:
        kind = t.get("kind")
        if kind == "model" and t["name"] not in seen:
            yield from self._paths(t["name"], path + ".", seen)
        elif kind == "array":
            yield from self._type_paths(t["items"], path + "[]", seen)
        elif kind == "map":
            yield from self._type_paths(t["values"], path + "{}", seen)

    def unknown(self, value: Mapping[str, Any], model: str = POOL_PROPERTIES) -> list[str]:
        """The paths in ``value`` (a JSON object of ``model``) that this api-version does not have (None = absent)."""
        out: list[str] = []
        self._unknown(value, {"kind": "model", "name": model}, "", out)
        return out

    def _unknown(self, value: Any, t: Mapping[str, Any], path: str, out: list[str]) -> None:
        kind = t.get("kind")
        if kind == "model" and isinstance(value, Mapping):
            props = self._models[t["name"]]
            for key, item in value.items():
                if item is None:
                    continue
                where = f"{path}.{key}" if path else key
                if key not in props:
                    out.append(where)
                else:
                    self._unknown(item, props[key].type, where, out)
        elif kind == "array" and isinstance(value, list):
            for item in value:
                self._unknown(item, t["items"], path + "[]", out)
        elif kind == "map" and isinstance(value, Mapping):
            for item in value.values():
                self._unknown(item, t["values"], path + "{}", out)

    # ---------------------------------------------------------------- validation

    def problems(self, value: Any, model: str = POOL_PROPERTIES, *, request: bool = True) -> list[str]:
        """Why ``value`` is not a valid JSON ``model`` of this api-version ([] = it is).

        ``request``: the body of a request, in which read-only properties are an error (ARM refuses or
        ignores them; the app must never send one) and required ones must be present. A response
        (``request=False``) may carry read-only properties and omit nothing but what is required of it.
        """
        out: list[str] = []
        self._check(value, {"kind": "model", "name": model}, "", out, request=request)
        return out

    def _check(self, value: Any, t: Mapping[str, Any], path: str, out: list[str], *, request: bool) -> None:
        kind = t.get("kind")
        where = path or "(body)"
        if value is None:
            return
        if kind == "model":
            if not isinstance(value, Mapping):
                out.append(f"{where}: expected an object, got {type(value).__name__}")
                return
            props = self._models[t["name"]]
            for key, prop in props.items():
                if prop.required and value.get(key) is None and (request or not prop.read_only):
                    out.append(f"{path + '.' if path else ''}{key}: required")
            for key, item in value.items():
                sub = f"{path}.{key}" if path else key
                if key not in props:
                    if item is not None:
                        out.append(f"{sub}: not a property of {t['name']} in api-version {self.api_version}")
                    continue
                if request and props[key].read_only and item is not None:
                    out.append(f"{sub}: read-only")
                self._check(item, props[key].type, sub, out, request=request)
        elif kind == "array":
            if not isinstance(value, list):
                out.append(f"{where}: expected an array, got {type(value).__name__}")
                return
            for i, item in enumerate(value):
                self._check(item, t["items"], f"{path}[{i}]", out, request=request)
        elif kind == "map":
            if not isinstance(value, Mapping):
                out.append(f"{where}: expected an object (map), got {type(value).__name__}")
                return
            for key, item in value.items():
                self._check(item, t["values"], f"{path}{{{key}}}", out, request=request)
        elif kind == "enum":
            if value not in t["values"]:
                out.append(f"{where}: {value!r} is not one of {', '.join(t['values'])}")
        elif kind == "union":
            if all(_scratch(self, value, option, request) for option in t["of"]):
                out.append(f"{where}: {value!r} matches none of the allowed types")
        else:
            problem = _scalar_problem(value, str(kind))
            if problem:
                out.append(f"{where}: {problem}")

    # ---------------------------------------------------------------- projections

    def keep_known(self, value: Mapping[str, Any], model: str = POOL_PROPERTIES) -> dict[str, Any]:
        """``value`` with every property this api-version does not have removed, at every depth (what a
        server on this api-version shows of a stored object)."""
        return dict(_filter(self, value, {"kind": "model", "name": model}, lambda prop: True))

    def writable(self, value: Mapping[str, Any], model: str = POOL_PROPERTIES) -> dict[str, Any]:
        """``value`` without read-only properties at any depth: what a request may send back of an object it
        read. Properties this api-version does not have are *kept* (a caller that sends them learns of them
        from :func:`api_version_for`, rather than losing them here without a word)."""
        return dict(_filter(self, value, {"kind": "model", "name": model}, lambda prop: not prop.read_only,
                            keep_unknown=True))


def _scratch(defs: Definitions, value: Any, t: Mapping[str, Any], request: bool) -> list[str]:
    out: list[str] = []
    defs._check(value, t, "", out, request=request)
    return out


def _scalar_problem(value: Any, kind: str) -> str:
    if kind == "any":
        return ""
    if kind == "boolean":
        return "" if isinstance(value, bool) else f"expected a boolean, got {value!r}"
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return "" if ok else f"expected an integer, got {value!r}"
    if kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return "" if ok else f"expected a number, got {value!r}"
    # string, datetime, duration, date, time, bytes travel as JSON strings
    return "" if isinstance(value, str) else f"expected a string, got {value!r}"


def _filter(defs: Definitions, value: Any, t: Mapping[str, Any], keep: Any, *, keep_unknown: bool = False) -> Any:
    kind = t.get("kind")
    if kind == "model" and isinstance(value, Mapping):
        props = defs.model(t["name"])
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k not in props:
                if keep_unknown:
                    out[k] = v
            elif keep(props[k]):
                out[k] = _filter(defs, v, props[k].type, keep, keep_unknown=keep_unknown)
        return out
    if kind == "array" and isinstance(value, list):
        return [_filter(defs, v, t["items"], keep, keep_unknown=keep_unknown) for v in value]
    if kind == "map" and isinstance(value, Mapping):
        return {k: _filter(defs, v, t["values"], keep, keep_unknown=keep_unknown) for k, v in value.items()}
    return value


@functools.cache
def definitions(api_version: str) -> Definitions:
    """The definitions of ``api_version`` (one of :data:`API_VERSIONS`); KeyError for one the app does not know."""
    path = HERE / f"containerservice-{api_version}.json"
    if api_version not in API_VERSIONS or not path.is_file():
        raise KeyError(f"no AgentPool definitions for api-version {api_version!r}")
    return Definitions(json.loads(path.read_text()))


def api_version_for(properties: Mapping[str, Any]) -> str | None:
    """The first api-version of :data:`API_VERSIONS` whose AgentPool definition has every property present in
    ``properties`` (at every depth); None when none has them all (:func:`unrepresentable` names them).

    A PUT is create-or-replace, and a server on an api-version that lacks a property neither reads nor
    writes it: sent on such a version, the property is silently not written."""
    for version in API_VERSIONS:
        if not definitions(version).unknown(properties):
            return version
    return None


def pool_property_names() -> frozenset[str]:
    """Every top-level AgentPool property of every api-version the app speaks."""
    return frozenset(name for version in API_VERSIONS for name in definitions(version).pool_properties())


def unrepresentable(properties: Mapping[str, Any]) -> list[str]:
    """The paths of ``properties`` that no api-version the app speaks can carry ([] = one can carry them all)."""
    missing: set[str] | None = None
    for version in API_VERSIONS:
        unknown = set(definitions(version).unknown(properties))
        missing = unknown if missing is None else missing & unknown
    return sorted(missing or ())
