"""Session-wide fixtures: one Azurite (queue + table, in memory) for every test that needs storage.

Azurite is installed from npm by ``make azurite`` (``devhost.azurite.ensure_installed``) and started
here once per session on free ports, so tests never depend on a developer's running emulator.
Tests isolate themselves with unique queue and table names (the ``names`` fixture).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


class UniqueNames:
    """Queue and table names no other test uses (Azure's naming rules respected)."""

    def __init__(self, tag: str) -> None:
        self._tag = "".join(c for c in tag.lower() if c.isalnum())[:12] or "t"

    def queue(self, prefix: str = "q") -> str:
        clean = "".join(c for c in prefix.lower() if c.isalnum() or c == "-")[:20]
        while "--" in clean:
            clean = clean.replace("--", "-")
        return f"{clean.strip('-') or 'q'}-{self._tag}-{uuid.uuid4().hex[:10]}"

    def table(self, prefix: str = "t") -> str:
        clean = "".join(c for c in prefix if c.isalnum()) or "t"
        if not clean[0].isalpha():
            clean = "t" + clean
        return f"{clean[:20]}{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def azurite() -> Iterator[object]:
    """A running Azurite (queue and table services) for the whole session."""
    from devhost import azurite as launcher

    log_dir = ROOT / ".state"
    log_dir.mkdir(exist_ok=True)
    instance = launcher.start(log=log_dir / f"azurite-tests-{os.getpid()}.log")
    try:
        yield instance
    finally:
        launcher.stop(instance)


@pytest.fixture(scope="session")
def storage_connection_string(azurite: object) -> str:
    return str(azurite.connection_string)  # type: ignore[attr-defined]


@pytest.fixture
def names(request: pytest.FixtureRequest) -> UniqueNames:
    return UniqueNames(request.node.name)
