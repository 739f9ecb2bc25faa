"""Execute the numbered notebooks with papermill, once (``make all``) or over a grid (``make sweep``).

Sweep file (YAML)::

    base: ../smoke.yaml                 # parameter file of every point (relative to the sweep file)
    notebooks: ["03", "04", "10"]       # which notebooks each point runs (prefixes)
    grid:                               # dotted parameter -> values; points = cartesian product
      simulation.profile: [a100_40gb_llama2_7b, h100_80gb_llama3_8b]
      simulation.horizon_factor: [1.5, 3.0]

Each point writes its executed notebooks, results and figures under ``<out>/<sweep>/<point>/``
and records its overrides in ``point.json``; a finished point (``done`` marker) is skipped when
the sweep is rerun, so an interrupted sweep resumes. Points share the base's canonical tables
and window cache unless the grid changes ``sources``, ``windows`` or ``standins``, in which case
the point gets its own data folder and manifest and must run notebooks 01 and 02.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
import time
from pathlib import Path

import yaml

from .core import figindex, io, outputs
from .core import plugins as _plugins  # noqa: F401 - registers its error classes (_project_error_names)
from .core.errors import ParameterError, PortbenchError
from .data import preflight
from .sim.engine import ahead
from .study.campaign import executors as _executors  # noqa: F401 - its error classes too
from .params import DEFAULT_FILE, load, project_root, read, undot

DATA_SECTIONS = ("sources", "windows", "standins")
NOTEBOOK_PATTERNS = ("0*.ipynb", "1*.ipynb")     # the numbered notebooks, in pipeline order
SIMULATION = "03"      # the first notebook that runs the campaign (names compare as strings: 01_.. < 03 <= 03_..)


def notebook_paths(only=None) -> list[Path]:
    folder = project_root() / "notebooks"
    nbs = sorted(p for pattern in NOTEBOOK_PATTERNS for p in folder.glob(pattern))  # 01 .. 09, then 10 ..
    if only:
        nbs = [p for p in nbs if any(p.name.startswith(o) for o in only)]
        if not nbs:
            raise ParameterError("--only", only, "prefixes of notebooks in notebooks/ (e.g. 03)")
    return nbs


def retire_stale(notebooks_dir: Path, figures_dir: Path) -> list[str]:
    """Outputs of numbered notebooks that no longer exist (say, after a renumbering: the summary became 10 and the
    attribution 09): their executed copies in ``notebooks_dir``, their figures in ``figures_dir`` and those
    figures' index entries. Only files portbench recorded writing are deleted (never a user's, never a file git
    tracks); returns the deleted paths."""
    current = {p.stem for p in notebook_paths()}
    stale = [p.name for p in Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb") if p.stem not in current]
    gone = outputs.remove_recorded(notebooks_dir, stale)
    idx = figindex.read_all(figures_dir)
    old = {e.get("notebook") for e in idx.values()
           if re.fullmatch(r"\d\d_\w+", e.get("notebook") or "") and e["notebook"] not in current}
    if old:
        files = [e[k] for e in idx.values() if e.get("notebook") in old for k in ("file", "pdf") if e.get(k)]
        gone += outputs.remove_recorded(figures_dir, files)
        figindex.forget(figures_dir, old)
    return gone


INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
TERMINAL_ENV = "PORTBENCH_TERMINAL_PROGRESS"    # set for the kernels: long stages draw progress on the terminal
# ipykernel's own log (a warning about TCP transport per kernel start, an interrupt caught at shutdown):
# errors only, so that the terminal shows the pipeline's progress and real problems. And the kernel's file
# descriptor 2 is left alone (not copied into the notebook): progress drawn on sys.__stderr__ reaches the
# terminal only, the notebook keeps the cells' own output.
# Level CRITICAL: ipykernel logs the interrupt that ends a kernel at shutdown as an ERROR ("KeyboardInterrupt caught
# in kernel") after every successful notebook; a cell's error is in the executed notebook and its log file either way.
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL", "--IPKernelApp.capture_fd_output=False"]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class NotebookFailed(PortbenchError):
    """A notebook stopped: a project error (its own one-line message) or an unexpected one (its traceback in the log
    file). Names the notebook and the log file."""


def _project_error_names() -> set[str]:
    """Names of every project error class (:class:`~portbench.core.errors.PortbenchError` and its subclasses, the
    plug-in and campaign modules' included): an error of one of these in a notebook is a message, not a crash."""
    names, todo = set(), [PortbenchError]
    while todo:
        c = todo.pop()
        names.add(c.__name__)
        todo += c.__subclasses__()
    return names


def _log_path(out: Path, nb: Path) -> Path:
    return out / "logs" / f"{nb.stem}.log"


def notebook_failure(err, nb: Path, out: Path, root: Path) -> NotebookFailed:
    """The one-line message of a notebook that stopped with ``err`` (papermill's PapermillExecutionError): a project
    error is its own message; anything else is named as unexpected. Either way the full traceback is written to
    ``<out>/logs/<notebook>.log`` (next to the executed copy) and the message says where."""
    ename, evalue = getattr(err, "ename", type(err).__name__), getattr(err, "evalue", str(err))
    tb = "\n".join(getattr(err, "traceback", None) or [str(err)])
    log = _log_path(out, nb)
    io.write_text(log, ANSI.sub("", f"{nb.name}: {ename}: {evalue}\n\n{tb}\n"))
    where = f"(full log: {_rel(log, root)}; executed notebook: {_rel(out / nb.name, root)})"
    first = ANSI.sub("", str(evalue)).strip()
    if ename in _project_error_names():
        return NotebookFailed(f"{nb.name} stopped: {first}\n{where}")
    return NotebookFailed(f"{nb.name} stopped on an unexpected error: {ename}: {first.splitlines()[0] if first else ''}"
                          f"\n{where} -- the traceback is in the log; please report it")


@contextlib.contextmanager
def _kernel_environment():
    """The environment the notebook kernels inherit: matplotlib's inline backend (a non-interactive
    ``MPLBACKEND`` such as Agg would stop every figure from being embedded in the executed notebook)
    and terminal progress for the library's long stages."""
    saved = {k: os.environ.get(k) for k in ("MPLBACKEND", TERMINAL_ENV)}
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    os.environ[TERMINAL_ENV] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_notebooks(params_file=None, out=None, *, only=None, overrides=None,
                  log_output: bool = False) -> list[Path]:
    """Run the notebooks in order; each executed copy goes to ``out`` (default: ``build/notebooks`` for the
    default study, ``build/<run name>/notebooks`` for any other parameter set). Before the first notebook the
    parameters are checked and the data they need is looked for (:func:`portbench.data.preflight.check`:
    one short error saying what is missing and how to get it). Stops at the first failure."""
    import papermill as pm

    root = project_root()
    params_file = str(params_file or DEFAULT_FILE)
    overrides = overrides or {}
    cfg = load(params_file, overrides)  # fail fast on bad parameters, before any notebook starts
    preflight.check(cfg)
    out = Path(out) if out is not None else cfg.paths.build_dir / "notebooks"
    out = out if out.is_absolute() else root / out
    try:
        outputs.claim(out, root)
    except outputs.OutputFolderError as e:
        raise ParameterError("--out", str(out), f"a folder portbench may write into: {e}") from None
    retired = retire_stale(out, cfg.paths.figures_dir)
    if retired:
        print(f"[portbench] removed {len(retired)} output(s) of notebooks that no longer exist (renumbered): "
              + ", ".join(_rel(Path(f), root) for f in retired[:4]) + (" ..." if len(retired) > 4 else ""), flush=True)
    print(f"[portbench] parameters {_rel(cfg.paths.params_file, root)}"
          + (f" (+ overrides {json.dumps(overrides, sort_keys=True, default=str)})" if overrides else "")
          + f": notebooks -> {_rel(out, root)}, results -> {_rel(cfg.paths.results_dir, root)}, "
          f"figures -> {_rel(cfg.paths.figures_dir, root)}, manifest -> {_rel(cfg.paths.manifest, root)}", flush=True)
    done = []
    nbs = notebook_paths(only)
    compiling = _compile_ahead(cfg.simulation.engine.core, nbs, out)
    with _kernel_environment(), contextlib.ExitStack() as stack:
        if compiling is not None:
            stack.callback(_stop, compiling)
        for nb in nbs:
            if compiling is not None and nb.name >= SIMULATION:    # the campaign loads what the child compiled
                _join(compiling)
                compiling = None
            t0 = time.perf_counter()
            print(f"[portbench] {nb.name} ...", flush=True)
            outputs.record(out / nb.name)      # recorded first: papermill writes the copy even when the notebook fails
            try:
                pm.execute_notebook(
                    str(nb), str(out / nb.name),
                    parameters={"params_file": params_file, "overrides": overrides},
                    cwd=str(root), kernel_name="python3", progress_bar=False, log_output=log_output,
                    extra_arguments=KERNEL_ARGS,
                )
            except pm.PapermillExecutionError as e:
                raise notebook_failure(e, nb, out, root) from None
            except (RuntimeError, OSError, TimeoutError) as e:     # nbclient: the kernel died or did not answer
                raise notebook_failure(e, nb, out, root) from None
            _log_path(out, nb).unlink(missing_ok=True)       # a log of an earlier failure of this notebook
            print(f"[portbench] {nb.name} done in {time.perf_counter() - t0:.1f} s -> {_rel(out / nb.name, root)}",
                  flush=True)
            done.append(out / nb.name)
    return done


def _compile_ahead(core: str, nbs: list[Path], out: Path) -> subprocess.Popen | None:
    """The engine's loops compiled in a low-priority child process (:mod:`portbench.sim.engine.ahead`) while the
    notebooks before the simulation run -- only when this run includes the simulation and a notebook before it, and
    the campaign uses the compiled core (``core``: ``simulation.engine.core``). Its output goes to ``<out>/logs/compile_ahead.log``."""
    names = [nb.name for nb in nbs]
    if core == "reference" or not any(n >= SIMULATION for n in names) \
            or not any(n < SIMULATION for n in names):
        return None
    log = out / "logs" / "compile_ahead.log"
    outputs.record(log)            # portbench's own file: make clean removes it
    try:
        return ahead.start(log)
    except OSError:
        return None         # the campaign compiles itself, as without this


def _join(proc: subprocess.Popen) -> None:
    """Wait for the compile; from now on nothing else of the run needs the CPU, so it runs at normal priority where
    the system allows raising it back (root; elsewhere it stays niced: on a loaded machine it then waits longer)."""
    if proc.poll() is None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, 0)
    proc.wait()


def _stop(proc: subprocess.Popen) -> None:
    """A compile still running when the notebooks stop (one failed before the simulation): ended."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _rel(p: Path, root: Path) -> str:
    p = Path(p)
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(p)


def _slug(assign: dict) -> str:
    parts = [f"{k.split('.')[-1]}={v}" for k, v in assign.items()]
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", "__".join(parts)) or "base"


def sweep_points(spec: dict) -> list[dict]:
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ParameterError("grid", grid, "a mapping of dotted parameter names to non-empty lists")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def point_fingerprint(base: str, overrides: dict, only) -> str:
    """SHA-256 of what a sweep point computes from: its effective parameters (the base file and every file it
    extends, merged with the point's overrides), the text of its plug-in files and the notebooks it runs. A
    finished point whose fingerprint changed (say, the base file was edited) is recomputed."""
    tree = read(base, overrides)
    plug = {}
    for p in tree.get("plugins") or []:
        f = Path(p)
        if f.is_file():
            plug[str(f)] = io.sha256_of(f)
    return io.sha256_hex({"parameters": {k: v for k, v in tree.items() if not k.startswith("_")},
                          "plugins": plug, "notebooks": sorted(only)})


def run_sweep(sweep_file, out="build/sweeps", *, plugins=()) -> list[Path]:
    """Run every point of a sweep; returns the point folders. ``plugins`` (absolute files or module
    names) are added to the base's ``plugins`` in every point."""
    root = project_root()
    sweep_file = Path(sweep_file)
    if not sweep_file.is_absolute():
        sweep_file = root / sweep_file
    if not sweep_file.is_file():
        raise ParameterError("SWEEP", str(sweep_file), "an existing sweep YAML file")
    spec = yaml.safe_load(sweep_file.read_text()) or {}
    unknown = set(spec) - {"base", "notebooks", "grid", "description"}
    if unknown:
        raise ParameterError(f"sweep key {sorted(unknown)[0]}", spec[sorted(unknown)[0]],
                             "one of base, notebooks, grid, description")
    base = str((sweep_file.parent / spec.get("base", "../default.yaml")).resolve())
    only = [str(n) for n in spec.get("notebooks") or ["03", "04", "05", "06", "07", "10"]]
    out_dir = (Path(out) if Path(out).is_absolute() else root / out) / sweep_file.stem
    folders = []
    for assign in sweep_points(spec):
        point = out_dir / _slug(assign)
        overrides = dict(assign)
        overrides.update({
            "paths.results_dir": str(point / "results"),
            "paths.figures_dir": str(point / "figures"),
        })
        if any(k.split(".")[0] in DATA_SECTIONS for k in assign):
            if not {"01", "02"} <= {o[:2] for o in only}:
                raise ParameterError("notebooks", only, "to include 01 and 02 when the grid changes "
                                     + "/".join(DATA_SECTIONS))
            overrides.update({"paths.data_dir": str(point / "data"),
                              "paths.manifest": str(point / "data" / "windows" / "manifest.json")})
        overrides = undot(overrides)
        if plugins:
            have = list(read(base).get("plugins") or [])
            overrides["plugins"] = have + [p for p in plugins if p not in have]
        load(base, overrides)  # validate every point before running any
        folders.append((point, overrides, assign))
    for point, overrides, assign in folders:
        fp = point_fingerprint(base, overrides, only)
        done = point / "done"
        if done.is_file() and done.read_text().strip() == fp:
            print(f"[portbench] sweep point {point.name}: done earlier with the same inputs, skipped", flush=True)
            continue
        if done.exists():
            print(f"[portbench] sweep point {point.name}: its inputs changed since it ran (base file, plug-ins or "
                  "grid): recomputed", flush=True)
            done.unlink()
        outputs.claim(point, root)
        io.write_text(point / "point.json", json.dumps({"base": base, "assign": assign,
                                                        "overrides": overrides}, indent=2, default=str))
        run_notebooks(base, point / "notebooks", only=only, overrides=overrides)
        io.write_text(done, fp + "\n")
    return [p for p, _, _ in folders]
