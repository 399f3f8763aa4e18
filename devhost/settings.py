"""App settings for the local host, shaped like ``local.settings.json`` and resolved like the host.

The Functions host gives the app its settings as environment variables and resolves ``%NAME%`` in
binding properties (queue names, schedules) from the same settings. Core Tools reads the ``Values``
of ``local.settings.json`` but lets a variable already set in the environment win; :func:`load`
does the same, so ``POOL_REQUEST_QUEUE=x python -m devhost run`` behaves as ``func start`` would.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

log = logging.getLogger("devhost")

_PERCENT = re.compile(r"%([^%]+)%")


class SettingsError(ValueError):
    """The settings file is malformed, or a binding names a setting that is not set."""


def read_values(path: str | Path) -> dict[str, str]:
    """The ``Values`` of a local.settings.json-shaped file, as strings."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"settings file {path} does not exist") from None
    except json.JSONDecodeError as error:
        raise SettingsError(f"settings file {path} is not valid JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("Values", {}), dict):
        raise SettingsError(f"settings file {path} must be an object with a 'Values' object")
    if document.get("IsEncrypted"):
        raise SettingsError(f"settings file {path} is encrypted; the local host reads plain values only")
    return {str(k): "" if v is None else str(v) for k, v in document.get("Values", {}).items()}


def load(path: str | Path | None, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Settings as Core Tools sees them: the file's values, each overridden by the environment."""
    env = os.environ if environ is None else environ
    values = read_values(path) if path else {}
    merged: dict[str, str] = {}
    for name, value in values.items():
        if name in env and env[name] != value:
            log.info("skipping %r from local settings: it is already set in the environment", name)
            merged[name] = env[name]
        else:
            merged[name] = value
    return merged


def apply(settings: Mapping[str, str], *, environ: MutableMapping[str, str] | None = None) -> None:
    """Put the settings into the process environment, where the app reads them."""
    env = os.environ if environ is None else environ
    for name, value in settings.items():
        env[name] = value


def resolve(value: str, settings: Mapping[str, str], *, what: str) -> str:
    """Replace every ``%NAME%`` in a binding property with the setting's value, as the host does."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in settings and settings[name] != "":
            return settings[name]
        if os.environ.get(name):
            return os.environ[name]
        raise SettingsError(f"{what} refers to setting %{name}% which is not set")

    return _PERCENT.sub(one, value)
