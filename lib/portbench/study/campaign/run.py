"""Running (or resuming) a campaign, and reading its results back."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ...core import io, outputs
from ...core import plugins as plugin_loader
from ...core.config import CampaignConfig, Config, DataSettings, PathsConfig, PredictorsConfig, SimulationConfig
from ...core.errors import DataError, check_choice
from ...core.io import read_meta, write_parquet_atomic
from ...core.progress import bar as progress_bar
from ...data import trace_checks
from ...data import windows as windows_mod
from ...sim import information
from ...sim import schedulers as scheduler_registry
from ...sim import settings as sim_settings
from ...sim.engine import compiled as compiled_core
from ...sim.engine.simulate import warm_compiled
from ...sim.metrics import NO_TENANT
from ...sim.metrics import warm_compiled as warm_metrics
from .engines import Engine, SimEngine
from .imported import run_classes
from .executors import (
    COUNTER_COLUMNS,
    EXECUTORS,
    KEY_COLUMNS,
    LOAD_COLUMNS,
    RUN_COLUMNS,
    SORT_COLUMNS,
    RunFailed,
    WorkerContext,
    _Executor,
    compute_shard,
    load_worker_code,
)
from .files import (
    _clean_stale_tmp,
    capacity_path,
    records_path,
    runs_path,
    shard_done,
    shard_path,
)
from .plan import Plan, make_plan, needs_predictions


@dataclass
class CampaignResult:
    """What :func:`run` did."""

    plan: Plan
    runs: Any                    # the consolidated runs DataFrame
    computed_shards: int
    reused_shards: int
    computed_capacities: int
    wall_s: float
    shard_wall_s: list = field(default_factory=list)
    executor: str = "process"
    workers: int = 1

    def summary(self) -> str:
        n_runs = self.runs.height if self.runs is not None else 0
        return (f"campaign {self.plan.hash}: {n_runs} runs in {len(self.plan.shards)} shards "
                f"({self.computed_shards} computed, {self.reused_shards} reused), "
                f"{self.computed_capacities} capacities measured, "
                f"{self.wall_s:.1f} s wall on {self.workers} {self.executor} worker(s)")


def load_capacities(paths: PathsConfig, plan: Plan) -> dict[str, dict]:
    """``{window_id: capacity record}`` (``capacity_rps``, how it was measured, the
    earlier burst definition ``burst_rps``) of the plan's windows found in the capacity cache (``paths.results_dir``)."""
    out = {}
    for wid, key in plan.capacity_keys.items():
        p = capacity_path(paths.results_dir, wid, key)
        if p.is_file():
            rec = json.loads(p.read_text())
            out[wid] = rec if isinstance(rec, dict) else {"capacity_rps": float(rec)}
    return out


REFUSAL_WARN_FRACTION = 0.01


def refusal_warnings(runs, threshold: float = REFUSAL_WARN_FRACTION, max_model_len: int | None = None) -> list[str]:
    """One warning line per source whose refused requests (prompt >= max_model_len) exceed
    ``threshold`` of its arrived requests (over all its runs)."""
    if runs is None or runs.height == 0 or "refused" not in runs.columns:
        return []
    agg = runs.group_by("source").agg(pl.col("refused").sum(), pl.col("arrived").sum()).sort("source")
    out = []
    for r in agg.iter_rows(named=True):
        frac = r["refused"] / r["arrived"] if r["arrived"] else 0.0
        if frac > threshold:
            lim = f"{max_model_len:,} tokens" if max_model_len else "max_model_len tokens"
            out.append(f"WARNING: source {r['source']}: {frac:.1%} of its requests are refused because their prompt "
                       f"has {lim} (the model's context) or more; they are left out of every metric "
                       f"({r['refused']:,} of {r['arrived']:,} arrivals over all runs)")
    return out


def run(cfg: Config, *, engine: Engine | None = None, executor: str | None = None,
                 workers: int | None = None, windows: Sequence[tuple] | None = None, progress: bool = True,
                 consolidate: bool = True, verbose: bool = True) -> CampaignResult:
    """Run (or resume) the campaign of ``cfg``; returns what was done and the consolidated runs table.

    ``engine``, ``executor`` and ``workers`` override the engine / ``campaign.executor`` /
    ``campaign.workers``; ``windows`` (``[(WindowRef, window_df)]``) replaces the manifest's windows.
    """
    t0 = time.perf_counter()
    engine = engine or SimEngine()
    # a terminal gets a live bar; a notebook or a log gets an update every 15 s (not hundreds of lines)
    executor = executor or cfg.campaign.executor
    workers = int(workers or cfg.campaign.workers)
    check_choice("campaign.executor", executor, EXECUTORS)
    # the manifest, loaded once for the stage (the plan, the window tables, their predictions)
    manifest = windows_mod.load_manifest(cfg.paths) if windows is None else None
    plan = make_plan(cfg.plan_settings, engine=engine, windows=windows, manifest=manifest)
    out = Path(cfg.paths.results_dir)
    for sub in ("runs", "requests", "capacity"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        _clean_stale_tmp(out / sub)
    todo = [sh for sh in plan.shards if not shard_done(out, sh)]
    caps = load_capacities(cfg.paths, plan)
    need_cap = sorted({sh.window.id for sh in todo} - set(caps))
    shard_walls: list[float] = []
    written: dict[str, pl.DataFrame] = {}      # shard name -> the runs table just written (not read back)
    if todo:
        needed = sorted({sh.window.id for sh in todo})
        if windows is not None:
            loaded = {ref.id: df for ref, df in windows if ref.id in needed}
        else:
            loaded = _load_window_tables(cfg.data, cfg.predictors, cfg.simulation, cfg.campaign, plan, needed, manifest)
        ctx = WorkerContext(engine=engine, sim=cfg.simulation, windows=loaded,
                            modules=engine.worker_modules(cfg.simulation),
                            plugins=plugin_loader.specs(cfg.plugins), refs={w.id: w for w in plan.windows},
                            time_limit=cfg.campaign.limit)
        if (executor == "dask" or workers > 1) and isinstance(engine, SimEngine) \
                and cfg.simulation.engine.core != "reference" and compiled_core.unsupported_here() is None:
            warm_compiled()    # compiled (or loaded from the disk cache) once, before the workers start
            warm_metrics()
        ex = _Executor(executor, workers, ctx, cfg.campaign.dask_address)
        try:
            if need_cap:
                bar = progress_bar(len(need_cap), "capacity", "window", disable=not progress)
                for wid, cap, wall in ex.map_unordered("capacity", [(w,) for w in need_cap]):
                    rec = {"window_id": wid, "engine": plan.common["engine"], **cap, "profile": plan.profile,
                           "capacity_policy": plan.common["capacity_policy"], "key": plan.capacity_keys[wid],
                           "wall_s": wall}
                    io.write_bytes(capacity_path(out, wid, plan.capacity_keys[wid]),
                                   json.dumps(rec, indent=1, default=float).encode())
                    caps[wid] = rec
                    bar.update(1)
                bar.close()
            check_plugins(ctx, todo, caps, plan)
            bar = progress_bar(len(plan.shards), "campaign", "shard", disable=not progress,
                               initial=len(plan.shards) - len(todo))
            by_name = {sh.name: sh for sh in todo}
            args = [(sh, caps[sh.window.id], plan.profile, plan.metrics) for sh in todo]
            for res in ex.map_unordered("shard", args):
                sh = by_name[res["shard"]]
                rp = records_path(out, sh)
                if rp is not None:
                    if res["records"] is None:
                        raise RunFailed(f"shard {sh.name}: records were requested but the engine returned none")
                    write_parquet_atomic(res["records"], rp, {"shard": sh.name, "kind": "requests"})
                # the runs file is written last: it marks the shard finished
                write_parquet_atomic(res["runs"], shard_path(out, sh),
                                     {"shard": sh.name, "kind": "runs", "fingerprint": json.loads(sh.fingerprint)})
                written[sh.name] = res["runs"]
                shard_walls.append(res["wall_s"])
                bar.update(1)
            bar.close()
        finally:
            ex.close()
    runs = consolidate_runs(cfg.paths, plan, written) if consolidate else None
    result = CampaignResult(plan=plan, runs=runs, computed_shards=len(todo),
                            reused_shards=len(plan.shards) - len(todo), computed_capacities=len(need_cap),
                            wall_s=time.perf_counter() - t0, shard_wall_s=shard_walls, executor=executor,
                            workers=workers)
    io.write_bytes(out / "campaign.json", json.dumps({
        "plan": plan.hash, "n_runs": plan.n_runs, "n_shards": len(plan.shards),
        "computed_shards": result.computed_shards, "reused_shards": result.reused_shards,
        "computed_capacities": result.computed_capacities, "wall_s": result.wall_s,
        "executor": executor, "workers": workers, "profile": plan.profile, "engine": plan.common["engine"],

        "schedulers": plan.schedulers, "regions": plan.regions, "replicates": plan.replicates,
        "windows": len(plan.windows), "metrics": plan.metrics}, indent=1).encode())
    if verbose:
        print(result.summary(), flush=True)
    if cfg.simulation.vllm_schedulers and windows is None and type(engine) is SimEngine:
        run_classes(cfg)          # the imported vLLM classes: on the virtual vLLM engine, in .venv-vllm
    if runs is not None:
        mml = getattr(engine.profile(cfg.simulation), "max_model_len", None) if hasattr(engine, "profile") else None
        for line in refusal_warnings(runs, max_model_len=mml):
            print(line, file=sys.stderr, flush=True)
    return result


def check_shards(shards: Sequence, n_windows: int = 3) -> list:
    """The shards a plug-in is checked on before the campaign: the lightest and the heaviest region (by rho) of
    ``n_windows`` windows spread over the sources (at least two sources when there are two: one window per source in
    turn, each source's windows taken from its middle outwards), so that a defect that shows only under load, on one
    source or on some windows is met."""
    if not shards:
        return []
    rhos = sorted({sh.rho for sh in shards})
    ends = {rhos[0], rhos[-1]}
    by_source: dict[str, list[str]] = {}
    for sh in shards:
        ids = by_source.setdefault(sh.window.source, [])
        if sh.window.id not in ids:
            ids.append(sh.window.id)
    for s, ids in by_source.items():   # middle outwards: not only each trace's first minutes
        mid = len(ids) // 2
        by_source[s] = sorted(ids, key=lambda i: abs(ids.index(i) - mid))
    chosen: list[str] = []
    while len(chosen) < n_windows and any(by_source.values()):
        for ids in by_source.values():      # one window per source in turn: two sources or more when there are
            if ids and len(chosen) < n_windows:
                chosen.append(ids.pop(0))
    return [sh for sh in shards if sh.window.id in chosen and sh.rho in ends]


def check_plugins(ctx: WorkerContext, shards: Sequence, caps: Mapping, plan: Plan) -> None:
    """The plug-in contract, checked before the campaign on every plug-in scheduler of the plan (in this process, on
    :func:`check_shards` of the shards to compute: the lightest and heaviest region of at least three windows of at
    least two sources); RunFailed naming the policy, the cause and the rule when it fails, the causes in this order:

    * a run that ends: each run has the time limit of :func:`~.executors.plugin_limit` (a plug-in that hangs);
    * randomness only from the run's generator: two runs with the same seed give the same results (a policy
      drawing from ``random``, ``numpy.random``'s global state or the clock does not, so its seeds, replicates
      and cached results would mean nothing) -- checked on every chosen shard before the information is, so that
      randomness is never named as reading the output; the campaign then compares a random-free plug-in's
      replicates on every shard (:func:`~.executors.compute_shard`);
    * the information it declares: unless it declares ``oracle``, its decisions do not change when only the true
      output lengths are permuted (:func:`portbench.sim.information.reads_true_output`)."""
    plug = [s for s in plan.schedulers if sim_settings.is_plugin(s)]
    chosen = check_shards(shards)
    if not plug or not chosen:
        return
    load_worker_code(ctx, "the main process")
    for name in plug:
        for shard in chosen:
            one = dataclasses.replace(shard, schedulers=(name,), replicates=tuple(shard.replicates[:1]),
                                      record_replicates=())
            cap = caps[shard.window.id]
            a, b = (compute_shard(ctx, one, cap, plan.profile, plan.metrics)["runs"] for _ in range(2))
            if not a.equals(b):
                diff = [c for c in a.columns if not a[c].equals(b[c])]
                raise RunFailed(f"scheduler {name!r} (a plug-in): two runs of window {shard.window.id}, region "
                                f"{shard.region} with the same seed gave different results ({', '.join(diff[:4])}): it "
                                "draws randomness outside the run's generator (random, numpy.random's global state, "
                                "the clock ...). Draw every random number from the generator the engine passes (ctx.rng "
                                "in reset(ctx)), so that a run is reproducible from its seed")
        declared = scheduler_registry.uses(name)
        prof = ctx.engine.profile(ctx.sim) if hasattr(ctx.engine, "profile") else None
        shard = chosen[0]
        if "oracle" not in declared and prof is not None and \
                information.reads_true_output(name, ctx.windows[shard.window.id], ctx.sim, prof):
            raise RunFailed(f"scheduler {name!r} (a plug-in) declares information {', '.join(declared)}, but its "
                            f"decisions on window {shard.window.id} change when only the requests' true output "
                            "lengths are permuted: it reads the true output length (r.output_tokens or "
                            "ctx.output_tokens). Declare information = \"oracle\" (and name it *_oracle), or decide "
                            "from what it declares (the prompt, predictions: r.predicted_output)")


def _load_window_tables(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, campaign: CampaignConfig,
                        plan: Plan, needed: Sequence[str], manifest: windows_mod.Manifest) -> dict:
    tables = windows_mod.load_windows(data, sorted({w.source for w in plan.windows}),
                                      per_source=campaign.windows_per_source, manifest=manifest)
    missing = [w for w in needed if w not in tables]
    if missing:
        raise DataError(windows_mod.manifest_path(data.paths), f"windows {missing[:3]} of the plan could not be loaded")
    by_id = {w.id: w for w in plan.windows}
    verified = {e["id"]: e["sha256"] for e in manifest["windows"]}
    for wid in needed:  # load_windows verified each table against the manifest's sha256; the plan must agree with it
        got = verified.get(wid)
        if got != by_id[wid].sha256:
            raise DataError(windows_mod.manifest_path(data.paths), f"window {wid}: sha256 {got} but the plan has "
                            f"{by_id[wid].sha256}")
    return run_tables(data, P, sim, {wid: tables[wid] for wid in needed}, plan.schedulers, manifest=manifest,
                      workers=campaign.workers)


def reuse_capacities(source: Config, target: Config) -> int:
    """Copy the capacity records measured by campaign ``source`` into campaign ``target``'s results folder
    (those not there yet). Capacity is measured on the reference engine for a window's content, so a
    sub-campaign or a variant on the same windows reads the same records; a record is only used when its key
    (window SHA-256, model, capacity policy, reference engine) matches. Returns the number copied."""
    src, dst = Path(source.paths.results_dir) / "capacity", Path(target.paths.results_dir) / "capacity"
    if not src.is_dir() or src.resolve() == dst.resolve():
        return 0
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in src.glob("*.json"):
        if not (dst / f.name).is_file():
            outputs.copy(f, dst / f.name)
            n += 1
    return n


def run_tables(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, tables: dict,
               schedulers: Sequence[str], *, manifest: Mapping, train: str | None = None,
               workers: int = 1) -> dict:
    """The tables the runs are given: the verified frozen window tables plus, when a scheduler reads
    them, the window's frozen predictions (columns ``predicted_output``, ``ltr_score``; source
    ``train``'s predictor instead of the home one when given); on a source without tenants and
    ``simulation.tenant_model: trace`` every request gets the tenant ``NO_TENANT`` (tenant metrics
    n/a, vtc has one counter). With ``simulation.arrival_jitter`` the windows of a source whose arrivals are
    quantised get them spread within the grid (:func:`jitter_tables`). The frozen tables themselves are not changed.
    (``data``, ``P``, ``workers``: where the predictions are, the ``predictors`` section and the processes that may
    train them, :func:`portbench.data.predictors.attach`; ``sim``: the ``simulation`` section.)"""
    if needs_predictions(schedulers):
        from ...data import predictors   # lightgbm and scikit-learn: not imported by the campaign's workers

        tables = predictors.attach(data, P, tables, manifest=manifest, train=train, workers=workers)
    by_id = {e["id"]: e["source"] for e in manifest["windows"]}
    if sim.arrival_jitter:
        tables = jitter_tables(tables, by_id, sim.seed)
    out = {}
    for wid, df in tables.items():
        if windows_mod.tenant_label(manifest, by_id[wid], sim.tenant_model) == "none":
            df = df.with_columns(pl.lit(NO_TENANT).alias("tenant"))
        out[wid] = df
    return out


def jitter_tables(tables: dict, source_of: dict, seed: int) -> dict:
    """The window tables with quantised arrivals spread within their grid: per source, the windows' arrivals are
    checked together (:func:`portbench.data.trace_checks.windows_check`); a quantised source with a grid step gets
    :func:`~portbench.data.trace_checks.jitter_arrivals` per window, seeded by ``seed`` and the window id."""
    by_source: dict[str, list] = {}
    for wid in tables:
        by_source.setdefault(source_of[wid], []).append(wid)
    out = dict(tables)
    for _src, wids in by_source.items():
        chk = trace_checks.windows_check([tables[w]["arrival_s"].to_numpy() for w in wids])
        if not (chk["quantised"] and chk["grid_step_s"]):
            continue
        for w in wids:
            rng = trace_checks.seeded_rng(seed, w)
            out[w] = tables[w].with_columns(pl.Series("arrival_s", trace_checks.jitter_arrivals(
                tables[w]["arrival_s"].to_numpy(), chk["grid_step_s"], rng)))
    return out


def consolidate_runs(paths: PathsConfig, plan: Plan, written: Mapping[str, pl.DataFrame] | None = None):
    """Concatenate the plan's shards (sorted) into ``{results_dir}/runs.parquet``; returns the table.
    ``written``: ``{shard name: runs table}`` of shards this process has just written (:func:`run`), used as they
    are instead of being read back; every other shard is read from its file."""
    out = paths.results_dir
    written = written or {}
    missing = [sh for sh in plan.shards if sh.name not in written and not shard_path(out, sh).is_file()]
    if missing:
        raise DataError(Path(out) / "runs", f"{len(missing)} of {len(plan.shards)} shards of this parameter "
                        f"set are missing (first: {missing[0].name}); run `portbench simulate --params "
                        f"{paths.params_file}` (notebook 03)")
    frames = [written[sh.name] if sh.name in written else pl.read_parquet(shard_path(out, sh)) for sh in plan.shards]
    runs = pl.concat(frames, how="vertical") if frames else _empty_runs(plan.metrics)
    runs = runs.sort(SORT_COLUMNS)
    dup = runs.select(KEY_COLUMNS[2:4] + ("scheduler", "replicate")).is_duplicated().sum()
    if dup:
        raise DataError(Path(out) / "runs", f"{dup} duplicated run keys among the plan's shards")
    write_parquet_atomic(runs, runs_path(out), {"plan": plan.hash, "kind": "runs"})
    return runs


def _empty_runs(metric_names):
    schema = {c: pl.String for c in ("source", "provenance", "window_id", "region", "scheduler", "profile")}
    schema.update({"rho": pl.Float64, "replicate": pl.Int64, "seed": pl.Int64, "capacity_rps": pl.Float64,
                   "horizon_s": pl.Float64, **{c: pl.Int64 for c in COUNTER_COLUMNS.values()},
                   **{c: pl.Float64 for c in LOAD_COLUMNS},
                   **{m: pl.Float64 for m in metric_names}})
    return pl.DataFrame(schema=schema).select(list(RUN_COLUMNS) + list(metric_names))


def load_runs(paths: PathsConfig, plan: Plan):
    """The runs table of the campaign planned by ``plan`` (:func:`make_plan`) under ``paths.results_dir``:
    ``runs.parquet`` when it belongs to this plan, else consolidated from the shards; DataError naming the
    command to run when shards are missing."""
    path = runs_path(paths.results_dir)
    if path.is_file():
        meta = read_meta(path) or {}
        if meta.get("plan") == plan.hash:
            return pl.read_parquet(path)
    return consolidate_runs(paths, plan)


def load_requests(paths: PathsConfig, plan: Plan):
    """Per-request records of the ``campaign.request_records`` subset of ``plan`` (records columns + run keys)."""
    files = [records_path(paths.results_dir, sh) for sh in plan.shards if sh.record_replicates]
    missing = [p for p in files if not p.is_file()]
    if missing:
        raise DataError(missing[0], f"{len(missing)} request-record files of this parameter set are missing; "
                        "run the campaign (`portbench simulate`, notebook 03)")
    if not files:
        return pl.DataFrame()
    return pl.concat([pl.read_parquet(p) for p in files], how="vertical_relaxed").sort(
        ["source", "window_id", "rho", "region", "scheduler", "replicate", "req_id"])
