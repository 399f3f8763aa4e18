"""No class in sim/ is longer than 400 lines (issue 12).

The simulator's big classes (``Cluster``, ``KubeApi``, ``ArmApi``) are facades over one part per concern
(sim/model.py, sim/kube/api.py, sim/arm/api.py list their parts). A class that grows past the limit is a
concern that wants its own part: this test names it and its length.
"""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "sim"
MAX_CLASS_LINES = 400


def class_spans(source: str, filename: str) -> list[tuple[str, int]]:
    """(qualified name, lines from its ``class`` line, decorators included, to its last line) of every class,
    nested ones too."""
    spans: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                name = f"{prefix}{child.name}"
                spans.append((name, int(child.end_lineno or child.lineno) - first + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename=filename), "")
    return spans


def oversized(root: Path, limit: int) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for name, lines in class_spans(path.read_text(encoding="utf-8"), str(path)):
            if lines > limit:
                out.append(f"{path.relative_to(root.parent)}:{name} has {lines} lines")
    return out


def test_no_class_in_the_simulator_is_longer_than_400_lines() -> None:
    assert sorted(SIM.rglob("*.py")), f"no Python files under {SIM}"
    assert oversized(SIM, MAX_CLASS_LINES) == []


def test_the_measure_counts_every_line_of_a_class_and_finds_nested_ones(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))  # with the class line: 401 lines
    (tmp_path / "big.py").write_text(
        f"import dataclasses\n\n\n@dataclasses.dataclass\nclass Small:\n    a: int = 0\n\n\n"
        f"class Outer:\n    class Inner:\n{body.replace('    ', '        ')}\n", encoding="utf-8")
    (tmp_path / "edge.py").write_text("class Edge:\n" + "\n".join(f"    y{i} = {i}" for i in range(MAX_CLASS_LINES - 1))
                                      + "\n", encoding="utf-8")
    spans = dict(class_spans((tmp_path / "big.py").read_text(encoding="utf-8"), "big.py"))
    assert spans["Small"] == 3  # decorator, class line, one field
    assert spans["Outer.Inner"] == MAX_CLASS_LINES + 1
    assert oversized(tmp_path, MAX_CLASS_LINES) == [
        f"{tmp_path.name}/big.py:Outer has {MAX_CLASS_LINES + 2} lines",
        f"{tmp_path.name}/big.py:Outer.Inner has {MAX_CLASS_LINES + 1} lines",
    ]  # edge.py's class is exactly 400 lines: allowed
