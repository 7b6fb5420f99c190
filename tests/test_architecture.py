"""The project's module import graph, read with ``ast`` (nothing is imported; imports at the top,
inside functions and under ``if TYPE_CHECKING:`` all count): no cycles, and
CONTRIBUTING.md's dependency direction for ``mechanisms`` (its own modules and
``privrelease.errors`` only)."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Edges known to close a cycle, left while another change reworks the files they join. Each is
# (importer, imported).
KNOWN_EDGES: set[tuple[str, str]] = {
    # kinds refactor in progress: an event module asks the kinds to register their events (and
    # builds its PLD from .pld, which accounts through .accountants, which imports the events);
    # the kinds' type hints name the policy schema and loader, which are assembled from the kinds.
    ("privrelease.mechanisms.events", "privrelease.mechanisms.kinds"),
    ("privrelease.mechanisms.events", "privrelease.mechanisms.pld"),
    ("privrelease.mechanisms.kinds", "privrelease.policies.loader"),
    ("privrelease.mechanisms.kinds", "privrelease.policies.schema"),
}


def package_dirs() -> dict[str, Path]:
    """Package name -> folder, from pyproject's ``[tool.setuptools] package-dir``."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    return {name: REPO / folder for name, folder in setuptools["package-dir"].items()}


def project_modules() -> dict[str, Path]:
    """Every module of the project (``privrelease.x.y`` -> its file); the most specific
    package-dir mapping wins (``privrelease.flows`` is ``flows/``, not ``privrelease/flows``)."""
    dirs = package_dirs()
    modules: dict[str, Path] = {}
    for package, folder in sorted(dirs.items(), key=lambda item: len(item[0])):
        for file in folder.rglob("*.py"):
            parts = file.relative_to(folder).with_suffix("").parts
            if "migrations" in parts and "versions" in parts:
                continue  # Alembic revisions are loaded by Alembic, not imported
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            first = ".".join((package, *parts[:1])) if parts else package
            if first != package and first in dirs and dirs[first] != folder / parts[0]:
                continue  # a folder of the same name mapped elsewhere
            modules[name] = file
    return modules


def _imported(nodes: list[ast.stmt], module: str, is_package: bool, modules: set[str]) -> Iterator[str]:
    """The project modules the import statements ``nodes`` of ``module`` import: ``from p import
    m`` imports the module ``p.m`` when there is one, else (a name defined in ``p``) ``p``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                yield f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports: at import time, when a function runs, or for a
    type checker (``if TYPE_CHECKING:``: a cycle there is still two modules that need each other)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, file in modules.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        targets = {
            imported
            for imported in _imported(nodes, name, file.name == "__init__.py", set(modules))
            if imported in modules and imported != name
        }
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a cycle
    through them found by a depth-first search, for the message."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_a_cycle(graph, component) for component in components]


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the first module of ``component`` (breadth-first: a shortest one)."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in component {component}")


def test_the_graph_sees_every_layer() -> None:
    graph = import_graph()
    assert "privrelease.flows.data" in graph and "privrelease.datasets" in graph["privrelease.flows.data"]
    assert "privrelease.mechanisms.events" in graph and "privrelease.audit.chain" in graph
    assert {"privrelease.errors", "privrelease.policies.schema", "privrelease.reports.render"} <= set(graph)


def test_no_import_cycles() -> None:
    graph = import_graph()
    for importer, imported in KNOWN_EDGES:
        graph[importer].discard(imported)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


KIND_HINTS = {"privrelease.policies.loader", "privrelease.policies.schema"}


def test_mechanisms_import_nothing_of_the_project_but_their_own_and_errors() -> None:
    """CONTRIBUTING: ``mechanisms`` imports its own modules (and ``privrelease.errors``) only,
    except ``mechanisms/kinds/``, which may import ``policies.fields``."""
    graph = import_graph()
    outside = {
        (module, imported)
        for module, targets in graph.items()
        if module.startswith("privrelease.mechanisms")
        for imported in targets
        if not imported.startswith("privrelease.mechanisms")
        and imported != "privrelease.errors"
        and not (module.startswith("privrelease.mechanisms.kinds") and imported == "privrelease.policies.fields")
        and (module, imported) not in KNOWN_EDGES
        # kinds refactor in progress: the kinds' type hints name the policy schema and loader
        and not (module.startswith("privrelease.mechanisms.kinds") and imported in KIND_HINTS)
    }
    assert not outside, sorted(outside)
