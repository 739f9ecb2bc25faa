"""The wall-clock engine's part of the validation's run (:func:`portbench.validation.pipeline.run`, whose docstring
describes the pipeline and its outputs): the fixed-shape step grid (:func:`measure_step_grid`) and the replays sized
to the time budget (:func:`run_replays`), step by step over small state objects passed explicitly --
:class:`_Run` (the budget, what ran), :class:`_Inputs` (the windows and what the simulator's runs are given),
:class:`_Engine` (the shared engine instance and its prepared windows), :class:`_Capacity` (the warm-up and the
saturation runs): the inputs (:func:`_prepare_inputs`), the engine's start (:func:`_engine_up`), the warm-up
(:func:`_warm_up`), the saturation runs (:func:`_saturate`) and the calibration profile, the replays
(:func:`_replay_cases`), sarathi's own instance (:func:`_replay_on_own_instance`), the raw tables and
``raw/run.json``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from ..core.config import (
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
    fidelity,
    repeat,
    replay,
    resim,
    steps,
)
from .common import (
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
    _source_of,
    _write_json,
    base_profile,
    sarathi_spec,
)
from .planning import Plan


def plan_manifest(the_plan: Plan) -> dict:
    """The windows' manifest the plan loaded (a runnable plan has one: its windows come from it)."""
    if the_plan.manifest is None:
        raise PortbenchError("the validation's plan has no windows manifest (its windows could not be chosen)")
    return the_plan.manifest


class _Run:
    """State of one validation run: its budget and what ran (the steps of :func:`run_replays` pass it on)."""

    def __init__(self, the_plan: Plan, out: Path, progress: bool, origin: float, budget: float):
        self.plan, self.out, self.progress = the_plan, out, progress
        self.origin, self.budget = origin, budget        # perf_counter() at the process start; seconds
        self.records: dict[tuple, pl.DataFrame] = {}     # KEY -> engine records
        self.repeats: dict[tuple, pl.DataFrame] = {}     # KEY -> the repeat replay's records (kept apart: repeat.py)
        self.repeat_info: list[dict] = []                 # what each repeat replay ran (raw/run.json "repeats")
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


def measure_step_grid(v: ValidationConfig, the_plan: Plan, out: Path, *,
                      progress: bool = True) -> tuple[pl.DataFrame, dict]:
    """The fixed-shape step grid (:mod:`.steps`) on an in-process engine of its own: its rows (also
    ``raw/step_grid.parquet``) and what ran (shapes, rounds, steps, wall time)."""
    e = the_plan.engine
    g = v.step_grid
    sp = the_plan.spec
    shapes = steps.grid(g, kv_tokens=int(sp.num_gpu_blocks) * int(sp.block_size)
                        if sp is not None and sp.num_gpu_blocks and sp.block_size else None)
    rounds = int(g.reduced_rounds if the_plan.reduced else g.rounds)
    _log(progress, f"step grid: {len(shapes)} shapes x {rounds} rounds x {g.steps_per_shape} steps (in-process engine)")
    t = time.perf_counter()
    grid_log = out / "iterations_grid.jsonl"
    grid_log.unlink(missing_ok=True)
    vocab = int(replay.model_config(e.model_config)["vocab_size"])
    rows, startup = steps.measure(the_plan.spec, shapes, rounds=rounds, steps_per_shape=int(g.steps_per_shape),
                                  seed=int(v.seed), log_path=grid_log, vocab=vocab)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    rows.write_parquet(out / "raw" / "step_grid.parquet")
    info = {"shapes": len(shapes), "rounds": rounds, "steps_per_shape": int(g.steps_per_shape),
            "steps": rows.height, "wall_s": time.perf_counter() - t, "startup_s": startup,
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


def _clear_step_logs(out: Path, log_path: Path, *, keep_grid: bool) -> None:
    """Remove the step logs of an earlier run (``keep_grid``: the step grid's, written before this run, stays)."""
    for f in [log_path, *out.glob("iterations_*.jsonl")]:
        if f.name != "iterations_grid.jsonl" or not keep_grid:
            f.unlink(missing_ok=True)


def _calibrate(logged: pl.DataFrame, phases: list[dict], base, out: Path, *, name: str, device: str | None,
               seed: int) -> tuple[pl.DataFrame, Any, Path, dict]:
    """The calibration profile: the cost model fitted to a sample of the saturation runs' steps (``logged``, labelled
    by ``phases``), saved as ``engine_profile_calibration.json``; its steps, the profile, its path and its fit (R²)."""
    calib_steps = fidelity.calibration_sample(_phase_steps(logged, phases, {"saturation"}), seed=seed)
    calib = fidelity.fit_engine_profile(calib_steps, base, name, floor=_floor(device))
    calib_path = profiles.save_profile(calib, out / "engine_profile_calibration.json")
    return calib_steps, calib, calib_path, fidelity.fit_r2(calib_steps, calib)


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


def _keyed(R: _Run, records: dict[tuple, pl.DataFrame]) -> pl.DataFrame:
    """``records`` (KEY -> a replay's records) in one table with the KEY columns and the replay's horizon."""
    keyed = []
    for key, rec in sorted(records.items()):
        sc, horizon, rho = R.scaled[(key[1], key[2])]
        lit = [pl.lit(x).alias(k) for k, x in zip(fidelity.KEY, key)] + [pl.lit(horizon).alias("horizon_s")]
        keyed.append(rec.with_columns(*lit))
    return pl.concat(keyed, how="vertical")


def _write_raw_tables(raw: Path, R: _Run, man: dict, bursts: dict[str, pl.DataFrame],
                      sat_records: dict[str, pl.DataFrame]) -> None:
    """The raw measurements analyze() reads (with ``run.json``): the replays' requests (keyed), the repeat replays'
    (apart, the same columns; none: the file of an earlier run is removed), the scaled windows, the saturation
    backlogs and their requests."""
    win_rows = []
    for (wid, region), (sc, horizon, rho) in sorted(R.scaled.items()):
        win_rows.append(sc.with_row_index("req_id").with_columns(
            pl.col("req_id").cast(pl.Int64), pl.lit(_source_of(man, wid)).alias("source"), pl.lit(wid).alias("window_id"),
            pl.lit(region).alias("region"), pl.lit(rho).alias("rho"), pl.lit(horizon).alias("horizon_s")))
    raw.mkdir(parents=True, exist_ok=True)
    _keyed(R, R.records).write_parquet(raw / "engine_requests.parquet")
    if R.repeats:
        _keyed(R, R.repeats).write_parquet(raw / repeat.RAW_FILE)
    else:
        (raw / repeat.RAW_FILE).unlink(missing_ok=True)
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


@dataclasses.dataclass
class _Inputs:
    """What the replays are given, prepared before the engine starts: the windows' manifest and tables (with what the
    simulator's runs are given too: frozen predictions and tenants), the sources, the required (pre-registered)
    cases' count and sources, and whether predictions are attached."""

    man: dict
    tables: dict[str, pl.DataFrame]
    sources: list[str]
    n_req: int
    required: list[str]
    with_predictions: bool


def _prepare_inputs(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, workers: int,
                    the_plan: Plan) -> _Inputs:
    """The plan's windows with what the simulator's runs are given too. Predictions are frozen per environment (their
    fingerprint has the library versions): when none are frozen for this one, they are trained here (~1-2 min on 2
    cores) only if a required case needs them or the run is the full one; a reduced run then skips the further cases
    that need them."""
    srcs_all = sorted(the_plan.windows)
    man = plan_manifest(the_plan)
    tables = windows.load_windows(data, sources=srcs_all, manifest=man)
    n_req = len(the_plan.confirmatory)     # the pre-registered cases: required, with every chosen window
    names_req = {"fcfs"} | {x for c in the_plan.cases[:n_req] for x in c.schedulers}
    names_all = names_req | {x for c in the_plan.cases for x in c.schedulers}
    with_predictions = campaign.needs_predictions(sorted(names_req)) or (
        campaign.needs_predictions(sorted(names_all))
        and (not the_plan.reduced or _predictions_frozen(data, P, man, srcs_all)))
    tables = campaign.run_tables(data, P, sim, tables, sorted(names_all if with_predictions else names_req),
                                 manifest=man, workers=workers)
    required = sorted({s for c in the_plan.cases[:n_req] for s in c.sources})
    return _Inputs(man, tables, srcs_all, n_req, required, with_predictions)


@dataclasses.dataclass
class _Engine:
    """The shared engine instance, its resolved settings and the windows as it runs them (prepared once each)."""

    eng: replay.Replayer
    es: resim.EngineSettings
    log_path: Path                     # its step log
    sim: SimulationConfig              # the seeds of the prompts and of the policies
    inputs: _Inputs
    vocab: int
    hash_tokens: dict[str, Any]        # engine tokens per block hash of each source (prefix caching)
    R: _Run
    prepared: dict[str, tuple[pl.DataFrame, dict]] = dataclasses.field(default_factory=dict)
    pools: dict[str, pl.DataFrame] = dataclasses.field(default_factory=dict)

    def prep(self, wid: str) -> tuple[pl.DataFrame, dict]:
        if wid not in self.prepared:
            self.prepared[wid] = resim.prepare_window(self.inputs.tables[wid], self.es)
        return self.prepared[wid]

    def pool(self, s: str) -> pl.DataFrame:
        """Every prepared window of source s, one after the other (what the saturation backlogs are drawn from)."""
        if s not in self.pools:
            cols = ["arrival_s", "prompt_tokens", "output_tokens", "tenant"] + (
                ["block_hashes"] if self.hash_tokens.get(s) else [])
            tables, man = self.inputs.tables, self.inputs.man
            self.pools[s] = pl.concat([self.prep(wid)[0].select(cols)
                                       for wid in sorted(t for t in tables if _source_of(man, t) == s)])
        return self.pools[s]

    def replay_one(self, df, policy, horizon, tag, phase, prio=None, *, source, engine=None, as_policy=None,
                   seed_tag=None):
        """One replay on ``engine`` (default: the shared one); ``as_policy``: the policy the engine runs it
        as (sarathi: fcfs on its own instance), recorded under ``policy``; ``seed_tag``: the tag its prompts' token
        ids are seeded from (default ``tag``; a repeat replay: its first replay's)."""
        engine = engine or self.eng
        reqs, rej = replay.build_requests(df, vocab_size=self.vocab,
                                          seed=_seed(self.sim, seed_tag or tag, "prompt-tokens", ""),
                                          priorities=prio, max_model_len=self.es.max_model_len,
                                          hash_block_tokens=self.hash_tokens.get(source))
        # every replay starts with vLLM's prefix cache empty, as the simulator's and the prediction's runs of a window
        # do: Mooncake's prompts share blocks across windows (their token ids are a function of the trace's block
        # hashes) and a repeat replay has its first replay's prompts, so a warm cache would hand a replay the blocks
        # of the runs before it -- and the second policy of a case the first one's
        reset = bool(self.es.prefix_caching) and engine.reset_prefix_cache()
        t_a = time.monotonic()
        rec = engine.replay(reqs, horizon_s=horizon, policy=as_policy or policy, rejected=rej, window_df=df, tag=tag)
        self.R.phases.append({"phase": phase, "tag": tag, "policy": policy, "t0": t_a, "t1": time.monotonic(),
                              "origin": engine.last_t0, "instance": "own" if engine is not self.eng else "shared",
                              "prefix_cache_reset": reset})
        return rec


def _engine_up(R: _Run, eng: replay.Replayer, log_path: Path, sim: SimulationConfig, I: _Inputs, the_plan: Plan,
               vocab: int) -> _Engine:
    """The started engine's resolved settings (read back from its init record) and the block hash size per source;
    ``vocab``: the model's vocabulary size (the prompts' token ids)."""
    es = _engine_settings(log_path, the_plan)
    hash_tokens = {s: resim.scaled_hash_block(windows.hash_block_size(I.man, {"source": s}), es) for s in I.sources}
    R.log(f"engine up in {eng.startup_s:.0f} s: {es.num_blocks} KV blocks x {es.block_size} tokens, budget "
          f"{es.max_num_batched_tokens} tokens, max_num_seqs {es.max_num_seqs}, max_model_len {es.max_model_len}")
    return _Engine(eng, es, log_path, sim, I, vocab, hash_tokens, R)


@dataclasses.dataclass
class _Capacity:
    """The warm-up's pilot rate and the saturation runs: the backlog's size, each source's measured capacity."""

    warm: pl.DataFrame                 # the warm-up's backlog (discarded)
    warmup_s: float
    pilot_rps: float                   # its completion rate: sizes the saturation runs
    n_sat: int = 0                     # requests per source of a saturation backlog
    target: int = 0                    # the campaign's backlog size
    allot_s: float = 0.0               # seconds allotted per required source
    note: str = ""                     # why n_sat
    rows: list[dict] = dataclasses.field(default_factory=list)                  # capacity rows
    engine_cap: dict[str, float] = dataclasses.field(default_factory=dict)      # source -> req/s
    bursts: dict[str, pl.DataFrame] = dataclasses.field(default_factory=dict)   # source -> backlog
    sat_records: dict[str, pl.DataFrame] = dataclasses.field(default_factory=dict)
    saturation_s: float = 0.0          # wall seconds of the required sources' saturation runs


def _warm_up(E: _Engine, the_plan: Plan, v: ValidationConfig) -> _Capacity:
    """3. The first chosen window of the first source as a backlog (every request at t = 0), discarded; its
    completion rate is the pilot that sizes the saturation runs (backlog: ``v.saturation_requests``)."""
    R, first = E.R, E.inputs.sources[0]
    w0 = the_plan.windows[first][0]
    wdf, _ = E.prep(w0)
    warm = wdf.with_columns(pl.lit(0.0).alias("arrival_s"))
    R.log(f"warm-up: {w0} ({warm.height} requests queued at t=0), discarded")
    t = time.perf_counter()
    wrec = E.replay_one(warm, "fcfs", WARMUP_HORIZON_S, f"warmup-{w0}", "warmup", source=first)
    warmup_s = time.perf_counter() - t
    try:      # its steady part: the fresh engine's first, slow steps fall in the trimmed start
        pilot_rps = capacity.saturation_throughput(wrec)["capacity_rps"]
    except PortbenchError:
        pilot_rps = warm.height / max(warmup_s, 1e-3)
    C = _Capacity(warm, warmup_s, pilot_rps)
    C.n_sat, C.target, C.allot_s, C.note = _backlog_size(
        v.saturation_requests, E.es.max_num_seqs, R.left, E.inputs.required,
        lambda s: _per_request_s(E, C, s), pilot_rps)
    R.log(f"saturation backlog: {C.note}")
    return C


def _per_request_s(E: _Engine, C: _Capacity, s: str, learned: bool = True) -> float:
    """Estimated engine seconds per backlog request of source s: the warm-up's rate scaled by the work
    per request, times what the saturation runs so far took over that estimate."""
    ratio = float(np.median(E.R.sat_ratio)) if (E.R.sat_ratio and learned) else 1.0
    return _work(E.pool(s)) / _work(C.warm) / C.pilot_rps * ratio


def _saturate(E: _Engine, C: _Capacity, s: str, phase: str = "saturation") -> None:
    """4. Calibration + capacity of source s: a backlogged fcfs run, regions.saturation's definition."""
    R, n_sat = E.R, C.n_sat
    burst = capacity.backlog_workload(E.pool(s), n_sat, _seed(E.sim, s, "saturation", "burst"))
    est = n_sat * _per_request_s(E, C, s)
    share = C.allot_s if phase == "saturation" else max(est, R.left() - _reserve(len(R.records))) / 2
    guard = max(SATURATION_GUARD * share, 10.0)
    R.log(f"saturation run {s}: {burst.height} requests queued at t=0 (fcfs), ~{est:.0f} s (cut at {guard:.0f} s)")
    t = time.perf_counter()
    rec = E.replay_one(burst, "fcfs", guard, f"sat-{s}", phase, source=s)
    took = time.perf_counter() - t
    R.sat_ratio.append(took / (n_sat * _per_request_s(E, C, s, learned=False)))
    c = capacity.saturation_throughput(rec)
    # diagnostic: the share of the steady part's engine steps with requests waiting (near 1: the scheduler
    # was the bottleneck; lower: vLLM's frontend could not queue the backlog faster than it was served)
    c["queue_nonempty_share"] = _queue_nonempty_share(E.log_path, E.eng.last_t0 + c["t_start_s"],
                                                      E.eng.last_t0 + c["t_end_s"])
    C.engine_cap[s] = c["capacity_rps"]
    C.bursts[s] = burst
    C.sat_records[s] = rec.with_columns(pl.lit(s).alias("source"))
    C.rows.append({"source": s, "side": "engine", **c, "preemptions": int(rec["preemptions"].sum()),
                   "phase": phase, "wall_s": took})
    R.log(f"  {s}: capacity {c['capacity_rps']:.2f} req/s (steady part {c['t_start_s']:.1f}-{c['t_end_s']:.1f} s, "
          f"{c['completed_in_interval']} completions, requests waiting in {c['queue_nonempty_share']:.0%} of its "
          f"steps; makespan rate {c['makespan_rps']:.2f}), {int(rec['preemptions'].sum())} preemptions, {took:.0f} s")


def _cap_of(E: _Engine, C: _Capacity, s: str) -> float:
    """The engine's capacity of s, or (not measured yet) the measured ones scaled by work per request."""
    if s in C.engine_cap:
        return C.engine_cap[s]
    known = [C.engine_cap[k] * _work(E.pool(k)) / _work(E.pool(s)) for k in C.engine_cap]
    return float(np.median(known)) if known else C.pilot_rps


def _scaled_window(E: _Engine, C: _Capacity, s: str, wid: str, region: str, rho: float):
    """Window wid rescaled to rho with the engine's capacity of its source s (measured first when it is not yet),
    its horizon and rho (kept in ``R.scaled``)."""
    R = E.R
    if (wid, region) not in R.scaled:
        if s not in C.engine_cap:
            _saturate(E, C, s, "capacity")
        df, _ = E.prep(wid)
        sc = regions.rescale(df, rho, C.engine_cap[s])
        R.scaled[(wid, region)] = (sc, float(regions.horizon_s(sc, E.sim.horizon_factor)), float(rho))
    return R.scaled[(wid, region)]


def _estimate(E: _Engine, C: _Capacity, s: str, wid: str, region: str, rho: float, learned: bool = True) -> float:
    """Estimated wall seconds of one replay (its span, or its horizon at and above saturation), times
    the median of measured / estimated so far."""
    R = E.R
    df, _ = E.prep(wid)
    cap = _cap_of(E, C, s)
    span = (df.height - 1) / (rho * cap)
    per = span * E.sim.horizon_factor if rho >= 0.9 else span + df.height / cap * 0.2
    ratio = float(np.median(R.est_ratio)) if (R.est_ratio and learned) else 1.0
    return per * max(ratio, 0.5)


def _need_s(E: _Engine, C: _Capacity, todo) -> float:
    """Estimated seconds of the replays ``todo`` ((s, wid, region, rho, sched)), saturation runs of new sources
    included."""
    new = [t for t in todo if (t[0], t[1], t[2], t[4]) not in E.R.records]
    srcs = {t[0] for t in new if t[0] not in C.engine_cap}
    return sum(_estimate(E, C, s, wid, region, rho) for s, wid, region, rho, _ in new) + \
        sum(C.n_sat * _per_request_s(E, C, s) for s in srcs)


def _replay(E: _Engine, C: _Capacity, the_plan: Plan, calib, deferred: list[tuple],
            s: str, wid: str, region: str, rho: float, sched: str, kind: str) -> None:
    """One replay of window wid at rho under sched on the shared engine (``R.records``), unless it ran already, its
    policy runs on an instance of its own (then ``deferred``) or the time left cannot hold it (then ``R.cut``);
    ``calib``: the calibration profile (the priorities of the policies that need a cost model)."""
    R, sim = E.R, E.sim
    key = (s, wid, region, sched)
    if key in R.records:
        return
    sc, horizon, _ = _scaled_window(E, C, s, wid, region, rho)
    if sched in cases.OWN_INSTANCE:      # its own engine instance, after the shared engine's replays
        if all(d[:3] + d[4:5] != (s, wid, region, sched) for d in deferred):
            deferred.append((s, wid, region, rho, sched, kind))
        return
    est_l = _estimate(E, C, s, wid, region, rho)
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
    est = _estimate(E, C, s, wid, region, rho, learned=False)
    t = time.perf_counter()
    rec = E.replay_one(sc, sched, horizon, f"{wid}.{region}", kind, prio, source=s)
    R.est_ratio.append((time.perf_counter() - t) / est if est > 0 else 1.0)
    R.records[key] = rec.with_columns(pl.lit(float(rho)).alias("rho"))


def _repeat(E: _Engine, calib, s: str, wid: str, region: str) -> None:
    """The repeat replay of source s's fidelity window wid (:mod:`.repeat`): the same scaled window, policy (fcfs),
    priorities, prompts' seed and horizon as its first replay, right after it on the same engine, with vLLM's
    prefix cache emptied first as before every replay (:meth:`_Engine.replay_one`: it finds none of the blocks its
    first replay left); kept
    apart (``R.repeats``, phase :data:`.repeat.PHASE`). Cut (``R.cut``) when the first replay's measured time and
    the reserve exceed the time left; nothing when the first replay did not run."""
    R, sim = E.R, E.sim
    key, tag = (s, wid, region, "fcfs"), f"{wid}.{region}"
    first = [ph for ph in R.phases if ph["tag"] == tag and ph["policy"] == "fcfs" and ph["phase"] == "fidelity"]
    if key not in R.records or not first:
        return
    took = first[-1]["t1"] - first[-1]["t0"]
    if took + _reserve(len(R.records) + 1) + R.virtual_s > R.left():
        R.cut.append({"replay": f"{repeat.PHASE}: fcfs on {wid} at {region}", "estimated_s": took, "left_s": R.left(),
                      "why": "its first replay's measured time and the reserve exceed the time left"})
        return
    sc, horizon, rho = R.scaled[(wid, region)]
    prio = replay.request_priorities("fcfs", sc, _seed(sim, wid, "fcfs", region), schedulers.options_for(sim, "fcfs"),
                                     profile=calib, slo=sim.edf_slo_dict)
    rec = E.replay_one(sc, "fcfs", horizon, repeat.tag(wid, region), repeat.PHASE, prio, source=s, seed_tag=tag)
    reset = bool(R.phases[-1].get("prefix_cache_reset"))
    R.repeats[key] = rec.with_columns(pl.lit(float(rho)).alias("rho"))
    R.repeat_info.append({**dict(zip(fidelity.KEY, key)), "tag": repeat.tag(wid, region), "first_s": took,
                          "repeat_s": R.phases[-1]["t1"] - R.phases[-1]["t0"],
                          "prefix_caching": bool(E.es.prefix_caching), "prefix_cache_reset": bool(reset)})
    R.log(f"repeat of {tag} (fcfs): {R.phases[-1]['t1'] - R.phases[-1]['t0']:.1f} s (first replay {took:.1f} s)")


def _case_todo(the_plan: Plan, interleave: bool, c: cases.Case, k: int) -> list[tuple]:
    """The wall-clock replays of case c on k windows per source: none when a policy of the pair is not one
    the wall-clock engine runs (mlfq, rr, vtc: the virtual engine alone judges such a case); the policy order
    alternates from window to window when ``interleave``."""
    if not all(cases.engine_runnable(x) for x in c.schedulers):
        return []
    return [(s, wid, c.region, float(c.rho), sched)
            for j in range(k) for s in c.sources if j < len(the_plan.windows[s])
            for wid in [the_plan.windows[s][j]]
            for sched in (c.schedulers if (j % 2 == 0 or not interleave) else c.schedulers[::-1])]


@dataclasses.dataclass
class _Replayed:
    """What step 5 ran: the cases replayed, those skipped (and why), the windows used, the deferred replays."""

    done_cases: list[cases.Case]
    skipped: list[str]
    skipped_why: dict[str, int]
    k_use: int
    k_plan: int
    n_fid: int
    deferred: list[tuple]


def _replay_cases(E: _Engine, C: _Capacity, v: ValidationConfig, the_plan: Plan, calib,
                  n_fid_plan: int) -> _Replayed:
    """5. Replays: fidelity (fcfs below saturation at ``v.fidelity_region``), then the cases (required: the
    pre-registered ones, on as many windows as the time left holds; further ones while they fit)."""
    R, I, sim = E.R, E.inputs, E.sim
    the_cases, n_req = the_plan.cases, I.n_req
    done_cases: list[cases.Case] = []
    skipped: list[str] = []
    skipped_why = {"time": 0, "family": 0, "predictions": 0}
    fid_region = v.fidelity_region
    fid_rho = float(sim.region_loads[fid_region])
    n_rep = int(v.repeat_windows)
    deferred: list[tuple] = []

    def repeats_s(todo: list[tuple]) -> float:
        """Estimated seconds of the repeat replays of the fidelity replays in ``todo`` (repeat.py)."""
        rep_ = {(t[0], t[1]) for t in todo if t[2] == fid_region and t[4] == "fcfs"
                and t[1] in the_plan.windows[t[0]][:n_rep] and (t[0], t[1], t[2], t[4]) not in R.repeats}
        return sum(_estimate(E, C, s, wid, fid_region, fid_rho) for s, wid in rep_)

    def required_todo(k: int, nf: int) -> list[tuple]:
        fid = [(s, wid, fid_region, fid_rho, "fcfs") for s in I.required for wid in the_plan.windows[s][:nf]]
        return fid + [t for c in the_cases[:n_req] for t in _case_todo(the_plan, v.interleave, c, k)]

    def do(s, wid, region, rho, sched, kind):
        _replay(E, C, the_plan, calib, deferred, s, wid, region, rho, sched, kind)

    # the windows of the required cases: as many of the chosen ones as the time left holds (>= 1)
    k_plan = max(len(w) for w in the_plan.windows.values())
    k_use = _windows_that_fit(R, k_plan, n_fid_plan, required_todo,
                              lambda todo: _need_s(E, C, todo) + repeats_s(todo))
    n_fid = min(n_fid_plan, k_use)
    if k_use < k_plan:
        R.log(f"the time left ({R.left():.0f} s) holds the required replays on {k_use} of the {k_plan} windows "
              "per source")
    for s, wid, region, rho, sched in required_todo(0, n_fid):
        do(s, wid, region, rho, sched, "fidelity")
        if wid in the_plan.windows[s][:n_rep]:     # the engine's run-to-run floor: the same replay again
            _repeat(E, calib, s, wid, region)
    for i, c in enumerate(the_cases):
        todo = _case_todo(the_plan, v.interleave, c, k_use)
        if i >= n_req:     # exploratory: while the time budget allows
            if not I.with_predictions and campaign.needs_predictions(list(c.schedulers)):
                skipped.append(f"{c.kind} {c.a} vs {c.b} ({c.metric}, {c.region}, {'/'.join(c.sources)}): needs "
                               "learned predictions, not frozen for this environment (training them does not fit "
                               "a reduced run)")
                skipped_why["predictions"] += 1
                continue
            need = _need_s(E, C, todo)
            n_new = sum(1 for t in todo if (t[0], t[1], t[2], t[4]) not in R.records)
            if need + _reserve(len(R.records) + n_new) + R.virtual_s > R.left():
                skipped.append(f"{c.kind} {c.a} vs {c.b} ({c.metric}, {c.region}, {'/'.join(c.sources)}): "
                               f"~{need:.0f} s of replays would exceed the {R.budget:.0f} s budget")
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
    return _Replayed(done_cases, skipped, skipped_why, k_use, k_plan, n_fid, deferred)


def _log_start(R: _Run, the_plan: Plan, prereg_path: Path, prereg_sha: str, *, after_grid: bool) -> None:
    """The plan's messages and the pre-registration's line."""
    for m in the_plan.messages:
        R.log(m)
    pre = the_plan.preregistration or {}
    pw = pre["power"]
    R.log(f"pre-registration {prereg_path} (SHA-256 {prereg_sha[:16]}...): written "
          f"{'after the step grid (fixed shapes; no case window) and ' if after_grid else ''}before the "
          "confirmatory family's runs on the virtual engine and before any wall-clock replay; "
          f"{len(the_plan.confirmatory)} confirmatory cases, {pre['windows_per_source']} windows per source "
          f"(power calculation with noise CV {pw.get('noise_cv', float('nan')):.3f}: {pw.get('noise_cv_source', '?')})")


def run_replays(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, v: ValidationConfig, workers: int,
         the_plan: Plan, out: Path, inputs: dict, *, progress: bool, origin: float | None = None,
         prereg_sha: str = "", grid: tuple[pl.DataFrame, dict] | None = None, family_s: float = 0.0) -> _Run:
    """The validation's replays (module docstring), their raw files under ``out`` for :func:`analyze`; returns the
    run's state (its origin, budget and phases). Sized to the budget, which counts from the process start:
    the saturation backlog (the campaign's size unless :data:`SATURATION_SHARE` of the time left cannot
    hold it, then no fewer than ``capacity.MIN_REQUESTS``), the windows of the required cases (fewer
    when their estimated replays do not fit, at least one per source), then optional cases while they
    fit; :func:`_reserve` is kept for the analysis. ``data``, ``P``, ``workers``: the windows and their frozen
    predictions; ``sim``, ``v``: the ``simulation`` and ``validation`` sections; ``inputs``: the parameters'
    fingerprint and the reversals' SHA-256, recorded in ``raw/run.json``.

    Steps: the inputs (:func:`_prepare_inputs`), the engine's start (:func:`_engine_up`), the warm-up
    (:func:`_warm_up`), the saturation runs (:func:`_saturate`) and the calibration profile, the replays
    (:func:`_replay_cases`), sarathi's own instance, the raw tables and ``raw/run.json``."""
    e = the_plan.engine
    budget = float(v.reduced_time_budget_s if the_plan.reduced else v.time_budget_s)
    R = _Run(the_plan, out, progress, time.perf_counter() if origin is None else origin, budget)
    n_fid_plan = int(v.reduced_fidelity_windows if the_plan.reduced else v.fidelity_windows)
    load_start = os.getloadavg()
    I = _prepare_inputs(data, P, sim, workers, the_plan)
    R.virtual_s = _virtual_reserve(v, the_plan)
    vocab = int(replay.model_config(e.model_config)["vocab_size"])
    log_path = out / "iterations.jsonl"
    _clear_step_logs(out, log_path, keep_grid=grid is not None)
    spec = the_plan.spec
    base = base_profile(sim)
    before_engine_s = R.elapsed()
    prereg_path = out / PREREGISTRATION
    _log_start(R, the_plan, prereg_path, prereg_sha, after_grid=grid is not None)
    # the step grid: measured before the pre-registration (run()); measured here when called without it
    _, step_info = grid if grid is not None else measure_step_grid(v, the_plan, out, progress=progress)
    R.log(f"starting vLLM ({the_plan.status.distribution} {the_plan.status.version}, {the_plan.device}, model "
          f"{e.model_config}); budget {budget:.0f} s from the process start")
    with replay.Replayer(spec, log_path) as eng:
        startup_s = eng.startup_s
        E = _engine_up(R, eng, log_path, sim, I, the_plan, vocab)
        C = _warm_up(E, the_plan, v)
        t = time.perf_counter()
        for s in I.required:
            _saturate(E, C, s)
        C.saturation_s = time.perf_counter() - t
        calib_steps, calib, calib_path, calib_fit = _calibrate(replay.iteration_rows(log_path), R.phases, base, out,
                                                               name=f"vllm_{e.model_config}_{the_plan.device}_calibration",
                                                               device=the_plan.device, seed=int(v.seed))
        R.log(f"calibration profile from {calib_steps.height} steps: R² {calib_fit['r2']:.3f}; {calib.formula()}")
        done = _replay_cases(E, C, v, the_plan, calib, n_fid_plan)
    own_settings = {}
    deferred = done.deferred
    if deferred:     # only what the time left holds: the instance's start and shutdown, its replays, the reserve
        deferred = _own_instance_fit(R, deferred, startup_s, lambda *a: _estimate(E, C, *a))
    if deferred:     # sarathi: FCFS on an engine instance of its own with Sarathi-Serve's budget (cases.OWN_INSTANCE)
        own_settings["sarathi"] = _replay_on_own_instance(R, deferred, sarathi_spec(sim, spec, e.token_scale),
                                                          out / "iterations_sarathi.jsonl", E.replay_one)
    if not R.records:
        raise PortbenchError("no replay ran: validation.fidelity_windows is 0 and the time budget held no other replay")
    load_end = os.getloadavg()
    engine_s = R.elapsed() - before_engine_s
    # the raw measurements: everything analyze() needs, so that the analysis can be redone from files
    raw = out / "raw"
    _write_raw_tables(raw, R, I.man, C.bursts, C.sat_records)
    replays_s = sum(ph["t1"] - ph["t0"] for ph in R.phases if ph["phase"] not in ("warmup", "saturation"))
    # the rest of engine_total: importing vLLM, the calibration fit, bookkeeping and the engine's shutdown
    other_s = engine_s - startup_s - C.warmup_s - C.saturation_s - replays_s
    _write_json(raw / "run.json", {
        "engine_settings": E.es.to_dict(), "status": dataclasses.asdict(the_plan.status), "device": the_plan.device,
        "reduced": the_plan.reduced, "budget_s": budget, "windows": the_plan.windows, "window_seed": int(v.window_seed),
        "cases": [c.to_dict() for c in done.done_cases], "cases_skipped": done.skipped, "phases": R.phases,
        "confirmatory_cases": I.n_req, "own_instance_settings": own_settings, "repeats": R.repeat_info,
        "preregistration": {"path": str(prereg_path), "sha256": prereg_sha,
                            "windows_per_source": int(the_plan.preregistration["windows_per_source"]),
                            "windows_per_source_run": done.k_use},
        "step_grid": step_info, "hash_block_tokens": E.hash_tokens,
        "capacity": C.rows, "startup_s": startup_s, "replay_wall_s": engine_s,
        "wall_s": {"before_engine": before_engine_s - float(step_info["wall_s"]) - family_s,
                   "step_grid": float(step_info["wall_s"]), "virtual_family": family_s,
                   "engine_startup": startup_s, "warmup": C.warmup_s,
                   "saturation": C.saturation_s, "replays": replays_s, "engine_other": other_s,
                   "engine_total": engine_s},
        "budget": {"budget_s": budget, "counted_from": "process start", "saturation_backlog": C.n_sat,
                   "saturation_backlog_target": C.target, "saturation_backlog_why": C.note,
                   "warmup_rate_rps": C.pilot_rps, "windows_per_source": done.k_use,
                   "windows_per_source_planned": done.k_plan,
                   "fidelity_windows": done.n_fid, "repeat_windows": int(v.repeat_windows),
                   "cases_replayed": len(done.done_cases),
                   "replays_cut": R.cut, "virtual_reserve_s": R.virtual_s,
                   "cases_skipped": {k: x for k, x in done.skipped_why.items() if k != "family"},
                   "predictions": "attached" if I.with_predictions else "not frozen for this environment: cases "
                                                                             "that need them skipped"},
        "loadavg_start": list(load_start), "loadavg_end": list(load_end), "calibration_profile": str(calib_path),
        "model_config": e.model_config, "dtype": e.dtype,
        "inputs": {**inputs, "manifest_checksum": I.man.get("checksum")}})
    return R


def _predictions_frozen(data: DataSettings, P: PredictorsConfig, man: dict, sources) -> bool:
    """Whether every source's home predictions are frozen for this environment (no training needed; ``data``:
    where they are, ``P``: the ``predictors`` section)."""
    return all(predictors.predictions_path(data.paths, s, s, predictors.fingerprint_key(
        predictors.fingerprint(P, data.standins, man, s, s))).is_file() for s in sources)
