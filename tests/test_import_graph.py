"""The op layer's imports, read from the source (every import statement, at module level, in a
function or under TYPE_CHECKING): no cycle through kdactl.kda or kdactl.kernel_abi, and the layers
below the op (the kernel ABI, the build layer, the fault parser, the SKU table) never import it."""

import ast
from pathlib import Path

import kdactl

ROOT = Path(kdactl.__file__).parent.parent
LOWER = ("kdactl.kernel_abi", "kdactl.jit", "kdactl.faults", "kdactl.skus")


def module_graph() -> dict[str, set[str]]:
    """module -> the kdactl modules it imports (a name imported from a module counts as the module)."""
    paths = {}
    for path in (ROOT / "kdactl").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names += [base, *(f"{base}.{a.name}" for a in node.names)]
        graph[module] = {m for n in names if n.startswith("kdactl") and (m := known(n)) and m != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_runs_through_the_op_layer():
    graph = module_graph()
    assert "kdactl.kda.api" in graph and "kdactl.kda.api" in graph["kdactl.kda.fla_api"]  # the reader sees imports
    op_layer = [c for c in cycles(graph) if any(m.startswith(("kdactl.kda", "kdactl.kernel_abi")) for m in c)]
    assert op_layer == []


def test_the_layers_below_the_op_never_import_it():
    graph = module_graph()
    upward = {m: sorted(t for t in targets if t.startswith("kdactl.kda"))
              for m, targets in graph.items() if m.startswith(LOWER)}  # fmt: skip
    assert {m: t for m, t in upward.items() if t} == {}
    assert graph["kdactl.kernel_abi"] == set()  # the bottom layer imports nothing of kdactl


def test_the_reader_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
