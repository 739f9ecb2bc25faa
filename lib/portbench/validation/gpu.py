"""The GPU run (``make gpu-validate``): the two primary cases on vLLM on a CUDA GPU, in one command that fits a lent
machine's device time.

What it does, in order, within ``device_budget_s`` (default 600 s of the machine's 15 minutes; the rest is its start):

1. checks the committed plan (:func:`.plan.check`) and the GPU (:func:`.replay.engine_status`);
2. sets the campaign's engine settings explicitly (:func:`.engine.settings_for` on ``validation.gpu`` at token scale
   1: the profile's KV cache, block size, token budget 2,048, ``max_num_seqs`` 256 and 131,072-token context --
   vLLM's defaults would pick their own budget and ``max_num_seqs``, and an 8,192 context refuses Mooncake's long
   prompts);
3. measures the GPU's step table first (:func:`.stages.step_table`, the reduced number of rounds);
4. predicts both cases at the GPU's scale (virtual engine, that step table) on the GPU's capacities;
5. sizes the paired design to the time left -- ``r`` = 2 pairs per window, as many windows per side (at least 2,
   at most the plan's ``k``) as the estimated replays (each window's horizon + :data:`REPLAY_OVERHEAD_S`) fit --
   and runs it, one engine instance per policy, the A/A pairs on one instance (an 8B model's weights and KV cache
   twice per policy do not fit beside each other);
6. writes the raw files (``raw/run.json``, ``raw/replays.parquet``, the step grid, the step logs) and the summary.
   Copy ``data/results/validation/`` back and ``portbench validate --analyze-only`` redoes the verdicts here.

``dry_run``: everything but the device, on vLLM's CPU build -- the same settings with the tiny model and the CPU's
block size, two windows per side, each replay's first ~3 s (``tests/test_vllm_harness.py`` runs it).
"""

from __future__ import annotations

import dataclasses
import time

from ..core.config import Config, SimulationConfig, ValidationConfig
from ..core.errors import PortbenchError
from . import engine, replay
from . import plan as plan_mod
from .common import base_profile, out_dir, summary_path
from .pipeline import Run, _from_plan, _write_json, execute, repo_root

REPLAY_OVERHEAD_S = 3.0     # per replay beyond its horizon: building the requests, emptying the cache, the records
STARTUP_S = 90.0            # per engine instance on a GPU (an 8B model with dummy weights; measured ~45 s on CPU)
RESERVE_S = 60.0            # the step table's fit, the predictions, the summary, the shutdown
DRY_MODEL = "tiny_llama_131k"
DRY_BUDGET_S = 1800.0      # the dry run's budget: a loaded 2-core machine (never cut in the test)
DRY_HORIZON_S = 3.0        # the dry run's replays: their first ~3 s


def gpu_settings(v: ValidationConfig, sim: SimulationConfig, *, dry_run: bool) -> engine.Settings:
    """The GPU run's settings: the campaign's, explicit (module docstring); the dry run's: the same with the tiny
    model on the CPU build (its attention wants blocks of 32)."""
    base = base_profile(sim)
    if dry_run:
        e = dataclasses.replace(v.gpu, model_config=DRY_MODEL, block_size=32, dtype="float32", enforce_eager=True,
                                section="validation.gpu (dry run)")
        return engine.settings_for(e, base, device="cpu", seed=int(v.seed), token_scale=1.0)
    return engine.settings_for(v.gpu, base, device="cuda", seed=int(v.seed), token_scale=1.0)


def primary(R: Run) -> Run:
    """The plan's two primary cases (key and control), nothing drawn, no planted case."""
    return dataclasses.replace(R, entries=[e for e in R.entries if e.get("role") != "draw"][:2], candidates={},
                               planted=None)


def windows_that_fit(horizons_s: list[float], sides: int, r: int, left_s: float, k_max: int) -> int:
    """Windows per side the time ``left_s`` holds: ``sides`` x k x ``r`` pairs x 2 replays of (the mean horizon +
    :data:`REPLAY_OVERHEAD_S`), between 2 and ``k_max``."""
    per = (sum(horizons_s) / len(horizons_s) if horizons_s else 30.0) + REPLAY_OVERHEAD_S
    k = int(left_s // (sides * r * 2 * per)) if per > 0 else k_max
    return max(2, min(int(k_max), k))


def run(cfg: Config, *, dry_run: bool = False, device_budget_s: float = 600.0, plan: Run | None = None,
        progress: bool = True) -> dict:
    """The GPU run (module docstring); ``summary.json`` and the raw files under ``data/results/validation``.
    ``plan``: the cases to run instead of the committed plan's (tests)."""
    t0 = time.monotonic()
    status = replay.engine_status("cpu" if dry_run else "cuda", cfg.validation.vllm_version)
    if not status.ok:
        s = {"ran": False, "skipped_because": status.reason}
        _write_json(summary_path(cfg.paths), s)
        return s
    if plan is None:
        pre = plan_mod.check(repo_root())
        plan = _from_plan(pre["doc"], pre, "full")
    R = primary(plan)
    if len(R.entries) < 2:
        raise PortbenchError("the plan has fewer than two primary cases: nothing for the GPU run to decide")
    S = gpu_settings(cfg.validation, cfg.simulation, dry_run=dry_run)
    budget = DRY_BUDGET_S if dry_run else float(device_budget_s)
    policies_ = {p for e in R.entries for p in (e["a"], e["b"])}
    sides = sum(len(e["sources"]) for e in R.entries)
    # the design sized to what is left after the instances' start and the reserve: the step table and the
    # capacities are measured first inside execute(), whose own estimate the horizon cap keeps short
    left = budget - (time.monotonic() - t0) - STARTUP_S * len(policies_) - RESERVE_S - 60.0
    horizon = DRY_HORIZON_S if dry_run else 20.0
    k = 2 if dry_run else windows_that_fit([horizon * 1.0], sides, 2, left, R.k)
    R = dataclasses.replace(R, k=k, r=2)
    return execute(cfg, R, mode="gpu-dry-run" if dry_run else "gpu", out=out_dir(cfg.paths),
                   device=S.device, progress=progress, settings=S, budget_s=budget - (time.monotonic() - t0),
                   max_horizon_s=horizon, twins=False)
