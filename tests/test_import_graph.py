"""No import cycles: not between modules (function-local imports included), not between subpackages."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "autoinfer"


def _modules(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(package: Path = PACKAGE) -> nx.DiGraph:
    """module → module it imports, anywhere in the file (a function-local import hides a cycle, it does not
    remove it)."""
    modules = _modules(package)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = parent.split(".")[: len(parent.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != package.name:
                    graph.add_edge(name, target)
    return graph


def _subpackage(module: str) -> str | None:
    """The subpackage a module belongs to (None for modules directly in autoinfer/)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def test_no_module_imports_itself_through_others():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, f"modules in an import circle: {cycles}"


def test_no_subpackages_import_each_other():
    packages = nx.DiGraph()
    for a, b in import_graph().edges:
        pa, pb = _subpackage(a), _subpackage(b)
        if pa and pb and pa != pb:
            packages.add_edge(pa, pb, via=f"{a} → {b}")
    cycles = [sorted(c) for c in nx.strongly_connected_components(packages) if len(c) > 1]
    edges = {f"{a}→{b}": d["via"] for a, b, d in packages.edges(data=True)
             if any(a in c and b in c for c in cycles)}
    assert not cycles, f"subpackages in an import circle: {cycles}; edges: {edges}"


def test_the_graph_sees_a_cycle_closed_inside_a_function(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import x\n    return x\n")
    graph = import_graph(package)
    assert graph.has_edge("pkg.a", "pkg.sub.b") and graph.has_edge("pkg.sub.b", "pkg.a")
    assert [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1] == [["pkg.a", "pkg.sub.b"]]



#: The packages bottom to top, as README's code map and docs/ARCHITECTURE.md list them.
LAYERS = ("measure", "model", "llama", "refengine", "engines", "store", "export", "campaign", "coordination", "search",
          "sweep", "analysis")


def test_packages_import_only_those_below_them():
    rank = {name: i for i, name in enumerate(LAYERS)}
    packages = {_subpackage(m) for m in import_graph()} - {None}
    assert packages == set(LAYERS), f"a package the layer list lacks (or lists in vain): {packages ^ set(LAYERS)}"
    upward = sorted(f"{a} → {b}" for a, b in import_graph().edges
                    if _subpackage(a) and _subpackage(b) and rank[_subpackage(b)] > rank[_subpackage(a)])
    assert not upward, upward
