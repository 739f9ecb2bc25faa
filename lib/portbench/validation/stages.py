"""The engine side of the validation's run, stage by stage (:mod:`.pipeline` strings them together): the engine's
settings, its step table, its capacities, the windows as it replays them, the engine-scale predictions and the
replays. Every stage takes what it needs explicitly and writes nothing but what its docstring names.

* :func:`step_table` -- the engine's step time on fixed shapes (:mod:`.steps`, an in-process engine with the
  engine's settings), fitted to the cost model: the *step table*, a :class:`~portbench.sim.profiles.Profile`.
* :func:`inputs` -- per source the engine's capacity at its own scale (the virtual engine with the step table on the
  campaign's backlog: :func:`.predict.engine_capacity`), and per (case, source, window) the window as the engine
  replays it: prepared (token scale, context limit), rescaled to the case's load, its horizon and seeds.
* :func:`predictions` -- each case's per-side predicted log-effect at the engine's scale (:func:`.predict.predict_case`).
* :func:`replays` -- the design's replay specs on the wall-clock engine (:func:`.engine.run`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import polars as pl

from ..core.config import SimulationConfig, StepGridConfig
from ..sim import profiles, regions, schedulers
from ..sim.profiles import Profile
from ..study.campaign.plan import run_seed
from . import capacity, engine, policies, predict, replay, resim, steps

PROMPTS = "prompt-tokens"     # what a window's prompt seed is drawn for (the same prompts for every policy)


def step_table(settings: engine.Settings, g: StepGridConfig, base: Profile, out: Path, *, rounds: int, seed: int,
               log: Callable[[str], None] = print) -> tuple[Profile, dict]:
    """The engine's step table: the step grid (``g``; decode shapes the KV cache cannot hold left out) timed on an
    in-process engine with ``settings`` and fitted (:func:`.steps.fit`). Writes ``raw/step_grid.parquet`` and
    ``engine_profile_step_grid.json`` under ``out``; returns the profile (limits: the engine's) and what ran."""
    shapes = steps.grid(g, kv_tokens=settings.kv_tokens)
    t = time.perf_counter()
    log(f"step table: {len(shapes)} shapes x {rounds} rounds x {g.steps_per_shape} steps (in-process engine)")
    out.mkdir(parents=True, exist_ok=True)
    grid_log = out / "iterations_grid.jsonl"
    grid_log.unlink(missing_ok=True)
    vocab = int(replay.model_config(settings.model)["vocab_size"])
    rows, startup = steps.measure(settings.spec(), shapes, rounds=rounds, steps_per_shape=int(g.steps_per_shape),
                                  seed=seed, log_path=grid_log, vocab=vocab)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    rows.write_parquet(out / "raw" / "step_grid.parquet")
    prof, _, fit = steps.fit(steps.shape_table(rows), base, f"vllm_{settings.model}_{settings.device}_step_table")
    prof = dataclasses.replace(prof, kv_capacity_blocks=int(settings.num_blocks) - 1, block_size=settings.block_size,
                               max_num_seqs=settings.max_num_seqs, max_batched_tokens=settings.max_num_batched_tokens,
                               max_model_len=settings.max_model_len)
    profiles.save_profile(prof, out / "engine_profile_step_grid.json")
    info = {"shapes": len(shapes), "rounds": rounds, "steps": rows.height, "wall_s": time.perf_counter() - t,
            "startup_s": startup, "fit": fit, "repeat_noise": steps.repeat_cv(rows)}
    log(f"step table: {rows.height} steps in {info['wall_s']:.0f} s; fit R² {fit['r2']:.3f}, median shape error "
        f"{fit['median_abs_rel_err']:.1%}")
    return prof, info


def table_from(rows: pl.DataFrame, settings: engine.Settings, base: Profile) -> Profile:
    """The step table from stored step-grid rows (an analysis on another machine: ``raw/step_grid.parquet``)."""
    prof, _, _ = steps.fit(steps.shape_table(rows), base, f"vllm_{settings.model}_{settings.device}_step_table")
    return dataclasses.replace(prof, kv_capacity_blocks=int(settings.num_blocks) - 1, block_size=settings.block_size,
                               max_num_seqs=settings.max_num_seqs, max_batched_tokens=settings.max_num_batched_tokens,
                               max_model_len=settings.max_model_len)


@dataclasses.dataclass
class Inputs:
    """What the engine and its prediction are given: capacities per source (req/s, at the engine's scale) and the
    windows as the engine replays them, per (case, source, window id)."""

    capacity: dict[str, dict]
    windows: dict[tuple[str, str, str], engine.Window]

    def window(self, spec: Mapping) -> engine.Window:
        return self.windows[(str(spec["case"]), str(spec["source"]), str(spec["window"]))]


def seed_of(sim: SimulationConfig, wid: str, what: str, region: str) -> int:
    return run_seed(int(sim.seed), wid, what, region, 0)


def inputs(cases: Sequence[Any], tables: Mapping[str, pl.DataFrame], windows: Mapping[str, Sequence[str]],
           source_of: Callable[[str], str], table: Profile, settings: engine.Settings, sim: SimulationConfig, *,
           backlog: int, hash_blocks: Mapping[str, int | None] | None = None, max_horizon_s: float | None = None,
           min_requests: int = 20, log: Callable[[str], None] = print) -> Inputs:
    """Capacities and windows (class docstring). ``cases``: the plan's entries (``id``, ``region``, ``sources``; the
    case's windows: ``windows[source]``); ``tables``: window id -> the frozen window table; ``backlog``: requests of
    each capacity run (the campaign's size, :func:`.capacity.backlog_size`; smaller in a reduced run);
    ``hash_blocks``: per source the trace's tokens per block hash (the manifest's; prefix caching where the engine
    has it on and the scaled size is whole KV blocks, :func:`.resim.scaled_hash_block`); ``max_horizon_s``: a
    replay's observation is kept to about this many seconds -- a window rescaled to the case's load keeps the
    requests that arrive in the first ``max_horizon_s / horizon_factor`` seconds, at least ``min_requests`` of
    them (None: whole windows)."""
    cases = [_case(c) for c in cases]
    es = settings.resim()
    srcs = sorted({s for c in cases for s in c.sources})
    prepared = {wid: resim.prepare_window(tables[wid], es)[0] for s in srcs for wid in windows[s]}
    caps: dict[str, dict] = {}
    for s in srcs:
        pool_ids = sorted(w for w in tables if source_of(w) == s)
        hb = resim.scaled_hash_block((hash_blocks or {}).get(s), es)
        cols = ["arrival_s", "prompt_tokens", "output_tokens", *(["block_hashes"] if hb else [])]
        pool = pl.concat([resim.prepare_window(tables[w], es)[0].select(cols) for w in pool_ids])
        t = time.perf_counter()
        caps[s] = predict.engine_capacity(pool, table, es, sim, backlog=backlog,
                                          seed=seed_of(sim, s, "saturation", "burst"),
                                          hash_block_tokens=(hash_blocks or {}).get(s))
        log(f"capacity of {s} at the engine's scale (virtual engine, step table, {backlog} requests): "
            f"{caps[s]['capacity_rps']:.2f} req/s ({time.perf_counter() - t:.0f} s)")
    wins: dict[tuple[str, str, str], engine.Window] = {}
    for c in cases:
        rho = float(sim.region_loads[c.region])
        for s in c.sources:
            for wid in windows[s]:
                sc = cut(regions.rescale(prepared[wid], rho, caps[s]["capacity_rps"]), max_horizon_s,
                         sim.horizon_factor, min_requests)
                wins[(c.name, s, wid)] = engine.Window(
                    sc, float(regions.horizon_s(sc, sim.horizon_factor)), seed_of(sim, wid, PROMPTS, c.region),
                    seed_of(sim, wid, "priority", c.region), resim.scaled_hash_block((hash_blocks or {}).get(s), es),
                    (hash_blocks or {}).get(s))
    return Inputs(caps, wins)


def cut(scaled: pl.DataFrame, max_horizon_s: float | None, horizon_factor: float, min_requests: int) -> pl.DataFrame:
    """The first requests of a rescaled window that arrive within ``max_horizon_s / horizon_factor`` seconds of
    its first arrival (at least ``min_requests``; all with None): the observation of its replay then lasts about
    ``max_horizon_s``."""
    if max_horizon_s is None:
        return scaled
    a = scaled["arrival_s"]
    n = int((a <= float(a.min()) + float(max_horizon_s) / float(horizon_factor)).sum())
    return scaled.head(max(n, int(min_requests)))


def policy_options(sim: SimulationConfig, policy: str, token_scale: float) -> dict:
    """The simulator's options of ``policy`` with its token-valued ones (quanta, sarathi's budget) x the scale."""
    if policy == engine.PLANTED:
        return {}
    return resim.scaled_options(policy, dict(schedulers.options_for(sim, policy)), token_scale)


def predictions(cases: Sequence[Any], inp: Inputs, windows: Mapping[str, Sequence[str]], table: Profile,
                settings: engine.Settings, sim: SimulationConfig) -> dict[str, dict]:
    """Per case (a plan entry: ``id``, ``a``, ``b``, ``metric``, ``sources``) the per-side predicted effect on this
    engine (:func:`.predict.predict_case`) on the case's windows as the engine replays them. A case with a policy the
    virtual engine cannot run (the planted ``delay_shortest``) has no prediction: its known order is the test."""
    es = settings.resim()
    out = {}
    for c in map(_case, cases):
        if not all(policies.virtual_mode(p) != "excluded" for p in (c.a, c.b)):
            continue
        wins = {s: [(inp.windows[(c.name, s, w)].df, inp.windows[(c.name, s, w)].horizon_s) for w in windows[s]]
                for s in c.sources}
        seeds = {s: [inp.windows[(c.name, s, w)].priority_seed for w in windows[s]] for s in c.sources}
        hb = {s: inp.windows[(c.name, s, windows[s][0])].trace_hash_block for s in c.sources if windows[s]}
        out[c.name] = predict.predict_case(c, table, es, sim=sim, windows=wins, seeds=seeds, hash_block_tokens=hb)
    return out


@dataclasses.dataclass(frozen=True)
class _Case:
    name: str
    a: str
    b: str
    metric: str
    region: str
    sources: tuple[str, ...]


def _case(e: Any) -> _Case:
    """A plan entry (mapping: ``id``, ``a``, ``b``, ``metric``, ``region``, ``sources``) as the stages read it."""
    if isinstance(e, _Case):
        return e
    g = (lambda k: e[k]) if isinstance(e, Mapping) else (lambda k: getattr(e, k))
    return _Case(str(g("id")), str(g("a")), str(g("b")), str(g("metric")), str(g("region")), tuple(g("sources")))


def replays(specs: Sequence[Any], inp: Inputs, settings: engine.Settings, table: Profile | None,
            sim: SimulationConfig, out: Path, *, deadline: float | None = None, twins: bool = True,
            log: Callable[[str], None] = print) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The specs on the wall-clock engine (:func:`.engine.run`), their per-replay table and per-request records,
    both also written under ``out/raw`` (``replays.parquet``, ``replay_requests.parquet``)."""
    vocab = int(replay.model_config(settings.model)["vocab_size"])
    tab, rec = engine.run(specs, inp.window, settings, options=lambda p: policy_options(sim, p, settings.token_scale),
                          out=out, vocab=vocab, step_table=table, slo=sim.slo_dicts, log=log, deadline=deadline,
                          twins=twins)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    tab.write_parquet(raw / "replays.parquet")
    if rec.height:
        rec.write_parquet(raw / "replay_requests.parquet")
    return tab, rec


def backlog_size(settings: engine.Settings, reduced: bool) -> int:
    """Requests of each capacity run: the campaign's rule (:func:`.capacity.backlog_size`), the smallest one the
    validation allows (:data:`.capacity.MIN_REQUESTS`) in a reduced run."""
    return capacity.MIN_REQUESTS if reduced else capacity.backlog_size(settings.max_num_seqs)


def finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None
