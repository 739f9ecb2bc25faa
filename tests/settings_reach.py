"""Where the whole parameter set travels, read from the package's source with ``ast`` (nothing imported).

A function *takes the whole Config* when one of its parameters is annotated ``Config`` (also
``Config | None``, ``"Config"``, ``config.Config``) or, unannotated, is named ``cfg``/``config`` and is not
used as a plain mapping (``cfg: dict`` is the analysis settings' dict, a different thing). For each such
function the report names the sections it reads (``cfg.paths``, ``cfg.simulation`` …) and whether it passes
``cfg`` on whole. ``load_manifest`` call sites are listed by stage (the package directory below
``portbench``: data, study/campaign, study/analysis …).

``python tests/settings_reach.py [--list]`` prints the counts (``--list``: every function and call site);
``tests/test_layers.py`` keeps the whole-Config functions below the pipeline drivers to an allow-list.
"""

from __future__ import annotations

import ast
import os
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

PKG = Path(__file__).resolve().parents[1] / "lib" / "portbench"
CFG_NAMES = ("cfg", "config")


class WholeConfig(NamedTuple):
    qualname: str          # module:Class.function or module:function (nested: outer.inner)
    param: str
    line: int
    sections: tuple[str, ...]   # attributes read off the parameter (cfg.paths -> "paths")
    passes_on: bool             # the parameter itself is passed whole to a call


class ManifestCall(NamedTuple):
    module: str
    function: str | None
    line: int


def _module_name(path: Path, root: Path = PKG) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def stage_of(module: str) -> str:
    """``portbench.study.analysis.ports`` -> ``study/analysis``; top modules (cli, params) are their own."""
    parts = module.split(".")[1:]
    if not parts:
        return "portbench"
    if parts[0] == "study" and len(parts) > 2:
        return "/".join(parts[:2])
    if len(parts) > 1 and parts[0] in ("data", "sim", "study", "validation", "present", "core", "bench"):
        return parts[0]
    return parts[0]


def _is_config_annotation(ann: ast.AST | None) -> bool:
    if ann is None:
        return False
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            ann = ast.parse(ann.value, mode="eval").body
        except SyntaxError:
            return False
    for n in ast.walk(ann):
        if isinstance(n, ast.Name) and n.id == "Config":
            return True
        if isinstance(n, ast.Attribute) and n.attr == "Config":
            return True
    return False


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs] + ([a.vararg] if a.vararg else []) + \
        ([a.kwarg] if a.kwarg else [])


def _is_mapping_use(fn: ast.AST, name: str) -> bool:
    """``name[...]`` or ``name.get(...)``: a dict, not the Config."""
    for n in ast.walk(fn):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == name:
            return True
        if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == name
                and n.attr in ("get", "items", "keys", "values")):
            return True
    return False


def _uses(fn: ast.AST, name: str) -> tuple[tuple[str, ...], bool]:
    """(sections read as ``name.<attr>``, whether ``name`` is passed on whole to a call). Nested functions
    that rebind ``name`` as a parameter are skipped (they are counted on their own)."""
    sections: set[str] = set()
    passes = False

    def visit(node: ast.AST, top: bool) -> None:
        nonlocal passes
        if not top and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if any(p.arg == name for p in _params(node) if p is not None) if not isinstance(node, ast.Lambda) \
                    else any(p.arg == name for p in node.args.args):
                return
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
            sections.add(node.attr)
        if isinstance(node, ast.Call):
            for a in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(a, ast.Name) and a.id == name:
                    passes = True
        for c in ast.iter_child_nodes(node):
            visit(c, False)

    visit(fn, True)
    return tuple(sorted(sections)), passes


def scan_source(source: str, module: str) -> tuple[list[WholeConfig], list[ManifestCall]]:
    tree = ast.parse(source)
    whole: list[WholeConfig] = []
    calls: list[ManifestCall] = []

    def walk(node: ast.AST, prefix: str, fn_name: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qn = f"{prefix}{child.name}"
                for p in _params(child):
                    if p is None:
                        continue
                    if _is_config_annotation(p.annotation) or (
                            p.annotation is None and p.arg in CFG_NAMES and not _is_mapping_use(child, p.arg)):
                        secs, passes = _uses(child, p.arg)
                        whole.append(WholeConfig(f"{module}:{qn}", p.arg, child.lineno, secs, passes))
                walk(child, qn + ".", qn)
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.", fn_name)
            else:
                if isinstance(child, ast.Call):
                    f = child.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if name == "load_manifest":
                        calls.append(ManifestCall(module, fn_name, child.lineno))
                walk(child, prefix, fn_name)

    walk(tree, "", None)
    return whole, calls


def scan(root: Path = PKG) -> tuple[list[WholeConfig], list[ManifestCall]]:
    whole: list[WholeConfig] = []
    calls: list[ManifestCall] = []
    for f in sorted(root.rglob("*.py")):
        w, c = scan_source(f.read_text(), _module_name(f, root))
        whole += w
        calls += c
    return whole, calls


def report(list_all: bool = False) -> str:
    whole, calls = scan()
    fns = sorted({w.qualname for w in whole})
    lines = [f"functions taking the whole Config: {len(fns)}"]
    by_stage = Counter(stage_of(q.split(":")[0]) for q in fns)
    lines += [f"  {s}: {n}" for s, n in sorted(by_stage.items())]
    one = [w for w in whole if len(w.sections) <= 1 and not w.passes_on]
    lines.append(f"  of which read at most one section and pass nothing on: {len(one)}")
    lines.append(f"load_manifest call sites: {len(calls)}")
    cs = Counter(stage_of(c.module) for c in calls)
    lines += [f"  {s}: {n}" for s, n in sorted(cs.items())]
    if list_all:
        lines.append("")
        for w in sorted(whole):
            lines.append(f"{w.qualname}({w.param}) line {w.line}: reads {', '.join(w.sections) or '-'}"
                         f"{'; passes it on' if w.passes_on else ''}")
        lines.append("")
        for c in calls:
            lines.append(f"load_manifest: {c.module}:{c.function} line {c.line}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the report; a reader that leaves early (``| head``) ends it quietly, with status 0."""
    try:
        print(report("--list" in argv))
        sys.stdout.flush()
    except BrokenPipeError:
        # the rest of the output has nowhere to go: point stdout at /dev/null so that the interpreter's own flush at
        # exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
