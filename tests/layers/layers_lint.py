"""Run import-linter on a tree and read its report, for the layer tests (issue 12, item 5).

import-linter is run in a subprocess, in the folder of the tree under test: in this process
``shared`` is already imported from the repository, and import-linter finds packages by importing
their specs, so a copy would be shadowed. Its text report is the interface: each contract's name is
followed by KEPT or BROKEN, and each broken contract's section lists the offending imports as
``importer -> imported (l.N)``. (https://import-linter.readthedocs.io/en/stable/usage.html)
"""

from __future__ import annotations

import configparser
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / ".importlinter"
PACKAGES = ("shared", "functions")
CONTRACT_PREFIX = "importlinter:contract:"


def contract_names(config_text: str) -> dict[str, str]:
    """Contract id (the section's suffix) -> its name, as the report prints it."""
    parser = configparser.ConfigParser()
    parser.read_string(config_text)
    return {section.removeprefix(CONTRACT_PREFIX): parser[section]["name"]
            for section in parser.sections() if section.startswith(CONTRACT_PREFIX)}


def type_only_imports_counted(config_text: str) -> str:
    """The same contracts with imports under ``if TYPE_CHECKING:`` counted, except those of shared.settings.

    .importlinter excludes type-only imports so that code may name ``Settings`` (app layer) in hints;
    this variant checks that no other type-only import crosses a layer.
    """
    parser = configparser.ConfigParser()
    parser.read_string(config_text)
    parser["importlinter"]["exclude_type_checking_imports"] = "False"
    for section in parser.sections():
        if section.startswith(CONTRACT_PREFIX):
            ignored = [line for line in parser[section].get("ignore_imports", "").splitlines() if line.strip()]
            parser[section]["ignore_imports"] = "\n".join([*ignored, "shared.** -> shared.settings"])
            parser[section]["unmatched_ignore_imports_alerting"] = "none"
    out = io.StringIO()
    parser.write(out)
    return out.getvalue()


@dataclass(frozen=True)
class LintReport:
    exit_code: int
    output: str
    status: dict[str, str]  # contract id -> "KEPT" or "BROKEN"
    sections: dict[str, str]  # contract id -> its part of "Broken contracts"

    def broken(self) -> set[str]:
        return {cid for cid, state in self.status.items() if state == "BROKEN"}

    def reports_import(self, contract: str, importer: str, imported: str, line: int) -> bool:
        """Whether the broken ``contract`` names the direct import ``importer -> imported`` at ``line``."""
        pattern = rf"^\s*-?\s*{re.escape(importer)} -> {re.escape(imported)} \(l\.[0-9, l.]*\b{line}\b"
        return re.search(pattern, self.sections.get(contract, ""), re.MULTILINE) is not None


def lint(root: Path, config_text: str) -> LintReport:
    """Run lint-imports on the packages under ``root`` with ``config_text`` as its configuration."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "importlinter.ini"
        config.write_text(config_text, encoding="utf-8")
        env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "PYTHONPATH": ""}
        done = subprocess.run(
            [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
             str(config), "--no-cache"],
            cwd=root, env=env, capture_output=True, text=True, timeout=240, check=False)
    output = done.stdout + done.stderr
    names = contract_names(config_text)
    status: dict[str, str] = {}
    for cid, name in names.items():
        found = re.search(rf"^{re.escape(name)} (KEPT|BROKEN)\b", output, re.MULTILINE)
        if found:
            status[cid] = found.group(1)
    return LintReport(done.returncode, output, status, _sections(output, names))


def _sections(output: str, names: dict[str, str]) -> dict[str, str]:
    _, _, broken = output.partition("\nBroken contracts\n")
    by_name = {name: cid for cid, name in names.items()}
    lines = broken.splitlines()
    starts = [(i, by_name[line]) for i, line in enumerate(lines)
              if line in by_name and i + 1 < len(lines) and set(lines[i + 1]) == {"-"}]
    out: dict[str, str] = {}
    for n, (start, cid) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(lines)
        out[cid] = "\n".join(lines[start + 2:end])
    return out


def copy_layout(dest: Path) -> None:
    """The real tree's packages and module names under ``dest``, every module emptied of its imports.

    The contracts then judge exactly the imports a test injects, whatever state the real code is in.
    """
    for package in PACKAGES:
        for source in (REPO / package).rglob("*.py"):
            target = dest / source.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text('"""A module of the real layout, emptied."""\n', encoding="utf-8")


def copy_tree(dest: Path) -> None:
    """The real tree's packages under ``dest``, as they are."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))


def ensure_module(root: Path, module: str) -> None:
    """Create ``module`` under ``root`` if the layout lacks it (the refactor moves modules; the cases name some)."""
    path = root.joinpath(*module.split("."))
    if path.is_dir() or not path.parent.is_dir():
        return
    if not path.with_suffix(".py").exists():
        path.with_suffix(".py").write_text('"""A module a test names."""\n', encoding="utf-8")


def inject(root: Path, module: str, statement: str) -> int:
    """Append ``statement`` to ``module`` (created if the layout lacks it); the line number of its last line."""
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"no package for {module} under {root}")
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    text += statement.rstrip("\n") + "\n"
    path.write_text(text, encoding="utf-8")
    return text.count("\n")
