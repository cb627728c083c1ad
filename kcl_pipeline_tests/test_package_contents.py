"""What the wheel ships: the package's own modules, never the tests' support (the fault-injecting proxy lives
in kcl_pipeline_tests/, which the wheel leaves out). Static: pyproject's package selection and every import."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.core


def _shipped_packages() -> list[str]:
    find_packages = pytest.importorskip("setuptools").find_packages  # a fresh 3.12+ venv has no setuptools
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return find_packages(str(ROOT), include=find["include"], exclude=find["exclude"])


def test_the_wheel_ships_no_test_support():
    packages = _shipped_packages()
    assert "kcl_pipeline" in packages
    assert not [p for p in packages if p.startswith("kcl_pipeline_tests")]
    shipped = {path.stem for p in packages for path in (ROOT / p.replace(".", "/")).glob("*.py")}
    assert "fault_proxy" not in shipped  # test support: kcl_pipeline_tests/fault_proxy.py


def test_no_shipped_module_imports_the_test_tree():
    """A shipped module importing kcl_pipeline_tests would fail on every install (the wheel leaves it out)."""
    offenders = {}
    for path in sorted((ROOT / "kcl_pipeline").rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        bad = sorted(n for n in names if n.split(".")[0] == "kcl_pipeline_tests")
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders
