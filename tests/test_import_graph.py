"""The kdactl package's import graph: no cycles, and no module imports a layer above its own.

Read from the source with ast, module-level and function-level imports alike (a function-level import
is still a dependency; it only hides it from the interpreter at import time). One arrow per module
pair: ``import a.b`` and ``from a import b`` point at the module a.b when it exists, else at a; the
parent packages the interpreter also runs are not arrows.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kdactl"

# Bottom to top, each layer importing only its own and lower ones: the shared plumbing, the target and
# SKU tables, reading the machine, building and loading the library, the node's facts (which name the
# library a node loads), planted faults, the KDA op, its fp64 reference, what measures or checks the op
# (the route smokes draw the bench's configurations), what judges a node, what publishes judgements,
# and the commands that drive all of it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("kdactl", "kdactl.errors", "kdactl.settings", "kdactl.atomic", "kdactl.assets", "kdactl.proc",
              "kdactl.results", "kdactl.emit", "kdactl.kernel_abi")),
    ("targets", ("kdactl.targets",)),
    ("skus", ("kdactl.skus",)),
    ("hw", ("kdactl.hw",)),
    ("jit", ("kdactl.jit",)),
    ("node", ("kdactl.node",)),
    ("faults", ("kdactl.faults",)),
    ("kda", ("kdactl.kda",)),
    ("reference", ("kdactl.reference",)),
    ("bench/smoke/sanitizer/suite", ("kdactl.bench", "kdactl.smoke", "kdactl.sanitizer", "kdactl.suite",
                                     "kdactl.suite_plugin")),
    ("certify", ("kdactl.certify",)),
    ("fleet/integrations", ("kdactl.fleet", "kdactl.integrations")),
    ("commands", ("kdactl.build_command", "kdactl.cli", "kdactl.entry", "kdactl.__main__")),
]  # fmt: skip

Edge = tuple[str, str]


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its __init__)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the innermost one it lies in."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        out.update(t for t in (_owner(n, mods) for n in names) if t and t != module)
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(package)
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def edges_of(graph: dict[str, set[str]]) -> set[Edge]:
    return {(a, b) for a, targets in graph.items() for b in targets}


def cycles(edges: set[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    succ: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the longest prefix that names the module or a package above it (the root
    package names only itself, so that a new module must be given a layer)."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            inside = module.startswith(p + ".") and p != PACKAGE.name
            if (module == p or inside) and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return None if best is None else best[1]


def upward(edges: set[Edge]) -> list[str]:
    out = []
    for a, b in sorted(edges):
        la, lb = layer_of(a), layer_of(b)
        if la is not None and lb is not None and lb > la:
            out.append(f"{a} ({LAYERS[la][0]}) -> {b} ({LAYERS[lb][0]})")
    return out


def _counted() -> set[Edge]:
    return edges_of(import_graph())


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in modules() if layer_of(m) is None)
    assert not unplaced, f"add these modules to a layer in LAYERS: {', '.join(unplaced)}"


def test_no_import_cycles():
    found = cycles(_counted())
    edges = _counted()
    shown = [f"{' <-> '.join(c)}: " + ", ".join(f"{a} -> {b}" for a, b in sorted(edges) if a in c and b in c)
             for c in found]  # fmt: skip
    assert not found, "import cycles:\n" + "\n".join(shown)


def test_no_cycles_between_packages():
    """Modules of a package may form no cycle with another package even where no module cycle does
    (a.x -> b.y -> a.z): the package is what a reader sees as one room."""
    rooms = {(_room(a), _room(b)) for a, b in _counted() if _room(a) != _room(b)}
    found = cycles(rooms)
    edges = _counted()
    shown = [f"{' <-> '.join(c)}: " + ", ".join(f"{a} -> {b}" for a, b in sorted(edges) if _room(a) in c and _room(b) in c
                                               and _room(a) != _room(b)) for c in found]  # fmt: skip
    assert not found, "import cycles between packages:\n" + "\n".join(shown)


def _room(module: str) -> str:
    """kdactl.jit.aot -> kdactl.jit; kdactl.node -> kdactl.node."""
    return ".".join(module.split(".")[:2])


def test_no_upward_imports():
    found = upward(_counted())
    assert not found, "imports of a higher layer (" + " < ".join(n for n, _ in LAYERS) + "):\n" + "\n".join(found)


def test_the_graph_reader_sees_function_level_relative_and_from_imports(tmp_path):
    pkg = tmp_path / "kdactl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("def f():\n    from kdactl.top import x\n    import kdactl.sub\n")
    (pkg / "top.py").write_text("from .sub.leaf import f\nx = 1\n")
    graph = import_graph(pkg)
    assert graph == {"kdactl": set(), "kdactl.sub": {"kdactl.sub.leaf"},
                     "kdactl.sub.leaf": {"kdactl.top", "kdactl.sub"}, "kdactl.top": {"kdactl.sub.leaf"}}  # fmt: skip
    assert cycles(edges_of(graph)) == [["kdactl.sub", "kdactl.sub.leaf", "kdactl.top"]]
    assert upward({("kdactl.errors", "kdactl.cli"), ("kdactl.cli", "kdactl.errors")}) == [
        "kdactl.errors (base) -> kdactl.cli (commands)"
    ]


def test_a_module_outside_every_layer_is_unplaced():
    assert layer_of("kdactl.new_module") is None and layer_of("kdactl.jit.new_module") == 4
