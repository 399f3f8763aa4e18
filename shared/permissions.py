"""Permissions declared where they are used.

Each adapter method that calls ARM or the Kubernetes API says which Azure action or Kubernetes verb
it needs, right on the method. The infrastructure tests collect these declarations to check that
the custom Azure role and the Kubernetes ClusterRole grant exactly what the code calls: the list is
derived from the code, never typed twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def requires_arm(*actions: str) -> Callable[[F], F]:
    """Mark a method as calling ARM operations that need these Azure RBAC actions."""

    def mark(fn: F) -> F:
        fn.__arm_actions__ = tuple(actions)  # type: ignore[attr-defined]
        return fn

    return mark


def requires_kube(group: str, resource: str, *verbs: str) -> Callable[[F], F]:
    """Mark a method as calling the Kubernetes API: ``group`` ("" for core), ``resource``, verbs.

    Stack several decorators when a method makes several kinds of calls.
    """

    def mark(fn: F) -> F:
        rules = list(getattr(fn, "__kube_rules__", ()))
        rules.append((group, resource, tuple(verbs)))
        fn.__kube_rules__ = tuple(rules)  # type: ignore[attr-defined]
        return fn

    return mark


def _functions(modules: Iterable[ModuleType]) -> Iterable[Callable[..., Any]]:
    for module in modules:
        for _, obj in inspect.getmembers(module):
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                for _, member in inspect.getmembers(obj):
                    if callable(member):
                        yield member
            elif inspect.isfunction(obj) and obj.__module__ == module.__name__:
                yield obj


def collect_arm_actions(*modules: ModuleType) -> set[str]:
    """Every Azure action declared in ``modules``."""
    return {a for fn in _functions(modules) for a in getattr(fn, "__arm_actions__", ())}


def collect_kube_rules(*modules: ModuleType) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) declared in ``modules``."""
    return {
        (group, resource, verb)
        for fn in _functions(modules)
        for group, resource, verbs in getattr(fn, "__kube_rules__", ())
        for verb in verbs
    }
