"""Real-engine validation: replay the key simulated reversal and a stable control through vLLM.

Entry points: :func:`validate` (the ``validation`` section's model config, called by ``params.load``),
:func:`plan` (what would run, and whether it can run here — never starts an engine) and
:func:`run` (``portbench validate`` / notebook 08: the replay when possible, a clear "skipped" report
otherwise; it never raises because vLLM or a GPU is missing).

Pipeline of :func:`run` (each step's module says more):

1. ``cases.select_cases`` on the analysis' reversal table -> the key reversal and the control.
2. ``replay.engine_status`` -> vLLM importable, version = the pinned one, CUDA present?
3. Calibration: a burst of ``validation.calibration_requests`` requests of the first case window,
   replayed under FCFS; ``profiles.fit_profile`` on its per-iteration timings -> the engine's cost
   model, from which each window's capacity on *this* engine is computed, so the replay runs at the
   case's operating region (rho) on this hardware, not on the simulated GPU's.
4. Replay: each of the first ``validation.max_windows`` windows of each case source, rescaled to
   the case's rho (``campaign.SimEngine.prepare``: the campaign's own rescaling and horizon), under
   each of the case's two schedulers (one engine per vLLM mode: fcfs / chunked / priority).
5. Metrics (``metrics.compute``), the final profile fitted to every iteration (saved as JSON that
   ``simulation.profile: <path>`` accepts), the re-simulation of the same windows with the same
   policies on that profile (``campaign.SimEngine.run``), and the verdicts (``verdict``).

Outputs under ``{results_dir}/validation/``: ``plan.json``, ``report.json``, ``engine_runs.parquet``,
``engine_requests.parquet``, ``iterations.parquet``, ``sim_runs.parquet``, ``sim_requests.parquet``,
``verdicts.parquet``, ``errors.parquet``, ``engine_profile.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import polars as pl

from ..core import io
from ..core.config import Config, SimulationConfig, ValidationConfig
from ..core.errors import ParameterError, PortbenchError
from ..data import windows
from ..sim import profiles, schedulers
from ..study import campaign
from ..study.campaign import run_seed
from . import cases, replay, verdict

def settings(v: ValidationConfig) -> dict:
    """The ``validation`` section as a plain dict."""
    return dataclasses.asdict(v)


def validate(v: ValidationConfig) -> None:
    """ParameterError unless ``validation.model_config`` names a shipped model config or a folder
    with a config.json (the other values are checked when the config is built)."""
    try:
        replay.model_dir(v.model_config)
    except PortbenchError:
        shipped = sorted(d.name for d in replay.MODEL_CONFIGS.iterdir() if (d / "config.json").is_file())
        raise ParameterError("validation.model_config", v.model_config,
                             "a folder under lib/portbench/validation/model_configs (" + ", ".join(shipped)
                             + ") or a path to a folder with config.json") from None


def out_dir(cfg: Config) -> Path:
    return Path(cfg.paths.results_dir) / "validation"


def reversals_path(cfg: Config) -> Path:
    return Path(cfg.paths.results_dir) / "analysis" / "reversals.parquet"


def base_profile(cfg: Config):
    return profiles.get_profile(cfg.simulation.profile)


def engine_spec(cfg: Config, status: replay.EngineStatus | None = None, profile=None) -> replay.EngineSpec:
    """The engine configuration of this run (mode is set per scheduler by ``replay.spec_for``)."""
    v = settings(cfg.validation)
    prof = profile if profile is not None else base_profile(cfg)
    kb = v["kv_blocks"]
    blocks = prof.kv_capacity_blocks if kb == "profile" else (None if kb == "engine" else int(kb))
    device = status.device if status is not None and status.device else ("cpu" if v["device"] == "cpu" else "cuda")
    spec = replay.EngineSpec(model=str(v["model_config"]), max_num_seqs=int(prof.max_num_seqs),
                             max_batched_tokens=int(prof.max_batched_tokens), num_gpu_blocks=blocks,
                             block_size=int(prof.block_size), dtype=str(v["dtype"]),
                             enforce_eager=bool(v["enforce_eager"]),
                             gpu_memory_utilization=float(v["gpu_memory_utilization"]), seed=int(v["seed"]))
    if device == "cpu":  # vLLM's CPU build: CPU attention needs blocks of 32k tokens; KV sized in bytes
        spec = dataclasses.replace(spec, block_size=None, num_gpu_blocks=None, kv_cache_memory_bytes=1 << 30,
                                   enforce_eager=True, dtype="float32" if v["dtype"] == "auto" else v["dtype"])
    return spec


@dataclasses.dataclass
class Plan:
    """What the validation would run, and whether it can run here."""

    status: replay.EngineStatus
    selection: cases.Selection | None
    windows: dict[str, list[str]]          # source -> window ids to replay
    spec: replay.EngineSpec | None
    policies: dict[str, replay.EnginePolicy]
    messages: list[str]

    @property
    def runnable(self) -> bool:
        return bool(self.status.ok and self.selection and self.selection.cases and self.windows)

    def replays(self) -> pl.DataFrame:
        """One row per replay the run would do: (case, source, region, rho, scheduler, vLLM mode, windows)."""
        rows = []
        for c in (self.selection.cases if self.selection else []):
            for s in c.sources:
                for sched in c.schedulers:
                    pol = self.policies.get(sched) or replay.engine_policy(sched)
                    rows.append({"case": c.kind, "source": s, "region": c.region, "rho": c.rho, "scheduler": sched,
                                 "vllm_mode": pol.mode, "windows": len(self.windows.get(s, []))})
        schema = {"case": pl.Utf8, "source": pl.Utf8, "region": pl.Utf8, "rho": pl.Float64, "scheduler": pl.Utf8,
                  "vllm_mode": pl.Utf8, "windows": pl.Int64}
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)

    def to_dict(self) -> dict:
        return {"status": dataclasses.asdict(self.status),
                "cases": [c.to_dict() for c in (self.selection.cases if self.selection else [])],
                "excluded": self.selection.excluded if self.selection else {},
                "windows": self.windows, "messages": self.messages,
                "engine_args": self.spec.engine_kwargs() if self.spec else None,
                "policies": {k: dataclasses.asdict(p) for k, p in self.policies.items()}}


def _manifest_window_ids(cfg: Config, sources, per_source: int) -> dict[str, list[str]]:
    man = windows.load_manifest(cfg)
    out: dict[str, list[str]] = {}
    for w in man["windows"]:
        if w["source"] in sources and len(out.setdefault(w["source"], [])) < per_source:
            out[w["source"]].append(w["id"])
    return out


def plan(cfg: Config, reversals: pl.DataFrame | None = None) -> Plan:
    """Select the cases and check the engine; starts nothing. ``reversals`` overrides the analysis' file."""
    v = settings(cfg.validation)
    status = replay.engine_status(v["device"], v["vllm_version"])
    msgs: list[str] = []
    selection = None
    try:
        rev = reversals if reversals is not None else cases.read_reversals(reversals_path(cfg))
        selection = cases.select_cases(rev, cfg.simulation.region_loads)
        msgs += selection.messages
    except PortbenchError as e:
        msgs.append(str(e))
    wins: dict[str, list[str]] = {}
    if selection and selection.cases:
        srcs = sorted({s for c in selection.cases for s in c.sources})
        try:
            wins = _manifest_window_ids(cfg, srcs, int(v["max_windows"]))
        except PortbenchError as e:
            msgs.append(f"windows: {e}")
    spec = None
    try:
        spec = engine_spec(cfg, status if status.ok else None)
    except PortbenchError as e:
        msgs.append(f"engine configuration: {e}")
    names = sorted({n for c in (selection.cases if selection else []) for n in c.schedulers})
    return Plan(status, selection, wins, spec, {n: replay.engine_policy(n) for n in names}, msgs)


def _seed(sim: SimulationConfig, window_id: str, what: str, region: str) -> int:
    return run_seed(int(sim.seed), window_id, what, region, 0)


def _write_json(path: Path, obj: Any) -> Path:
    io.write_text(path, json.dumps(obj, indent=1, default=io.json_default) + "\n")
    return path


def skipped_report(pl_: Plan) -> dict:
    why = pl_.status.reason if not pl_.status.ok else "; ".join(pl_.messages) or "nothing to replay"
    return {"ran": False, "skipped_because": why, "plan": pl_.to_dict()}


def run(cfg: Config, reversals: pl.DataFrame | None = None, *, progress: bool = True) -> dict:
    """Run the validation when vLLM and a GPU are present; otherwise write and return a "skipped" report.

    Returns the report (also written to ``{results_dir}/validation/report.json``). Never raises for a
    missing GPU / vLLM / analysis: the rest of the pipeline does not depend on this stage.
    """
    out = out_dir(cfg)
    the_plan = plan(cfg, reversals)
    _write_json(out / "plan.json", the_plan.to_dict())
    if not the_plan.runnable:
        report = skipped_report(the_plan)
        _write_json(out / "report.json", report)
        if progress:
            print(f"[portbench] validation skipped: {report['skipped_because']}", flush=True)
        return report
    report = _outside_event_loop(_run, cfg, the_plan, out, progress=progress)
    _write_json(out / "report.json", report)
    return report


def _outside_event_loop(fn, *args, **kwargs):
    """Call ``fn`` here, or in a worker thread when this thread already runs an asyncio loop (a Jupyter
    kernel does): the replay drives vLLM's AsyncLLM on an event loop of its own."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args, **kwargs)
    with ThreadPoolExecutor(1, thread_name_prefix="portbench-replay") as ex:
        return ex.submit(fn, *args, **kwargs).result()


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[portbench] validation: {msg}", flush=True)


def _run(cfg: Config, the_plan: Plan, out: Path, *, progress: bool) -> dict:
    v, sim = settings(cfg.validation), cfg.simulation
    t_start = time.perf_counter()
    sel = the_plan.selection
    assert sel is not None and the_plan.spec is not None
    base = base_profile(cfg)
    srcs = sorted(the_plan.windows)
    tables = windows.load_windows(cfg, sources=srcs, per_source=int(v["max_windows"]))
    tables = {k: tables[k] for s in srcs for k in the_plan.windows[s] if k in tables}
    vocab = int(replay.model_config(v["model_config"])["vocab_size"])
    iter_logs: list[Path] = []
    for f in out.glob("iterations_*.jsonl"):
        f.unlink()

    # 1. calibration: a burst under FCFS -> the engine's own cost model -> capacities on this engine
    first = the_plan.windows[sel.cases[0].sources[0]][0]
    calib_df = tables[first].head(int(v["calibration_requests"])).with_columns(pl.lit(0.0).alias("arrival_s"))
    spec_fcfs = replay.spec_for(replay.engine_policy("fcfs"), the_plan.spec)
    mml = spec_fcfs.resolved_max_model_len()
    log = out / "iterations_calibration.jsonl"
    iter_logs.append(log)
    _log(progress, f"calibration: {calib_df.height} requests of {first} at once (FCFS)")
    reqs, rej = replay.build_requests(calib_df, vocab_size=vocab, seed=_seed(sim, first, "calibration", "burst"),
                                      max_model_len=mml)
    with replay.Replayer(spec_fcfs, log) as r:
        startup = {"fcfs": r.startup_s}
        r.replay(reqs, horizon_s=1e6, rejected=rej, window_df=calib_df, tag="calib")
    calib_rows = replay.iteration_rows(log)
    calib_prof = verdict.fit_engine_profile(calib_rows, base, f"vllm_{v['model_config']}_calibration")
    calib_path = profiles.save_profile(calib_prof, out / "engine_profile_calibration.json")
    sim_cal = dataclasses.replace(sim, profile=str(calib_path))
    sim_engine = campaign.SimEngine()

    # 2. the replays, grouped by vLLM mode (one engine per mode)
    todo: dict[tuple, dict] = {}
    for c in sel.cases:
        for s in c.sources:
            for wid in the_plan.windows.get(s, []):
                for sched in c.schedulers:
                    todo.setdefault((s, wid, c.region, sched), {"rho": c.rho})
    prepared: dict[tuple, tuple] = {}
    for (s, wid, region, _), info in todo.items():
        if (wid, region) not in prepared:
            cap = sim_engine.capacity(tables[wid], sim_cal)
            scaled, horizon = sim_engine.prepare(tables[wid], float(info["rho"]), cap, sim_cal)
            prepared[(wid, region)] = (scaled, float(horizon), float(cap))
    by_mode: dict[str, list[tuple]] = {}
    for key in todo:
        by_mode.setdefault(replay.engine_policy(key[3]).mode, []).append(key)
    records: dict[tuple, pl.DataFrame] = {}
    horizons: dict[tuple, float] = {}
    for mode, keys in sorted(by_mode.items()):
        spec = dataclasses.replace(the_plan.spec, mode=mode)
        log = out / f"iterations_{mode}.jsonl"
        iter_logs.append(log)
        with replay.Replayer(spec, log) as r:
            startup[mode] = r.startup_s
            for i, key in enumerate(sorted(keys)):
                s, wid, region, sched = key
                scaled, horizon, _cap = prepared[(wid, region)]
                pol = replay.engine_policy(sched)
                prio = None
                if pol.mode == "priority":
                    prio = replay.priority_ranks(replay.static_keys(
                        sched, scaled, _seed(sim, wid, sched, region), campaign.scheduler_options(sim, sched),
                        profile=calib_prof, slo=sim.edf_slo_dict))
                reqs, rej = replay.build_requests(scaled, vocab_size=vocab, seed=_seed(sim, wid, "prompt-tokens", region),
                                                  priorities=prio, max_model_len=spec.resolved_max_model_len())
                _log(progress, f"[{mode} {i + 1}/{len(keys)}] {wid} {region} {sched}: {len(reqs)} requests, "
                               f"horizon {horizon:.1f} s")
                svc = calib_prof.isolated_service_s(scaled["prompt_tokens"].to_numpy(), scaled["output_tokens"].to_numpy())
                rec = r.replay(reqs, horizon_s=horizon, rejected=rej,
                               window_df=scaled, tag=f"{wid}-{sched}", service_s=svc)
                records[key], horizons[key] = rec, horizon

    # 3. the engine's profile from every iteration; metrics; re-simulation; verdicts
    iters = pl.concat([replay.iteration_rows(p) for p in iter_logs], how="vertical")
    prof = verdict.fit_engine_profile(iters, base, f"vllm_{v['model_config']}")
    prof_path = profiles.save_profile(prof, out / "engine_profile.json")
    engine_runs = verdict.engine_metric_rows(records, horizons, sim.slo_dicts)
    sim_fit = dataclasses.replace(sim, profile=str(prof_path))
    sim_rows, sim_recs = [], []
    for key in sorted(records):
        s, wid, region, sched = key
        scaled, horizon, _ = prepared[(wid, region)]
        res = sim_engine.run(scaled, sched, _seed(sim, wid, sched, region), horizon, sim_fit)
        sim_rows.append({**dict(zip(verdict.KEY, key)), "horizon_s": horizon, **res.metrics})
        if res.records is not None:
            sim_recs.append(res.records.with_columns(*[pl.lit(x).alias(k) for k, x in zip(verdict.KEY, key)]))
    sim_runs = pl.DataFrame(sim_rows)
    eng_req = pl.concat([rec.with_columns(*[pl.lit(x).alias(k) for k, x in zip(verdict.KEY, key)])
                         for key, rec in sorted(records.items())], how="vertical")
    sim_req = pl.concat(sim_recs, how="diagonal_relaxed") if sim_recs else pl.DataFrame()
    verdicts = verdict.verdict_table(sel.cases, engine_runs, alpha=float(cfg.analysis.alpha),
                                     correction=str(cfg.analysis.correction), sim_runs=sim_runs)
    errors = verdict.error_table(eng_req, sim_req) if sim_req.height else pl.DataFrame()
    for name, df in {"engine_runs": engine_runs, "engine_requests": eng_req, "iterations": iters,
                     "sim_runs": sim_runs, "sim_requests": sim_req, "verdicts": verdicts, "errors": errors}.items():
        if df.height:
            df.write_parquet(out / f"{name}.parquet")
    clock = {f"{k[1]}/{k[3]}": p for k, rec in records.items() if (p := replay.clock_problems(rec))}
    lag = eng_req.filter(~pl.col("rejected"))["submit_lag_s"]
    return {
        "ran": True, "plan": the_plan.to_dict(), "engine": dataclasses.asdict(the_plan.status),
        "startup_s": startup, "wall_s": time.perf_counter() - t_start,
        "calibration": {"requests": calib_df.height, "iterations": calib_rows.height,
                        "profile": str(calib_path), "provenance": calib_prof.provenance},
        "profile": {"path": str(prof_path), "coefficients": dict(zip(("c0_s", "c_prefill_s", "c_decode_s", "c_kv_s"),
                                                                     (prof.c0_s, prof.c_prefill_s, prof.c_decode_s,
                                                                      prof.c_kv_s))),
                    "iterations": iters.height, "provenance": prof.provenance},
        "capacity_rps": {f"{w}/{r}": c for (w, r), (_, _, c) in prepared.items()},
        "submit_lag_s": {"max": float(lag.max() or math.nan) if lag.len() else math.nan,
                         "p99": float(lag.quantile(0.99) or math.nan) if lag.len() else math.nan},
        "clock_problems": clock, **verdict.summarize(verdicts, errors),
    }


# --------------------------------------------------------------------------- notebook helpers


def policy_table(names=None) -> pl.DataFrame:
    """How each scheduler would run in vLLM (mode and how), for every registered scheduler."""
    if names is None:
        names = list(schedulers.SCHEDULERS)
    rows = [dataclasses.asdict(replay.engine_policy(n)) for n in names]
    return pl.DataFrame(rows).rename({"name": "scheduler", "mode": "vllm_mode", "note": "how / why not"})


def status_markdown(the_plan: Plan) -> str:
    """One paragraph: will the replay run here, and if not, exactly why."""
    st = the_plan.status
    if st.ok and the_plan.runnable:
        where = f"GPU **{st.gpu_name}**" if st.device == "cuda" else "vLLM's **CPU build** (tiny models only)"
        return (f"**The replay runs here**: {st.distribution} {st.version} (the tested version is {st.expected}) "
                f"on {where}.")
    if not st.ok:
        return (f"**The replay was skipped: {st.reason}.** Everything below that needs measurements is "
                "empty; the selected cases and the replay plan are still shown, and the rest of the "
                "pipeline does not depend on this notebook. On a machine with an NVIDIA GPU, "
                "`make gpu-validate` installs vLLM (`.venv-gpu`) and runs this notebook with the replay.")
    return ("**The replay was skipped: nothing to replay** — " + ("; ".join(the_plan.messages) or "no case")
            + ".")
