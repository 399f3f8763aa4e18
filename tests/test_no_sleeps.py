"""No test sleeps: every wait goes through tests/waiting.py (issue 12, "Tests").

A ``time.sleep`` in a test either pads a wait that should be a condition with a deadline, or lets a
test assert that nothing happened without proof that the system looked. This scan reads every
Python file under tests/ (its AST, so comments and strings do not count) and lists each call of
``time.sleep``, ``asyncio.sleep`` or a ``sleep`` imported from either, outside the files allowed below.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: Files that may sleep, and why.
ALLOWED: dict[str, str] = {
    "tests/waiting.py": "the one waiting helper: the pause between two looks at a condition",
    "tests/devhost/fake_app/function_app.py": "the fake app's function runs as long as its message asks, so that "
                                              "the host's functionTimeout and lease paths can be driven; it is the "
                                              "system under test's workload, not a wait of a test",
}
SLEEPY_MODULES = ("time", "asyncio")


def sleep_calls(source: str) -> list[int]:
    """Line numbers of ``time.sleep(...)``, ``asyncio.sleep(...)`` and ``sleep(...)`` imported from those
    modules (under any alias) in ``source``."""
    tree = ast.parse(source)
    module_aliases: set[str] = set()
    function_aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            module_aliases |= {a.asname or a.name for a in node.names if a.name in SLEEPY_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in SLEEPY_MODULES:
            function_aliases |= {a.asname or a.name for a in node.names if a.name == "sleep"}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        module_sleep = isinstance(func, ast.Attribute) and func.attr == "sleep" and isinstance(func.value, ast.Name) \
            and func.value.id in module_aliases
        imported_sleep = isinstance(func, ast.Name) and func.id in function_aliases
        if module_sleep or imported_sleep:
            lines.append(node.lineno)
    return sorted(lines)


def offenders() -> list[str]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in ALLOWED:
            continue
        found += [f"{relative}:{line}" for line in sleep_calls(path.read_text(encoding="utf-8"))]
    return found


def test_no_test_sleeps_outside_the_waiting_helper() -> None:
    found = offenders()
    assert found == [], ("these tests sleep; wait for a condition or a count with tests/waiting.py instead "
                         "(or inject a clock):\n" + "\n".join(found))


def test_the_allowed_files_exist() -> None:
    assert [name for name in ALLOWED if not (ROOT / name).is_file()] == []


def test_the_scan_finds_every_spelling_of_a_sleep() -> None:
    source = "\n".join([
        "import time",
        "import time as t",
        "import asyncio",
        "from time import sleep",
        "from time import sleep as nap",
        "time.sleep(1)",  # line 6
        "t.sleep(1)",  # 7
        "sleep(1)",  # 8
        "nap(1)",  # 9
        "async def f():",
        "    await asyncio.sleep(1)",  # 11
        "clock.sleep(1)",  # an injected clock's sleep is not a wall-clock wait
        "'time.sleep(1)'",  # nor is a string
        "# time.sleep(1)",
    ])
    assert sleep_calls(source) == [6, 7, 8, 9, 11]
