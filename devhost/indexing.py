"""Find the app's functions and their bindings the way the Python worker indexes them.

The worker imports ``function_app``, takes the single ``FunctionRegister`` (``func.FunctionApp``) it
finds there, and reads each function's trigger and bindings from the decorators. We do the same,
so the bindings the local host serves are the app's own, never a second hand-kept list. ``%NAME%``
in binding properties is resolved from the settings here, once, with an error naming the function.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from devhost.settings import resolve

QUEUE_TRIGGER = "queueTrigger"
TIMER_TRIGGER = "timerTrigger"
EVENT_GRID_TRIGGER = "eventGridTrigger"
QUEUE_OUTPUT = "queue"
SUPPORTED_TRIGGERS = (QUEUE_TRIGGER, TIMER_TRIGGER, EVENT_GRID_TRIGGER)


class IndexingError(RuntimeError):
    """The app cannot be indexed (what the worker would refuse at startup)."""


@dataclass(frozen=True)
class Binding:
    """One binding of a function, as function.json would hold it, with %SETTINGS% resolved."""

    type: str
    name: str
    direction: str  # "in" | "out"
    properties: Mapping[str, Any] = field(default_factory=dict)

    @property
    def queue_name(self) -> str:
        return str(self.properties.get("queueName", ""))

    @property
    def connection(self) -> str:
        return str(self.properties.get("connection") or "AzureWebJobsStorage")


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    trigger: Binding
    outputs: tuple[Binding, ...]
    func: Callable[..., Any]
    parameters: tuple[str, ...]

    @property
    def kind(self) -> str:
        return self.trigger.type

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    def describe(self) -> dict[str, Any]:
        trigger = {k: v for k, v in self.trigger.properties.items() if v is not None}
        return {"name": self.name, "trigger": {"type": self.trigger.type, "arg": self.trigger.name, **trigger},
                "outputs": [{"type": b.type, "arg": b.name, **{k: v for k, v in b.properties.items() if v is not None}}
                            for b in self.outputs]}


# app.get_functions() may be called only once per FunctionApp instance (a second call raises), so
# the raw index is kept per app object and shared by every Host in the process.
_raw_index: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_raw_lock = threading.Lock()


def import_app_module(app_module: str = "function_app", *, app_dir: str | Path | None = None) -> ModuleType:
    """Import the app's script. With ``app_dir``, load ``app_dir/<app_module>.py`` under a private name
    (so a test app never shadows the real ``function_app`` in ``sys.modules``)."""
    if app_dir is None:
        return importlib.import_module(app_module)
    path = (Path(app_dir) / (app_module.replace(".", "/") + ".py")).resolve()
    if not path.exists():
        raise IndexingError(f"no app script at {path}")
    name = f"_devhost_app_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise IndexingError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def find_app(module: ModuleType) -> Any:
    """The one FunctionRegister in the module (the worker refuses zero or several)."""
    from azure.functions.decorators.function_app import FunctionRegister

    apps = [value for value in vars(module).values() if isinstance(value, FunctionRegister)]
    if not apps:
        raise IndexingError(f"{module.__name__} defines no func.FunctionApp instance")
    if len(apps) > 1:
        raise IndexingError(f"More than one FunctionApp instance is defined in {module.__name__}")
    return apps[0]


def _raw_functions(app: Any) -> list[Any]:
    with _raw_lock:
        if app not in _raw_index:
            _raw_index[app] = list(app.get_functions())
        return _raw_index[app]


def _check_annotations(name: str, func: Callable[..., Any], trigger: Binding, outputs: tuple[Binding, ...]) -> None:
    """The worker's load-time checks: a trigger's annotation must suit its converter, an output's must be
    ``func.Out[T]`` with a T the binding can send. Unannotated parameters are accepted, as by the worker."""
    import typing

    import azure.functions as azf
    from azure.functions import meta

    try:
        hints = typing.get_type_hints(func)
    except Exception as error:
        raise IndexingError(f"function {name}: cannot resolve its annotations ({error})") from error
    converters = getattr(meta._ConverterMeta, "_bindings", {})  # the worker's own registry
    pytype = hints.get(trigger.name)
    converter = converters.get(trigger.type)
    if pytype is not None and converter is not None and not (
            isinstance(pytype, type) and converter.check_input_type_annotation(pytype)):
        raise IndexingError(f'function {name}: type of {trigger.name} binding "{trigger.type}" does not match '
                            f'its Python annotation "{getattr(pytype, "__name__", pytype)}"')
    for binding in outputs:
        pytype = hints.get(binding.name)
        if pytype is None:
            continue
        if typing.get_origin(pytype) is not azf.Out:
            raise IndexingError(f'function {name}: binding {binding.name} is declared to have the "out" direction, '
                                "but its annotation in Python is not a subclass of azure.functions.Out")
        converter = converters.get(binding.type)
        inner = (typing.get_args(pytype) or (None,))[0]
        if converter is not None and inner is not None and not converter.check_output_type_annotation(inner):
            raise IndexingError(f'function {name}: type of {binding.name} binding "{binding.type}" does not match '
                                f'its Python annotation "{getattr(inner, "__name__", inner)}"')


def _direction(binding: Any) -> str:
    return "out" if getattr(binding, "direction", 0) == 1 else "in"


def _binding(raw: Any, settings: Mapping[str, str], function: str) -> Binding:
    props = {k: v for k, v in raw.get_dict_repr().items() if k not in ("direction", "type", "name", "dataType")}
    for key in ("queueName", "schedule"):
        if isinstance(props.get(key), str):
            props[key] = resolve(props[key], settings, what=f"function {function}, binding {raw.name}.{key}")
    return Binding(type=str(raw.type), name=str(raw.name), direction=_direction(raw), properties=props)


def index(app: Any, settings: Mapping[str, str]) -> list[FunctionSpec]:
    """Every function of the app with its trigger, outputs and resolved properties."""
    specs: list[FunctionSpec] = []
    for raw in _raw_functions(app):
        name = raw.get_function_name()
        trigger_raw = raw.get_trigger()
        if trigger_raw is None:
            raise IndexingError(f"function {name} has no trigger")
        trigger = _binding(trigger_raw, settings, name)
        others = [_binding(b, settings, name) for b in raw.get_bindings() if b is not trigger_raw]
        outputs = tuple(b for b in others if b.direction == "out")
        inputs = [b for b in others if b.direction == "in"]
        if inputs:
            raise IndexingError(f"function {name}: input bindings ({', '.join(b.type for b in inputs)}) "
                                "are not supported by the local host")
        func = raw.get_user_function()
        params = tuple(inspect.signature(func).parameters)
        bound = {trigger.name, *(b.name for b in outputs)} - {"$return"}
        missing = set(params) - bound
        if missing:
            raise IndexingError(f"function {name}: parameters are declared in Python but not in the function "
                                f"definition: {sorted(missing)}")
        unbound = bound - set(params)
        if unbound:
            raise IndexingError(f"function {name}: bindings {sorted(unbound)} have no parameter")
        _check_annotations(name, func, trigger, outputs)
        specs.append(FunctionSpec(name=name, trigger=trigger, outputs=outputs, func=func, parameters=params))
    names = [s.name for s in specs]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise IndexingError(f"function names are not unique: {sorted(duplicates)}")
    return specs
