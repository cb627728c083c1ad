"""defs/ is Dagster wiring only: every module in it is Dagster code (it imports dagster or a dagster_* library;
a package's __init__ may only gather its own package's Dagster modules), and no function in it runs longer than
40 lines (from its `def` line to the end of its body, decorators excluded; a nested function counts towards its
enclosing one too). Plain Python belongs below (deployment/, windows/, zone/, kcl/, transform/) as a domain
function or setting the wiring calls. A pure AST scan: no Dagster import."""
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


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, level) of every import statement, lazy ones included."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


def plain_modules(root: Path) -> list[str]:
    """Every module under `root` that is not Dagster code: it imports neither dagster nor a dagster_* library,
    unless it is a package's __init__ importing only from its own package (or nothing)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        imports = _imports(ast.parse(path.read_text(), filename=str(path)))
        if any(name.split(".")[0] == "dagster" or name.startswith("dagster_") for name, level in imports if not level):
            continue
        if path.name == "__init__.py" and all(level == 1 for _, level in imports):
            continue
        found.append(str(path.relative_to(root.parent)))
    return found


def test_every_module_in_defs_is_dagster_code():
    offenders = plain_modules(DEFS)
    assert not offenders, ("modules in kcl_pipeline/defs/ that are not Dagster code (move them below: settings to "
                           "deployment/, decisions to windows/): " + ", ".join(offenders))


def test_the_scan_finds_a_plain_module_among_dagster_ones(tmp_path):
    package = tmp_path / "defs" / "kinesis"
    package.mkdir(parents=True)
    (tmp_path / "defs" / "__init__.py").write_text("from .kinesis.definitions import build\n")
    (package / "__init__.py").write_text('"""docs only"""\n')
    (package / "definitions.py").write_text("from dagster import Definitions\n")
    (package / "resources.py").write_text("def f():\n    from dagster_aws.s3 import S3Resource\n")
    (package / "settings.py").write_text("from dataclasses import dataclass\nfrom ...kcl import config\n")
    (package / "lazy.py").write_text("from typing import TYPE_CHECKING\nimport dagsterish\n")
    (tmp_path / "defs" / "reexport.py").write_text("from .kinesis.settings import x\n")
    assert plain_modules(tmp_path / "defs") == ["defs/kinesis/lazy.py", "defs/kinesis/settings.py", "defs/reexport.py"]


def test_no_function_in_defs_is_longer_than_40_lines():
    offenders = long_functions(DEFS)
    assert not offenders, (f"functions in kcl_pipeline/defs/ longer than {MAX_LINES} lines (move their logic into "
                           f"windows/, zone/ or deployment/ as domain functions): " + "; ".join(offenders))


def test_the_scan_counts_from_the_def_line_to_the_end_of_the_body(tmp_path):
    (tmp_path / "defs").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))  # 39 lines
    nested = "\n".join(f"    {line}" for line in body.splitlines())
    (tmp_path / "defs" / "wiring.py").write_text(
        f"@decorated\ndef fits():\n{body}\n\n\ndef outer():\n    def too_long():\n{nested}\n        pass\n")
    assert long_functions(tmp_path / "defs") == ["defs/wiring.py:44 outer (42 lines)",
                                                 "defs/wiring.py:45 too_long (41 lines)"]
