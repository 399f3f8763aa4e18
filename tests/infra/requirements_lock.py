"""The deployed dependency set, pinned: requirements.txt's closure as installed, for constraints.txt.

Flex Consumption builds the app's dependencies remotely (``pip install -r requirements.txt``). The
top-level packages are pinned in requirements.txt; their own dependencies are not, so two builds
of one commit could get different transitive versions. requirements.txt therefore names
``-c constraints.txt``, which pins every package of the closure. This module computes that closure
from the installed distributions (the venv the tests run in), evaluating environment markers for
the deployment target (Linux, x86_64, CPython 3.11), so the lock is exactly what the tests ran with.

    .venv/bin/python tests/infra/requirements_lock.py          # rewrite constraints.txt
    .venv/bin/python tests/infra/requirements_lock.py --check  # exit 1 if it is stale

tests/infra/test_infra_requirements_lock.py checks that the file is current.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements.txt"
CONSTRAINTS = REPO / "constraints.txt"

# Flex Consumption, Linux, Python 3.11 (infra/app/api.bicep): markers are judged for this, not the laptop.
TARGET_ENVIRONMENT = {
    "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
    "platform_python_implementation": "CPython", "implementation_name": "cpython",
    "python_version": "3.11", "python_full_version": "3.11.0", "implementation_version": "3.11.0",
}

HEADER = """\
# Every package the deployed app installs, pinned (requirements.txt's dependency closure). Generated from
# the venv by `.venv/bin/python tests/infra/requirements_lock.py`; tests/infra checks it is current.
# requirements.txt applies it with `-c constraints.txt`, so the Flex Consumption remote build installs
# exactly these versions. After changing requirements.txt: pip install, then regenerate this file.
"""


class LockError(RuntimeError):
    """The closure cannot be computed (a requirement is missing from the venv, or is not pinned)."""


def top_level() -> dict[str, Requirement]:
    """requirements.txt's requirements by canonical name (option lines such as ``-c`` skipped)."""
    out: dict[str, Requirement] = {}
    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        requirement = Requirement(text)
        out[canonicalize_name(requirement.name)] = requirement
    return out


def _applies(marker: Marker | None, extras: set[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**TARGET_ENVIRONMENT, "extra": extra}) for extra in (extras or {""}))


def closure() -> dict[str, str]:
    """Canonical name -> installed version, for requirements.txt and everything it pulls in."""
    found: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    queue = [(name, set(req.extras)) for name, req in top_level().items()]
    while queue:
        name, extras = queue.pop()
        if name in found and extras <= extras_seen[name]:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise LockError(f"{name} is needed by the deployed app but is not installed in this venv") from None
        found[name] = dist.version
        extras_seen[name] = extras_seen.get(name, set()) | extras
        for text in dist.requires or ():
            requirement = Requirement(text)
            if _applies(requirement.marker, extras_seen[name]):
                queue.append((canonicalize_name(requirement.name), set(requirement.extras)))
    return found


def render(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def read_constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            name, _, version = text.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def main(argv: list[str]) -> int:
    text = render(closure())
    if "--check" in argv:
        current = CONSTRAINTS.read_text(encoding="utf-8") if CONSTRAINTS.exists() else ""
        if current != text:
            print("constraints.txt is stale: regenerate it with .venv/bin/python tests/infra/requirements_lock.py")
            return 1
        return 0
    CONSTRAINTS.write_text(text, encoding="utf-8")
    print(f"wrote {CONSTRAINTS.relative_to(REPO)} ({text.count(chr(10)) - HEADER.count(chr(10))} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
