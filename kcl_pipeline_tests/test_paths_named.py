"""Every repository file a document, comment or docstring names exists, and none names a document outside the
repository: a reference to a moved or deleted file sends the reader nowhere. And the prose of the shipped modules
says why, now: no simulation seed numbers (they are in docs/simulation.md and the tests), no history."""
from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kcl_pipeline"

pytestmark = pytest.mark.core

# The extensions of the files the repository holds (a name with another extension is not a file of ours).
EXTENSIONS = ("py", "md", "yaml", "yml", "toml", "sh", "json", "lock", "proto", "xml", "properties", "js", "java")
_PATH = re.compile(
    r"(?<![\w./:\-*<{$~%@=])"                       # not the tail of a URL, a glob, a placeholder or a longer word
    r"((?:\.\./)*(?:[\w.\-]+/)*[\w\-][\w.\-]*\.(?:" + "|".join(EXTENSIONS) + r")"
    r"|(?:\.\./)+(?:[\w.\-]+/)*[\w.\-]*"            # anything under ../ (outside the repository)
    r"|(?:[a-z_][\w\-]*/)+)"                         # a directory: name/ or name/name/
    r"(?![\w/*{<\-])")
# Documents of the project that live outside the repository: a reader of the repository cannot follow them.
_OUTSIDE = re.compile(r"\bDESIGN\b(?:\.md)?|(?<![\w.])\.\./[\w.\-/]*|(?<![\w./])seeds/")
# Names that look like repository paths and are not, each with the reason.
NOT_REPOSITORY_PATHS = {
    "env.sh": "the environment file `kcl-pipeline local up` writes into the user's state directory",
    ".kcl_local/env.sh": "the same, in the demo's default state directory",
    "STATE_DIR/env.sh": "the same, in a state directory of the user's choice",
    "_manifest.json": "a key of the transform's output (docs/transform-commits.md), not a file of the repository",
    "_commits/": "a prefix of the landing zone (docs/landing.md)",
    "_start/": "a prefix of the landing zone (docs/landing.md)",
    "_checkpoints/frontier.json": "a key of the output location: the legacy checkpoint frontier (docs/windows.md)",
    "frontier.json": "the same, named alone",
    "_checkpoints/record.json": "a key of the output location: the checkpoint record (docs/windows.md)",
    "quarantine/": "a prefix of the transform's output",
    "transformed/": "a prefix of the transform's output",
    "a/b/": "an example store prefix in a comment",
    "sbin/start-connect-server.sh": "Spark's script, in a Spark installation",
    "setup.py": "kclpy's setup.py, in its sdist",
    "logback.xml": "the Java MultiLangDaemon's logging configuration, of the user's own",
    "sample.properties": "the properties file kclpy ships",
    "Scala.js": "a product (kinesis-mock's JavaScript build), not a file",
}
_SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules", "target",
              "build", "dist"}


@dataclass(frozen=True)
class Reference:
    where: str  # file:line
    path: str


def repository_files() -> list[str]:
    found: list[str] = []
    for directory, subdirectories, files in os.walk(ROOT):
        # Never into a virtualenv, caches or build output: their files are not the repository's.
        subdirectories[:] = [d for d in subdirectories if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        base = Path(directory).relative_to(ROOT)
        found.extend((base / name).as_posix() for name in files)
    return sorted(found)


@functools.cache
def python_prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, each with the line it starts on."""
    source = path.read_text()
    prose: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            prose.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                prose.extend((body[0].lineno + i, line) for i, line in enumerate(body[0].value.value.splitlines()))
    return prose


def text_lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text().splitlines(), start=1))


@functools.cache
def scanned() -> dict[Path, list[tuple[int, str]]]:
    documents = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    scripts = [ROOT / ".ci" / "run"]
    modules = [p for p in sorted(PACKAGE.rglob("*.py")) if not p.name.endswith("_pb2.py")]
    modules += sorted((ROOT / "benchmarks").glob("*.py"))
    prose = {p: text_lines(p) for p in documents + scripts}
    prose.update({p: python_prose(p) for p in modules})
    return prose


def references(prose: dict[Path, list[tuple[int, str]]]) -> list[Reference]:
    found: list[Reference] = []
    for path, lines in prose.items():
        for number, line in lines:
            paths = [(m.start(1), m.end(1), m.group(1)) for m in _PATH.finditer(line)]
            # A name outside that is not a path as well (DESIGN §3): the paths (DESIGN.md, ../x/) are found above.
            outside = [(m.start(), m.end(), m.group(0)) for m in _OUTSIDE.finditer(line)
                       if not any(start <= m.start() < end for start, end, _ in paths)]
            where = f"{path.relative_to(ROOT)}:{number}"
            found.extend(Reference(where, name) for _, _, name in sorted(paths + outside))
    return found


class Repository:
    """The repository's files and directories, and how a name in prose resolves to one of them."""

    def __init__(self, files: list[str]):
        self.files = set(files)
        self.directories = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
        self.basenames: dict[str, list[str]] = {}
        for f in files:
            self.basenames.setdefault(f.rpartition("/")[2], []).append(f)

    def _exists(self, path: str, directory: bool) -> bool:
        return path in (self.directories if directory else self.files)

    def dead(self, reference: Reference) -> str | None:
        """Why `reference` names nothing of the repository (None when it names a file or directory that exists)."""
        name = reference.path.removeprefix("./")
        if name in NOT_REPOSITORY_PATHS:
            return None
        if name.startswith("../") or _OUTSIDE.fullmatch(name):
            return "a document outside the repository"
        directory = name.endswith("/")
        name = name.rstrip("/")
        if "/" not in name and not directory:
            # A bare file name: a module or file of the repository, found by its name alone.
            return None if name in self.basenames else "no file of this name"
        source = reference.where.rpartition(":")[0]
        bases = ["", "kcl_pipeline/"] + ["/".join(source.split("/")[:i]) + "/" for i in range(1, source.count("/") + 1)]
        if any(self._exists(base + name, directory) for base in bases):
            return None
        # A path given from inside the package (zone/sink.py, kinesis/settings.py, core/): its tail names the file.
        inside = (d for d in self.directories if d.startswith("kcl_pipeline/")) if directory else self.files
        if any(f.endswith("/" + name) for f in inside):
            return None
        return "no such directory" if directory else "no such file"


def dead_references(repository: Repository, prose: dict[Path, list[tuple[int, str]]]) -> list[str]:
    return [f"{r.where}: {r.path} ({why})" for r in references(prose) if (why := repository.dead(r))]


def test_every_path_named_in_docs_comments_and_docstrings_exists():
    assert dead_references(Repository(repository_files()), scanned()) == []


def test_every_name_allowed_is_still_named():
    named = {r.path.removeprefix("./") for r in references(scanned())}
    allowed = set(NOT_REPOSITORY_PATHS)
    assert sorted(allowed - named) == [], "an allowed name no document names any more: remove it"


def test_the_check_finds_dead_paths_and_documents_outside_and_passes_the_rest(tmp_path):
    repository = Repository(["README.md", "docs/windows.md", "kcl_pipeline/zone/sink.py",
                             "kcl_pipeline/windows/checkpoints/plan.py", "kcl_pipeline/kcl/core/fleet/balance.py",
                             "kcl_pipeline/sim/balance.py", "benchmarks/bench_x.py"])
    module = ROOT / "kcl_pipeline" / "zone" / "sink.py"
    prose = {module: [
        (1, "alive: kcl_pipeline/zone/sink.py, zone/sink.py, `docs/windows.md`, benchmarks/bench_x.py, sink.py"),
        (2, "alive: windows/checkpoints/plan.py, balance.py (two of that name), zone/, core/, ./README.md"),
        (3, "not paths: https://example.com/docs/x.md, s3://bucket/prefix/, bench_*.py, <t0>.json, and/or, I/O"),
        (4, "dead: zone/store.py, landing/, kcl/aws.py, docs/transform.md, planner_rules.py"),
        (5, "outside: ../shared/notes.md, DESIGN §6, DESIGN.md, seeds/"),
    ]}
    where = "kcl_pipeline/zone/sink.py"
    assert dead_references(repository, prose) == [
        f"{where}:4: zone/store.py (no such file)",
        f"{where}:4: landing/ (no such directory)",
        f"{where}:4: kcl/aws.py (no such file)",
        f"{where}:4: docs/transform.md (no such file)",
        f"{where}:4: planner_rules.py (no file of this name)",
        f"{where}:5: ../shared/notes.md (a document outside the repository)",
        f"{where}:5: DESIGN (a document outside the repository)",
        f"{where}:5: DESIGN.md (a document outside the repository)",
        f"{where}:5: seeds/ (a document outside the repository)",
    ]


def test_comments_and_docstrings_are_the_prose_of_a_module(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Module: a.py"""\n\n\ndef f():\n    """Function:\n    b.py"""\n    x = "c.py"  # d.py\n')
    assert python_prose(module) == [(7, "# d.py"), (1, "Module: a.py"), (5, "Function:"), (6, "    b.py")]


# A simulation seed's number (seed 13, seeds 6056 and 3451): the finding belongs in docs/simulation.md and the test.
_SEED = re.compile(r"\bseeds? \d+", re.IGNORECASE)
# History ("X used to …"): a comment says why the code is as it is now. "is used to" (a purpose) is not history.
_USED_TO = re.compile(r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )\bused to\b", re.IGNORECASE)


def shipped_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not p.name.endswith("_pb2.py")]


def seed_numbers(lines: list[tuple[int, str]]) -> list[int]:
    return [number for number, line in lines if _SEED.search(line)]


def history_wording(lines: list[tuple[int, str]]) -> list[int]:
    return [number for number, line in lines if _USED_TO.search(line)]


def test_no_simulation_seed_number_in_a_shipped_module_outside_the_simulation():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in shipped_modules() if PACKAGE / "sim" not in p.parents
             for n in seed_numbers(text_lines(p))]
    assert found == [], "seed numbers belong in docs/simulation.md and the tests"


def test_no_used_to_in_the_comments_and_docstrings_of_a_shipped_module():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in shipped_modules() for n in history_wording(python_prose(p))]
    assert found == [], "say why the code is as it is, not what it was"


def test_the_prose_checks_find_seed_numbers_and_history_and_pass_the_rest():
    lines = list(enumerate([
        "holder lands again (sim seed 3593: the lookback found nothing)",
        "(seeds 6056 and 3451, LATEST)",
        "the simulation's Seed 2577",
        "a seeded world; random.Random(seed=13); seed: int = 0",
        "The transform used to write the window's commit itself",
        "the key is used to fence a holder; they are used to it; USED TO",
    ], start=1))
    assert seed_numbers(lines) == [1, 2, 3]
    assert history_wording(lines) == [5, 6]
