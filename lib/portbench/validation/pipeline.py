"""The validation's run: the simulator against a real vLLM engine (CUDA GPU, or vLLM's CPU build).

Entry points: :func:`validate` (parameter checks, called by ``params.load``), :func:`plan` (what
would run and whether it can run here -- never starts an engine), :func:`run` (``portbench
validate`` / ``make validate``; on a CUDA GPU also notebook 08: the replay when possible, a
"skipped" report otherwise -- it never raises because vLLM or a GPU is missing) and
:func:`read_results` (notebook 08 in the main environment reads what the run wrote).

Pipeline of :func:`run` (one engine instance for every policy but ``sarathi``, which runs on an
instance of its own with its budget; every step's module says more):

1. Cases (:mod:`.prereg`, :mod:`.cases`):
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
   sides (:func:`.resim.prepare_window`: first N requests, token scale, vLLM's context limit). On this engine,
   before any replay, the fixed-shape step grid (:mod:`.steps`: the replays' engine and clock; no case's window
   runs; its repeat noise, :func:`.steps.repeat_cv`, is recorded -- it is not the deciding engine's).
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
7. Fidelity (:func:`.verdict.fidelity`: per-request TTFT/TPOT/E2E MAPE, median absolute error,
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

Outputs under ``{results_dir}/validation/``: ``preregistration.json`` (written before the family's runs, the step grid
and any replay;
its SHA-256 in the summary), ``summary.json`` (the headline: engine, settings_match, preregistration,
verdicts, step_fit, MAPE, fit R², capacities, wall time), ``report.json`` (everything), and tables
``engine_runs``, ``sim_runs``, ``engine_requests``, ``sim_requests``, ``iterations``, ``verdicts`` (one row
per case x source: both steps' effects and intervals, the confirmatory tests), ``step_grid`` (per shape),
``window_errors``, ``capacity``, ``virtual_requests`` (the whole-run prediction's; an analysis where vLLM cannot
be imported reuses it), ``virtual_runs`` / ``virtual_resim_runs`` (the family at the campaign's settings, from
``raw/family_virtual.parquet`` / ``raw/family_resim.parquet``) (parquet), ``engine_profile*.json`` (``engine_profile_step_grid.json``: the
cost model fitted to the step grid), the step logs ``iterations*.jsonl`` (``iterations.jsonl``: the
shared engine's, the step grid's steps included (phase ``grid``); ``_sarathi``: sarathi's own instance).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from ..core import io
from ..core.config import (
    Config,
    DataSettings,
    PredictorsConfig,
    SimulationConfig,
    ValidationConfig,
)
from ..core.errors import PortbenchError
from ..data import predictors, windows
from ..sim import profiles, regions, schedulers
from ..study import campaign
from . import (
    capacity,
    cases,
    confirm,
    prereg,
    replay,
    resim,
    steps,
    verdict,
)
from .analysis import analyze
from .common import (
    FAMILY_TABLES,
    OWN_INSTANCE_S,
    PREREGISTRATION,
    RESERVE_BASE_S,
    RESERVE_PER_REPLAY_S,
    SATURATION_GUARD,
    SATURATION_SHARE,
    VIRTUAL_BASE_S,
    VIRTUAL_RUN_S,
    WARMUP_HORIZON_S,
    _floor,
    _log,
    _phase_steps,
    _seed,
    _sha,
    _source_of,
    _write_json,
    base_profile,
    how_to_enable,
    out_dir,
    params_fingerprint,
    reversals_path,
    sarathi_spec,
    summary_path,
)
from .planning import Plan, plan


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
    # the confirmatory family, written and hashed before any case's run (prereg.py; plan() sized it with the
    # deciding virtual engine's noise: none) ...
    sha = prereg.write(out / PREREGISTRATION, the_plan.preregistration)
    _log(progress, f"pre-registration written: {out / PREREGISTRATION} (SHA-256 {sha[:16]}...), before the "
                   "confirmatory family's runs on the virtual engine and any wall-clock replay")
    # ... decided on the virtual vLLM engine at the campaign's own settings (family.py): never cut ...
    fam = run_family(cfg, the_plan, out, progress=progress)
    # ... then the wall-clock engine's replays (exploratory, sized to the time left) ...
    inputs = {"params_fingerprint": params_fingerprint(cfg.tree),
              "reversals_sha256": _sha(reversals_path(cfg.paths)) if reversals is None else "given"}
    R = _outside_event_loop(_run, cfg.data, cfg.predictors, cfg.simulation, cfg.validation, int(cfg.campaign.workers),
                            the_plan, out, inputs, progress=progress, origin=origin, prereg_sha=sha,
                            family_s=float(fam["wall_s"]))
    # ... and the analysis of what ran (from the raw files)
    summary = analyze(cfg, t_start=R.origin, manifest=_manifest(the_plan))
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
                            doc.get("windows") or the_plan.windows, manifest=_manifest(the_plan),
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


def _manifest(the_plan: Plan) -> dict:
    """The windows' manifest the plan loaded (a runnable plan has one: its windows come from it)."""
    if the_plan.manifest is None:
        raise PortbenchError("the validation's plan has no windows manifest (its windows could not be chosen)")
    return the_plan.manifest


class _Run:
    """State of one validation run (kept small: the steps are the closures of :func:`_run`)."""

    def __init__(self, the_plan: Plan, out: Path, progress: bool, origin: float, budget: float):
        self.plan, self.out, self.progress = the_plan, out, progress
        self.origin, self.budget = origin, budget        # perf_counter() at the process start; seconds
        self.records: dict[tuple, pl.DataFrame] = {}     # KEY -> engine records
        self.scaled: dict[tuple, tuple[pl.DataFrame, float, float]] = {}   # (wid, region) -> (df, horizon, rho)
        self.phases: list[dict] = []                      # {"phase", "t0", "t1", ...} on the monotonic clock
        self.est_ratio: list[float] = []                  # measured / estimated replay wall time
        self.cut: list[dict] = []                         # replays not run: the budget could not hold them
        self.virtual_s = 0.0                              # reserved for the analysis' virtual engine runs
        self.sat_ratio: list[float] = []                  # the same for the saturation runs

    def log(self, msg: str) -> None:
        _log(self.progress, f"[{self.elapsed():6.0f} s] {msg}")

    def elapsed(self) -> float:
        """Seconds since the process started: what the budget counts."""
        return time.perf_counter() - self.origin

    def left(self) -> float:
        return self.budget - self.elapsed()


def _reserve(n_replays: int) -> float:
    return RESERVE_BASE_S + RESERVE_PER_REPLAY_S * n_replays


def measure_step_grid(v: ValidationConfig, the_plan: Plan, out: Path, eng: replay.Replayer, *,
                      progress: bool = True) -> tuple[pl.DataFrame, dict]:
    """The fixed-shape step grid (:mod:`.steps`) on the replays' engine ``eng`` (before any replay): its rows (also
    ``raw/step_grid.parquet``) and what ran (shapes, rounds, steps, wall time, its span on the monotonic clock)."""
    g = v.step_grid
    sp = the_plan.spec
    shapes = steps.grid(g, kv_tokens=int(sp.num_gpu_blocks) * int(sp.block_size)
                        if sp is not None and sp.num_gpu_blocks and sp.block_size else None,
                        prefix_caching=bool(sp is None or sp.enable_prefix_caching))
    rounds = int(g.reduced_rounds if the_plan.reduced else g.rounds)
    _log(progress, f"step grid: {len(shapes)} shapes x {rounds} rounds x {g.steps_per_shape} steps (the replays' "
                   "engine, before any replay)")
    t, t0 = time.perf_counter(), time.monotonic()
    vocab = int(replay.model_config(the_plan.engine.model_config)["vocab_size"])
    rows = steps.measure(eng, shapes, rounds=rounds, steps_per_shape=int(g.steps_per_shape), seed=int(v.seed),
                         vocab=vocab)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    rows.write_parquet(out / "raw" / "step_grid.parquet")
    info = {"shapes": len(shapes), "rounds": rounds, "steps_per_shape": int(g.steps_per_shape),
            "steps": rows.height, "wall_s": time.perf_counter() - t, "t0": t0, "t1": time.monotonic(),
            "repeat_noise": steps.repeat_cv(rows)}
    _log(progress, f"step grid: {rows.height} steps in {info['wall_s']:.0f} s; repeat noise (relative SD over the "
                   f"rounds of the machine's speed, every shape counted) {info['repeat_noise']['cv']:.3f}")
    return rows, info


def _virtual_reserve(v: ValidationConfig, the_plan: Plan) -> float:
    """Seconds kept for the analysis' virtual engine runs: the prediction of every replay below saturation that may
    run (the fidelity replays and the family's replays at rho < 1; the family itself ran on it before: run_family)."""
    k_max = max((len(w) for w in the_plan.windows.values()), default=0)
    n_fid_src = len({s for c in the_plan.confirmatory for s in c.sources})
    n_below = n_fid_src * int(v.reduced_fidelity_windows if the_plan.reduced else v.fidelity_windows) + sum(
        len(c.sources) * len(c.schedulers) * k_max for c in the_plan.confirmatory
        if float(c.rho or 0) < 1.0 and all(cases.engine_runnable(x) for x in c.schedulers))
    return VIRTUAL_BASE_S + VIRTUAL_RUN_S * n_below


def _clear_step_logs(out: Path, log_path: Path) -> None:
    """Remove the step logs of an earlier run."""
    for f in [log_path, *out.glob("iterations_*.jsonl")]:
        f.unlink(missing_ok=True)


def _calibrate(logged: pl.DataFrame, phases: list[dict], base, out: Path, *, name: str, device: str | None,
               seed: int) -> tuple[pl.DataFrame, Any, Path, dict]:
    """The calibration profile: the cost model fitted to a sample of the saturation runs' steps (``logged``, labelled
    by ``phases``), saved as ``engine_profile_calibration.json``; its steps, the profile, its path and its fit (R²)."""
    calib_steps = verdict.calibration_sample(_phase_steps(logged, phases, {"saturation"}), seed=seed)
    calib = verdict.fit_engine_profile(calib_steps, base, name, floor=_floor(device))
    calib_path = profiles.save_profile(calib, out / "engine_profile_calibration.json")
    return calib_steps, calib, calib_path, verdict.fit_r2(calib_steps, calib)


def _own_instance_fit(R: _Run, deferred: list[tuple], startup_s: float, estimate: Callable[..., float]) -> list[tuple]:
    """The replays of ``deferred`` ((source, window, region, rho, policy, kind)) that sarathi's own engine instance
    can run in the time left (its start and shutdown, their estimated times, the reserve); the others are cut
    (``R.cut``)."""
    fit_: list[tuple] = []
    total = startup_s + OWN_INSTANCE_S
    for d in deferred:
        est_d = estimate(d[0], d[1], d[2], d[3])
        if total + est_d + _reserve(len(R.records) + len(fit_) + 1) + R.virtual_s <= R.left():
            fit_.append(d)
            total += est_d
        else:
            R.cut.append({"replay": f"{d[5]}: {d[4]} on {d[1]} at {d[2]} (own instance)", "estimated_s": est_d,
                          "left_s": R.left(), "why": "its own engine instance's start, its estimated time and the "
                                                      "reserve exceed the time left"})
    return fit_


def _write_raw_tables(raw: Path, R: _Run, man: dict, bursts: dict[str, pl.DataFrame],
                      sat_records: dict[str, pl.DataFrame]) -> None:
    """The raw measurements analyze() reads (with ``run.json``): the replays' requests (keyed), the scaled windows,
    the saturation backlogs and their requests."""
    keyed = []
    win_rows = []
    for key, rec in sorted(R.records.items()):
        sc, horizon, rho = R.scaled[(key[1], key[2])]
        lit = [pl.lit(x).alias(k) for k, x in zip(verdict.KEY, key)] + [pl.lit(horizon).alias("horizon_s")]
        keyed.append(rec.with_columns(*lit))
    for (wid, region), (sc, horizon, rho) in sorted(R.scaled.items()):
        win_rows.append(sc.with_row_index("req_id").with_columns(
            pl.col("req_id").cast(pl.Int64), pl.lit(_source_of(man, wid)).alias("source"), pl.lit(wid).alias("window_id"),
            pl.lit(region).alias("region"), pl.lit(rho).alias("rho"), pl.lit(horizon).alias("horizon_s")))
    raw.mkdir(parents=True, exist_ok=True)
    pl.concat(keyed, how="vertical").write_parquet(raw / "engine_requests.parquet")
    pl.concat(win_rows, how="diagonal_relaxed").write_parquet(raw / "windows.parquet")
    pl.concat([b.with_columns(pl.lit(s).alias("source")) for s, b in bursts.items()],
              how="diagonal_relaxed").write_parquet(raw / "bursts.parquet")   # block_hashes where a source has them
    pl.concat(list(sat_records.values()), how="diagonal_relaxed").write_parquet(raw / "saturation_requests.parquet")


def _engine_settings(log_path: Path, the_plan: Plan) -> resim.EngineSettings:
    """The engine's resolved settings, read back from the init record it wrote to ``log_path``."""
    status, spec, e = the_plan.status, the_plan.spec, the_plan.engine
    inits, _ = replay.read_iteration_log(log_path)
    if not inits:
        raise PortbenchError(f"the engine wrote no init record to {log_path} (is the scheduler class loaded?)")
    return resim.EngineSettings.from_init(inits[-1], device=the_plan.device, distribution=status.distribution,
                                          version=status.version, model=e.model_config, token_scale=e.token_scale,
                                          requests_per_window=e.requests_per_window,
                                          prefix_caching=spec.enable_prefix_caching)


def _work(df: pl.DataFrame) -> float:
    """Mean tokens (prompt + output) per request."""
    return float((df["prompt_tokens"] + df["output_tokens"]).mean())


def _backlog_size(saturation_requests: int | None, max_num_seqs: int, left: Callable[[], float], required: list[str],
                  per_request_s: Callable[[str], float], pilot_rps: float) -> tuple[int, int, float, str]:
    """Requests per source of the saturation backlog (the campaign's size unless :data:`SATURATION_SHARE` of the
    seconds ``left()`` cannot hold it at ``per_request_s(source)`` for the ``required`` sources, never fewer than
    ``capacity.MIN_REQUESTS``), the campaign's size, the seconds allotted per required source, and why."""
    target = capacity.backlog_size(max_num_seqs, saturation_requests)
    floor_n = min(target, capacity.MIN_REQUESTS)
    allot_s = SATURATION_SHARE * max(left() - RESERVE_BASE_S, 0.0) / len(required)   # per required source
    fits = int(allot_s * len(required) / sum(per_request_s(s) for s in required))
    n_sat = int(min(target, max(floor_n, fits)))
    why = ("the campaign's backlog (regions.saturation: max(MIN_BACKLOG, BACKLOG_PER_SEQ x max_num_seqs))"
           if saturation_requests is None else "validation.saturation_requests")
    sat_note = (f"{n_sat} requests per source: {why}" if n_sat == target else
                f"{n_sat} requests per source instead of {target} ({why}): {SATURATION_SHARE:.0%} of the "
                f"{max(left(), 0):.0f} s left holds ~{fits} at the warm-up's rate of {pilot_rps:.0f} req/s "
                f"(never fewer than {floor_n})")
    return n_sat, target, allot_s, sat_note


def _queue_nonempty_share(log_path: Path, lo: float, hi: float) -> float:
    """Diagnostic of a saturation run: the share of its steady part's engine steps (``lo``-``hi`` on the monotonic
    clock) with requests waiting (near 1: the scheduler was the bottleneck; lower: vLLM's frontend could not queue
    the backlog faster than it was served)."""
    st = replay.iteration_rows(log_path)
    st = st.filter((pl.col("t_start") >= lo) & (pl.col("t_start") <= hi))
    return float((st["waiting"] > 0).mean()) if st.height else math.nan


def _windows_that_fit(R: _Run, k_plan: int, n_fid_plan: int, required_todo: Callable[[int, int], list],
                      need_s: Callable[[list], float]) -> int:
    """Windows per source of the required cases: as many of the ``k_plan`` chosen ones as the time left holds
    (at least one)."""
    k_use = k_plan
    while k_use > 1:
        todo = required_todo(k_use, min(n_fid_plan, k_use))
        if need_s(todo) + _reserve(len(todo)) + R.virtual_s <= R.left():
            break
        k_use -= 1
    return k_use


def _replay_on_own_instance(R: _Run, deferred: list[tuple], sspec: replay.EngineSpec, s_log: Path,
                            replay_one: Callable) -> dict:
    """The ``deferred`` replays ((source, window, region, rho, policy, kind)) on an engine instance of their own
    (``sspec``, its step log ``s_log``), each run as fcfs and recorded under its policy (``R.records``); the
    instance's init record."""
    R.log(f"{len(deferred)} replays on sarathi's own engine instance (token budget {sspec.max_batched_tokens})")
    with replay.Replayer(sspec, s_log) as eng2:
        init = replay.read_iteration_log(s_log)[0][-1]
        for s, wid, region, rho, sched, kind in deferred:
            sc, horizon, _ = R.scaled[(wid, region)]
            rec = replay_one(sc, sched, horizon, f"{wid}.{region}", kind, None, source=s, engine=eng2,
                             as_policy="fcfs")
            R.records[(s, wid, region, sched)] = rec.with_columns(pl.lit(float(rho)).alias("rho"))
    return init


def _run(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, v: ValidationConfig, workers: int,
         the_plan: Plan, out: Path, inputs: dict, *, progress: bool, origin: float | None = None,
         prereg_sha: str = "", family_s: float = 0.0) -> _Run:
    """The validation's replays (module docstring), their raw files under ``out`` for :func:`analyze`; returns the
    run's state (its origin, budget and phases). Sized to the budget, which counts from the process start:
    the saturation backlog (the campaign's size unless :data:`SATURATION_SHARE` of the time left cannot
    hold it, then no fewer than ``capacity.MIN_REQUESTS``), the windows of the required cases (fewer
    when their estimated replays do not fit, at least one per source), then optional cases while they
    fit; :func:`_reserve` is kept for the analysis. ``data``, ``P``, ``workers``: the windows and their frozen
    predictions; ``sim``, ``v``: the ``simulation`` and ``validation`` sections; ``inputs``: the parameters'
    fingerprint and the reversals' SHA-256, recorded in ``raw/run.json``."""
    e = the_plan.engine
    budget = float(v.reduced_time_budget_s if the_plan.reduced else v.time_budget_s)
    R = _Run(the_plan, out, progress, time.perf_counter() if origin is None else origin, budget)
    n_fid_plan = int(v.reduced_fidelity_windows if the_plan.reduced else v.fidelity_windows)
    load_start = os.getloadavg()
    srcs_all = sorted(the_plan.windows)
    man = _manifest(the_plan)
    tables = windows.load_windows(data, sources=srcs_all, manifest=man)
    # what the simulator's runs are given too: frozen predictions (edf, ltr, sjf_predicted) and tenants.
    # Predictions are frozen per environment (their fingerprint has the library versions): when none are
    # frozen for this one, they are trained here (~1-2 min on 2 cores) only if a required case needs them or
    # the run is the full one; a reduced run then skips the further cases that need them.
    n_req = len(the_plan.confirmatory)     # the pre-registered cases: required, with every chosen window
    R.virtual_s = _virtual_reserve(v, the_plan)
    names_req = {"fcfs"} | {x for c in the_plan.cases[:n_req] for x in c.schedulers}
    names_all = names_req | {x for c in the_plan.cases for x in c.schedulers}
    with_predictions = campaign.needs_predictions(sorted(names_req)) or (
        campaign.needs_predictions(sorted(names_all))
        and (not the_plan.reduced or _predictions_frozen(data, P, man, srcs_all)))
    tables = campaign.run_tables(data, P, sim, tables, sorted(names_all if with_predictions else names_req),
                                 manifest=man, workers=workers)
    vocab = int(replay.model_config(e.model_config)["vocab_size"])
    log_path = out / "iterations.jsonl"
    _clear_step_logs(out, log_path)
    status = the_plan.status
    spec = the_plan.spec
    base = base_profile(sim)
    before_engine_s = R.elapsed()
    for m in the_plan.messages:
        R.log(m)
    prereg_path = out / PREREGISTRATION
    pw = the_plan.preregistration["power"]
    R.log(f"pre-registration {prereg_path} (SHA-256 {prereg_sha[:16]}...): written "
          "before the confirmatory family's runs on the virtual engine and before any wall-clock replay; "
          f"{n_req} confirmatory cases, {the_plan.preregistration['windows_per_source']} windows per source "
          f"(power calculation with noise CV {pw.get('noise_cv', float('nan')):.3f}: {pw.get('noise_cv_source', '?')})")
    R.log(f"starting vLLM ({status.distribution} {status.version}, {the_plan.device}, model {e.model_config}); "
          f"budget {budget:.0f} s from the process start")
    with replay.Replayer(spec, log_path) as eng:
        startup_s = eng.startup_s
        es = _engine_settings(log_path, the_plan)
        # engine tokens per block hash of each source (prefix caching: prompts built from the trace's hashes)
        hash_tokens = {s: resim.scaled_hash_block(windows.hash_block_size(man, {"source": s}), es) for s in srcs_all}
        R.log(f"engine up in {startup_s:.0f} s: {es.num_blocks} KV blocks x {es.block_size} tokens, budget "
              f"{es.max_num_batched_tokens} tokens, max_num_seqs {es.max_num_seqs}, max_model_len {es.max_model_len}")
        # 2b. the fixed-shape step grid on this engine, before any replay (its steps: phase "grid")
        _, step_info = measure_step_grid(v, the_plan, out, eng, progress=progress)
        R.phases.append({"phase": "grid", "tag": "step-grid", "policy": "grid", "t0": step_info["t0"],
                         "t1": step_info["t1"], "origin": None, "instance": "shared"})
        prepared: dict[str, tuple[pl.DataFrame, dict]] = {}

        def prep(wid: str):
            if wid not in prepared:
                prepared[wid] = resim.prepare_window(tables[wid], es)
            return prepared[wid]

        def replay_one(df, policy, horizon, tag, phase, prio=None, *, source, engine=None, as_policy=None):
            """One replay on ``engine`` (default: the shared one); ``as_policy``: the policy the engine runs it
            as (sarathi: fcfs on its own instance), recorded under ``policy``."""
            engine = engine or eng
            reqs, rej = replay.build_requests(df, vocab_size=vocab, seed=_seed(sim, tag, "prompt-tokens", ""),
                                              priorities=prio, max_model_len=es.max_model_len,
                                              hash_block_tokens=hash_tokens.get(source))
            t_a = time.monotonic()
            rec = engine.replay(reqs, horizon_s=horizon, policy=as_policy or policy, rejected=rej, window_df=df, tag=tag)
            R.phases.append({"phase": phase, "tag": tag, "policy": policy, "t0": t_a, "t1": time.monotonic(),
                             "origin": engine.last_t0, "instance": "own" if engine is not eng else "shared"})
            return rec

        # 3. warm-up: the first chosen window of the first source as a backlog (every request at t = 0),
        #    discarded; its completion rate is the pilot that sizes the saturation runs
        w0 = the_plan.windows[srcs_all[0]][0]
        wdf, _ = prep(w0)
        warm = wdf.with_columns(pl.lit(0.0).alias("arrival_s"))
        R.log(f"warm-up: {w0} ({warm.height} requests queued at t=0), discarded")
        t = time.perf_counter()
        wrec = replay_one(warm, "fcfs", WARMUP_HORIZON_S, f"warmup-{w0}", "warmup", source=srcs_all[0])
        warmup_s = time.perf_counter() - t
        try:      # its steady part: the fresh engine's first, slow steps fall in the trimmed start
            pilot_rps = capacity.saturation_throughput(wrec)["capacity_rps"]
        except PortbenchError:
            pilot_rps = warm.height / max(warmup_s, 1e-3)

        # 4. calibration + capacity per source: a backlogged fcfs run, regions.saturation's definition
        cap_rows: list[dict] = []
        engine_cap: dict[str, float] = {}
        bursts: dict[str, pl.DataFrame] = {}
        sat_records: dict[str, pl.DataFrame] = {}
        pools: dict[str, pl.DataFrame] = {}

        def pool(s: str) -> pl.DataFrame:
            if s not in pools:
                cols = ["arrival_s", "prompt_tokens", "output_tokens", "tenant"] + (
                    ["block_hashes"] if hash_tokens.get(s) else [])
                pools[s] = pl.concat([prep(wid)[0].select(cols)
                                      for wid in sorted(t for t in tables if _source_of(man, t) == s)])
            return pools[s]

        def per_request_s(s: str, learned: bool = True) -> float:
            """Estimated engine seconds per backlog request of source s: the warm-up's rate scaled by the work
            per request, times what the saturation runs so far took over that estimate."""
            ratio = float(np.median(R.sat_ratio)) if (R.sat_ratio and learned) else 1.0
            return _work(pool(s)) / _work(warm) / pilot_rps * ratio

        required = sorted({s for c in the_plan.cases[:n_req] for s in c.sources})
        n_sat, target, allot_s, sat_note = _backlog_size(v.saturation_requests, es.max_num_seqs, R.left, required,
                                                         per_request_s, pilot_rps)
        R.log(f"saturation backlog: {sat_note}")

        def saturate(s: str, phase: str = "saturation") -> None:
            burst = capacity.backlog_workload(pool(s), n_sat, _seed(sim, s, "saturation", "burst"))
            est = n_sat * per_request_s(s)
            share = allot_s if phase == "saturation" else max(est, R.left() - _reserve(len(R.records))) / 2
            guard = max(SATURATION_GUARD * share, 10.0)
            R.log(f"saturation run {s}: {burst.height} requests queued at t=0 (fcfs), ~{est:.0f} s (cut at {guard:.0f} s)")
            t = time.perf_counter()
            rec = replay_one(burst, "fcfs", guard, f"sat-{s}", phase, source=s)
            took = time.perf_counter() - t
            R.sat_ratio.append(took / (n_sat * per_request_s(s, learned=False)))
            c = capacity.saturation_throughput(rec)
            # diagnostic: the share of the steady part's engine steps with requests waiting (near 1: the scheduler
            # was the bottleneck; lower: vLLM's frontend could not queue the backlog faster than it was served)
            c["queue_nonempty_share"] = _queue_nonempty_share(log_path, eng.last_t0 + c["t_start_s"],
                                                              eng.last_t0 + c["t_end_s"])
            engine_cap[s] = c["capacity_rps"]
            bursts[s] = burst
            sat_records[s] = rec.with_columns(pl.lit(s).alias("source"))
            cap_rows.append({"source": s, "side": "engine", **c, "preemptions": int(rec["preemptions"].sum()),
                             "phase": phase, "wall_s": took})
            R.log(f"  {s}: capacity {c['capacity_rps']:.2f} req/s (steady part {c['t_start_s']:.1f}-{c['t_end_s']:.1f} s, "
                  f"{c['completed_in_interval']} completions, requests waiting in {c['queue_nonempty_share']:.0%} of its "
                  f"steps; makespan rate {c['makespan_rps']:.2f}), {int(rec['preemptions'].sum())} preemptions, {took:.0f} s")

        t = time.perf_counter()
        for s in required:
            saturate(s)
        saturation_s = time.perf_counter() - t
        calib_steps, calib, calib_path, calib_fit = _calibrate(replay.iteration_rows(log_path), R.phases, base, out,
                                                               name=f"vllm_{e.model_config}_{the_plan.device}_calibration",
                                                               device=the_plan.device, seed=int(v.seed))
        R.log(f"calibration profile from {calib_steps.height} steps: R² {calib_fit['r2']:.3f}; {calib.formula()}")

        # 5. replays: fidelity (fcfs below saturation), then the cases (required: the first two)
        the_cases = the_plan.cases
        done_cases: list[cases.Case] = []
        skipped: list[str] = []
        skipped_why = {"time": 0, "family": 0, "predictions": 0}
        fid_region = v.fidelity_region
        fid_rho = float(sim.region_loads[fid_region])

        def cap_of(s: str) -> float:
            """The engine's capacity of s, or (not measured yet) the measured ones scaled by work per request."""
            if s in engine_cap:
                return engine_cap[s]
            known = [engine_cap[k] * _work(pool(k)) / _work(pool(s)) for k in engine_cap]
            return float(np.median(known)) if known else pilot_rps

        def scaled_window(s, wid, region, rho):
            if (wid, region) not in R.scaled:
                if s not in engine_cap:
                    saturate(s, "capacity")
                df, _ = prep(wid)
                sc = regions.rescale(df, rho, engine_cap[s])
                R.scaled[(wid, region)] = (sc, float(regions.horizon_s(sc, sim.horizon_factor)), float(rho))
            return R.scaled[(wid, region)]

        def estimate(s, wid, region, rho, learned: bool = True) -> float:
            """Estimated wall seconds of one replay (its span, or its horizon at and above saturation), times
            the median of measured / estimated so far."""
            df, _ = prep(wid)
            cap = cap_of(s)
            span = (df.height - 1) / (rho * cap)
            per = span * sim.horizon_factor if rho >= 0.9 else span + df.height / cap * 0.2
            ratio = float(np.median(R.est_ratio)) if (R.est_ratio and learned) else 1.0
            return per * max(ratio, 0.5)

        def need_s(todo) -> float:
            """Estimated seconds of the replays ``todo`` ((s, wid, region, rho, sched)), saturation runs of new sources included."""
            new = [t for t in todo if (t[0], t[1], t[2], t[4]) not in R.records]
            srcs = {t[0] for t in new if t[0] not in engine_cap}
            return sum(estimate(s, wid, region, rho) for s, wid, region, rho, _ in new) + \
                sum(n_sat * per_request_s(s) for s in srcs)

        def do(s, wid, region, rho, sched, kind):
            key = (s, wid, region, sched)
            if key in R.records:
                return
            sc, horizon, _ = scaled_window(s, wid, region, rho)
            if sched in cases.OWN_INSTANCE:      # its own engine instance, after the shared engine's replays
                if all(d[:3] + d[4:5] != (s, wid, region, sched) for d in deferred):
                    deferred.append((s, wid, region, rho, sched, kind))
                return
            est_l = estimate(s, wid, region, rho)
            # every replay is cut when it no longer fits, but the first fidelity replay of each source: without
            # one the analysis has nothing to compare (a few seconds: fcfs below saturation)
            first_fid = kind == "fidelity" and wid == the_plan.windows[s][0]
            if not first_fid and est_l + _reserve(len(R.records) + 1) + R.virtual_s > R.left():
                R.cut.append({"replay": f"{kind}: {sched} on {wid} at {region}", "estimated_s": est_l,
                              "left_s": R.left(), "why": "its estimated time and the reserve exceed the time left"})
                return
            seed = _seed(sim, wid, sched, region)
            prio = replay.request_priorities(sched, sc, seed, schedulers.options_for(sim, sched),
                                             profile=calib, slo=sim.edf_slo_dict)
            est = estimate(s, wid, region, rho, learned=False)
            t = time.perf_counter()
            rec = replay_one(sc, sched, horizon, f"{wid}.{region}", kind, prio, source=s)
            R.est_ratio.append((time.perf_counter() - t) / est if est > 0 else 1.0)
            R.records[key] = rec.with_columns(pl.lit(float(rho)).alias("rho"))

        deferred: list[tuple] = []

        def case_todo(c, k):
            """The wall-clock replays of case c on k windows per source: none when a policy of the pair is not one
            the wall-clock engine runs (mlfq, rr, vtc: the virtual engine alone judges such a case)."""
            if not all(cases.engine_runnable(x) for x in c.schedulers):
                return []
            return [(s, wid, c.region, float(c.rho), sched)
                    for j in range(k) for s in c.sources if j < len(the_plan.windows[s])
                    for wid in [the_plan.windows[s][j]]
                    for sched in (c.schedulers if (j % 2 == 0 or not v.interleave) else c.schedulers[::-1])]

        def required_todo(k, nf):
            fid = [(s, wid, fid_region, fid_rho, "fcfs") for s in required for wid in the_plan.windows[s][:nf]]
            return fid + [t for c in the_cases[:n_req] for t in case_todo(c, k)]

        # the windows of the required cases: as many of the chosen ones as the time left holds (>= 1)
        k_plan = max(len(w) for w in the_plan.windows.values())
        k_use = _windows_that_fit(R, k_plan, n_fid_plan, required_todo, need_s)
        n_fid = min(n_fid_plan, k_use)
        if k_use < k_plan:
            R.log(f"the time left ({R.left():.0f} s) holds the required replays on {k_use} of the {k_plan} windows "
                  "per source")
        for s, wid, region, rho, sched in required_todo(0, n_fid):
            do(s, wid, region, rho, sched, "fidelity")
        for i, c in enumerate(the_cases):
            todo = case_todo(c, k_use)
            if i >= n_req:     # exploratory: while the time budget allows
                if not with_predictions and campaign.needs_predictions(list(c.schedulers)):
                    skipped.append(f"{c.kind} {c.a} vs {c.b} ({c.metric}, {c.region}, {'/'.join(c.sources)}): needs "
                                   "learned predictions, not frozen for this environment (training them does not fit "
                                   "a reduced run)")
                    skipped_why["predictions"] += 1
                    continue
                need = need_s(todo)
                n_new = sum(1 for t in todo if (t[0], t[1], t[2], t[4]) not in R.records)
                if need + _reserve(len(R.records) + n_new) + R.virtual_s > R.left():
                    skipped.append(f"{c.kind} {c.a} vs {c.b} ({c.metric}, {c.region}, {'/'.join(c.sources)}): "
                                   f"~{need:.0f} s of replays would exceed the {budget:.0f} s budget")
                    skipped_why["time"] += 1
                    continue
            t = time.perf_counter()
            for s, wid, region, rho, sched in todo:
                do(s, wid, region, rho, sched, f"case{i}")
            done_cases.append(c)
            if i < n_req:
                R.log(f"case {i + 1}/{len(the_cases)} {c.kind}: {c.a} vs {c.b}, {c.metric} at {c.region} on "
                      f"{', '.join(c.sources)}, {k_use} windows per source: {time.perf_counter() - t:.0f} s")
        if R.cut:
            R.log(f"{len(R.cut)} replays cut to hold the budget (budget.replays_cut in run.json / summary.json)")
        R.log(f"{len(done_cases)} cases replayed ({len(R.records)} replays); {len(skipped)} further cases not "
              f"({skipped_why['time']} for time, {skipped_why['predictions']} for want of frozen predictions)")
    own_settings = {}
    if deferred:     # only what the time left holds: the instance's start and shutdown, its replays, the reserve
        deferred = _own_instance_fit(R, deferred, startup_s, estimate)
    if deferred:     # sarathi: FCFS on an engine instance of its own with Sarathi-Serve's budget (cases.OWN_INSTANCE)
        own_settings["sarathi"] = _replay_on_own_instance(R, deferred, sarathi_spec(sim, spec, e.token_scale),
                                                          out / "iterations_sarathi.jsonl", replay_one)
    if not R.records:
        raise PortbenchError("no replay ran: validation.fidelity_windows is 0 and the time budget held no other replay")
    load_end = os.getloadavg()
    engine_s = R.elapsed() - before_engine_s
    # the raw measurements: everything analyze() needs, so that the analysis can be redone from files
    raw = out / "raw"
    _write_raw_tables(raw, R, man, bursts, sat_records)
    replays_s = sum(ph["t1"] - ph["t0"] for ph in R.phases if ph["phase"] not in ("warmup", "saturation", "grid"))
    # the rest of engine_total: importing vLLM, the calibration fit, bookkeeping and the engine's shutdown
    other_s = engine_s - startup_s - float(step_info["wall_s"]) - warmup_s - saturation_s - replays_s
    _write_json(raw / "run.json", {
        "engine_settings": es.to_dict(), "status": dataclasses.asdict(status), "device": the_plan.device,
        "reduced": the_plan.reduced, "budget_s": budget, "windows": the_plan.windows, "window_seed": int(v.window_seed),
        "cases": [c.to_dict() for c in done_cases], "cases_skipped": skipped, "phases": R.phases,
        "confirmatory_cases": n_req, "own_instance_settings": own_settings,
        "preregistration": {"path": str(prereg_path), "sha256": prereg_sha,
                            "windows_per_source": int(the_plan.preregistration["windows_per_source"]),
                            "windows_per_source_run": k_use},
        "step_grid": step_info, "hash_block_tokens": hash_tokens,
        "capacity": cap_rows, "startup_s": startup_s, "replay_wall_s": engine_s,
        "wall_s": {"before_engine": before_engine_s - family_s,
                   "step_grid": float(step_info["wall_s"]), "virtual_family": family_s,
                   "engine_startup": startup_s, "warmup": warmup_s,
                   "saturation": saturation_s, "replays": replays_s, "engine_other": other_s,
                   "engine_total": engine_s},
        "budget": {"budget_s": budget, "counted_from": "process start", "saturation_backlog": n_sat,
                   "saturation_backlog_target": target, "saturation_backlog_why": sat_note,
                   "warmup_rate_rps": pilot_rps, "windows_per_source": k_use, "windows_per_source_planned": k_plan,
                   "fidelity_windows": n_fid, "cases_replayed": len(done_cases),
                   "replays_cut": R.cut, "virtual_reserve_s": R.virtual_s,
                   "cases_skipped": {k: x for k, x in skipped_why.items() if k != "family"},
                   "predictions": "attached" if with_predictions else "not frozen for this environment: cases "
                                                                           "that need them skipped"},
        "loadavg_start": list(load_start), "loadavg_end": list(load_end), "calibration_profile": str(calib_path),
        "model_config": e.model_config, "dtype": e.dtype,
        "inputs": {**inputs, "manifest_checksum": man.get("checksum")}})
    return R


def _predictions_frozen(data: DataSettings, P: PredictorsConfig, man: dict, sources) -> bool:
    """Whether every source's home predictions are frozen for this environment (no training needed; ``data``:
    where they are, ``P``: the ``predictors`` section)."""
    return all(predictors.predictions_path(data.paths, s, s, predictors.fingerprint_key(
        predictors.fingerprint(P, data.standins, man, s, s))).is_file() for s in sources)
