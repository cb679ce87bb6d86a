"""The module map: no import cycle between graphattn modules, no upward import between subpackages.

Every ``import`` / ``from ... import`` anywhere in a file counts, including those inside
functions (a lazy import still makes two modules depend on each other). ``from pkg import name``
is an import of ``pkg.name`` when that is a module, else of ``pkg``; a package's ``__init__`` is
the package's module, so the submodules it imports are its edges too. docs/design.md ("Module
map") describes the table below.
"""

from __future__ import annotations

import ast
import pathlib

import graphattn

ROOT = pathlib.Path(graphattn.__file__).resolve().parent
TOP = {"graphattn", "graphattn.cli", "graphattn.__main__"}  # may import anything

# subpackage -> the subpackages it may import (besides itself).
ALLOWED = {
    "common": set(),
    "graphs": {"common"},
    "cuda": {"common", "graphs"},
    "hip": {"common", "graphs"},
    "kernels": {"common"},
    "backends": {"common", "kernels"},
    "testing": {"common", "graphs", "kernels", "backends"},
    "bench": {"common", "graphs", "kernels", "backends"},
}
# Single edges the table does not allow, each with its reason.
EXCEPTIONS = {
    # aot compiles every setting of the NVIDIA and AMD launch tables ahead of time.
    ("graphattn.kernels.aot", "graphattn.cuda.configs"),
    ("graphattn.kernels.aot", "graphattn.hip.configs"),
}
# Deprecated re-exports at the paths the graph machinery moved from (one release): the only
# upward imports allowed.
SHIMS = {
    "graphattn.common": {"graphattn.graphs"},
    "graphattn.common.graphs": {"graphattn.graphs.breakable", "graphattn.graphs.segments"},
    "graphattn.common.runner": {"graphattn.graphs.runner"},
    "graphattn.common.sanitizer": {"graphattn.graphs.sanitizer"},
    "graphattn.common.emulated": {"graphattn.graphs.emulated"},
}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported(name: str, path: pathlib.Path, modules: set[str]) -> set[str]:
    """The graphattn modules that module ``name`` (file ``path``) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import a.b.func``: the module part
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` over every graphattn module."""
    modules = _modules()
    return {name: _imported(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        scc.append(top)
                        if top == node:
                            break
                    if len(scc) > 1:
                        sccs.append(sorted(scc))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sccs


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def _upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        if src in TOP:
            continue
        for dst in sorted(targets):
            ok = (_layer(dst) == _layer(src) or _layer(dst) in ALLOWED[_layer(src)]
                  or (src, dst) in EXCEPTIONS or dst in SHIMS.get(src, ()))
            if not ok and dst not in TOP:
                bad.append(f"{src} -> {dst} ({_layer(src)} may import only {sorted(ALLOWED[_layer(src)])})")
            elif dst in TOP:
                bad.append(f"{src} -> {dst} (only the top imports the top)")
    return bad


def test_no_import_cycle():
    graph = import_graph()
    cycles = _cycles(graph)
    lines = []
    for scc in cycles:
        edges = [f"{a} -> {b}" for a in scc for b in sorted(graph[a]) if b in scc]
        lines.append(" <-> ".join(scc) + "\n    edges: " + "; ".join(edges))
    assert not cycles, "import cycles (function-level imports counted):\n  " + "\n  ".join(lines)


def test_no_upward_import_between_subpackages():
    graph = import_graph()
    assert set(ALLOWED) | {"graphattn", "cli", "__main__"} >= {_layer(m) for m in graph}, (
        f"a subpackage is missing from ALLOWED: {sorted({_layer(m) for m in graph} - set(ALLOWED))}"
    )
    bad = _upward(graph)
    assert not bad, "imports against the module map (docs/design.md):\n  " + "\n  ".join(bad)


def test_shims_and_exceptions_are_real():
    """Every listed shim and exception is an edge that exists: the lists cannot go stale."""
    graph = import_graph()
    stale = [f"{s} -> {d}" for s, ds in SHIMS.items() for d in ds if d not in graph.get(s, ())]
    stale += [f"{s} -> {d}" for s, d in sorted(EXCEPTIONS) if d not in graph.get(s, ())]
    assert not stale, f"listed edges that no longer exist (remove them from the lists): {stale}"


def test_the_checker_sees_function_level_and_relative_imports():
    """A cycle made only through an import inside a function is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    modules = _modules()
    edges = _imported("graphattn.common.capture", modules["graphattn.common.capture"], set(modules))
    assert "graphattn.common.platform" in edges  # imported inside is_capturing()


def test_old_import_paths_still_work_and_warn():
    """The deprecated paths re-export the very objects (for one release) and say where they went."""
    import importlib

    import pytest

    import graphattn.common
    import graphattn.graphs as graphs

    for name in ("BreakableGraph", "eager_on_graph", "GraphRunner", "default_buckets"):
        assert getattr(graphattn.common, name) is getattr(graphs, name)
    for old, names in {"graphattn.common.graphs": ["BreakableGraph", "StreamGraphSegment"],
                       "graphattn.common.runner": ["GraphRunner", "default_buckets"],
                       "graphattn.common.sanitizer": ["StorageTracker", "sanitize_enabled"],
                       "graphattn.common.emulated": ["EmulatedGraphSegment"]}.items():
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated; import from graphattn.graphs"):
            module = importlib.reload(importlib.import_module(old))
        for name in names:
            assert getattr(module, name) is getattr(graphs, name), f"{old}.{name}"
