"""The validation's constants (labels, error targets, the time budget's reserves), its output paths, the
engine's specification from the settings and small helpers the plan, the run, the analysis and notebook 08 share."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import polars as pl

from ..core import io
from ..core.config import (
    PathsConfig,
    SimulationConfig,
    ValidationConfig,
)
from ..core.errors import ParameterError, PortbenchError
from ..sim import profiles, schedulers
from ..study.campaign import run_seed
from .engine import settings_for
from . import (
    cases,
    confirm,
    replay,
    resim,
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
    """The engine of this run on ``device`` (``cpu``: ``validation.cpu``; ``cuda``: ``validation.gpu``): the wall-clock
    engine's own settings, every one explicit (:func:`.engine.settings_for`)."""
    return settings_for(v.engine(device), base_profile(sim), device=device, seed=int(v.seed)).spec()


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


def _write_json(path: Path, obj: Any) -> Path:
    io.write_text(path, json.dumps(obj, indent=1, default=io.json_default) + "\n")
    return path


def how_to_enable() -> str:
    return ("CPU engine: `make setup-vllm` (builds .venv-vllm: vLLM's CPU build, ~3 min, 4.3 GB), then "
            "`make validate` (full, <= 45 min) or `make all` (reduced); CUDA GPU: `make gpu-validate`.")


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


def _case_from_dict(d: dict) -> cases.Case:
    sides = tuple(cases.SideResult(**{k: x for k, x in sd.items()}) for sd in d["sides"])
    return cases.Case(d["kind"], d["a"], d["b"], d["region"], d["metric"], sides, rho=d.get("rho"),
                      direction=d.get("direction"), notes=d.get("notes", ""))


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


def steps_of(logged: pl.DataFrame, ph: dict) -> pl.DataFrame:
    """The steps of ``logged`` (the step log's rows) that started during the phase ``ph`` (its ``t0``..``t1`` on the
    monotonic clock): one replay's steps."""
    return logged.filter((pl.col("t_start") >= ph["t0"]) & (pl.col("t_start") <= ph["t1"]))


def _phase_steps(steps: pl.DataFrame, phases: list[dict], which: set[str]) -> pl.DataFrame:
    return _label_phases(steps, phases).filter(pl.col("phase").is_in(sorted(which)))


FAMILY_TABLES = ("family_virtual", "family_resim")     # raw/: the family's runs on vLLM's scheduler, on the simulator
