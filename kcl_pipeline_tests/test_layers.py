"""The layers are the architecture: imports point down only, the pure core imports no shell, and no module of
the package imports itself back through another (static: every import statement, lazy ones included). The same
holds a grain up: the rooms of the package sit on the floors of FLOORS, an arrow between two rooms points to a lower
floor, and no two rooms import each other round a circle."""
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



def kcl_room(module: str) -> str | None:
    """The room of the kcl layer a module is in: `core`, `records`, `shells`, or `kcl` for its top-level modules
    (config, processor, properties, ...); None outside the kcl layer."""
    parts = module.split(".")
    if parts[:2] != ["kcl_pipeline", "kcl"]:
        return None
    return parts[2] if len(parts) > 2 and parts[2] in ("core", "records", "shells") else "kcl"


def test_no_import_circle_between_the_rooms_of_the_kcl_layer():
    # Modules may form no circle and still their rooms one (config -> shells.aws, shells.worker -> config): then
    # neither room stands below the other and neither can be read, tested or moved without the other.
    rooms: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        room = kcl_room(name)
        if room is not None:
            rooms.setdefault(room, set()).update(
                r for r in map(kcl_room, targets) if r is not None and r != room)
    assert cycles(rooms) == []


def test_a_module_that_says_it_is_pure_imports_no_shell():
    # "(pure)" in a module's first line is a promise its readers rely on (no I/O to fake, no clock to pin).
    said_pure = [p for p in sources() if "(pure)" in (ast.get_docstring(ast.parse(p.read_text())) or "").split("\n")[0]]
    assert said_pure
    offenders = {module_name(p): sorted(i for i in imports_of(p) if i.startswith("kcl_pipeline.kcl.shells"))
                 for p in said_pure}
    assert not {m: i for m, i in offenders.items() if i}

def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The house, floor by floor, lowest first: every room of the package (its top-level packages and modules, and the
# sub-rooms of kcl/) on one floor. A room imports rooms on lower floors only: never one above it, nor one beside it
# on its own floor (rooms that share a floor do not know each other). A new package or top-level module is a room
# the test does not know until it is placed here. docs/architecture.md draws the same house.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("kcl.core",),                          # the pure lease protocol's ground: model, streams, shard graph, lineage
    ("kcl.core.table",),                    # the lease table's items as Java writes and reads them
    ("kcl.core.lease",),                    # one lease's hold and life, and the effects it asks for
    ("kcl.core.fleet",),                    # the fleet's decisions: balance, planner, fleet mode, the cycle
    ("kcl.records", "kcl.processor", "kcl.aws_settings"),  # record codecs; the processor API; AWS client settings
    ("kcl.config",),                        # the consumer's one validated configuration
    ("kcl.shells",),                        # the I/O around the core: AWS, shards, transport, lease table
    ("kcl.shells.read",),                   # the readers: polling and enhanced fan-out
    ("kcl.shells.workers",),                # one worker process per lease, and their memory
    ("kcl.shells.fleet",),                  # the lease manager and the headless consumer
    ("kcl.properties", "kcl.jsonl_sink"),   # Java KCL .properties files; the jsonl:DIR sink
    ("zone",),                              # the landing zone: stores, layout, batches, chain, sink
    ("windows",),                           # windows of the zone: completeness, scans, reports, the window commit
    ("windows.checkpoints",),               # the checkpoint plan, its run and its stored record
    ("windows.tick",),                      # the sensor tick's decisions, its cursor, where reports start
    ("audit",),                             # lineage, history, verification, reconciliation
    ("transform",),                         # the PySpark transform
    ("deployment",),                        # the deployment's plain settings, and the fleet member a code server hosts
    ("sim.runtime",),                       # the simulation's seeded scheduler, scenario and pauses
    ("sim.aws",),                           # simulated DynamoDB, Kinesis and zone store
    ("sim.judge",),                         # the invariant checker and the planted bugs
    ("sim.actors",),                        # the shipped consumer and pipeline in the simulation; the Java peers
    ("defs", "sim", "instance"),            # Dagster wiring; the simulated world, its runner and CLI; the
                                            # Dagster instance's own parts (its run launcher)
    ("local", "log_format"),                # the local deployment (drives a Dagster webserver); JSON logs
    ("cli", "definitions", "fleet_member"),  # the entry points: the CLI and the two Dagster code locations
)
# Packages that only hold rooms: their __init__ imports nothing of the package, and they are no room themselves.
CONTAINERS = ("kcl_pipeline", "kcl_pipeline.kcl")


def room_of(module: str) -> str | None:
    """The room a module lives in: the deepest room of FLOORS that holds it (a sub-package not on a floor belongs
    to its parent's room); else its top-level package or module, or within kcl/ its sub-package or module, which
    then fails the "every room is on a floor" test (None for a container's own __init__)."""
    if module in CONTAINERS:
        return None
    parts = module.split(".")[1:]
    for depth in range(len(parts), 0, -1):
        if ".".join(parts[:depth]) in _DECLARED:
            return ".".join(parts[:depth])
    return ".".join(parts[:2]) if parts[0] == "kcl" else parts[0]


_DECLARED = frozenset(room for rooms in FLOORS for room in rooms)


def room_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Every arrow between two rooms, with the module imports that draw it."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            here, there = room_of(module), room_of(target)
            if here is not None and there is not None and here != there:
                arrows.setdefault((here, there), []).append(f"{module} -> {target}")
    return {arrow: sorted(imports) for arrow, imports in sorted(arrows.items())}


def arrows_not_pointing_down(arrows: dict[tuple[str, str], list[str]],
                             floors: tuple[tuple[str, ...], ...]) -> list[str]:
    """The arrows from a room to one on its own floor or above, each with the imports that draw it."""
    floor = {room: level for level, rooms in enumerate(floors) for room in rooms}
    return [f"{here} (floor {floor[here]}) -> {there} (floor {floor[there]}): {', '.join(imports)}"
            for (here, there), imports in arrows.items()
            if here in floor and there in floor and floor[there] >= floor[here]]


def room_circles(arrows: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for here, there in arrows:
        graph.setdefault(here, set()).add(there)
    return cycles(graph)


def rooms_of_the_tree() -> set[str]:
    return {room for room in map(room_of, map(module_name, sources())) if room is not None}


def _arrows_of_the_tree() -> dict[tuple[str, str], list[str]]:
    return room_graph(import_graph())


def test_every_room_of_the_package_is_on_a_floor():
    declared = [room for rooms in FLOORS for room in rooms]
    assert len(declared) == len(set(declared)), "a room is on two floors"
    assert sorted(rooms_of_the_tree() - set(declared)) == [], "rooms not placed in FLOORS"
    assert sorted(set(declared) - rooms_of_the_tree()) == [], "FLOORS names rooms the package does not have"


def test_imports_between_rooms_point_down_only():
    assert arrows_not_pointing_down(_arrows_of_the_tree(), FLOORS) == []


def test_no_circle_between_rooms():
    assert room_circles(_arrows_of_the_tree()) == []


def test_containers_import_nothing_of_the_package():
    graph = import_graph()
    assert {c: sorted(graph[c]) for c in CONTAINERS if graph.get(c)} == {}


def test_the_layering_check_finds_an_upward_arrow_a_sideways_arrow_and_a_package_circle():
    floors = (("base",), ("left", "right"), ("top",))
    arrows = {("left", "base"): ["base import"], ("top", "left"): ["down"],
              ("base", "top"): ["x.base.m -> x.top.n"], ("left", "right"): ["x.left.a -> x.right.b"]}
    assert arrows_not_pointing_down(arrows, floors) == [
        "base (floor 0) -> top (floor 2): x.base.m -> x.top.n",
        "left (floor 1) -> right (floor 1): x.left.a -> x.right.b",
    ]
    assert room_circles(arrows) == [["base", "left", "top"]]


def test_rooms_are_top_level_packages_and_the_sub_rooms_of_kcl():
    assert room_of("kcl_pipeline.zone.store.s3") == "zone"
    assert room_of("kcl_pipeline.kcl.core.model") == "kcl.core"
    assert room_of("kcl_pipeline.kcl.core.fleet.cycle") == "kcl.core.fleet"
    assert room_of("kcl_pipeline.sim.world") == "sim"
    assert room_of("kcl_pipeline.kcl.config") == "kcl.config"
    assert room_of("kcl_pipeline.cli") == "cli"
    assert room_of("kcl_pipeline.kcl") is None
    assert room_graph({"kcl_pipeline.zone.sink": {"kcl_pipeline.zone.store", "kcl_pipeline.kcl.core.model"},
                       "kcl_pipeline.kcl.core.model": {"kcl_pipeline.zone.layout"}}) == {
        ("kcl.core", "zone"): ["kcl_pipeline.kcl.core.model -> kcl_pipeline.zone.layout"],
        ("zone", "kcl.core"): ["kcl_pipeline.zone.sink -> kcl_pipeline.kcl.core.model"],
    }
