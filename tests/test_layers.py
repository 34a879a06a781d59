"""The layers, read from the imports themselves.

From the bottom: `placement`, the core, stands alone and pure (no I/O, no environment, no logging, no process-wide
state that changes), and so does `certs`, the TLS material; `server` is the plumbing (HTTP app, logs, metrics, API
client, list/watch, reading inputs); the two faces, `webhook` and `extender`, stand on it side by side; `cli`, the
command line with its commands and the composition of a server process, is on top. A module imports its own
package and the layers below it, never one beside or above. Every `import` and `from … import` counts, at module
level or inside a function: a function-level import defers a circle to the first call, it does not remove it.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# package -> its layer; packages on one layer may not import each other.
LAYERS = {"placement": 0, "certs": 0, "server": 1, "webhook": 2, "extender": 2, "cli": 3}
PACKAGES = tuple(LAYERS)

# What the core may not import: the file system, the process and its environment, logging, the network.
IMPURE = {"os", "sys", "io", "pathlib", "shutil", "tempfile", "subprocess", "socket", "logging", "importlib"}
IMPURE_CALLS = {"open", "print", "input"}
# What a core module may bind at module level besides literals: calls whose result never changes.
IMMUTABLE_CALLS = {"re.compile", "get_args", "range", "frozenset", "tuple", "Decimal"}
MUTATORS = {"append", "appendleft", "add", "update", "pop", "popitem", "clear", "setdefault", "extend", "insert",
            "remove", "discard"}

Graph = dict[str, set[str]]


def package(module: str) -> str:
    return module.split(".")[0]


def sources(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    """module name -> (its source, whether it is a package's __init__)."""
    found = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            init = parts[-1] == "__init__"
            found[".".join(parts[:-1] if init else parts)] = (path.read_text(), init)
    return found


def imported(module: str, source: str, init: bool) -> set[str]:
    """Every dotted name `source` imports, at any depth (relative imports resolved against `module`)."""
    names: set[str] = set()
    here = module if init else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # the name may be a submodule
    return names


def graph(found: Mapping[str, tuple[str, bool]]) -> Graph:
    """module -> the modules of ours it imports (a name inside a module counts as that module)."""
    edges: Graph = {}
    for module, (source, init) in found.items():
        targets = set()
        for name in imported(module, source, init):
            while name and name not in found:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        edges[module] = targets
    return edges


def circles(edges: Graph) -> list[str]:
    """Each strongly connected component of more than one module (Tarjan): its modules, and its shortest circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while (w := stack.pop()) != v:
                component.add(w)
            components.append(component | {v})

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [f"{', '.join(sorted(c))} (e.g. {' -> '.join(_circle(edges, c))})" for c in components if len(c) > 1]


def _circle(edges: Graph, component: set[str]) -> list[str]:
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way round
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def violations(edges: Graph) -> list[str]:
    """The imports that go down-to-up or sideways between layers, as `importer -> imported: why`."""
    found = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            why = _forbidden(module, target)
            if why:
                found.append(f"{module} -> {target}: {why}")
    return found


def _forbidden(module: str, target: str) -> str | None:
    mine, theirs = package(module), package(target)
    if mine == theirs or LAYERS[theirs] < LAYERS[mine]:
        return None
    return f"{mine} (layer {LAYERS[mine]}) imports only the layers below it, not {theirs} (layer {LAYERS[theirs]})"


def impurities(module: str, source: str) -> list[str]:
    """What makes a core module impure: an import of IMPURE, a call of IMPURE_CALLS, a `global`, and module-level
    state that changes (bound to anything but a literal or an IMMUTABLE_CALLS call, or a literal it mutates)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [f"{module} imports {n}" for n in names if n.split(".")[0] in IMPURE]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IMPURE_CALLS:
            found.append(f"{module} calls {node.func.id}()")
        if isinstance(node, ast.Global):
            found.append(f"{module} rebinds the global {', '.join(node.names)}")
    displays: set[str] = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        bound = [ast.unparse(target) for target in targets]
        if isinstance(value, (ast.Dict, ast.Set, ast.List, ast.DictComp, ast.SetComp, ast.ListComp)):
            displays.update(bound)
        elif isinstance(value, ast.Call) and ast.unparse(value.func) not in IMMUTABLE_CALLS:
            found += [f"{module} keeps {name} = {ast.unparse(value)}, process-wide state" for name in bound]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and isinstance(node.value, ast.Name) and node.value.id in displays:
            found.append(f"{module} changes its module-level {node.value.id}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in displays:
            found.append(f"{module} changes its module-level {node.func.value.id}")
    return found


def test_no_import_circles() -> None:
    found = circles(graph(sources()))
    assert not found, "import circles: " + "; ".join(found)


def test_each_layer_imports_only_below_it() -> None:
    found = violations(graph(sources()))
    assert not found, "\n".join(found)


def test_the_core_is_pure() -> None:
    found = [i for module, (source, _) in sources().items() if package(module) == "placement"
             for i in impurities(module, source)]
    assert not found, "\n".join(found)


def test_each_impurity_is_found() -> None:
    source = """
import os.path
from logging import getLogger
from . import quiet
import re
JOURNAL = Stamps()
PATTERN = re.compile("x")
TABLE = {"a": 1}
SEEN = set()
NOTES = []

def note(text):
    global COUNT
    NOTES.append(text)
    TABLE["b"] = 2
    return open(text)
"""
    assert sorted(impurities("placement.bad", source)) == [
        "placement.bad calls open()", "placement.bad changes its module-level NOTES",
        "placement.bad changes its module-level TABLE", "placement.bad imports logging",
        "placement.bad imports os.path", "placement.bad keeps JOURNAL = Stamps(), process-wide state",
        "placement.bad keeps SEEN = set(), process-wide state", "placement.bad rebinds the global COUNT"]


def test_every_package_has_a_layer_and_ships() -> None:
    """A new top-level package is placed in LAYERS, and the wheel, the image and mypy take each layered one."""
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert on_disk == set(LAYERS), on_disk ^ set(LAYERS)
    assert {package(m) for m in graph(sources())} == set(LAYERS)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sorted(project["tool"]["setuptools"]["packages"]["find"]["include"]) == sorted(f"{p}*" for p in LAYERS)
    assert sorted(project["tool"]["mypy"]["files"]) == sorted(LAYERS)


def _synthetic(modules: Iterable[tuple[str, str]]) -> Graph:
    return graph({name: (text, name in {package(n) for n, _ in modules}) for name, text in modules})


def test_a_circle_through_a_function_level_import_is_found() -> None:
    edges = _synthetic([
        ("cli", ""),
        ("cli.main", "from cli.runner import run\n"),
        ("cli.runner", "def make():\n    from cli.main import parser\n"),
        ("server", ""),
        ("server.app", "from . import logs\n"),
        ("server.logs", ""),
    ])
    assert edges["server.app"] == {"server", "server.logs"}
    assert circles(edges) == ["cli.main, cli.runner (e.g. cli.main -> cli.runner -> cli.main)"]


def test_each_upward_or_sideways_import_fails() -> None:
    edges = _synthetic([
        ("placement", ""), ("placement.fit", "from server.app import Runtime\n"),
        ("certs", ""), ("certs.reload", "import placement.fit\n"),
        ("server", ""), ("server.app", "from extender import routes\n"),
        ("server.logs", "def f():\n    from cli.main import parser\n"),
        ("webhook", ""), ("webhook.routes", "from extender.filter import Judge\nfrom server.app import Runtime\n"),
        ("extender", ""), ("extender.filter", "from cli.render import render\nimport placement.fit\n"),
        ("cli", ""), ("cli.main", "from cli.render import render\n"),
        ("cli.render", "import webhook.routes, extender.filter, server.app, certs, placement.fit\n"),
    ])
    assert [v.split(":")[0] for v in violations(edges)] == [
        "certs.reload -> placement.fit", "extender.filter -> cli.render", "placement.fit -> server.app",
        "server.app -> extender", "server.logs -> cli.main", "webhook.routes -> extender.filter"]
