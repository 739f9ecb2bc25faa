"""The package's layering, checked from its source with ``ast`` (no import is executed).

core -> data -> sim -> vllm -> study -> (present, validation, params, cli, notebooks, bench): each layer
imports only the layers below it, except that study may import ``portbench.vllm`` (the policies as vLLM scheduler
classes, which need the heavy ``vllm`` library) only inside functions (``IN_FUNCTIONS_ONLY``); of the rooms on top, validation never imports present (present shows what
validation computes: notebook 08's prose, tables and figures are present's); no module imports a module that
(directly or not) imports it;
the package's own modules are imported at module top, and an import inside a function is only ever
of an optional heavy dependency (``OPTIONAL_HEAVY``); the compute layers and validation never import a
plotting library. Every import counts: ``import``/``from`` statements (also under ``if TYPE_CHECKING:``) and
``__import__(...)`` / ``importlib.import_module(...)`` calls; a call whose module name cannot be read
from the source is allowed only where ``DYNAMIC_IMPORTS`` names it (plug-in loaders).

The checks are pure functions of ``{module: [Imp]}``; the ``test_checker_*`` tests feed them
injected violations so that a hole in the parser fails here, not silently.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pytest

PKG = Path(__file__).resolve().parents[1] / "lib" / "portbench"
LAYERS = ("core", "data", "sim", "vllm", "study")
ALLOWED = {  # layer -> layers it may import
    "core": set(),
    "data": {"core"},
    "sim": {"core", "data"},
    "vllm": {"core", "data", "sim"},
    "study": {"core", "data", "sim"},
}
IN_FUNCTIONS_ONLY = {"study": {"vllm"}}   # layer -> layers it may import inside a function only
PLOTTING = ("matplotlib", "seaborn")
# Rooms on top of study/ and the rooms they may not import: present/ shows what validation/ computes.
NOT_BELOW = {"portbench.validation": ("portbench.present",)}
NO_PLOTTING = ("portbench.validation",)    # besides the layers: the validation computes, present/ draws
# Top-level names that may be imported inside a function (optional, or heavy and needed by few calls).
OPTIONAL_HEAVY = ("vllm", "distributed", "dask", "papermill", "pooch", "torch", "scikit_posthocs", "pandas",
                  "pyarrow", "IPython", "matplotlib", "seaborn", "transformers", "sklearn", "psutil", "numba",
                  "nbconvert", "nbformat", "jinja2", "mistune", "mkdocs",   # the last five: the results site only
                  "scipy", "statsmodels", "lightgbm")   # required, but ~0.5-2 s each: not imported by the campaign's workers
# (module, function) whose import_module call takes a run-time name: the scheduler modules and plug-ins
# a campaign names (user code, not the package's).
DYNAMIC_IMPORTS = {("portbench.core.plugins", "load_spec"), ("portbench.study.campaign.executors", "load_worker_code"),
                   ("portbench.validation.imported", "load_class")}   # a user's vLLM scheduler class (issue #40)
DYNAMIC = "<dynamic>"   # target of an import call whose module name is not a literal


class Imp(NamedTuple):
    target: str          # absolute module name (package-relative names resolved); DYNAMIC if unknown
    line: int
    function: str | None  # enclosing function (None: module level, class bodies included)


def _module_name(path: Path, root: Path = PKG) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _exists(module: str, root: Path) -> bool:
    rel = Path(*module.split("."))
    return (root.parent / rel.with_suffix(".py")).is_file() or (root.parent / rel / "__init__.py").is_file()


def _call_target(node: ast.Call, pkg: list[str], names: set[str]) -> str | None:
    """The module an ``__import__`` / ``import_module`` call (``names``: those names and their aliases)
    imports, DYNAMIC when it is not a literal; None when the call is not an import."""
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name not in names or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        text = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        # f"portbench.bench.{name}": a module of the literal prefix's package
        text = arg.values[0].value.rstrip(".")
        if not text or text.startswith("."):
            return DYNAMIC
    else:
        return DYNAMIC
    if text.startswith("."):  # import_module(".x", __package__)
        level = len(text) - len(text.lstrip("."))
        base = pkg[: len(pkg) - (level - 1)]
        return ".".join(base + ([text.lstrip(".")] if text.lstrip(".") else []))
    return text


def parse_imports(source: str, module: str, is_package: bool = False, root: Path = PKG) -> list[Imp]:
    """Every import of one module's source (see the module docstring)."""
    tree = ast.parse(source)
    pkg = module.split(".") if is_package else module.split(".")[:-1]
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def function(node) -> str | None:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
            if isinstance(node, ast.Lambda):
                return "<lambda>"
        return None

    import_fns = {"__import__", "import_module"} | {
        a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "importlib"
        for a in n.names if a.name == "import_module" and a.asname}
    out = []
    for node in ast.walk(tree):
        fn = function(node) if isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)) else None
        if isinstance(node, ast.Import):
            out += [Imp(a.name, node.lineno, fn) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "portbench":
                for a in node.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{target}.{a.name}"
                    out.append(Imp(sub if _exists(sub, root) else target, node.lineno, fn))
            else:
                out.append(Imp(target, node.lineno, fn))
        elif isinstance(node, ast.Call) and (target := _call_target(node, pkg, import_fns)) is not None:
            out.append(Imp(target, node.lineno, fn))
    return out


def package_imports(root: Path = PKG) -> dict[str, list[Imp]]:
    return {_module_name(f, root): parse_imports(f.read_text(), _module_name(f, root), f.name == "__init__.py", root)
            for f in sorted(root.rglob("*.py"))}


def own(target: str) -> bool:
    return target.split(".")[0] == "portbench"


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def graph(imports: dict[str, list[Imp]]) -> dict[str, set[str]]:
    """module -> package modules it imports (a name that is not a module counts as its package)."""
    g: dict[str, set[str]] = defaultdict(set)
    for mod, imps in imports.items():
        for imp in imps:
            t = imp.target
            while t and t not in imports:
                t = t.rpartition(".")[0]
            if own(imp.target) and t and t != mod:
                g[mod].add(t)
    return g


def layer_violations(imports) -> list[str]:
    bad = []
    for mod, imps in imports.items():
        lay = layer(mod)
        if lay is None:
            continue
        for imp in imps:
            if own(imp.target) and layer(imp.target) != lay and layer(imp.target) not in ALLOWED[lay]:
                if imp.function and layer(imp.target) in IN_FUNCTIONS_ONLY.get(lay, ()):
                    continue
                bad.append(f"{mod}:{imp.line} imports {imp.target} "
                           f"({lay} may import only {sorted(ALLOWED[lay]) or 'nothing of the package'}"
                           + (f", and {sorted(IN_FUNCTIONS_ONLY[lay])} inside functions" if lay in IN_FUNCTIONS_ONLY
                              else "") + ")")
    return bad


def cycles(imports) -> list[list[str]]:
    """Strongly connected components of more than one module of the import graph."""
    g = graph(imports)
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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

    for v in sorted(imports):
        if v not in index:
            strong(v)
    return comps


def heavy_own_modules(imports) -> set[str]:
    """Our modules that import an optional heavy dependency at module top, directly or through another such
    module (e.g. the vLLM-only ones): importing them is importing that dependency, so they too may be imported
    inside a function."""
    heavy: set[str] = set()
    while True:
        more = {mod for mod, imps in imports.items() if mod not in heavy
                and any(not imp.function and imp.target != DYNAMIC
                        and (imp.target.split(".")[0] in OPTIONAL_HEAVY or imp.target in heavy) for imp in imps)}
        if not more:
            return heavy
        heavy |= more


def function_import_violations(imports) -> list[str]:
    bad = []
    heavy = heavy_own_modules(imports)
    for mod, imps in imports.items():
        for imp in imps:
            if imp.target == DYNAMIC:
                if (mod, imp.function) not in DYNAMIC_IMPORTS:
                    bad.append(f"{mod}:{imp.line} imports a module named at run time (add it to DYNAMIC_IMPORTS "
                               "only if it loads user code)")
            elif imp.function and imp.target not in heavy and (own(imp.target)
                                                               or imp.target.split(".")[0] not in OPTIONAL_HEAVY):
                bad.append(f"{mod}:{imp.line} imports {imp.target} inside {imp.function}() "
                           "(only optional heavy dependencies may be imported inside a function)")
    return bad


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def room_violations(imports) -> list[str]:
    """Imports of a room on top (``NOT_BELOW``) into a room it sits below: validation/ -> present/."""
    return [f"{mod}:{imp.line} imports {imp.target} ({room} may not import {', '.join(above)})"
            for mod, imps in imports.items() for room, above in NOT_BELOW.items() if _in(mod, room)
            for imp in imps if any(_in(imp.target, a) for a in above)]


def plotting_violations(imports) -> list[str]:
    return [f"{mod}:{imp.line} imports {imp.target}" for mod, imps in imports.items()
            if layer(mod) is not None or any(_in(mod, r) for r in NO_PLOTTING)
            for imp in imps if imp.target.split(".")[0] in PLOTTING]


ALL = package_imports()


def test_every_layer_imports_only_layers_below_it():
    bad = layer_violations(ALL)
    assert not bad, "\n".join(bad)


def test_validation_never_imports_present():
    bad = room_violations(ALL)
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    comps = cycles(ALL)
    assert not comps, "import cycles: " + "; ".join(" <-> ".join(c) for c in comps)


def test_imports_inside_functions_only_of_optional_heavy_dependencies():
    bad = function_import_violations(ALL)
    assert not bad, "\n".join(bad)


def test_compute_layers_never_import_plotting_libraries():
    bad = plotting_violations(ALL)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("lay", LAYERS)
def test_layer_packages_exist(lay):
    assert (PKG / lay / "__init__.py").is_file()


def test_import_graph_is_read():
    # every file parsed, and each layer above core seen importing the layer below it (a parser that
    # resolves nothing would pass every check above)
    assert len(ALL) == len(list(PKG.rglob("*.py"))) > 50
    g = graph(ALL)
    assert sum(len(ts) for ts in g.values()) > 2 * len(ALL)
    for lay in ("data", "sim", "study"):
        assert any(layer(m) == lay and any(layer(t) in ALLOWED[lay] for t in ts) for m, ts in g.items()), lay
    for top in ("portbench.present", "portbench.validation", "portbench.cli", "portbench.bench"):
        assert any(m.startswith(top) and any(layer(t) == "study" for t in ts) for m, ts in g.items()), top


# --------------------------------------------------------------------------- the checker itself

def _pkg_with(module: str, source: str) -> dict[str, list[Imp]]:
    """The package's imports with ``module`` (a real or new module) replaced by ``source``."""
    return {**ALL, module: parse_imports(source, module)}


INJECTED = {  # name -> (module, source, check that must report it)
    "upward_type_checking": ("portbench.sim.regions",
                             "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..study import stats\n",
                             layer_violations),
    "upward_dunder_import": ("portbench.sim.regions", "stats = __import__('portbench.study.stats')\n",
                             layer_violations),
    "upward_import_module": ("portbench.data.traces",
                             "import importlib\nm = importlib.import_module('portbench.sim.metrics')\n",
                             layer_violations),
    "upward_relative_import_module": ("portbench.data.traces",
                                      "from importlib import import_module\n"
                                      "m = import_module('..sim.metrics', __package__)\n", layer_violations),
    "upward_fstring_import_module": ("portbench.core.io",
                                     "import importlib\ndef f(n):\n    return importlib.import_module(f'portbench.study.{n}')\n",
                                     layer_violations),
    "core_imports_top_package": ("portbench.core.io", "from .. import __version__\n", layer_violations),
    "study_imports_validation": ("portbench.study.stats", "from ..validation import verdict\n", layer_violations),
    "study_imports_vllm_at_top": ("portbench.study.stats", "from ..vllm import options\n", layer_violations),
    "vllm_imports_study": ("portbench.vllm.options", "from ..study import stats\n", layer_violations),
    "vllm_imports_validation": ("portbench.vllm.driver", "def f():\n    from ..validation import policies\n",
                                layer_violations),
    "sim_imports_vllm": ("portbench.sim.regions", "from ..vllm import options\n", layer_violations),
    "validation_imports_present": ("portbench.validation.design", "from ..present import figures\n", room_violations),
    "validation_imports_present_package": ("portbench.validation.plan", "from .. import present\n", room_violations),
    "validation_imports_plotting": ("portbench.validation.verdict", "import matplotlib.pyplot as plt\n",
                                    plotting_violations),
    # core.figindex imports core.io
    "cycle_type_checking": ("portbench.core.io",
                            "import typing\nif typing.TYPE_CHECKING:\n    from . import figindex\n", cycles),
    "cycle_import_module": ("portbench.core.io",
                            "import importlib\nfi = importlib.import_module('portbench.core.figindex')\n", cycles),
    "own_module_in_function": ("portbench.sim.regions", "def f():\n    from . import metrics\n",
                               function_import_violations),
    "own_module_via_import_module_in_function": ("portbench.bench",
                                                 "import importlib\ndef f(n):\n"
                                                 "    return importlib.import_module(f'portbench.bench.{n}')\n",
                                                 function_import_violations),
    "light_dependency_in_function": ("portbench.sim.regions", "def f():\n    import json\n    import numpy\n",
                                     function_import_violations),
    "aliased_import_module": ("portbench.sim.regions",
                              "from importlib import import_module as im\nm = im('portbench.study.stats')\n",
                              layer_violations),
    "dynamic_name": ("portbench.study.stats", "import importlib\ndef f(n):\n    importlib.import_module(n)\n",
                     function_import_violations),
    "plotting_via_dunder_import": ("portbench.study.stats", "plt = __import__('matplotlib.pyplot')\n",
                                   plotting_violations),
    "plotting_via_import_module": ("portbench.data.synth",
                                   "import importlib\ndef f():\n    return importlib.import_module('seaborn')\n",
                                   plotting_violations),
    "plotting_type_checking": ("portbench.sim.metrics",
                               "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from matplotlib.axes import Axes\n",
                               plotting_violations),
}


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_checker_reports_injected_violation(name):
    module, source, check = INJECTED[name]
    clean = check(_pkg_with(module, ""))
    assert len(check(_pkg_with(module, source))) > len(clean), f"{name} not reported by {check.__name__}"


def test_checker_allows_heavy_dependencies_in_functions():
    src = "def f():\n    import vllm\n    from distributed import Client\n    pd = __import__('pandas')\n"
    m = "portbench.validation.replay"
    assert function_import_violations(_pkg_with(m, src)) == function_import_violations(_pkg_with(m, ""))


# --------------------------------------------------------------------------- settings narrowed at each door
#
# A function takes the sections it reads (``paths``, ``simulation``, ``analysis`` …) or a manifest loaded once
# per stage, not the whole ``Config`` (tests/settings_reach.py finds the ones that do; ``python
# tests/settings_reach.py --list`` prints them with the sections each reads). The pipeline drivers keep the
# Config: they are the doors where it is split. Every other function that still takes it is listed below, to be
# narrowed: the list may only shrink (a new whole-Config function fails; a narrowed one must leave the list).

import settings_reach  # noqa: E402 - the AST scan, shared with the command-line count

WHOLE_CONFIG_DRIVERS = frozenset({
    # command-line, notebook and benchmark entry points, the parameter check, the campaign-level drivers
    "portbench.params:validate_config",
    "portbench.data.preflight:check", "portbench.data.preflight:window_budget", "portbench.data.traces:ingest_all",
    "portbench.data.windows:freeze", "portbench.data.windows:verify",
    "portbench.present.notebook:open_analysis", "portbench.present.plots_analysis:run",
    "portbench.study.analysis.results:load", "portbench.study.analysis.results:write_summary",
    "portbench.study.attribution:attribute", "portbench.study.attribution.runs:run",
    "portbench.study.campaign.run:run", "portbench.study.honest:run_transfer",
    "portbench.validation.pipeline:run", "portbench.validation.pipeline:pilot",
    "portbench.validation.pipeline:execute", "portbench.validation.pipeline:analyze", "portbench.validation.gpu:run",
    "portbench.validation.results:read_results",
    "portbench.validation.conformance:run", "portbench.validation.virtual_campaign:check",   # portbench conform / vllm-virtual
    "portbench.bench:main", "portbench.bench:_bench_campaign", "portbench.bench:_campaign_once",
    # derive the Config of a sub-campaign (with_overrides) and run it
    "portbench.study.analysis.hygiene:_jitter_config", "portbench.study.analysis.hygiene:run_jitter",
    "portbench.study.analysis.hygiene:run_equal_information", "portbench.study.analysis.hardware:run_hardware", "portbench.study.honest:_sub_config",
    "portbench.study.engine_sensitivity:variant", "portbench.study.engine_sensitivity:batching_variant",
    "portbench.study.engine_sensitivity:swap_variant", "portbench.study.engine_sensitivity:run_variant",
    "portbench.study.engine_sensitivity:batching_sensitivity", "portbench.study.campaign.run:reuse_capacities",
    # a claim's policy the campaign lacks, and vLLM scheduler classes: their own sub-campaign (issue #40)
    "portbench.cli:_delegate_vllm", "portbench.study.claim:sub_config", "portbench.study.campaign.imported:run_classes",
    "portbench.validation.imported:simulate",
})

# functions still taking the whole Config that are to be narrowed: none left (the list may only shrink)
WHOLE_CONFIG_TO_NARROW: frozenset[str] = frozenset()

# load_manifest call sites (module:function). A stage loads the manifest once and passes it on: only the stages'
# entry points load it (``windows.load_windows`` and ``campaign.make_plan`` take it; the list may only shrink).
LOAD_MANIFEST_SITES = frozenset({
    # the commands `portbench predict` and `portbench attribute`, freezing/verifying, preflight, a campaign, the
    # analysis (notebooks 04-07 and 10, `portbench analyze`: results.stage_manifest), the transfer campaign, the
    # benchmark's campaign part, the validation (its plan, once for the whole run; its analysis run alone)
    "portbench.cli:cmd_predict", "portbench.cli:cmd_attribute", "portbench.data.preflight:missing_files",
    "portbench.data.windows:freeze", "portbench.data.windows:verify",
    "portbench.study.analysis.results:stage_manifest", "portbench.study.campaign.run:run",
    "portbench.study.honest:run_transfer", "portbench.bench:_bench_campaign",
    "portbench.validation.conformance:run", "portbench.validation.virtual_campaign:check",   # conform / vllm-virtual
    "portbench.validation.pipeline:execute", "portbench.validation.pipeline:pilot",   # validate (a run), its A/A pilot
    "portbench.cli:cmd_claim",   # portbench claim: the campaign's plan, once
})

WHOLE, MANIFEST_CALLS = settings_reach.scan()


def test_whole_config_functions_only_drivers_and_a_shrinking_list():
    found = {w.qualname for w in WHOLE}
    new = sorted(found - WHOLE_CONFIG_DRIVERS - WHOLE_CONFIG_TO_NARROW)
    assert not new, ("functions taking the whole Config (give them the sections they read, or name a pipeline "
                     "driver in WHOLE_CONFIG_DRIVERS):\n" + "\n".join(new))
    gone = sorted((WHOLE_CONFIG_TO_NARROW | WHOLE_CONFIG_DRIVERS) - found)
    assert not gone, "no longer take the whole Config (or renamed): remove them from the lists:\n" + "\n".join(gone)
    assert not WHOLE_CONFIG_DRIVERS & WHOLE_CONFIG_TO_NARROW


def test_load_manifest_call_sites_only_shrink():
    found = {f"{c.module}:{c.function}" for c in MANIFEST_CALLS}
    new = sorted(found - LOAD_MANIFEST_SITES)
    assert not new, "new load_manifest call sites (load it once per stage and pass it on):\n" + "\n".join(new)
    gone = sorted(LOAD_MANIFEST_SITES - found)
    assert not gone, "load_manifest no longer called here: remove from LOAD_MANIFEST_SITES:\n" + "\n".join(gone)
    assert len(MANIFEST_CALLS) == len(found), "two load_manifest calls in one function"


SETTINGS_SOURCE = '''
from ..core.config import Config, PathsConfig
from ..core import config
def annotated(cfg: Config, x): return cfg.paths
def optional(c: "Config | None" = None): return c
def qualified(p: config.Config): return load_manifest(p.paths)
def bare(cfg): return f(cfg)
def analysis_dict(cfg: dict): return cfg["alpha"]
def bare_dict(cfg): return cfg.get("alpha")
def narrow(paths: PathsConfig): return windows.load_manifest(paths)
class K:
    def method(self, cfg: Config):
        def inner(config: Config): return config.simulation
        return inner
'''


def test_settings_checker_finds_whole_config_parameters_and_manifest_loads():
    whole, calls = settings_reach.scan_source(SETTINGS_SOURCE, "portbench.x")
    names = {w.qualname for w in whole}
    assert names == {"portbench.x:annotated", "portbench.x:optional", "portbench.x:qualified", "portbench.x:bare",
                     "portbench.x:K.method", "portbench.x:K.method.inner"}
    by = {w.qualname: w for w in whole}
    assert by["portbench.x:annotated"].sections == ("paths",) and not by["portbench.x:annotated"].passes_on
    assert by["portbench.x:bare"].passes_on
    assert [c.function for c in calls] == ["qualified", "narrow"]
    assert settings_reach.stage_of("portbench.study.analysis.ports") == "study/analysis"
    assert settings_reach.stage_of("portbench.data.windows") == "data"
