"""The layers are the architecture: imports point down only, the pure core imports no shell, and no module of
the package imports itself back through another (static: every import statement, lazy ones included)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kcl_pipeline"

pytestmark = pytest.mark.core


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports (absolute names; `from pkg import mod` counts mod when it is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                if _is_module(candidate):
                    found.add(candidate)
    return found


def _is_module(name: str) -> bool:
    if not name.startswith("kcl_pipeline"):
        return False
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def sources(under: str = "") -> list[Path]:
    return sorted(p for p in (PACKAGE / under).rglob("*.py") if not p.name.endswith("_pb2.py"))


def test_the_kcl_layer_never_imports_dagster_or_pyspark():
    offenders = {module_name(p): sorted(i for i in imports_of(p) if i.split(".")[0] in ("dagster", "pyspark"))
                 for p in sources("kcl")}
    assert not {m: i for m, i in offenders.items() if i}


def test_the_pure_core_imports_no_shell_and_no_aws_client():
    allowed_prefix = "kcl_pipeline.kcl.core"
    offenders = {}
    for path in sources("kcl/core"):
        bad = sorted(i for i in imports_of(path)
                     if (i.startswith("kcl_pipeline") and not i.startswith(allowed_prefix))
                     or i.split(".")[0] in ("boto3", "botocore", "threading", "multiprocessing", "socket"))
        if bad:
            offenders[module_name(path)] = bad
    assert not offenders, f"the pure core imports shells or I/O: {offenders}"


def test_the_kcl_layer_shows_core_shells_and_records():
    rooms = {p.name for p in (PACKAGE / "kcl").iterdir() if (p / "__init__.py").is_file()}
    assert {"core", "shells", "records"} <= rooms


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in sources()}
    return {name: {i for i in imports_of(path) if i in modules and i != name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere_in_the_package():
    # A package's __init__ importing its own modules is not a circle of the architecture: leave packages out
    # of the edges into them from their own modules.
    graph = import_graph()
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    assert cycles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
