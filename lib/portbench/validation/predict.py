"""Whole-run prediction: vLLM's own scheduler (:mod:`.virtual`) stepped with a measured step table.

The virtual vLLM engine runs a replayed window under the **wall-clock engine's settings**
(:class:`.resim.EngineSettings`: KV blocks, block size, budget, ``max_num_seqs``, context limit, prefix
caching, token scale -- the same mapping as the re-simulation, :func:`.resim.sim_settings`) and advances
its clock by a cost-model profile -- in the validation the one fitted to the fixed-shape **step grid**
(:mod:`.steps`), i.e. the engine's measured per-step times. That is a prediction of the wall-clock
replay from per-step timing alone: what it misses is how the steps compose on the real engine and the
frontend (process hop, ingestion), plus the step model's own error (:func:`error_budget`).

The same runs are the *engine* side of the two-step verdicts where the virtual engine is the engine:
every policy runs on vLLM's scheduler (MLFQ, RR, VTC included) and ``sarathi`` with its own token budget
x token_scale (:func:`policy_settings`) -- the wall-clock engine cannot run that budget (vLLM requires a
budget of at least ``max_num_seqs``), the virtual one runs it as the simulator does (the running
sequences capped at the budget). Given the same profile, settings, window and seed, the virtual engine
and the simulator take the same steps (:mod:`.conformance`); :func:`predict` is the join the tests check.

Import needs vLLM (``.venv-vllm``); :func:`available` says whether it can run here.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl

from ..core.config import SimulationConfig
from ..sim import metrics
from ..sim.profiles import Profile
from . import resim

ENGINE_NAME = "virtual vLLM (vLLM's V1 scheduler, measured step table)"


def available() -> bool:
    """Whether the virtual engine can run here (vLLM of the tested version importable)."""
    try:
        from . import virtual
        virtual.check_version()
        return True
    except Exception:      # noqa: BLE001 -- any import failure means: not here
        return False


def policy_settings(es: resim.EngineSettings, scheduler: str, sarathi_budget: int | None) -> resim.EngineSettings:
    """The settings a policy runs with on the virtual engine: ``es``, and for a policy with an engine-wide
    token budget (``sarathi``) that budget (``sarathi_budget``: the simulator's x token_scale, not raised)."""
    if scheduler in resim.ENGINE_WIDE_TOKEN_OPTIONS and sarathi_budget:
        return dataclasses.replace(es, max_num_batched_tokens=int(sarathi_budget))
    return es


def predict(window_df: pl.DataFrame, scheduler: str, seed: int, horizon_s: float, es: resim.EngineSettings,
            profile: Profile, sim: SimulationConfig, hash_block_tokens: int | None = None):
    """One window on the virtual vLLM engine with the settings ``es`` (:func:`.resim.sim_settings`, the
    re-simulation's mapping) and the step times of ``profile``; ``hash_block_tokens``: the trace's tokens per
    block hash (prefix caching when ``es`` has it on). Returns :class:`.virtual.VirtualResult`."""
    from . import virtual

    prof, opts = resim.sim_settings(es, profile, scheduler, sim)
    hb = resim.scaled_hash_block(hash_block_tokens, es)
    df = window_df if hb is not None or "block_hashes" not in window_df.columns else window_df.drop("block_hashes")
    budget = opts.get("prefill_token_budget") if scheduler in resim.ENGINE_WIDE_TOKEN_OPTIONS else None
    return virtual.run(df, scheduler, prof, horizon_s=horizon_s, seed=seed, slo=sim.edf_slo_dict, options=opts,
                       prefix_caching=hb is not None, hash_block_tokens=hb, budget=budget)


def run_metrics(records: pl.DataFrame, horizon_s: float, sim: SimulationConfig) -> dict:
    """The study's metrics of one run's records (the same function for every engine)."""
    return metrics.compute(records, horizon_s, sim.slo_dicts)


def error_budget(mape_prediction: float, mape_step_model: float, mape_scheduling: float) -> dict:
    """Split a whole-run prediction's E2E MAPE by cause.

    ``mape_prediction``: the virtual engine + step table vs the wall-clock replays; ``mape_step_model``: the
    step table's times on the engine's *own* schedule vs the measured latencies (the error had the
    prediction taken exactly the engine's steps); ``mape_scheduling``: the virtual engine vs the simulator
    with the same profile (vLLM's scheduling vs the simulator's; ~0 by conformance). The rest -- how the
    schedule and its step times differ on the real engine from the stepped prediction: the frontend's
    ingestion, the process hop, the time between steps, the schedule the real timing leads to -- is
    ``composition_and_frontend`` (shares are of the prediction's MAPE; MAPEs do not add exactly, so the rest
    is a difference, not a measurement)."""
    ok = all(isinstance(x, float) and math.isfinite(x) for x in (mape_prediction, mape_step_model))
    rest = (mape_prediction - mape_step_model) if ok else math.nan
    return {"e2e_mape_prediction": mape_prediction, "step_time_model": mape_step_model,
            "scheduling_model": mape_scheduling, "composition_and_frontend": rest,
            "share_step_time_model": (mape_step_model / mape_prediction) if ok and mape_prediction > 0 else math.nan,
            "explanation": "E2E MAPE below saturation of the whole-run prediction (virtual vLLM engine + the step "
                           "grid's cost model) vs the wall-clock replays; step_time_model: the same cost model's "
                           "step times summed over the engine's own recorded schedule; the rest is composition "
                           "and frontend (a difference of MAPEs); scheduling_model: the virtual engine vs the "
                           "simulator on the same profile"}


def mape(a: np.ndarray, ref: np.ndarray) -> float:
    """Mean of |a - ref| / ref over finite pairs with ref > 0 (NaN when none)."""
    a, ref = np.asarray(a, float), np.asarray(ref, float)
    m = np.isfinite(a) & np.isfinite(ref) & (ref > 0)
    return float(np.mean(np.abs(a[m] - ref[m]) / ref[m])) if m.any() else math.nan
