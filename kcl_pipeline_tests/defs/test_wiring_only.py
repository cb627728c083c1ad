"""defs/ is Dagster wiring only: no function in it runs longer than 40 lines (from its `def` line to the end of its
body, decorators excluded; a nested function counts towards its enclosing one too). Longer logic belongs in
landing/ (or kcl/, transform/) as a domain function the wiring calls. A pure AST scan: no Dagster import."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kcl_pipeline

pytestmark = pytest.mark.core

MAX_LINES = 40
DEFS = Path(kcl_pipeline.__file__).parent / "defs"


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """`path:line name (n lines)` for every function under `root` longer than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # lineno: the `def` line, decorators excluded
                if length > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_in_defs_is_longer_than_40_lines():
    offenders = long_functions(DEFS)
    assert not offenders, (f"functions in kcl_pipeline/defs/ longer than {MAX_LINES} lines (move their logic into "
                           f"landing/ as domain functions): " + "; ".join(offenders))


def test_the_scan_counts_from_the_def_line_to_the_end_of_the_body(tmp_path):
    (tmp_path / "defs").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))  # 39 lines
    nested = "\n".join(f"    {line}" for line in body.splitlines())
    (tmp_path / "defs" / "wiring.py").write_text(
        f"@decorated\ndef fits():\n{body}\n\n\ndef outer():\n    def too_long():\n{nested}\n        pass\n")
    assert long_functions(tmp_path / "defs") == ["defs/wiring.py:44 outer (42 lines)",
                                                 "defs/wiring.py:45 too_long (41 lines)"]
