"""Simulating the hybrids: every subset of swapped properties x window pair x region x scheduler x replicate,
through the campaign's engine (:class:`portbench.study.campaign.SimEngine`: its capacity, its rescaling to a
region's load and horizon, its runs and metrics; :func:`portbench.study.campaign.compute_shard`: its seeds
and run rows), so that the attribution uses the campaign's definitions of capacity and load and picks up
any change to them.

**Seeds.** A hybrid of A's window ``w`` is run with the seeds of ``w`` (:func:`~portbench.study.campaign.run_seed`
of A's window id, scheduler, region, replicate): the subset that swaps nothing reproduces the campaign's runs
of ``w`` bit for bit, and a swap that does not change the window changes no run.

**Load.** Every hybrid is run as the campaign runs every window: rescaled to the region's rho on the
sustainable throughput of its own requests (its capacity), i.e. at the region's target load. That *is* the
project's load (issue #10): capacity is the throughput the reference engine sustains on the request mix, so
that every source in a region is equally loaded -- in steady state the achieved utilisation is close to
min(rho, 1) whatever the lengths (:data:`LOAD_CHECK` measures it here on both sources). A and B of a pair are simulated
in the same regions, so they are at the same load, and the ``load`` swap ("each source at the other's
load") is the identity: its runs are those of the same subset without it, its Shapley value is exactly 0.

The achieved utilisation of a *finite* window (``utilisation``, the campaign's per-run column) is not used
as the load. Measured when this definition was chosen (default design, December 2026): at one rho it ranged
over 0.6-1.5 between the sources and hybrids in 200-request windows, while the same windows repeated to 2,000
requests gave 0.96-1.00 at overload and severe, and 0.90 for every source at rho = 0.9. The finite-window value depends on
how the window's requests fill the engine -- how much work its long requests still hold at the last arrival,
how deep its queue gets before the window ends -- so it is a consequence of the window's lengths and arrival
pattern, and the attribution credits it to those properties. Swapping it as a separate property (the earlier
design: a hybrid with ``load`` rescaled to B's finite-window utilisation, the others at rho) counted that
effect twice: on planted sources that differ only in output lengths it gave the load 42% of the attribution.
Holding every hybrid at A's finite-window utilisation instead is not feasible: rescaling to a target
utilisation missed it by up to 0.3, and some targets are out of reach (azure_code's windows stayed below 0.93
up to rho = 5, while azure's reach 1.1 at rho = 1.2). The ``load`` table reports each hybrid's finite-window
utilisation and both sources' steady-state utilisation (:data:`LOAD_CHECK`), so the reader sees both.

**Files.** ``hybrids.json`` next to the window manifest: the committed SHA-256 of every hybrid of the default
design (:func:`portbench.data.hybrids.frozen_path`), against which every rebuilt hybrid is verified;
``{results_dir}/attribution/hybrids/<A>__<B>.json``: the full records of the pair's hybrids
(:func:`portbench.data.hybrids.hybrid_record`; those outside ``hybrids.json`` are verified against them);
``{results_dir}/attribution/runs/<A>__<B>__<region>__<key>.parquet``: the runs of one *unit* (one
window-hybrid of every window pair, one region and rho), ``key`` a hash of everything that changes them
(the campaign's model fingerprint and settings, the hybrids' SHA-256, region and rho, schedulers,
replicates), so stale runs are never read, identical hybrids share their runs, and changing the
regions or adding pairs recomputes only what is new; ``.../<A>__<B>__steady__<region>__<key>.parquet``: the
load check's runs; ``{results_dir}/attribution/runs.parquet``: all of them, labelled by subset.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ...core import io as fileio
from ...core import plugins as plugin_loader
from ...core import procs
from ...core.progress import bar as progress_bar
from ...core.config import Config, DataSettings, PredictorsConfig, SimulationConfig
from ...core.errors import DataError
from ...core.io import sha256_hex, write_parquet_atomic
from ...data import hybrids, windows as windows_mod
from ...sim.schedulers import names as scheduler_names
from ..campaign import (Engine, ShardSpec, SimEngine, WindowRef, WorkerContext, compute_capacity, compute_shard,
                        load_worker_code, plan_common, run_tables, scheduler_options)
from .design import Design, cost_plan, make_design, spaced

FORMAT_VERSION = 3
STEADY_REQUESTS = 2000    # the load check: each window's arrival pattern repeated to at least this many requests
UTILISATION_DEFINITION = ("achieved utilisation of a run = the campaign's definition (issue #10, "
                          "portbench.sim.regions.utilisation): useful tokens done per second between the 10%-quantile "
                          "and the last arrival, over capacity x the window's mean useful tokens per request; of the "
                          "reference policy's runs (simulation.capacity_policy), mean over the window pairs")
LOAD_DEFINITION = ("load = the offered load: the region's rho on the sustainable throughput of the hybrid's own requests "
                   "(the campaign's definition, issue #10). Both sources of a pair run in the same regions, so they "
                   "are at the same load and the load swap is the identity; the achieved utilisation of a finite "
                   "window differs between sources (how the window's requests fill the engine) and is credited to "
                   "the window properties that produce it")
LOAD_CHECK = (f"steady-state utilisation: each attribution window's arrival pattern repeated to at least "
              f"{STEADY_REQUESTS} requests, rescaled to the region's rho on the window's capacity, run under the "
              "reference policy; mean over the window pairs, beside the mean over the 200-request windows themselves")
PAIR_COLUMNS = ("pair", "source_a", "provenance_a", "source_b", "provenance_b", "mask", "hybrid", "window_id",
                "window_b", "hybrid_sha256", "region", "rho_region")


def attribution_dir(results_dir: Path) -> Path:
    return Path(results_dir) / "attribution"


def pair_key(a: str, b: str) -> str:
    return f"{a}|{b}"


def hybrids_path(results_dir: Path, a: str, b: str) -> Path:
    return attribution_dir(results_dir) / "hybrids" / f"{a}__{b}.json"


def achieved_utilisation(runs: pl.DataFrame) -> pl.Series:
    """The achieved utilisation of each run (:data:`UTILISATION_DEFINITION`): the campaign's own
    ``utilisation`` column (work-based, measured in the engine run)."""
    if "utilisation" not in runs.columns:
        raise KeyError("runs have no 'utilisation' column: they were not produced by portbench.study.campaign")
    return runs["utilisation"].alias("utilisation")


@dataclass
class PairWindows:
    """The window pairs of one source pair: A's and B's manifest entries (paired by position) and tables."""

    a: str
    b: str
    a_entries: list
    b_entries: list
    tables: dict

    def __len__(self) -> int:
        return len(self.a_entries)


def pair_windows(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, windows_per_source: int | None,
                 manifest: Mapping, a: str, b: str, n: int, tables: Mapping | None = None, *,
                 workers: int = 1) -> PairWindows:
    """``n`` windows of each source, evenly spaced through its campaign windows (the manifest's, or the first
    ``windows_per_source``, ``campaign.windows_per_source``), paired by position
    (A's i-th with B's i-th); the tables are loaded and hash-verified (``windows.load_windows``, ``data``) and
    given what the campaign's runs get (:func:`portbench.study.campaign.run_tables`: ``P``, ``sim``, ``workers``)."""
    ea = windows_mod.select_entries(manifest, [a], windows_per_source)   # the campaign's windows
    eb = windows_mod.select_entries(manifest, [b], windows_per_source)
    m = min(len(ea), len(eb))
    if m < 2:
        raise DataError(windows_mod.manifest_path(data.paths), f"attribution of {a} vs {b} needs two windows of each, "
                        f"found {len(ea)} and {len(eb)}")
    ea = [ea[i] for i in spaced(len(ea), min(n, m))]
    eb = [eb[i] for i in spaced(len(eb), min(n, m))]
    if tables is None:
        tables = windows_mod.load_windows(data, [a, b], manifest=manifest)
    # the tables the campaign's runs get: frozen predictions attached, the tenant model applied
    given = run_tables(data, P, sim, {e["id"]: tables[e["id"]] for e in ea + eb}, list(scheduler_names(sim.schedulers)),
                       manifest=manifest, workers=workers)
    return PairWindows(a, b, ea, eb, given)


def window_part(design: Design, mask: int) -> tuple[str, ...]:
    """The window properties swapped by the subset ``mask`` (``load`` left out: the identity)."""
    return tuple(p for p in design.swap(mask) if p in hybrids.WINDOW_PROPERTIES)


def window_parts(design: Design) -> list[tuple[str, ...]]:
    """The distinct window-property swaps of the design's subsets (each one simulated), ``()`` first."""
    out: list[tuple[str, ...]] = []
    for mask in design.masks:
        part = window_part(design, mask)
        if part not in out:
            out.append(part)
    return out


def _part_code(part: Sequence[str]) -> str:
    return "+".join(part) or "none"


def build_hybrids(design: Design, pw: PairWindows) -> tuple[dict, list[dict]]:
    """Every window-hybrid of the pair: ``{(part, i): df}`` and their records (ids ``<A window>~<B window>:<part>``)."""
    tables, records = {}, []
    full = window_part(design, design.full)
    for part in window_parts(design):
        for i, (ea, eb) in enumerate(zip(pw.a_entries, pw.b_entries)):
            df = hybrids.hybrid_window(pw.tables[ea["id"]], pw.tables[eb["id"]], part, a_id=ea["id"], b_id=eb["id"])
            tables[(part, i)] = df
            rec = hybrids.hybrid_record(ea, eb, part, df, seed=design.seed,
                                        hybrid_id=f"{ea['id']}~{eb['id']}:{_part_code(part)}")
            rec["is_a"], rec["is_b"] = part == (), part == full
            records.append(rec)
    return tables, records


def freeze_hybrids(path: Path, records: list[dict], frozen: Mapping[str, str] | None,
                   frozen_file: Path | str = "hybrids.json", refreeze: bool = False) -> dict:
    """Verify ``records``: those in the committed ``frozen`` SHA-256s (``{id: sha256}``) against them
    (:func:`~portbench.data.hybrids.verify_frozen`), the others against the run's own file ``path`` (unless
    ``refreeze``); then write the union of both into ``path``. Returns ``{"committed": n, "run": m}``:
    how many were verified against the committed file, and how many only against this run's file."""
    run_frozen = {}
    if path.is_file():
        try:
            run_frozen = {r["id"]: r for r in json.loads(path.read_text())["hybrids"]}
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DataError(path, f"not a hybrid definitions file ({e}); delete it or refreeze") from None
    n_committed = 0
    if not refreeze:
        if frozen:
            n_committed = hybrids.verify_frozen(records, frozen, str(frozen_file))
        hybrids.verify_records([r for r in records if not frozen or r["id"] not in frozen], run_frozen, str(path))
    merged = {} if refreeze else dict(run_frozen)
    merged.update({r["id"]: r for r in records})
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_text(path, json.dumps({"construction": hybrids.CONSTRUCTION, "properties": hybrids.DESCRIPTIONS,
                                        "hybrids": [merged[k] for k in sorted(merged)]}, indent=1, sort_keys=True))
    return {"committed": n_committed, "run": len(records) - n_committed}


def repeated(df: pl.DataFrame, n_min: int) -> pl.DataFrame:
    """``df`` (a window with its extra columns) repeated until it has at least ``n_min`` requests: copy ``k``
    starts one mean gap after copy ``k - 1`` ends, so the arrival pattern and the request mix (and hence the
    capacity) are the window's."""
    reps = -(-int(n_min) // df.height)
    if reps <= 1:
        return df
    arr = df["arrival_s"].to_numpy()
    span = float(arr[-1] - arr[0])
    step = span + span / max(1, df.height - 1)
    return pl.concat([df.with_columns(pl.Series("arrival_s", arr - arr[0] + k * step, dtype=pl.Float64))
                      for k in range(reps)], how="vertical")


# --------------------------------------------------------------------------- execution

_WORKER_ENGINE: Engine | None = None


def _init_worker(ctx: WorkerContext) -> None:
    """Pool initializer: the campaign's plug-ins and scheduler modules (``load_worker_code``), then the engine."""
    global _WORKER_ENGINE
    os.environ.setdefault("MPLBACKEND", "Agg")
    procs.die_with_parent()
    load_worker_code(ctx)
    _WORKER_ENGINE = ctx.engine


def _simulate(engine: Engine, sim: SimulationConfig, df: pl.DataFrame, ref: WindowRef, loads: Mapping[str, float],
              capacity: float | None, schedulers: tuple, replicates: tuple, profile: str, metrics: list) -> dict:
    """Capacity (unless given) and every scheduler x replicate run of one hybrid window in each region of
    ``loads`` (``{region: rho}``), through :func:`~portbench.study.campaign.compute_shard`."""
    t0, c0 = time.perf_counter(), time.process_time()
    ctx = WorkerContext(engine=engine, sim=sim, windows={ref.id: df}, refs={ref.id: ref})
    cap = compute_capacity(ctx, ref.id)[1] if capacity is None else float(capacity)
    frames = []
    for region, rho in loads.items():
        shard = ShardSpec(window=ref, region=region, rho=float(rho), schedulers=tuple(schedulers),
                          replicates=tuple(replicates), record_replicates=(), key="", name=f"{ref.id}__{region}",
                          fingerprint="")
        # a hybrid is not a run of source A: no source / provenance columns (the pair's columns replace them)
        frames.append(compute_shard(ctx, shard, cap, profile, metrics)["runs"].drop("source", "provenance"))
    return {"capacity": cap, "runs": pl.concat(frames), "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0}


def _pool_simulate(key, *args):
    return key, _simulate(_WORKER_ENGINE, *args)


class _Runner:
    """Runs tasks in this process (workers = 1) or a spawn-context process pool (as the campaign does)."""

    def __init__(self, engine: Engine, sim: SimulationConfig, workers: int, plugins: Sequence = ()):
        self.engine, self.sim, self.workers = engine, sim, workers
        self.modules = engine.worker_modules(sim)
        self.pool = None
        if workers > 1 and "__main__" not in self.modules:
            ctx = WorkerContext(engine=engine, sim=sim, windows={}, modules=list(self.modules), plugins=list(plugins))
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                            initializer=_init_worker, initargs=(ctx,))

    def map(self, tasks: dict, desc: str, progress: bool):
        """``{key: args}`` -> yields ``(key, result)`` as tasks finish."""
        bar = progress_bar(len(tasks), desc, "task", disable=not progress or not tasks)
        try:
            if self.pool is None:
                for key, args in tasks.items():
                    yield key, _simulate(self.engine, self.sim, *args)
                    bar.update(1)
            else:
                futures = [self.pool.submit(_pool_simulate, key, self.sim, *args) for key, args in tasks.items()]
                try:
                    for f in as_completed(futures):
                        yield f.result()
                        bar.update(1)
                finally:
                    for f in futures:
                        f.cancel()
        finally:
            bar.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------- the runs of a pair

@dataclass
class AttributionRuns:
    """What :func:`run` produced: every run (one table), the hybrids' definitions, the design and the cost."""

    runs: pl.DataFrame
    hybrids: pl.DataFrame
    design: Design
    windows: dict                 # pair -> [(A window id, B window id)]
    load: pl.DataFrame            # pair x region x subset: finite-window utilisation; A's and B's steady-state one
    cost: dict = field(default_factory=dict)
    frozen: dict = field(default_factory=dict)     # file, committed / run: hybrids verified against it / only
                                                   # against the run's records; written: SHA-256s (re)frozen into it


def _fingerprint_common(sim: SimulationConfig, plugins: Sequence[str], engine: Engine) -> dict:
    """Everything common to every run that changes results: the campaign's own definition
    (:func:`portbench.study.campaign.plan_common`, as ``make_plan(...).common``), plus the scheduler list with
    options. A scheduler that is not registered fails here."""
    scheduler_names(sim.schedulers)
    common = plan_common(sim, plugins, engine)
    scheds = list(sim.schedulers) if sim.schedulers != "all" else "all"
    return {"format": FORMAT_VERSION, "campaign": common, "schedulers": scheds,
            "scheduler_options": {k: scheduler_options(sim, k) for k in sorted(set(sim.scheduler_options))}}


def _unit_path(results_dir: Path, a: str, b: str, region: str, key: str) -> Path:
    return attribution_dir(results_dir) / "runs" / f"{a}__{b}__{region}__{key}.parquet"


def _label_rows(df: pl.DataFrame, *, a: str, pa: str, b: str, pb: str, mask: int, code: str, window_b: dict,
                sha: dict, rho_region: dict) -> pl.DataFrame:
    """Run rows from ``compute_shard`` re-labelled: the hybrid is not a run of source A (no ``source`` /
    ``provenance`` columns: ``source_a``/``source_b`` with their provenance instead)."""
    return df.with_columns(
        pl.lit(pair_key(a, b)).alias("pair"), pl.lit(a).alias("source_a"), pl.lit(pa).alias("provenance_a"),
        pl.lit(b).alias("source_b"), pl.lit(pb).alias("provenance_b"), pl.lit(mask, dtype=pl.Int64).alias("mask"),
        pl.lit(code).alias("hybrid"),
        pl.col("window_id").replace_strict(window_b, return_dtype=pl.String).alias("window_b"),
        pl.col("window_id").replace_strict(sha, return_dtype=pl.String).alias("hybrid_sha256"),
        pl.col("region").replace_strict(rho_region, return_dtype=pl.Float64).alias("rho_region"),
    )


LOAD_SCHEMA = {"pair": pl.String, "source_a": pl.String, "provenance_a": pl.String, "source_b": pl.String,
               "provenance_b": pl.String, "mask": pl.Int64, "hybrid": pl.String, "region": pl.String,
               "rho_region": pl.Float64, "utilisation_window": pl.Float64, "utilisation_steady": pl.Float64}


def run(cfg: Config, *, manifest: Mapping, engine: Engine | None = None, refreeze: bool = False,
        progress: bool = True, verbose: bool = True, tables: Mapping | None = None,
        workers: int | None = None) -> AttributionRuns:
    """Build, verify (or freeze) and simulate every hybrid of every pair of ``cfg.attribution`` (cached runs
    reused), and the load check.

    ``manifest``: the window manifest the caller's stage loaded (``windows.load_manifest``); ``engine``
    replaces the campaign's :class:`SimEngine`; ``tables`` ({window id: table}) replace its verified windows
    (tests); ``workers`` overrides
    ``campaign.workers``. The committed hybrid SHA-256s are read from (and, when there are none yet or with
    ``refreeze``, written to) :func:`portbench.data.hybrids.frozen_path` of ``paths.manifest``."""
    t0 = time.perf_counter()
    engine = engine or SimEngine()
    design = make_design(cfg.attribution, cfg.simulation, cfg.analysis, manifest)
    sim = cfg.simulation
    prov = windows_mod.provenance(manifest)
    profile, metrics = engine.profile_name(sim), list(engine.metric_names(sim))
    common = _fingerprint_common(cfg.simulation, cfg.plugins, engine)
    out_dir = cfg.paths.results_dir
    frozen_file = hybrids.frozen_path(windows_mod.manifest_path(cfg.paths))
    frozen = None if refreeze else hybrids.read_frozen(frozen_file)
    all_shas: dict[str, str] = {}
    # committed: verified against frozen_file; run: only against this run's records; written: SHA-256s written
    verified = {"file": str(frozen_file), "committed": 0, "run": 0, "written": 0}
    runner = _Runner(engine, sim, int(workers or cfg.campaign.workers), plugin_loader.specs(cfg.plugins))
    frames, recs, loads, win_pairs = [], [], [], {}
    stats_ = {"n_sim": 0, "tasks": 0, "sim_wall": 0.0, "map_wall": 0.0, "sim_cpu": 0.0, "check_runs": 0,
              "check_wall": 0.0, "check_cpu": 0.0}

    def simulate_units(units: dict, pw: PairWindows, htab: dict, hbs: dict, a: str, b: str, caps: dict | None,
                       what: str, *, kind: str = "", repeat: int = 1, schedulers=None, replicates=None) -> dict:
        """``{(shas, region, rho): None}`` -> the runs of every window of each unit (cached files reused).
        A unit is content-addressed (the hybrids' SHA-256 per window, region, rho), so identical hybrids
        (a swap that changes nothing) share their runs: same tables, same seeds. ``repeat``: the load check
        (each window repeated to ``repeat`` requests, ``schedulers``/``replicates`` of the check)."""
        scheds = tuple(schedulers or design.schedulers)
        reps = tuple(replicates if replicates is not None else design.replicates)
        out, paths, tasks = {}, {}, dict[tuple, list]()
        for (shas, region, rho) in units:
            key = sha256_hex({"common": common, "hybrids": list(shas), "region": region, "rho": rho,
                              "replicates": list(reps), "schedulers": list(scheds), "repeat": repeat})[:16]
            p = paths[(shas, region, rho)] = _unit_path(out_dir, a, b, f"{kind}{region}", key)
            if p.is_file():
                out[(shas, region, rho)] = pl.read_parquet(p)
                continue
            for e, h in zip(pw.a_entries, shas):
                df = htab[h] if repeat <= 1 else repeated(htab[h], repeat)
                t = tasks.setdefault((e["id"], h), [df, WindowRef(e["id"], a, "hybrid", h, hbs.get(h)), {},
                                                    None if caps is None else caps[(e["id"], h)],
                                                    scheds, reps, profile, metrics])
                t[2][region] = rho
        got = {}
        t1 = time.perf_counter()
        check = repeat > 1          # the load check is counted apart from the design's runs
        for key, res in runner.map({k: tuple(v) for k, v in tasks.items()}, what, progress):
            got[key] = res["runs"]
            stats_["check_cpu" if check else "sim_cpu"] += res["cpu_s"]
            if check:
                stats_["check_runs"] += res["runs"].height
            else:
                stats_["sim_wall"] += res["wall_s"]
                stats_["n_sim"] += res["runs"].height
        stats_["check_wall" if check else "map_wall"] += time.perf_counter() - t1
        stats_["tasks"] += len(tasks)
        for u, p in paths.items():
            if u in out:
                continue
            shas, region, rho = u
            df = pl.concat([got[(e["id"], h)].filter(pl.col("region") == region)
                            for e, h in zip(pw.a_entries, shas)]).sort(["window_id", "scheduler", "replicate"])
            write_parquet_atomic(df, p, {"kind": f"attribution-runs{kind and ' ' + kind}", "pair": pair_key(a, b),
                                         "region": region, "rho": rho, "hybrids": list(shas)})
            out[u] = df
        return out

    try:
        for a, b in design.pairs:
            pw = pair_windows(cfg.data, cfg.predictors, cfg.simulation, cfg.campaign.windows_per_source, manifest, a, b,
                              design.windows, tables, workers=cfg.campaign.workers)
            win_pairs[pair_key(a, b)] = [(ea["id"], eb["id"]) for ea, eb in zip(pw.a_entries, pw.b_entries)]
            htables, records = build_hybrids(design, pw)
            got = freeze_hybrids(hybrids_path(out_dir, a, b), records, frozen, frozen_file, refreeze)
            verified["committed"] += got["committed"]
            verified["run"] += got["run"]
            all_shas.update({r["id"]: r["sha256"] for r in records})
            for r in records:
                recs.append({"pair": pair_key(a, b), "source_a": a, "provenance_a": prov[a], "source_b": b,
                             "provenance_b": prov[b], "hybrid_id": r["id"], "window_id": r["a"]["id"],
                             "window_b": r["b"]["id"], "swap": _part_code(r["window_swap"]), "sha256": r["sha256"],
                             "n_requests": r["n_requests"], **{k: r["stats"].get(k) for k in r["stats"]}})
            parts = window_parts(design)
            # units are keyed by the hybrids' whole content (window + the predictions they carry); runs are
            # labelled with the hybrids' definitions (window columns: the frozen records' SHA-256)
            shas = {part: tuple(hybrids.window_sha256(htables[(part, i)]) for i in range(len(pw))) for part in parts}
            dshas = {part: tuple(hybrids.definition_sha256(htables[(part, i)]) for i in range(len(pw)))
                     for part in parts}
            htab = {h: htables[(part, i)] for part in parts for i, h in enumerate(shas[part])}
            # tokens per prompt-hash block of each hybrid: its prompts' source's (hashes travel with prompts)
            hbs = {h: windows_mod.hash_block_size(manifest, (pw.b_entries if "prompt" in part else pw.a_entries)[i])
                   for part in parts for i, h in enumerate(shas[part])
                   if hybrids.HASH_COLUMN in htables[(part, i)].columns}
            wb = {ea["id"]: eb["id"] for ea, eb in zip(pw.a_entries, pw.b_entries)}
            label: dict[str, Any] = dict(a=a, pa=prov[a], b=b, pb=prov[b], window_b=wb)

            # every window-hybrid at the regions' rho (the load swap is the identity: see the module docstring)
            units = simulate_units({(shas[p], r, rho): None for p in parts for r, rho in design.regions.items()},
                                   pw, htab, hbs, a, b, None, f"attribution {a} vs {b}")
            for mask in design.masks:
                part = window_part(design, mask)
                df = pl.concat([units[(shas[part], r, rho)] for r, rho in design.regions.items()])
                frames.append(_label_rows(df, mask=mask, code=design.code(mask),
                                          sha={e["id"]: h for e, h in zip(pw.a_entries, dshas[part])},
                                          rho_region=dict(design.regions), **label))

            # the load check: A and B (the full window swap) in steady state, under the reference policy
            ref_pol = sim.capacity_policy
            full_part = window_part(design, design.full)
            caps = {}
            for (sh, _, _), df in units.items():
                for e, h in zip(pw.a_entries, sh):
                    caps[(e["id"], h)] = float(df.filter(pl.col("window_id") == e["id"])["capacity_rps"][0])
            steady = simulate_units({(shas[p], r, rho): None for p in ((), full_part) for r, rho in design.regions.items()},
                                    pw, htab, hbs, a, b, caps, f"attribution {a} vs {b}: load check", kind="steady__",
                                    repeat=STEADY_REQUESTS, schedulers=(ref_pol,), replicates=(0,))
            for part in parts:
                for r, rho in design.regions.items():
                    ref = units[(shas[part], r, rho)].filter(pl.col("scheduler") == ref_pol)
                    st = steady.get((shas[part], r, rho))
                    mask = min(m for m in design.masks if window_part(design, m) == part)
                    loads.append({"pair": pair_key(a, b), "source_a": a, "provenance_a": prov[a], "source_b": b,
                                  "provenance_b": prov[b], "mask": mask, "hybrid": design.code(mask), "region": r,
                                  "rho_region": rho, "utilisation_window": _mean_util(ref),
                                  "utilisation_steady": _mean_util(st) if st is not None else None})
    finally:
        runner.close()
    if refreeze or frozen is None:        # an explicit refreeze, or the first freeze (no committed file yet)
        hybrids.write_frozen(frozen_file, all_shas)
        verified.update(written=len(all_shas), run=0)
        if verbose:
            print(f"attribution: {'re' if refreeze else ''}froze the SHA-256 of {len(all_shas)} hybrids in {frozen_file}",
                  flush=True)
    elif verbose and verified["run"]:
        print(f"attribution: {verified['committed']} hybrids verified against {frozen_file}; {verified['run']} are "
              "not in it (another design than the committed one) and were verified against this run's own records",
              flush=True)
    runs = pl.concat(frames, how="vertical").sort(["pair", "mask", "window_id", "region", "scheduler", "replicate"])
    cols = list(PAIR_COLUMNS) + [c for c in runs.columns if c not in PAIR_COLUMNS]
    runs = runs.select(cols)     # "utilisation": the campaign's per-run column (achieved_utilisation)
    write_parquet_atomic(runs, attribution_dir(out_dir) / "runs.parquet", {"kind": "attribution-runs"})
    wall = time.perf_counter() - t0
    n_sim, sim_wall, sim_cpu, map_wall = stats_["n_sim"], stats_["sim_wall"], stats_["sim_cpu"], stats_["map_wall"]
    cost = {"runs": runs.height, "simulated_runs": n_sim, "tasks_computed": stats_["tasks"],
            "wall_s": wall, "simulation_wall_s": map_wall, "worker_wall_s": sim_wall, "simulation_cpu_s": sim_cpu,
            "workers": runner.workers, "runs_per_wall_s": (n_sim / map_wall) if map_wall > 0 else None,
            "runs_per_cpu_s": (n_sim / sim_cpu) if sim_cpu > 0 else None,
            "cpu_share": (sim_cpu / sim_wall) if sim_wall > 0 else None, "load_check_runs": stats_["check_runs"],
            "load_check_wall_s": stats_["check_wall"], "load_check_cpu_s": stats_["check_cpu"], "reused": False}
    cost_file = attribution_dir(out_dir) / "cost.json"
    if n_sim:
        fileio.write_json(cost_file, cost)
    elif cost_file.is_file():          # everything reused: report the run that computed it
        cost = {**json.loads(cost_file.read_text()), "runs": runs.height, "reused": True}
    cost["plan"] = cost_plan(cfg.campaign, cfg.simulation, design, manifest)
    if verbose:
        print(f"attribution: {runs.height} runs ({n_sim} simulated now, the rest reused) of {len(design.pairs)} "
              f"pair(s) x {2 ** design.k} subsets in {wall:.1f} s", flush=True)
    load_df = pl.DataFrame(loads, schema=LOAD_SCHEMA)
    return AttributionRuns(runs=runs, hybrids=pl.DataFrame(recs), design=design, windows=win_pairs, load=load_df,
                           cost=cost, frozen=verified)


def _mean_util(runs: pl.DataFrame | None) -> float | None:
    """Mean achieved utilisation of ``runs`` (None when there are none or none is defined)."""
    if runs is None or runs.height == 0:
        return None
    u = achieved_utilisation(runs).drop_nans().drop_nulls()
    return float(u.mean()) if u.len() else None
