"""The validation's constants (labels, error targets, the time budget's reserves), its output paths, the
engine's specification from the settings and small helpers the plan, the run, the analysis and notebook 08 share."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping


from ..core import io
from ..core.config import (
    PathsConfig,
    SimulationConfig,
    ValidationConfig,
)
from ..core.errors import ParameterError, PortbenchError
from ..sim import profiles, schedulers
from ..study.campaign import run_seed
from . import replay, resim
from .engine import settings_for

LABEL_CPU = ("real vLLM engine, CPU backend, tiny model — the scheduling and memory mechanics are vLLM's, "
             "the timings are a CPU's")
LABEL_GPU = "real vLLM engine on a CUDA GPU"


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




