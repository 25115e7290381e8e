"""The layout's rules, read from the code: no import circle, between modules or between sim's
packages and top-level modules (packages import one way), no network client reachable from
the pure core (sim.memory, sim.output), no reach into another package's private modules,
agents that reach the engine only through their context, aiomqtt only in the one MQTT layer
(sim.mqtt), child processes started by `sim.helper` only, no module over 400 lines nor class
over 250 (a room that grew past its job), tests that wait for conditions rather than for a
fixed time.

Every `import` and `from ... import` of sim, agents and benchmarks is read with `ast`, those
inside functions too, and those under `if TYPE_CHECKING:` for the circles (a circle that
only type checking closes is still one module needing the other both ways). An
import of `a.b` loads the package `a` first, but that implicit edge is not counted for the
circles (every submodule would otherwise form one with its package's `__init__`); it is for
what the pure core reaches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import REPO

ROOTS = ("sim", "agents", "benchmarks")
# What an agent may import from the engine: its context, the wire events, the state model.
AGENT_ALLOWED = ("sim.shard", "sim.wire", "sim.memory", "sim.scenario")
PROCESS_STARTERS = {"sim.helper", "sim.broker"}
"""The modules that start child processes: npcsim's own (`sim.helper`) and Mosquitto (`sim.broker`)."""
PROCESS_MODULES = ("multiprocessing", "subprocess", "concurrent.futures.process")
MQTT_LAYER = "sim.mqtt"
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250
SLEEPS_ALLOWED = ("tests/helpers.py", "tests/faults/")
"""Where tests may sleep for a literal time: `elapse` in the helpers, and the fault harness,
whose outages and delays are what it injects."""


def _modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Ids of the import nodes inside `if TYPE_CHECKING:` bodies."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                hidden.update(id(n) for n in ast.walk(inner))
    return hidden


def _package_of(module: str) -> str:
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports(module: str, *, type_checking: bool = False) -> Iterator[tuple[str, str, int]]:
    """(target module, imported name or "", line) for every import `module` makes; those under
    `if TYPE_CHECKING:` too with `type_checking`."""
    tree = ast.parse(MODULES[module].read_text())
    hidden = set() if type_checking else _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(module).split(".")
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                yield base, alias.name, node.lineno


def edges(module: str, *, type_checking: bool = False) -> Iterator[tuple[str, str, int]]:
    """(target module, imported name, line) for imports of modules of this repository."""
    for base, name, line in imports(module, type_checking=type_checking):
        if name and f"{base}.{name}" in MODULES:
            yield f"{base}.{name}", "", line
        elif base in MODULES:
            yield base, name, line


def test_no_import_circle() -> None:
    graph = {m: sorted({t for t, _, _ in edges(m, type_checking=True) if t != m}) for m in MODULES}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in graph[module]:
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def _private_owner(target: str) -> str | None:
    """The package a private module belongs to (`sim.memory` for `sim.memory._build`), or None."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_no_module_reaches_into_another_packages_private_modules() -> None:
    reaches = []
    for module in sorted(MODULES):
        for target, name, line in edges(module):
            owner = _private_owner(target)
            if name.startswith("_") and not name.startswith("__"):
                owner = owner or _package_of(target)
            if owner is not None and not (module == owner or module.startswith(owner + ".")):
                reaches.append(f"{MODULES[module].relative_to(REPO)}:{line}: {target} {name}".rstrip())
    assert not reaches, "private imports across packages:\n" + "\n".join(reaches)


def test_agents_reach_the_engine_only_through_their_context() -> None:
    wrong = []
    for module in sorted(m for m in MODULES if m.startswith("agents")):
        for target, name, line in edges(module):
            if target.startswith("sim") and not target.startswith(AGENT_ALLOWED):
                wrong.append(f"{MODULES[module].relative_to(REPO)}:{line}: {target} {name}".rstrip())
    assert not wrong, "agents importing engine internals:\n" + "\n".join(wrong)


def process_starts(module: str) -> Iterator[int]:
    """The lines where `module` imports a way of starting processes, or starts an asyncio child process."""
    for base, name, line in imports(module):
        if base.startswith(PROCESS_MODULES) or name == "ProcessPoolExecutor":
            yield line
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("create_subprocess_"):
            yield node.lineno


def test_child_processes_are_started_by_sim_helper_only() -> None:
    wrong = [
        f"{MODULES[module].relative_to(REPO)}:{line}"
        for module in sorted(m for m in MODULES if m.startswith("sim") and m not in PROCESS_STARTERS)
        for line in process_starts(module)
    ]
    assert not wrong, "a child process started outside sim.helper (use sim.helper.Helper):\n" + "\n".join(wrong)


def literal_sleeps(tree: ast.AST) -> Iterator[int]:
    """The lines of `time.sleep(N)` and `asyncio.sleep(N)` (or `sleep(N)` imported from either)
    with N a literal other than 0 (`asyncio.sleep(0)` is a yield, not a wait)."""
    bare = {
        a.asname or a.name
        for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module in ("time", "asyncio")
        for a in n.names if a.name == "sleep"
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        sleep = (isinstance(f, ast.Attribute) and f.attr == "sleep" and isinstance(f.value, ast.Name)
                 and f.value.id in ("time", "asyncio")) or (isinstance(f, ast.Name) and f.id in bare)
        given = [*node.args, *(k.value for k in node.keywords)][:1]
        if sleep and given and isinstance(given[0], ast.Constant) and given[0].value != 0:
            yield node.lineno


def test_tests_wait_for_conditions_not_for_a_literal_time() -> None:
    wrong = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        where = path.relative_to(REPO).as_posix()
        if where.startswith(SLEEPS_ALLOWED):
            continue
        wrong += [f"{where}:{line}" for line in literal_sleeps(ast.parse(path.read_text(), str(path)))]
    assert not wrong, ("a sleep for a literal time: wait for the condition (helpers.eventually, the shard's "
                       "VirtualClock), or, where the time itself is the subject, helpers.elapse:\n" + "\n".join(wrong))


def test_aiomqtt_only_in_the_mqtt_layer() -> None:
    """One MQTT connection layer: every other module reaches a broker through sim.mqtt."""
    outside = [
        f"{MODULES[module].relative_to(REPO)}:{line}"
        for module in sorted(MODULES)
        if not (module == MQTT_LAYER or module.startswith(MQTT_LAYER + "."))
        for target, _, line in imports(module, type_checking=True)
        if target == "aiomqtt" or target.startswith("aiomqtt.")
    ]
    assert not outside, "aiomqtt imported outside sim.mqtt:\n" + "\n".join(outside)


def oversized(source: str) -> Iterator[str]:
    """A module over MAX_MODULE_LINES lines, a class over MAX_CLASS_LINES: more than one job."""
    if (lines := source.count("\n")) > MAX_MODULE_LINES:
        yield f"{lines} lines"
    for node in ast.walk(ast.parse(source)):
        size = (node.end_lineno or node.lineno) - node.lineno + 1 if isinstance(node, ast.ClassDef) else 0
        if isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES:
            yield f"{node.lineno}: class {node.name}, {size} lines"


def test_rooms_are_sized_by_their_job() -> None:
    big = [f"{MODULES[m].relative_to(REPO)}: {what}" for m in sorted(MODULES) if m.startswith(("sim", "agents"))
           for what in oversized(MODULES[m].read_text())]
    assert not big, "rooms past their job:\n" + "\n".join(big)


def test_the_rules_see_what_they_are_about() -> None:
    """The reader finds imports inside functions and skips TYPE_CHECKING ones (else the tests above prove nothing)."""
    assert len(MODULES) > 80
    assert any(t == "sim.memory" for t, _, _ in edges("sim.checkers.memory"))
    source = ast.parse("import x\nif TYPE_CHECKING:\n    import y\ndef f():\n    import z\n")
    hidden = _type_checking_only(source)
    names = [a.name for n in ast.walk(source) if isinstance(n, ast.Import) and id(n) not in hidden for a in n.names]
    assert sorted(names) == ["x", "z"]
    big = "class A:\n" + "    x = 1\n" * MAX_CLASS_LINES
    assert list(oversized(big)) == [f"1: class A, {MAX_CLASS_LINES + 1} lines"]
    assert list(oversized("x = 1\n" * (MAX_MODULE_LINES + 1))) == [f"{MAX_MODULE_LINES + 1} lines"]
    assert _private_owner("sim.memory._build") == "sim.memory" and _private_owner("sim.memory.render") is None
    sleeps = ast.parse("import time\nfrom asyncio import sleep as nap\ntime.sleep(0.3)\nnap(1)\n"
                       "asyncio.sleep(0)\nasyncio.sleep(delay=2)\nclock.sleep(5)\ntime.sleep(s)\n")
    assert list(literal_sleeps(sleeps)) == [3, 4, 6]
    assert list(process_starts("sim.broker")) and list(process_starts("sim.helper"))


def _unit(module: str) -> str | None:
    """The room a module of sim belongs to: its package under sim, or the top-level module
    itself (`sim.wire` for `sim.wire.trace`, `sim.audit` for `sim.audit`); None outside sim
    and for sim's own `__init__`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sim" and len(parts) > 1 else None


def package_graph() -> dict[str, dict[str, list[str]]]:
    """Between sim's packages and top-level modules: for each room, the rooms it imports and
    where (`path:line`), `if TYPE_CHECKING:` imports too."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module in sorted(MODULES):
        if (room := _unit(module)) is None:
            continue
        graph.setdefault(room, {})
        for target, _, line in edges(module, type_checking=True):
            if (other := _unit(target)) is not None and other != room:
                graph[room].setdefault(other, []).append(f"{MODULES[module].relative_to(REPO)}:{line}")
    return graph


def package_circles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The groups of rooms that import each other, directly or round a circle (Tarjan's
    strongly connected components of more than one room), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(room: str) -> None:
        index[room] = low[room] = len(index)
        stack.append(room)
        for other in graph.get(room, {}):
            if other not in index:
                visit(other)
                low[room] = min(low[room], low[other])
            elif other in stack:
                low[room] = min(low[room], index[other])
        if low[room] == index[room]:
            group = []
            while (top := stack.pop()) != room:
                group.append(top)
            if group:
                found.append(sorted([room, *group]))

    for room in sorted(graph):
        if room not in index:
            visit(room)
    return found


def test_packages_import_one_way() -> None:
    """No two of sim's packages and top-level modules import each other, directly or round a
    circle: shared value types live in one leaf module both import (sim.wire.attempt)."""
    graph = package_graph()
    lines = []
    for group in package_circles(graph):
        lines.append(" <-> ".join(group))
        lines += [f"  {a} -> {b}: {', '.join(graph[a][b][:3])}" for a in group for b in group if b in graph[a]]
    assert not lines, "package-level import circles:\n" + "\n".join(lines)


NETWORK_CLIENTS = ("httpx", "aiohttp", "aiomqtt", "aiosqlite", "sqlite3", "socket", "urllib.request", "http.client")
PURE_CORE = ("sim.memory", "sim.output")


def network_path(start: str) -> list[str] | None:
    """The chain of imports from the package `start` (any of its modules) to a network client,
    or None. Imports inside functions count (they run when called); `if TYPE_CHECKING:` ones
    do not; importing `a.b.c` loads the packages `a.b` and `a` too."""
    came_from: dict[str, str | None] = {m: None for m in MODULES if m == start or m.startswith(start + ".")}
    queue = sorted(came_from)
    while queue:
        module = queue.pop(0)
        for base, name, _ in imports(module):
            for target in (base, f"{base}.{name}" if name else base):
                if any(target == client or target.startswith(client + ".") for client in NETWORK_CLIENTS):
                    chain = [target, module]
                    while (before := came_from[chain[-1]]) is not None:
                        chain.append(before)
                    return chain[::-1]
        parts = module.split(".")
        loaded = [t for t, _, _ in edges(module)] + [".".join(parts[:i]) for i in range(1, len(parts))]
        for target in loaded:
            if target in MODULES and target not in came_from:
                came_from[target] = module
                queue.append(target)
    return None


def test_the_pure_core_reaches_no_network_client() -> None:
    """sim.memory and sim.output import no network client, directly or through other modules."""
    assert network_path("sim.output") is None, " -> ".join(network_path("sim.output") or [])
    assert network_path("sim.memory") is None, " -> ".join(network_path("sim.memory") or [])


def test_the_direction_checks_see_what_they_are_about() -> None:
    """The package check finds a circle and the reachability check a client (else they prove nothing)."""
    assert package_circles({"sim.a": {"sim.b": []}, "sim.b": {"sim.c": []}, "sim.c": {"sim.a": []}, "sim.d": {}}) == [
        ["sim.a", "sim.b", "sim.c"]]
    assert package_circles({"sim.a": {"sim.b": []}, "sim.b": {}}) == []
    assert _unit("sim.wire.trace") == "sim.wire" and _unit("sim.audit") == "sim.audit" and _unit("sim") is None
    assert "sim.wire" in package_graph()["sim.audit"]
    assert (network_path("sim.inference.backends") or [""])[-1] == "httpx"
    assert (network_path("sim.store") or [""])[-1] in ("aiosqlite", "sqlite3")
    assert (network_path("sim.mqtt") or [""])[-1] in NETWORK_CLIENTS


def test_no_function_takes_more_than_nine_parameters() -> None:
    """A function of sim or agents over 9 parameters (every one but self/cls, keyword-only and
    *args/**kwargs included) asks for parts, not a longer list."""
    limit = 9

    def counted(args: ast.arguments) -> int:
        names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
        return len(names) - (names[:1] in (["self"], ["cls"])) + (args.vararg is not None) + (args.kwarg is not None)

    def over(source: str) -> Iterator[str]:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (n := counted(node.args)) > limit:
                yield f"{node.lineno}: {node.name}, {n} parameters"

    assert list(over("def f(self, a, b, c, d, e, f, g, h, *i): pass\n")) == []
    assert list(over("async def f(a, b, c, d, e, f, g, h, *, i, **j): pass\n")) == ["1: f, 10 parameters"]
    long = [f"{MODULES[m].relative_to(REPO)}: {what}" for m in sorted(MODULES) if m.startswith(("sim", "agents"))
            for what in over(MODULES[m].read_text())]
    assert not long, "parameter lists instead of parts:\n" + "\n".join(long)
