"""Typed readers for app settings.

Every setting the app reads goes through one of these functions with a literal name, so that the
infrastructure tests can derive the list of settings from the code (an AST scan for ``env_*``
calls) instead of a second hand-kept list. Errors name the setting and say what was expected.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping


class SettingError(ValueError):
    """A setting is missing or malformed; the message names it."""


def _raw(env: Mapping[str, str] | None, name: str) -> str | None:
    value = (os.environ if env is None else env).get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def env_str(name: str, default: str | None = None, *, env: Mapping[str, str] | None = None,
            required: bool = False) -> str:
    value = _raw(env, name)
    if value is None:
        if required:
            raise SettingError(f"setting {name} is required but not set")
        return default or ""
    return value


def env_int(name: str, default: int, *, env: Mapping[str, str] | None = None,
            minimum: int | None = None, maximum: int | None = None) -> int:
    value = _raw(env, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise SettingError(f"setting {name} must be a whole number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise SettingError(f"setting {name} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise SettingError(f"setting {name} must be at most {maximum}, got {number}")
    return number


def env_float(name: str, default: float, *, env: Mapping[str, str] | None = None,
              minimum: float | None = None, maximum: float | None = None) -> float:
    value = _raw(env, name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise SettingError(f"setting {name} must be a number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise SettingError(f"setting {name} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise SettingError(f"setting {name} must be at most {maximum}, got {number}")
    return number


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_bool(name: str, default: bool, *, env: Mapping[str, str] | None = None) -> bool:
    value = _raw(env, name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingError(f"setting {name} must be true or false, got {value!r}")


def env_list(name: str, default: tuple[str, ...] = (), *, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """A comma-separated list; blanks dropped."""
    value = _raw(env, name)
    if value is None:
        return default
    return tuple(part.strip() for part in value.split(",") if part.strip())


def env_choice(name: str, default: str, choices: tuple[str, ...], *, env: Mapping[str, str] | None = None) -> str:
    value = _raw(env, name)
    if value is None:
        return default
    for choice in choices:
        if value.lower() == choice.lower():
            return choice
    raise SettingError(f"setting {name} must be one of {', '.join(choices)}, got {value!r}")


def count_pairs(name: str, items: Iterable[str], *, unit: str, allowed: tuple[str, ...] | None = None) -> dict[str, int]:
    """``key=N`` pairs of a list setting (``N`` a whole, non-negative number of ``unit``), errors naming it.

    Several policies take such a setting (REMEDIATION_THRESHOLDS and REMEDIATION_RUNG_TIMEOUTS in
    seconds, MIGRATION_QUOTA_HEADROOM in vCPUs); the key's own form is theirs to check.
    """
    out: dict[str, int] = {}
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SettingError(f"setting {name} must be key={unit} pairs, got {item!r}")
        if allowed is not None and key not in allowed:
            raise SettingError(f"setting {name}: {key!r} is not one of {', '.join(allowed)}")
        try:
            count = int(value.strip())
        except ValueError:
            raise SettingError(f"setting {name}: {item!r} must end with a whole number of {unit}") from None
        if count < 0:
            raise SettingError(f"setting {name}: {item!r} must not be negative")
        out[key] = count
    return out
