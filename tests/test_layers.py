"""The package's layering, checked from its source with ``ast`` (no import is executed).

core -> data -> sim -> study -> (present, validation, params, cli, notebooks, bench): each layer
imports only the layers below it; no module imports a module that (directly or not) imports it;
the package's own modules are imported at module top (never inside a function); and the compute
layers never import a plotting library.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lib" / "portbench"
LAYERS = ("core", "data", "sim", "study")
ALLOWED = {  # layer -> layers it may import
    "core": set(),
    "data": {"core"},
    "sim": {"core", "data"},
    "study": {"core", "data", "sim"},
}
PLOTTING = ("matplotlib", "seaborn")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path):
    """(target module, line, inside a function?) of every import in ``path`` (package-relative
    imports resolved to absolute names; third-party imports as written)."""
    tree = ast.parse(path.read_text())
    mod = _module_name(path)
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def in_function(node) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return True
        return False

    def in_type_checking(node) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                return True
        return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno, in_function(node), in_type_checking(node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("portbench"):
                for a in node.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{target}.{a.name}"
                    if (PKG.parent / (sub.replace(".", "/") + ".py")).is_file() or \
                            (PKG.parent / sub.replace(".", "/")).is_dir():
                        yield sub, node.lineno, in_function(node), in_type_checking(node)
                    else:
                        yield target, node.lineno, in_function(node), in_type_checking(node)
            else:
                yield target, node.lineno, in_function(node), in_type_checking(node)


FILES = sorted(PKG.rglob("*.py"))
GRAPH: dict[str, set[str]] = defaultdict(set)
ALL = {}
for _f in FILES:
    _m = _module_name(_f)
    ALL[_m] = list(_imports(_f))
    for _t, _line, _in_fn, _tc in ALL[_m]:
        if _t.startswith("portbench") and _t != _m and not _tc:
            GRAPH[_m].add(_t)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _is_module(name: str) -> bool:
    return name in ALL


def test_every_layer_imports_only_layers_below_it():
    bad = []
    for mod, imports in ALL.items():
        layer = _layer(mod)
        if layer is None:
            continue
        for target, line, _, tc in imports:
            if not target.startswith("portbench") or tc:
                continue
            t_layer = _layer(target)
            if t_layer == layer:
                continue
            if t_layer not in ALLOWED[layer]:
                bad.append(f"{mod}:{line} imports {target} ({layer} may import only {sorted(ALLOWED[layer]) or 'nothing of the package'})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    # Tarjan's strongly connected components over module -> module imports (package __init__ edges
    # count as imports of the package's __init__ module)
    graph = {m: {t for t in ts if t in ALL} for m, ts in GRAPH.items()}
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(ALL):
        if v not in index:
            strong(v)
    assert not comps, "import cycles: " + "; ".join(" <-> ".join(c) for c in comps)


OPTIONAL_HEAVY = ("vllm", "distributed", "dask", "papermill", "pooch", "torch", "scikit_posthocs", "pandas",
                  "pyarrow", "IPython", "matplotlib", "seaborn", "transformers", "sklearn", "psutil")


def test_own_modules_are_imported_at_module_top():
    bad = [f"{mod}:{line} imports {target} inside a function"
           for mod, imports in ALL.items() for target, line, in_fn, _ in imports
           if in_fn and target.startswith("portbench")]
    assert not bad, "\n".join(bad)


def test_compute_layers_never_import_plotting_libraries():
    bad = [f"{mod}:{line} imports {target}"
           for mod, imports in ALL.items() if _layer(mod) is not None
           for target, line, _, _ in imports if target.split(".")[0] in PLOTTING]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_packages_exist(layer):
    assert (PKG / layer / "__init__.py").is_file()
