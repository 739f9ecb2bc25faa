"""The validation's run: the simulator against a real vLLM engine (CUDA GPU, or vLLM's CPU build).

Entry points: :func:`validate` (parameter checks, called by ``params.load``), :func:`plan` (what
would run and whether it can run here -- never starts an engine), :func:`run` (``portbench
validate`` / ``make validate``; on a CUDA GPU also notebook 08: the replay when possible, a
"skipped" report otherwise -- it never raises because vLLM or a GPU is missing) and
:func:`read_results` (notebook 08 in the main environment reads what the run wrote).

Pipeline of :func:`run` (one engine instance for every policy but ``sarathi``, which runs on an
instance of its own with its budget; the wall-clock engine's steps are :mod:`.wallclock`'s; every step's module
says more):

1. The fixed-shape step grid (:mod:`.steps`) on an in-process engine: no case's window runs (its repeat noise,
   :func:`.steps.repeat_cv`, is recorded; it is not the deciding engine's). Cases (:mod:`.prereg`, :mod:`.cases`):
   the pre-registered confirmatory family -- the analysis' most dramatic significant-and-practical reversal whose
   policies the deciding engine (the virtual one: every built-in policy) runs, a stable control
   (replayed on the reversal's sources), up to three reversals drawn at random (seeded, stratified by
   source pair), the number of windows from a power calculation (the deciding engine is deterministic: no
   engine noise, :data:`VIRTUAL_NOISE`) -- written with its SHA-256 to ``preregistration.json`` before any
   case runs, with the engine that decides (:data:`.confirm.DECIDING_ENGINE`). Then the family is decided
   (:func:`run_family`, :mod:`.family`): every pre-registered window on the virtual vLLM engine and on the
   simulator at the campaign's own settings -- never cut. Then every further reversal of a pair the wall-clock
   engine runs (exploratory) while the time budget allows.
   Windows: chosen at random per source with ``window_seed`` (recorded), the same windows for every case.
2. Engine (:mod:`.replay`, :mod:`.engine_scheduler`, :mod:`.policies`): vLLM V1 batching,
   ``scheduling_policy="priority"``, the recording/dynamic-policy scheduler; its resolved settings
   (KV blocks, block size, budget, ``max_num_seqs``, ``max_model_len``) are read back from its
   own init record (:class:`.resim.EngineSettings`). Windows are transformed the same way for both
   sides (:func:`.resim.prepare_window`: first N requests, token scale, vLLM's context limit).
3. Warm-up: one window's requests queued at t = 0, replayed and discarded (first steps of a fresh
   engine are slow); its completion rate sizes the saturation runs.
4. Calibration and capacity, per source, as the campaign defines capacity (``regions.saturation``):
   a backlog of the campaign's size (``capacity.backlog_size``: 4,096 requests for ``max_num_seqs``
   256; ``saturation_requests`` overrides) queued at t = 0 under fcfs; capacity = completions per
   second from the 10 % completion quantile to the last admission (:func:`.capacity.saturation_throughput`,
   the same function on the simulator's run of the same backlog); its steps fit the cost model
   (``profiles.fit_profile`` -> the *calibration profile*, R², residuals).
5. Replays at matched load: each window rescaled to the case's rho with the *engine's* capacity of
   its source (``regions.rescale``; horizon ``regions.horizon_s``), every policy of a case on the
   same engine, the policy order alternating from window to window; plus ``fidelity_windows``
   fcfs replays per source at ``fidelity_region`` (below saturation: the error targets).
6. Re-simulation of every replay (:func:`.resim.simulate`: same window, seed, horizon, engine
   settings) on the calibration profile -- a prediction, the profile was fitted before any replay --
   and, as a diagnostic, on a profile refitted to every step of the run.
7. Fidelity (:func:`.fidelity.fidelity`: per-request TTFT/TPOT/E2E MAPE, median absolute error,
   correlation; per window x policy means) and the two-step verdicts (:mod:`.confirm`: does the finding
   survive the engine's settings in re-simulation; does the engine reproduce the re-simulation -- TOST
   on effect sizes; the pre-registered family confirmed by one-sided tests, intersection-union, Holm).
8. The virtual vLLM engine: (a) the whole-run prediction (:mod:`.predict`, :func:`virtual_section`): vLLM's
   scheduler stepped with the step grid's cost model under the wall-clock engine's settings, given the arrivals as
   each replay's client sent them, every replay against the wall-clock replays, below saturation (measured:
   :func:`.predict.saturated`) and saturated apart (``whole_run_prediction``: MAPE, the error budget by cause,
   the step table on the replays' shapes; ``virtual_replays.parquet``); (b) the
   engine that decides the confirmatory family, from the runs of step 1 at the campaign's settings
   (:func:`family_section`; :func:`.confirm.combine`: ``decided_by``, ``by_engine``; ``virtual_family``).

**Time budget** (``time_budget_s``; ``reduced_time_budget_s`` for ``make all``): counted from the start
of the process, imports, planning and window tables included, to the written summary
(``wall_s.total``). What is done is sized to it: the saturation backlog is the campaign's unless 30 % of
the time left cannot hold it at the warm-up's rate (then smaller, never below ``capacity.MIN_REQUESTS``),
and a saturation run still going at 1.5x that share is cut (its steady part then ends at its last
admission all the same); the required cases use as many of the chosen windows as their estimated
replays leave room for (at least one per source); further cases are added while they fit; a reserve
is kept for the analysis (the virtual engine's runs included), the engine's shutdown and the interpreter's exit
(which ``wall_s.total``, written before it, cannot include). The confirmatory family on the virtual engine is
never cut (it runs before the wall-clock replays, :func:`run_family`); any wall-clock replay -- the family's
pairs too: the wall-clock engine is exploratory -- whose estimate and the reserve exceed the time left is cut,
with its reason (``budget.replays_cut``).

Outputs under ``{results_dir}/validation/``: ``preregistration.json`` (written after the step grid -- fixed shapes, no case's window -- and before the
family's runs and any replay;
its SHA-256 in the summary), ``summary.json`` (the headline: engine, settings_match, preregistration,
verdicts, step_fit, MAPE, fit R², capacities, wall time), ``report.json`` (everything), and tables
``engine_runs``, ``sim_runs``, ``engine_requests``, ``sim_requests``, ``iterations``, ``verdicts`` (one row
per case x source: both steps' effects and intervals, the confirmatory tests), ``step_grid`` (per shape),
``window_errors``, ``capacity``, ``virtual_requests`` (the whole-run prediction's; an analysis where vLLM cannot
be imported reuses it), ``virtual_runs`` / ``virtual_resim_runs`` (the family at the campaign's settings, from
``raw/family_virtual.parquet`` / ``raw/family_resim.parquet``) (parquet), ``engine_profile*.json`` (``engine_profile_step_grid.json``: the
cost model fitted to the step grid), the step logs ``iterations*.jsonl`` (``_grid``: the step grid;
``_sarathi``: sarathi's own instance).
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from ..core import io
from ..core.config import Config
from . import confirm, prereg
from .analysis import analyze
from .common import (
    FAMILY_TABLES,
    PREREGISTRATION,
    _log,
    _sha,
    _write_json,
    how_to_enable,
    out_dir,
    params_fingerprint,
    reversals_path,
    summary_path,
)
from .planning import Plan, plan
from .wallclock import plan_manifest, measure_step_grid, run_replays


def skipped_report(pl_: Plan) -> dict:
    why = pl_.status.reason if not pl_.status.ok else "; ".join(pl_.messages) or "nothing to replay"
    return {"ran": False, "skipped_because": why, "plan": pl_.to_dict()}


def process_age_s() -> float:
    """Seconds since this process started (Linux: ``/proc/self/stat``; elsewhere: since this module was
    imported)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])     # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def run(cfg: Config, reversals: pl.DataFrame | None = None, *, reduced: bool = False, progress: bool = True) -> dict:
    """Run the validation when vLLM can run here; otherwise write and return a "skipped" report.

    Returns the report (also ``report.json``; the headline is ``summary.json``). Never raises for a
    missing GPU / vLLM / analysis: the rest of the pipeline does not depend on this stage. The time
    budget counts from the start of the process (:func:`process_age_s`).
    """
    origin = time.perf_counter() - process_age_s()
    out = out_dir(cfg.paths)
    the_plan = plan(cfg, reversals, reduced=reduced)
    _write_json(out / "plan.json", the_plan.to_dict())
    if not the_plan.runnable:
        report = skipped_report(the_plan)
        _write_json(out / "report.json", report)
        _write_json(summary_path(cfg.paths), {"ran": False, "skipped_because": report["skipped_because"],
                                        "how_to_enable": how_to_enable()})
        if progress:
            print(f"[portbench] validation skipped: {report['skipped_because']}", flush=True)
        return report
    # the wall-clock engine's fixed-shape step grid first (no case's window runs; vLLM's in-process engine cannot
    # start in a process that has run the virtual engine) ...
    grid = _outside_event_loop(measure_step_grid, cfg.validation, the_plan, out, progress=progress)
    # ... the confirmatory family, written and hashed before any case's run (prereg.py; plan() sized it with the
    # deciding virtual engine's noise: none) ...
    sha = prereg.write(out / PREREGISTRATION, the_plan.preregistration)
    _log(progress, f"pre-registration written: {out / PREREGISTRATION} (SHA-256 {sha[:16]}...), after the step grid "
                   "(fixed shapes on an in-process engine; no case's window ran) and before the confirmatory family's "
                   "runs on the virtual engine and any wall-clock replay")
    # ... decided on the virtual vLLM engine at the campaign's own settings (family.py): never cut ...
    fam = run_family(cfg, the_plan, out, progress=progress)
    # ... then the wall-clock engine's replays (exploratory, sized to the time left) ...
    inputs = {"params_fingerprint": params_fingerprint(cfg.tree),
              "reversals_sha256": _sha(reversals_path(cfg.paths)) if reversals is None else "given"}
    R = _outside_event_loop(run_replays, cfg.data, cfg.predictors, cfg.simulation, cfg.validation, int(cfg.campaign.workers),
                            the_plan, out, inputs, progress=progress, origin=origin, prereg_sha=sha, grid=grid,
                            family_s=float(fam["wall_s"]))
    # ... and the analysis of what ran (from the raw files)
    summary = analyze(cfg, t_start=R.origin, manifest=plan_manifest(the_plan))
    m = summary["mape"]
    R.log(f"done in {summary['wall_s']['total']:.0f} s from the process start (budget {R.budget:.0f} s): MAPE below "
          f"saturation TTFT {m['ttft']:.3f}, TPOT {m['tpot']:.3f}, E2E {m['e2e']:.3f}; "
          + confirm.verdict_line(summary["verdict_counts"]))
    report = {**summary, "plan": the_plan.to_dict(), "phases": R.phases}
    _write_json(out / "report.json", report)
    return report


def run_family(cfg: Config, the_plan: Plan, out: Path, *, progress: bool = True) -> dict:
    """The pre-registered family on the virtual vLLM engine and the simulator at the campaign's own settings
    (:mod:`.family`): ``raw/family_virtual.parquet``, ``raw/family_resim.parquet``, ``raw/family.json``."""
    from . import family  # imports vLLM

    doc = the_plan.preregistration or {}
    v, r, info = family.run(cfg.data, cfg.predictors, cfg.simulation, cfg.campaign, the_plan.confirmatory,
                            doc.get("windows") or the_plan.windows, manifest=plan_manifest(the_plan),
                            log=lambda m: _log(progress, m))
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, df in zip(FAMILY_TABLES, (v, r)):
        io.atomic_write(raw / f"{name}.parquet", df.write_parquet)
    _write_json(raw / "family.json", info)
    return info


def _outside_event_loop(fn, *args, **kwargs):
    """Call ``fn`` here, or in a worker thread when this thread already runs an asyncio loop (a Jupyter
    kernel does): the replay drives vLLM's AsyncLLM on an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args, **kwargs)
    with ThreadPoolExecutor(1, thread_name_prefix="portbench-replay") as ex:
        return ex.submit(fn, *args, **kwargs).result()
