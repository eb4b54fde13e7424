"""No circles, no arrow up: the imports inside src/attnlab form no cycle, and a floor imports only from its own
floor and the floors below it (README "Layout"; issue 39).

``FLOORS`` is the one written order, top floor first. Every import counts, the ones inside functions too: a lazy
import still needs the module it names when it runs, and moving an import into a function is the usual way a
circle gets hidden rather than removed. What a module's parent package imports is not an arrow of the module
(Python runs ``attnlab/tasks/__init__.py`` before ``attnlab.tasks.registry``, but the package importing its own
members is how built-ins register); an import of the package itself (``from attnlab.tasks import TaskData``) is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Top floor first; a module is on the floor of the longest prefix that names it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("attnlab.cli", "attnlab.train", "attnlab.evaluate", "attnlab.table"),  # Hydra entry points (python -m shims)
    ("attnlab.training",),
    ("attnlab.tasks",),
    ("attnlab.decoding",),
    ("attnlab.metrics",),
    ("attnlab.models",),
    ("attnlab.attention",),  # kernels/ included
    ("attnlab.results",),  # no torch: run records, tables
    # What every floor may use: the package face, shared errors, the registry shape, the plugin loader (it
    # imports the user's modules by name, nothing of attnlab's above) and the packaged Hydra configs.
    ("attnlab", "attnlab.errors", "attnlab.registry", "attnlab.plugins", "attnlab.conf"),
)


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``package`` under ``src``."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> list[tuple[str, int]]:
    """(imported module of ``package``, line) for every import statement in the file, at any depth."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = name.split(".")[: len(name.split(".")) - node.level + is_package]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # ``from pkg import submodule`` names the submodule
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in modules else target, node.lineno))
    return [(target, line) for target, line in found if target == package or target.startswith(package + ".")]


def import_graph(src: Path, package: str) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, within ``package``."""
    modules = module_files(src, package)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for target, line in imports_of(name, path, modules, package):
            if target != name:
                edges.setdefault(target, line)
    return graph


def floor_of(module: str, floors=FLOORS) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, floor)
    for index, prefixes in enumerate(floors):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def arrows_up(graph: dict[str, dict[str, int]], floors=FLOORS) -> list[str]:
    return [f"{module} (floor {floor_of(module, floors)}) imports {target} (floor {floor_of(target, floors)}) "
            f"at line {line}"
            for module, edges in sorted(graph.items()) for target, line in sorted(edges.items())
            if floor_of(target, floors) < floor_of(module, floors)]


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, {})))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
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
                        found.append(sorted(component))
    return found


def describe_circle(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    ties = [f"{module} -> {target} (line {line})" for module in component
            for target, line in sorted(graph[module].items()) if target in members]
    return "; ".join(ties)


@pytest.fixture(scope="module")
def graph():
    return import_graph(SRC, "attnlab")


def test_every_module_of_attnlab_is_on_a_floor(graph):
    homeless = sorted(module for module in graph if floor_of(module) is None)
    assert not homeless, f"put these modules on a floor of FLOORS (here and in README 'Layout'): {homeless}"


def test_no_module_imports_from_a_floor_above_its_own(graph):
    up = arrows_up(graph)
    assert not up, "imports from a higher floor:\n" + "\n".join(up)


def test_no_import_cycle_inside_attnlab(graph):
    found = circles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe_circle(c, graph) for c in found)


# The checker itself, on a small package written here: it must see what the tests above rely on.
def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, dict[str, int]]:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(tmp_path, "pkg")


def test_the_checker_sees_a_circle_closed_by_a_lazy_relative_import(tmp_path):
    graph = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from pkg.low import b\n",
        "low/b.py": "def f():\n    from . import c\n",
        "low/c.py": "import pkg.low.a\n",
        "low/d.py": "from pkg.low.a import X\n",
    })
    assert circles(graph) == [["pkg.low.a", "pkg.low.b", "pkg.low.c"]]
    assert "pkg.low.b -> pkg.low.c (line 2)" in describe_circle(circles(graph)[0], graph)


def test_the_checker_sees_an_arrow_up_and_a_module_on_no_floor(tmp_path):
    graph = _package(tmp_path, {
        "__init__.py": "",
        "top.py": "from pkg.low.x import helper\n",
        "low/__init__.py": "",
        "low/x.py": "def helper():\n    from pkg import top\n",  # up, even though lazily
        "stray.py": "",
    })
    floors = (("pkg.top",), ("pkg.low",), ("pkg",))
    assert arrows_up(graph, floors) == ["pkg.low.x (floor 1) imports pkg.top (floor 0) at line 2"]
    assert floor_of("pkg.stray", (("pkg.top",), ("pkg.low",))) is None and floor_of("pkg.low.x", floors) == 1


def test_no_benchmark_imports_a_command():
    """Benchmarks time the library, not a command (issue 51): composing is ``training.compose``, and a benchmark
    that runs a command runs it by its ``python -m attnlab.<name>`` shim. Neither an import of ``attnlab.cli`` nor
    a module name spelled in a string."""
    root = SRC.parent / "benchmarks"
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.startswith("attnlab.cli")]
        if "attnlab.cli" in text:
            found.append(f"{path.name} names attnlab.cli")
    assert root.is_dir() and not found, "\n".join(found)
