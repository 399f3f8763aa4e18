"""No module of the app's core grows past what one reader holds in mind (issue 12: at most 500 lines).

A module that needs more is doing two things; split it by concern, as shared/remediation and
shared/migration are split (records, steps, one module per phase or rung).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def oversized(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every ``.py`` file under ``root`` longer than ``limit`` lines, with its length."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found[str(path.relative_to(root))] = lines
    return found


def test_no_module_in_shared_is_longer_than_500_lines() -> None:
    assert oversized(REPO / "shared") == {}


def test_the_measure_names_a_module_one_line_over_the_limit(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (tmp_path / "pkg" / "fits.py").write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    assert oversized(tmp_path) == {"pkg/long.py": MAX_LINES + 1}
