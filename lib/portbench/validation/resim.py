"""The engine's settings and how the simulator copies them (the re-simulation of every replay).

:class:`EngineSettings` holds what the engine really ran with (read back from the engine's own
``init`` record: KV blocks, block size, token budget, ``max_num_seqs``, ``max_model_len``) and the
workload transformation both sides share (token scale, requests per window, context limit).
:func:`sim_settings` is the **one** mapping "engine settings -> simulator settings"; every
re-simulation (replays, the capacity run) goes through :func:`simulate`.

Batching. vLLM V1 runs decodes first and chunks prompts under ``max_num_batched_tokens`` for every
policy; the re-simulation runs the simulator's own vLLM-V1 mode (:data:`ENGINE`: ``batching: v1``,
recompute preemption as V1 does), with the profile's token budget set to the engine's
``max_num_batched_tokens``. Prefix caching as the engine ran it (``EngineSettings.prefix_caching``):
on, the re-simulation passes the window's block hashes with ``hash_block_tokens`` x ``token_scale``
tokens per hash (the replay builds prompts from the same hashes: ``replay.hashed_prompt``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import polars as pl

from ..core.config import EngineConfig, SimulationConfig
from ..sim import schedulers
from ..sim.engine import simulate as _simulate
from ..sim.profiles import Profile
from . import policies

# The simulator's engine for the re-simulation: vLLM V1 as the replay engine runs it.
ENGINE = EngineConfig(batching="v1", preemption="recompute", prefix_caching="off")
ENGINE_PREFIX = EngineConfig(batching="v1", preemption="recompute", prefix_caching="auto")
BATCHING = ENGINE.batching


@dataclass(frozen=True)
class EngineSettings:
    """What the engine ran with, and the workload transformation both sides see."""

    device: str
    distribution: str
    version: str
    model: str
    num_blocks: int            # vLLM's num_gpu_blocks (block 0 is vLLM's null block: usable = num_blocks - 1)
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    token_scale: float = 1.0
    requests_per_window: int | None = None
    prefix_caching: bool = False

    @property
    def usable_blocks(self) -> int:
        return int(self.num_blocks) - 1

    @classmethod
    def from_init(cls, init: dict, *, device: str, distribution: str, version: str, model: str,
                  token_scale: float, requests_per_window: int | None, prefix_caching: bool = False
                  ) -> "EngineSettings":
        """From the ``init`` record :class:`portbench.vllm.StepRecords` writes."""
        return cls(device=device, distribution=distribution, version=version, model=model,
                   num_blocks=int(init["num_blocks"]), block_size=int(init["block_size"]),
                   max_num_batched_tokens=int(init["max_num_batched_tokens"]),
                   max_num_seqs=int(init["max_num_seqs"]), max_model_len=int(init["max_model_len"]),
                   token_scale=float(token_scale), requests_per_window=requests_per_window,
                   prefix_caching=bool(prefix_caching))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "usable_blocks": self.usable_blocks, "sim_batching": BATCHING}


def scale_tokens(df: pl.DataFrame, scale: float) -> pl.DataFrame:
    """Prompt and output lengths x ``scale`` (rounded up, at least 1); 1.0 leaves them as they are."""
    if scale == 1.0:
        return df
    return df.with_columns(*[(pl.col(c).cast(pl.Float64) * scale).ceil().clip(lower_bound=1).cast(pl.Int64).alias(c)
                             for c in ("prompt_tokens", "output_tokens")])


def context_limit(df: pl.DataFrame, max_model_len: int) -> tuple[pl.DataFrame, int, int]:
    """vLLM's input rule on both sides: a prompt of ``max_model_len`` tokens or more is refused
    (dropped from the window: it never reaches either scheduler); a longer output is cut to
    ``max_model_len - prompt``. Returns ``(window, refused, clipped)``."""
    keep = df.filter(pl.col("prompt_tokens") < max_model_len)
    cap = max_model_len - pl.col("prompt_tokens")
    clipped = int(keep.filter(pl.col("output_tokens") > cap).height)
    keep = keep.with_columns(pl.min_horizontal("output_tokens", cap).alias("output_tokens"))
    return keep, df.height - keep.height, clipped


def prepare_window(df: pl.DataFrame, s: EngineSettings) -> tuple[pl.DataFrame, dict]:
    """The window as both sides replay it: its first ``requests_per_window`` requests, tokens scaled,
    context limit applied. Returns ``(window, counts)``."""
    if s.requests_per_window:
        df = df.head(int(s.requests_per_window))
    n0 = df.height
    df, refused, clipped = context_limit(scale_tokens(df, s.token_scale), s.max_model_len)
    return df, {"requests": n0, "refused": refused, "clipped": clipped}


# token-valued options of policies the engine runs as an engine-wide setting (sarathi: its own engine instance
# with this budget), scaled on the simulator's side like the engine's
ENGINE_WIDE_TOKEN_OPTIONS = {"sarathi": ("prefill_token_budget",)}


def scaled_options(name: str, options: dict, scale: float) -> dict:
    """Token-valued scheduler options (e.g. LAS's quantum, Sarathi-Serve's budget) x ``scale``, at least 1."""
    out = dict(options)
    for key in (*policies.QUANTUM_OPTIONS.get(name, ()), *ENGINE_WIDE_TOKEN_OPTIONS.get(name, ())):
        v = out.get(key, schedulers.SCHEDULERS[name].option_defaults().get(key))
        if v is not None:
            out[key] = max(1, int(math.ceil(v * scale)))
    return out


def sim_settings(s: EngineSettings, profile: Profile, scheduler: str, sim: SimulationConfig) -> tuple[Profile, dict]:
    """THE mapping engine -> simulator: the profile with the engine's memory and batch limits, and
    scheduler ``name``'s options as the engine runs it.

    Profile: ``kv_capacity_blocks`` = the engine's usable blocks (``num_blocks - 1``), its
    ``block_size``, ``max_num_seqs`` and ``max_batched_tokens`` (the token budget). Options: the
    simulation's (``schedulers.options_for``) with token quanta scaled like the workload; the batching
    is :data:`ENGINE`'s (module docstring). A policy run on an engine instance of its own with an engine-wide
    token option (:data:`ENGINE_WIDE_TOKEN_OPTIONS`: sarathi's budget) gets that instance's budget (``s`` is
    then that instance's settings).
    """
    prof = dataclasses.replace(profile, kv_capacity_blocks=s.usable_blocks, block_size=s.block_size,
                               max_num_seqs=s.max_num_seqs, max_batched_tokens=s.max_num_batched_tokens)
    opts = scaled_options(scheduler, dict(schedulers.options_for(sim, scheduler)), s.token_scale)
    for key in ENGINE_WIDE_TOKEN_OPTIONS.get(scheduler, ()):   # what its own engine instance ran with
        opts[key] = int(s.max_num_batched_tokens)
    return prof, opts


def engine_policy_options(s: EngineSettings, sim: SimulationConfig) -> dict:
    """Options of the engine-side dynamic policies (same values as :func:`sim_settings` gives the simulator)."""
    return {name: {k: v for k, v in scaled_options(name, dict(schedulers.options_for(sim, name)), s.token_scale).items()
                   if k in policies.QUANTUM_OPTIONS.get(name, ())} for name in policies.QUANTUM_OPTIONS}


def scaled_hash_block(hash_block_tokens: int | None, s: EngineSettings) -> int | None:
    """Engine tokens per block hash (the trace's x ``token_scale``) when the engine caches prefixes and that
    is a whole number of its KV blocks; else None (no prefix caching for this window)."""
    if not (s.prefix_caching and hash_block_tokens):
        return None
    hb = float(hash_block_tokens) * s.token_scale
    return int(hb) if hb == int(hb) and int(hb) % s.block_size == 0 else None


def simulate(window_df: pl.DataFrame, scheduler: str, seed: int, horizon_s: float, s: EngineSettings,
             profile: Profile, sim: SimulationConfig, hash_block_tokens: int | None = None):
    """One re-simulation of a replayed window with the engine's settings (:func:`sim_settings`);
    ``hash_block_tokens``: the trace's tokens per block hash (prefix caching when the engine had it on)."""
    prof, opts = sim_settings(s, profile, scheduler, sim)
    sched = schedulers.get_scheduler(scheduler, **opts)
    hb = scaled_hash_block(hash_block_tokens, s)
    if hb is None and "block_hashes" in window_df.columns:
        window_df = window_df.drop("block_hashes")
    return _simulate(window_df, sched, prof, horizon_s=horizon_s, seed=seed, slo=sim.edf_slo_dict,
                     engine=ENGINE_PREFIX if hb else ENGINE, hash_block_tokens=hb)
