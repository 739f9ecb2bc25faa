"""Hardware x model cost model of one serving iteration, and the KV-cache capacity.

One engine iteration (one forward pass over the scheduled batch) takes

    t = c0_s + c_prefill_s·P + c_decode_s·B + c_kv_s·C + floor_s·max(0, 1 − N/floor_tokens)

with N = P + B, where

* ``P`` = ``prefill_tokens``: prompt tokens computed in this iteration (whole prompts or chunks),
  summed over the batch;
* ``B`` = ``decode_seqs``: sequences that generate one token in this iteration;
* ``N`` = P + B: the tokens the weight GEMMs process in this iteration (a decode is one token);
* ``C`` = ``context_tokens``: Σ over every scheduled sequence (prefill and decode) of the tokens in
  its KV cache *after* this iteration (prompt tokens prefilled so far, this chunk included, plus
  generated tokens) — the KV the attention kernels read.

The last term is the **roofline floor** (the weight-read floor). Derivation, for the token-linear
path (the weight GEMMs plus the per-token layer ops) on N tokens:

* memory-bound (small N, decode-sized batches): every weight is streamed from HBM once per
  iteration whatever N, so the time is a floor plus a small per-token slope (activations, partial
  tiles) — measured line ``T_mem(N) = a_d + s_d·N`` fitted on N in [1, max_num_seqs];
* compute-bound (large N, prefill-sized batches): ``T_cmp(N) = a_p + c_p·N``, fitted on N in
  [256, max_model_len], with c_p ≈ 2·weights FLOPs / achieved FLOP/s;
* the path costs the larger of the two (weights are read while the tensor cores compute):

      T(N) = max(T_mem, T_cmp) = a_p + c_p·N + max(0, (a_d − a_p) − (c_p − s_d)·N)
           = a_p + c_p·N + floor_s·max(0, 1 − N/floor_tokens)

  with ``floor_s = a_d − a_p`` (the weight-read time the compute line does not cover at N = 0) and
  ``floor_tokens = (a_d − a_p)/(c_p − s_d)`` (the knee: the N where the lines cross, above which
  the iteration is compute-bound and the floor term is 0).

So ``c0_s = a_p`` + LM-head weight read + engine overhead (paid by every iteration),
``c_prefill_s = c_p``, ``c_decode_s = c_p`` + LM-head compute of one sampled row (a decoding
sequence is one GEMM token plus its logits), ``c_kv_s`` = KV bytes per token / achieved bandwidth.
Consequences: a decode-only iteration with B below the knee costs ``c0 + floor_s + (s_d + LM
head)·B + c_kv·C`` — the memory-bound line, unchanged from the earlier strictly linear model whose c0
carried a_d; a prefill-only iteration of P >= floor_tokens costs ``c0 + c_p·P + c_kv·C`` — the
compute line, without the weight-read floor the strictly linear model charged it (+31 % for a
512-token chunk on the default profile; :func:`describe` gives before/after for every profile).
``floor_s = 0`` gives back the strictly linear model (profiles saved before the floor existed load
that way).

**Closed forms.** Between simulator events the batch composition (P, B) is fixed and each iteration
adds B to C. N = P + B is the same in every iteration of such a run, so the floor term is a constant
per iteration and k iterations cost ``k·iteration_time(P, B, C) + c_kv·B·k(k−1)/2``
(:meth:`Profile.run_s`); the number of iterations that fit in a time budget solves a quadratic
(:meth:`Profile.max_iterations_within`); :meth:`Profile.isolated_service_s` is the same sum for one
prefill (N = prompt) and output−1 single-sequence decodes (N = 1). These three methods and
:meth:`Profile.iteration_time` are the one definition of the cost model: the simulator, capacity
estimates and metrics must call them rather than recombine the coefficients.

Where the numbers come from (each profile's ``provenance`` and :func:`describe` repeat this):

* **Token-linear (GEMM) part — calibrated.** The measured per-layer operator times of the Vidur
  profiles in ``../shared/gpu_profiles`` (summed per-op medians x layers + the embedding, TP=1; a
  compact copy ships as ``portbench/data/gpu_operator_times.json``, rebuilt and hash-checked by
  :func:`build_operator_table`) give the whole-model time T(N) for N tokens. The two regime lines
  above are least-squares fits to them (each on its own N range, ``provenance["prefill_fit"]`` /
  ``["decode_fit"]``); the model is their maximum, and ``provenance["model_fit"]`` holds its errors
  over decode-sized (N <= max_num_seqs) and prefill-sized (N >= 256) batches; :func:`calibration_table`
  lists them row by row.
* **Still roofline (not in the measured rows):** attention / KV read ``c_kv_s`` = bytes per KV token
  / (HBM bandwidth x eta_mem); the LM-head weight read (in c0) and LM-head compute per sequence (in
  c_decode); eta_mem is the weight-streaming efficiency *measured* on the same GPU from the N=1 rows
  (an assumption: paged-attention kernels stream as efficiently as the GEMVs). The KV read and LM
  head are added to the max(), not overlapped with it (a small overcharge for large decode batches).
  Prefill attention's quadratic FLOPs are not modelled (their share of a max_model_len prefill is in
  each profile's provenance, ``prefill_attention_flop_share``, and in :func:`describe`).
* **Assumed:** the engine's per-iteration CPU overhead (scheduling, sampling) ``ENGINE_OVERHEAD_S``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..core.errors import DataError, ParameterError, check_choice

_SCALARS = (int, float)
FORMAT = "portbench-profile"
# Version 2 added ``floor_s`` and ``floor_tokens``; version-1 files (no floor) still load, with
# floor_s = 0, i.e. exactly the strictly linear model they were written with.
FORMAT_VERSION = 2
DTYPE_BYTES = 2  # FP16/BF16 weights, activations and KV cache


# --------------------------------------------------------------------------------------------
# The Profile dataclass (the simulator's view)
# --------------------------------------------------------------------------------------------



# --------------------------------------------------------------------------- decode runs in closed form
# A run of k decode iterations of one composition: the first costs a = iteration_time(0, B, C), each
# later one g = c_kv·B more (B new context tokens). The simulator advances whole runs with these; the
# Profile methods below are the same functions with a and g taken from the profile.


def decode_run_s(k, a: float, g: float):
    """T(k) = k·a + g·k(k−1)/2: seconds of k iterations starting at cost a, growing by g each."""
    return k * a + g * k * (k - 1) / 2


def last_k_within(a: float, g: float, x: float) -> int:
    """Largest k >= 0 with T(k) <= x (a quadratic, then a rounding guard against T itself)."""
    if x < a:
        return 0
    if g > 0:
        b = a - g / 2
        k = math.floor((-b + math.sqrt(b * b + 2 * g * x)) / g)
    else:
        k = math.floor(x / a)
    while k > 0 and decode_run_s(k, a, g) > x:
        k -= 1
    while decode_run_s(k + 1, a, g) <= x:
        k += 1
    return k


def first_k_reaching(a: float, g: float, x: float) -> int:
    """Smallest k >= 1 with T(k) >= x (the run that reaches an event time x)."""
    if g > 0:
        b = a - g / 2
        k = math.ceil((-b + math.sqrt(b * b + 2 * g * x)) / g)
    else:
        k = math.ceil(x / a)
    if k < 1:
        k = 1
    while k > 1 and decode_run_s(k - 1, a, g) >= x:
        k -= 1
    while decode_run_s(k, a, g) < x:
        k += 1
    return k

@dataclass(frozen=True)
class Profile:
    """One GPU x model cost model: iteration-time coefficients (seconds) and memory limits.

    Iteration time (see the module docstring for the derivation)::

        t = c0_s + c_prefill_s·P + c_decode_s·B + c_kv_s·C + floor_s·max(0, 1 − (P + B)/floor_tokens)

    Fields:

    * ``c0_s``: seconds every iteration pays (compute-line intercept, LM-head weight read, engine
      overhead);
    * ``c_prefill_s``: seconds per prefill token (compute-bound GEMM slope);
    * ``c_decode_s``: seconds per decoding sequence (GEMM slope of its token + its LM-head row);
    * ``c_kv_s``: seconds per context (KV) token read;
    * ``floor_s``: the roofline (weight-read) floor, seconds: how far the memory-bound time of the
      weight GEMMs exceeds their compute line at N = P + B = 0. It shrinks linearly with N and is 0
      from ``floor_tokens`` on. 0 = strictly linear model (the default, and what profile JSON
      written before the floor existed loads as);
    * ``floor_tokens``: the knee, in tokens (a float): the N where the memory-bound and
      compute-bound lines cross. Required > 0 when ``floor_s`` > 0. For the named profiles
      ``floor_s/floor_tokens = c_prefill_s − s_d`` (s_d: the measured memory-bound slope), so
      ``c_prefill_s·N + floor term = max(memory-bound line, compute line)`` minus the intercept.
    * memory: ``kv_capacity_blocks`` x ``block_size`` KV tokens, ``max_num_seqs`` running
      sequences, ``max_batched_tokens`` chunked-prefill token budget.

    Use :meth:`iteration_time`, :meth:`run_s`, :meth:`max_iterations_within` and
    :meth:`isolated_service_s`; they are one consistent definition (tests hold the closed forms to
    explicit loops, with the floor active and inactive). Do not recombine the coefficients.
    """

    name: str
    gpu: str
    model: str
    kv_capacity_blocks: int
    c0_s: float
    c_prefill_s: float
    c_decode_s: float
    c_kv_s: float
    block_size: int = 16
    max_num_seqs: int = 256
    max_batched_tokens: int = 512
    floor_s: float = 0.0
    floor_tokens: float = 0.0
    notes: str = ""
    provenance: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        for f in ("floor_s", "floor_tokens"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                    or not math.isfinite(v) or v < 0:
                raise ParameterError(f"Profile.{f}", v, "a finite number >= 0")
        if self.floor_s > 0 and self.floor_tokens <= 0:
            raise ParameterError("Profile.floor_tokens", self.floor_tokens,
                                 "> 0 when floor_s > 0 (the token count where the floor reaches 0)")

    @property
    def kv_capacity_tokens(self) -> int:
        """KV-cache capacity in tokens (= kv_capacity_blocks x block_size)."""
        return int(self.kv_capacity_blocks) * int(self.block_size)

    @property
    def coefficients(self) -> tuple[float, float, float, float]:
        """``(c0_s, c_prefill_s, c_decode_s, c_kv_s)`` — the linear part only; the floor is
        ``(floor_s, floor_tokens)``."""
        return (self.c0_s, self.c_prefill_s, self.c_decode_s, self.c_kv_s)

    def floor_time(self, tokens):
        """The floor term for an iteration of ``tokens`` = P + B tokens:
        ``floor_s·max(0, 1 − tokens/floor_tokens)`` (scalar -> float, array -> array)."""
        if self.floor_s <= 0:
            return 0.0 if type(tokens) in _SCALARS else np.zeros(np.shape(tokens))
        if type(tokens) in _SCALARS:
            return self.floor_s * (1.0 - tokens / self.floor_tokens) if tokens < self.floor_tokens else 0.0
        return self.floor_s * np.maximum(0.0, 1.0 - np.asarray(tokens, dtype=float) / self.floor_tokens)

    def iteration_time(self, prefill_tokens, decode_seqs, context_tokens):
        """Seconds of one iteration (scalars -> float, numpy arrays -> array, broadcast).

        ``context_tokens`` = Σ over the scheduled sequences of their KV tokens *after* this
        iteration (a prefill chunk counts its own tokens; a decode counts the new token). The floor
        term depends on ``prefill_tokens + decode_seqs`` only.
        """
        if type(prefill_tokens) in _SCALARS and type(decode_seqs) in _SCALARS and type(context_tokens) in _SCALARS:
            return (self.c0_s + self.c_prefill_s * prefill_tokens + self.c_decode_s * decode_seqs
                    + self.c_kv_s * context_tokens + self.floor_time(prefill_tokens + decode_seqs))
        p = np.asarray(prefill_tokens, dtype=float)
        b = np.asarray(decode_seqs, dtype=float)
        t = (self.c0_s + self.c_prefill_s * p + self.c_decode_s * b
             + self.c_kv_s * np.asarray(context_tokens, dtype=float) + self.floor_time(p + b))
        return float(t) if np.ndim(t) == 0 else t

    def run_s(self, k, prefill_tokens, decode_seqs, context_tokens):
        """Seconds of ``k`` consecutive iterations of one composition (closed form).

        ``context_tokens`` is the first iteration's value; each iteration adds ``decode_seqs``
        (one generated token per decoding sequence): Σ_{i<k} iteration_time(P, B, C + i·B). P + B,
        hence the floor term, is the same in every iteration, so the sum is
        ``k·iteration_time(P, B, C) + c_kv·B·k(k−1)/2``. Repeating a prefill chunk is not
        meaningful (its context would grow by P too), so use ``prefill_tokens=0`` for k > 1.
        """
        if type(k) in _SCALARS and type(decode_seqs) in _SCALARS:      # plain-Python fast path
            return (k * self.iteration_time(prefill_tokens, decode_seqs, context_tokens)
                    + self.c_kv_s * decode_seqs * k * (k - 1.0) / 2.0)
        k = np.asarray(k, dtype=float)
        b = np.asarray(decode_seqs, dtype=float)
        t = (k * self.iteration_time(prefill_tokens, decode_seqs, context_tokens)
             + self.c_kv_s * b * k * (k - 1.0) / 2.0)
        return float(t) if np.ndim(t) == 0 else t

    def max_iterations_within(self, budget_s: float, decode_seqs: int, context_tokens: int) -> int:
        """Largest k >= 0 with ``run_s(k, 0, decode_seqs, context_tokens) <= budget_s`` (:func:`last_k_within`
        with a = iteration_time(0, B, C), floor included, and g = c_kv·B)."""
        if budget_s <= 0:
            return 0
        a, g = self._decode_run(decode_seqs, context_tokens)
        return last_k_within(a, g, budget_s)

    def min_iterations_reaching(self, target_s: float, decode_seqs: int, context_tokens: int) -> int:
        """Smallest k >= 1 with ``run_s(k, 0, decode_seqs, context_tokens) >= target_s`` (the decode run that
        reaches an event time; :func:`first_k_reaching`)."""
        if target_s <= 0:
            return 1
        a, g = self._decode_run(decode_seqs, context_tokens)
        return first_k_reaching(a, g, target_s)

    def _decode_run(self, decode_seqs: int, context_tokens: int) -> tuple[float, float]:
        a = self.iteration_time(0, decode_seqs, context_tokens)   # first iteration
        g = self.c_kv_s * decode_seqs                              # growth per iteration
        if a <= 0:
            raise ParameterError("iteration time", a, "> 0 (a profile whose iterations cost nothing "
                                 "has no finite iteration count)")
        return a, g

    def isolated_service_s(self, prompt_tokens, output_tokens):
        """Service time of a request alone on the replica (vectorised closed form).

        One prefill iteration of the whole prompt (it yields the first token; context = prompt,
        N = prompt), then ``output_tokens − 1`` single-sequence decode iterations (N = 1, so a
        constant floor term) with contexts prompt+1, …, prompt+output−1:
        iteration_time(p, 0, p) + Σ_{j=1}^{k} iteration_time(0, 1, p + j), k = output − 1.
        """
        p = np.asarray(prompt_tokens, dtype=float)
        k = np.asarray(output_tokens, dtype=float) - 1.0
        prefill = self.c0_s + (self.c_prefill_s + self.c_kv_s) * p + self.floor_time(p)
        per_decode = self.c0_s + self.c_decode_s + self.floor_time(1.0)
        decode = k * (per_decode + self.c_kv_s * p) + self.c_kv_s * k * (k + 1.0) / 2.0
        t = prefill + decode
        return float(t) if np.ndim(t) == 0 else t

    def formula(self) -> str:
        """The iteration-time formula with this profile's numbers (for reports)."""
        text = (f"{self.c0_s * 1e3:.2f} ms + {self.c_prefill_s * 1e6:.2f} µs × prefill tokens + "
                f"{self.c_decode_s * 1e6:.2f} µs × decode sequences + {self.c_kv_s * 1e9:.1f} ns × "
                "context tokens")
        if self.floor_s > 0:
            text += (f" + {self.floor_s * 1e3:.2f} ms × max(0, 1 − (prefill tokens + decode sequences)"
                     f"/{self.floor_tokens:.0f}) (weight-read floor)")
        return text

    def to_dict(self) -> dict:
        """JSON-ready dictionary (what :func:`save_profile` writes)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("name", "notes", "provenance")}
        return {"format": FORMAT, "version": FORMAT_VERSION, "name": self.name, "fields": fields,
                "notes": self.notes, "provenance": self.provenance}


# --------------------------------------------------------------------------------------------
# Public specs: GPUs and models
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers of one GPU."""

    name: str
    memory_mib: int         # total device memory as nvidia-smi / torch report it (MiB)
    hbm_bw_gb_s: float      # peak HBM bandwidth (GB/s, 1e9 bytes)
    fp16_tflops: float      # peak dense FP16/BF16 tensor-core TFLOP/s (no sparsity)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20


# NVIDIA datasheets: A100 (SXM4) 1,555 GB/s (40 GB HBM2) / 2,039 GB/s (80 GB HBM2e), 312 dense
# FP16 TFLOP/s; H100 SXM5 80 GB HBM3 3,352 GB/s ("3.35 TB/s"), 989.4 dense FP16 TFLOP/s (1,979 is
# with 2:4 sparsity). Memory: nvidia-smi totals 40,960 / 81,920 / 81,559 MiB.
GPUS: dict[str, GPUSpec] = {
    "a100_40gb": GPUSpec("A100-SXM4-40GB", 40960, 1555.0, 312.0),
    "a100_80gb": GPUSpec("A100-SXM4-80GB", 81920, 2039.0, 312.0),
    "h100_80gb": GPUSpec("H100-SXM5-80GB", 81559, 3352.0, 989.4),
}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers from the model's public config.json."""

    name: str
    hf_id: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_model_len: int

    @property
    def layer_gemm_params(self) -> int:
        """Weights of one layer's token-linear GEMMs: q, k, v, o projections + gated MLP."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        """All weights: untied embedding + LM head, layers (GEMMs + two RMSNorms), final norm."""
        return (2 * self.vocab * self.hidden
                + self.layers * (self.layer_gemm_params + 2 * self.hidden) + self.hidden)

    @property
    def weight_bytes(self) -> int:
        return self.params * DTYPE_BYTES

    @property
    def lm_head_bytes(self) -> int:
        return self.vocab * self.hidden * DTYPE_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer: 2 · layers · kv_heads · head_dim · 2 bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES

    @property
    def activation_bytes_per_token(self) -> int:
        """Live activations per token at the peak of a forward pass (residual + normed hidden,
        q/k/v, gate/up/act outputs of the MLP), FP16."""
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        return DTYPE_BYTES * (2 * self.hidden + qkv + 3 * self.intermediate)


# meta-llama/Llama-2-7b-hf and meta-llama/Meta-Llama-3-8B config.json.
MODELS: dict[str, ModelSpec] = {
    "llama2_7b": ModelSpec("Llama-2-7B", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 128, 11008,
                           32000, 4096),
    "llama3_8b": ModelSpec("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 128, 14336,
                           128256, 8192),
}

# vLLM defaults / engine assumptions.
GPU_MEMORY_UTILIZATION = 0.9   # vLLM's default fraction of device memory it may use
BLOCK_SIZE = 16                # vLLM's default KV block (tokens)
MAX_NUM_SEQS = 256             # vLLM's default cap on running sequences
# Chunked-prefill token budget. 512 is vLLM's original chunked-prefill default and Sarathi-Serve's
# budget for strict TBT targets: a full 512-token chunk iteration stays below the tight TPOT SLO
# (50 ms) on the default profile (describe() prints the time), whereas vLLM's later defaults
# (2,048 / 8,192) give 100-300 ms stalls on an A100 and would make every TPOT SLO unreachable for
# chunked policies. Same value on every profile so that profiles compare one thing at a time.
MAX_BATCHED_TOKENS = 512
# Memory vLLM's profiling run cannot give to the KV cache besides weights and activations: CUDA
# context, cuBLAS/NCCL workspaces, CUDA-graph pools. ASSUMPTION (vLLM logs show ~0.5–1.5 GiB).
NON_TORCH_RESERVE_BYTES = 2**30
# Per-iteration CPU overhead (scheduling, input preparation, sampling, output processing) not in the
# GPU rows. ASSUMPTION: ~1 ms for vLLM >= 0.6 with async output processing.
ENGINE_OVERHEAD_S = 1e-3
# Token ranges of the two calibration fits.
PREFILL_FIT_MIN_TOKENS = 256
DECODE_FIT_MIN_TOKENS = 1
# Tolerance the tests hold the prefill-regime fit to (see tests/test_profiles.py): GEMM times are a
# staircase in N (tile/wave quantisation, ±15 % steps at 256–700 tokens) that no line can follow, so
# the median and 90th-percentile |error| are held tight and the max error looser.
CALIBRATION_TOLERANCE = {"median_abs_rel_err": 0.05, "p90_abs_rel_err": 0.12, "max_abs_rel_err": 0.25}
# Tolerance of the full model (max of the two lines) over decode-sized batches, N in [1,
# max_num_seqs]: the measured curve there is flat up to ~128 tokens and then steps up by 30–45 % at
# 144 tokens on the A100 (GEMM tile change), so one line through it is off by up to ~20 % next to the
# step; the median stays within 10 %.
DECODE_CALIBRATION_TOLERANCE = {"median_abs_rel_err": 0.10, "p90_abs_rel_err": 0.16, "max_abs_rel_err": 0.25}


def activation_reserve_bytes(model: ModelSpec, profile_tokens: int, max_num_seqs: int) -> int:
    """Peak non-KV memory of vLLM's profiling forward pass: activations of ``profile_tokens``
    tokens, FP32 logits of ``max_num_seqs`` sampled rows, and :data:`NON_TORCH_RESERVE_BYTES`."""
    logits = max_num_seqs * model.vocab * 4
    return profile_tokens * model.activation_bytes_per_token + logits + NON_TORCH_RESERVE_BYTES


def kv_capacity(gpu: GPUSpec, model: ModelSpec, *, block_size: int = BLOCK_SIZE,
                max_num_seqs: int = MAX_NUM_SEQS,
                utilization: float = GPU_MEMORY_UTILIZATION) -> dict[str, int | float]:
    """KV blocks = floor((memory x utilization − weights − activation reserve) / (bytes per KV
    token x block_size)); the profiling pass uses max_model_len tokens (whole-prompt prefill)."""
    budget = gpu.memory_bytes * utilization
    reserve = activation_reserve_bytes(model, model.max_model_len, max_num_seqs)
    free = budget - model.weight_bytes - reserve
    blocks = int(free // (model.kv_bytes_per_token * block_size))
    return {"memory_bytes": gpu.memory_bytes, "utilization": utilization, "budget_bytes": budget,
            "weight_bytes": model.weight_bytes, "activation_reserve_bytes": reserve,
            "kv_bytes_per_token": model.kv_bytes_per_token, "kv_free_bytes": free,
            "kv_capacity_blocks": blocks, "kv_capacity_tokens": blocks * block_size}


# --------------------------------------------------------------------------------------------
# Measured operator times (Vidur mlp.csv) -> whole-model GEMM time T(N)
# --------------------------------------------------------------------------------------------

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
OTHER_LAYER_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
OPERATOR_TABLE = "gpu_operator_times.json"
VIDUR_SOURCE = ("microsoft/vidur @ 7d47513363ec447a741ac5e47241580b47724fbf, "
                "data/profiling/compute/<gpu>/<model>/mlp.csv (MIT licence; Vidur, MLSys 2024)")
# Folder under gpu_profiles -> (GPU the rows were measured on, model).
# Vidur's A100 SKU is the 80 GB part (vidur/config/device_sku_config.py: total_memory_gb 80); the
# SXM/PCIe variant is not recorded — SXM4 (2,039 GB/s) is assumed for the bandwidth scaling.
DATASETS: dict[str, tuple[str, str]] = {
    "a100_meta-llama_Llama-2-7b-hf": ("a100_80gb", "llama2_7b"),
    "h100_meta-llama_Llama-2-7b-hf": ("h100_80gb", "llama2_7b"),
    "a100_meta-llama_Meta-Llama-3-8B": ("a100_80gb", "llama3_8b"),
}


def default_gpu_profiles_dir() -> Path:
    """``../shared/gpu_profiles`` next to the project root."""
    from ..core.config import project_root

    return project_root().parent / "shared" / "gpu_profiles"


def build_operator_table(gpu_profiles_dir: str | Path | None = None) -> dict:
    """Reduce each ``mlp.csv`` to per-``num_tokens`` sums at TP=1 (ms, per layer).

    For each distinct num_tokens: ``gemm_ms`` = Σ medians of the four GEMM ops, ``other_ms`` = Σ
    medians of the other per-layer ops, ``emb_ms`` = embedding median (runs once per forward pass);
    duplicated rows of one num_tokens are reduced by their median. Records each file's SHA-256.
    """
    root = Path(gpu_profiles_dir) if gpu_profiles_dir else default_gpu_profiles_dir()
    statistic = " ".join(build_operator_table.__doc__.split("\n\n")[1].split())
    out: dict[str, Any] = {"source": VIDUR_SOURCE, "statistic": statistic, "datasets": {}}
    for folder, (gpu, model) in DATASETS.items():
        path = root / folder / "mlp.csv"
        if not path.is_file():
            raise DataError(path, "measured operator-time file not found (see gpu_profiles/PROVENANCE.md)")
        raw = path.read_bytes()
        df = pl.read_csv(raw)
        cols = [f"time_stats.{op}.median" for op in (*GEMM_OPS, *OTHER_LAYER_OPS, "emb")]
        missing = [c for c in (*cols, "num_tokens", "num_tensor_parallel_workers") if c not in df.columns]
        if missing:
            raise DataError(path, f"missing columns {missing}")
        g = (df.filter(pl.col("num_tensor_parallel_workers") == 1)
             .with_columns(gemm_ms=pl.sum_horizontal([f"time_stats.{o}.median" for o in GEMM_OPS]),
                           other_ms=pl.sum_horizontal([f"time_stats.{o}.median" for o in OTHER_LAYER_OPS]),
                           emb_ms=pl.col("time_stats.emb.median"))
             .group_by("num_tokens").agg(pl.col("gemm_ms", "other_ms", "emb_ms").median())
             .sort("num_tokens"))
        shape = df.select("n_head", "n_kv_head", "n_embd", "n_expanded_embd").row(0, named=True)
        out["datasets"][folder] = {
            "gpu": gpu, "model": model, "sha256": hashlib.sha256(raw).hexdigest(), "shape": shape,
            "num_tokens": g["num_tokens"].to_list(),
            **{c: [round(v, 6) for v in g[c].to_list()] for c in ("gemm_ms", "other_ms", "emb_ms")},
        }
    return out


def write_operator_table(gpu_profiles_dir: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Rebuild ``portbench/data/gpu_operator_times.json`` from the measured rows."""
    path = Path(out) if out else Path(__file__).parent / "resources" / OPERATOR_TABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build_operator_table(gpu_profiles_dir), indent=1) + "\n")
    return path


@lru_cache(maxsize=1)
def operator_table() -> dict:
    """The shipped operator table (package data)."""
    return json.loads(resources.files("portbench.sim").joinpath("resources", OPERATOR_TABLE).read_text())


def _curve(folder: str) -> dict[str, np.ndarray]:
    d = operator_table()["datasets"][folder]
    return {k: np.asarray(d[k], dtype=float) for k in ("num_tokens", "gemm_ms", "other_ms", "emb_ms")}


def _model_time_ms(c: dict[str, np.ndarray], layers: int) -> np.ndarray:
    """Whole-model token-linear time: (GEMMs + other layer ops) x layers + embedding."""
    return layers * (c["gemm_ms"] + c["other_ms"]) + c["emb_ms"]


def streaming_efficiency(folder: str) -> float:
    """Measured weight-streaming efficiency of a dataset's GPU: one layer's GEMM weight bytes read
    in Σ GEMM medians at N=1, as a fraction of the datasheet HBM bandwidth."""
    gpu, model = DATASETS[folder]
    c = _curve(folder)
    bytes_read = MODELS[model].layer_gemm_params * DTYPE_BYTES
    return bytes_read / (c["gemm_ms"][0] * 1e-3) / (GPUS[gpu].hbm_bw_gb_s * 1e9)


def gemm_curve(gpu_key: str, model_key: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(num_tokens, whole-model token-linear time in ms, how it was obtained) for a GPU x model.

    * measured rows exist -> used directly;
    * same model measured on the 80 GB A100, wanted on another memory system of the same chip
      (A100-40GB: same SMs and clocks, less bandwidth): per-layer GEMM time = max(measured,
      weight-streaming floor at N=1 x bandwidth ratio) — compute-bound rows are unchanged,
      memory-bound rows slow down by the bandwidth ratio;
    * model not measured on this GPU (H100 x Llama-3-8B): that GPU's Llama-2-7B rows with the GEMM
      ops scaled by the ratio of the models' per-layer GEMM FLOPs (= weights; 218.1M / 202.4M);
      norms/rope/act/add kept (same hidden size). :func:`transfer_check` tests this transfer on
      the A100, where both models were measured.
    """
    model = MODELS[model_key]
    for folder, (g, m) in DATASETS.items():
        if g == gpu_key and m == model_key:
            c = _curve(folder)
            return c["num_tokens"], _model_time_ms(c, model.layers), f"measured rows {folder}"
    for folder, (g, m) in DATASETS.items():
        if m == model_key and _chip(g) == _chip(gpu_key):
            c = dict(_curve(folder))
            ratio = GPUS[g].hbm_bw_gb_s / GPUS[gpu_key].hbm_bw_gb_s
            c["gemm_ms"] = np.maximum(c["gemm_ms"], c["gemm_ms"][0] * ratio)
            return (c["num_tokens"], _model_time_ms(c, model.layers),
                    f"{folder} rows, GEMM weight-streaming floor x bandwidth ratio {ratio:.3f} "
                    f"({GPUS[g].hbm_bw_gb_s:.0f}/{GPUS[gpu_key].hbm_bw_gb_s:.0f} GB/s)")
    for folder, (g, m) in DATASETS.items():
        if g == gpu_key:
            c = dict(_curve(folder))
            ratio = model.layer_gemm_params / MODELS[m].layer_gemm_params
            c["gemm_ms"] = c["gemm_ms"] * ratio
            return (c["num_tokens"], _model_time_ms(c, model.layers),
                    f"{folder} rows, GEMM ops x FLOP ratio {ratio:.4f} ({model.name}/{MODELS[m].name})")
    raise ParameterError("gpu x model", f"{gpu_key} x {model_key}", "a pair the measured rows can reach")


def _line_fit(n: np.ndarray, t: np.ndarray, lo: int, hi: int) -> dict[str, float]:
    """Least squares t ≈ a + b·n over lo <= n <= hi (numpy lstsq), with R² and errors."""
    m = (n >= lo) & (n <= hi)
    x, y = n[m], t[m]
    (a, b), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)
    pred = a + b * x
    rel = pred / y - 1.0
    return {"intercept_ms": float(a), "slope_ms": float(b), "lo": int(lo), "hi": int(x.max()),
            "n_rows": int(m.sum()), "r2": float(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2)),
            "max_abs_rel_err": float(np.max(np.abs(rel))),
            "median_abs_rel_err": float(np.median(np.abs(rel))),
            "p90_abs_rel_err": float(np.percentile(np.abs(rel), 90))}


def transfer_check() -> dict[str, float]:
    """How well the FLOP-ratio transfer (used for H100 x Llama-3-8B) predicts measured rows: the
    A100 Llama-2-7B rows scaled to Llama-3-8B vs the measured A100 Llama-3-8B rows, N in
    [256, 4096] (prefill regime) and [1, 256] (decode regime)."""
    src, dst = _curve("a100_meta-llama_Llama-2-7b-hf"), _curve("a100_meta-llama_Meta-Llama-3-8B")
    l2, l3 = MODELS["llama2_7b"], MODELS["llama3_8b"]
    src = dict(src, gemm_ms=src["gemm_ms"] * l3.layer_gemm_params / l2.layer_gemm_params)
    common, i, j = np.intersect1d(src["num_tokens"], dst["num_tokens"], return_indices=True)
    pred = _model_time_ms(src, l3.layers)[i]
    meas = _model_time_ms(dst, l3.layers)[j]
    out = {}
    for label, lo, hi in (("prefill", PREFILL_FIT_MIN_TOKENS, 4096), ("decode", 1, MAX_NUM_SEQS)):
        m = (common >= lo) & (common <= hi)
        rel = pred[m] / meas[m] - 1
        out[f"{label}_median_abs_rel_err"] = float(np.median(np.abs(rel)))
        out[f"{label}_integrated_rel_err"] = float(pred[m].sum() / meas[m].sum() - 1)
    return out


# --------------------------------------------------------------------------------------------
# Building the named profiles
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileSpec:
    """Recipe of a named profile: which GPU, which model, which dataset gives eta_mem."""

    name: str
    gpu: str
    model: str
    summary: str


PROFILE_SPECS: dict[str, ProfileSpec] = {s.name: s for s in (
    ProfileSpec("a100_40gb_llama2_7b", "a100_40gb", "llama2_7b",
                "default; full multi-head KV on a 40 GB card: the KV cache binds under overload"),
    ProfileSpec("a100_80gb_llama2_7b", "a100_80gb", "llama2_7b",
                "direct-calibration twin of the default on the 80 GB card (more KV capacity)"),
    ProfileSpec("a100_80gb_llama3_8b", "a100_80gb", "llama3_8b",
                "calibrated directly on the measured A100 Llama-3-8B rows; GQA: KV rarely binds"),
    ProfileSpec("h100_80gb_llama3_8b", "h100_80gb", "llama3_8b",
                "H100 Llama-2-7B rows scaled by the Llama-3-8B/Llama-2-7B GEMM FLOP ratio"),
)}


def _chip(gpu_key: str) -> str:
    """The silicon ("A100", "H100"): memory variants of one chip share SMs, clocks and FLOP/s."""
    return GPUS[gpu_key].name.split("-")[0]


def _eta_mem(gpu_key: str) -> tuple[float, str]:
    """Weight-streaming efficiency for a GPU: measured on that chip (the mean over its datasets)."""
    folders = [f for f, (g, _) in DATASETS.items() if _chip(g) == _chip(gpu_key)]
    return float(np.mean([streaming_efficiency(f) for f in folders])), ", ".join(folders)


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """R², median / 90th-percentile / max |relative error| and the signed mean relative error."""
    rel = pred / y - 1.0
    return {"n_rows": int(len(y)), "r2": float(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2)),
            "median_abs_rel_err": float(np.median(np.abs(rel))),
            "p90_abs_rel_err": float(np.percentile(np.abs(rel), 90)),
            "max_abs_rel_err": float(np.max(np.abs(rel))), "mean_rel_err": float(np.mean(rel))}


def _roofline_floor(prefill: dict, decode: dict) -> tuple[float, float]:
    """(floor_ms, knee_tokens) that make ``a_p + c_p·N + floor_ms·max(0, 1 − N/knee)`` equal
    ``max(a_d + s_d·N, a_p + c_p·N)`` — the larger of the memory-bound (decode-regime) line and the
    compute-bound (prefill-regime) line. (0, 0) when the compute line is never below the other."""
    a_p, c_p = prefill["intercept_ms"], prefill["slope_ms"]
    a_d, s_d = decode["intercept_ms"], decode["slope_ms"]
    if a_d <= a_p:
        return 0.0, 0.0
    if s_d >= c_p:
        raise DataError("gpu_operator_times.json", f"memory-bound slope {s_d:.4g} ms/token >= compute-bound "
                        f"slope {c_p:.4g} ms/token: the two regime lines never cross (not a roofline shape)")
    return a_d - a_p, (a_d - a_p) / (c_p - s_d)


def model_gemm_ms(profile: Profile, tokens) -> np.ndarray:
    """What ``profile`` charges the token-linear path of an iteration of ``tokens`` = P + B tokens,
    in ms: ``iteration_time(tokens, 0, 0)`` less the parts that are not in the measured rows (the
    LM-head read and the engine overhead, ``provenance["non_gemm_s"]``). For a decode-only
    iteration the LM-head compute ``lm_head_per_seq_s·B`` comes on top of this."""
    n = np.asarray(tokens, dtype=float)
    return (profile.iteration_time(n, np.zeros_like(n), np.zeros_like(n))
            - profile.provenance["non_gemm_s"]) * 1e3


def build_profile(spec: ProfileSpec, *, max_num_seqs: int = MAX_NUM_SEQS,
                  max_batched_tokens: int = MAX_BATCHED_TOKENS, block_size: int = BLOCK_SIZE) -> Profile:
    """Derive one profile's coefficients and KV capacity (see the module docstring).

    Calibration: least-squares lines through the measured whole-model token-linear time T(N) in
    the decode regime (N in [1, max_num_seqs]: T_mem = a_d + s_d·N) and the prefill regime
    (N in [256, max_model_len]: T_cmp = a_p + c_p·N); the model charges max(T_mem, T_cmp), written
    as the compute line (a_p in c0, c_p per token) plus the floor term (``_roofline_floor``).
    """
    gpu, model = GPUS[spec.gpu], MODELS[spec.model]
    n, t_ms, basis = gemm_curve(spec.gpu, spec.model)
    prefill = _line_fit(n, t_ms, PREFILL_FIT_MIN_TOKENS, model.max_model_len)
    decode = _line_fit(n, t_ms, DECODE_FIT_MIN_TOKENS, max_num_seqs)
    eta_mem, eta_basis = _eta_mem(spec.gpu)
    bw = gpu.hbm_bw_gb_s * 1e9 * eta_mem                        # achieved bytes/s
    # Achieved FLOP/s in the prefill regime: 2 FLOPs per GEMM weight per token / measured slope.
    flops = 2 * model.layers * model.layer_gemm_params / (prefill["slope_ms"] * 1e-3)
    eta_flop = flops / (gpu.fp16_tflops * 1e12)
    lm_head_read_s = model.lm_head_bytes / bw                   # LM head streamed once per iteration
    lm_head_seq_s = 2 * model.hidden * model.vocab / flops      # logits of one sampled row
    floor_ms, knee = _roofline_floor(prefill, decode)
    # Every iteration: compute-line intercept + LM-head read + engine overhead. Each token of the
    # batch (prefill or decode) costs the compute slope c_p; the floor term lifts small-N
    # iterations to the memory-bound line. A decoding sequence also pays its LM-head row.
    c0 = prefill["intercept_ms"] * 1e-3 + lm_head_read_s + ENGINE_OVERHEAD_S
    c_prefill = prefill["slope_ms"] * 1e-3
    c_decode = c_prefill + lm_head_seq_s
    c_kv = model.kv_bytes_per_token / bw
    kv = kv_capacity(gpu, model, block_size=block_size, max_num_seqs=max_num_seqs)
    provenance = {
        "gpu_spec": dataclasses.asdict(gpu), "model_spec": dataclasses.asdict(model),
        "token_linear_basis": basis, "prefill_fit": prefill, "decode_fit": decode,
        "gemm_model": "max(decode-regime line, prefill-regime line) = prefill line + floor_s·max(0, "
                      "1 − N/floor_tokens), N = prefill tokens + decode sequences",
        "floor_ms": floor_ms, "knee_tokens": knee,
        "eta_mem": eta_mem, "eta_mem_basis": f"measured weight streaming at N=1 ({eta_basis})",
        "eta_flop": eta_flop, "lm_head_read_s": lm_head_read_s, "lm_head_per_seq_s": lm_head_seq_s,
        "engine_overhead_s": ENGINE_OVERHEAD_S, "non_gemm_s": lm_head_read_s + ENGINE_OVERHEAD_S,
        "kv": kv,
        # causal attention QK^T + AV over a max_model_len prompt: 2·L·d·p² FLOPs, vs GEMMs 2·L·W·p
        "prefill_attention_flop_share": (2 * model.layers * model.hidden * model.max_model_len**2)
        / (2 * model.layers * model.layer_gemm_params * model.max_model_len),
        "roofline_parts": "c_kv (KV read), LM head (read in c0, compute in c_decode), prefill "
                          "attention FLOPs ignored; engine overhead assumed",
        "calibrated_parts": "c_prefill and the compute-line intercept in c0 (prefill-regime line), "
                            "floor_s and floor_tokens (where the decode-regime line lies above the "
                            "prefill-regime line), eta_mem",
        "source": VIDUR_SOURCE,
    }
    profile = Profile(name=spec.name, gpu=gpu.name, model=model.name,
                      kv_capacity_blocks=kv["kv_capacity_blocks"], c0_s=c0, c_prefill_s=c_prefill,
                      c_decode_s=c_decode, c_kv_s=c_kv, block_size=block_size, max_num_seqs=max_num_seqs,
                      max_batched_tokens=max_batched_tokens, floor_s=floor_ms * 1e-3, floor_tokens=knee,
                      notes=spec.summary, provenance=provenance)
    # How the whole model (one formula, through Profile.iteration_time) fits the rows, per regime,
    # next to the strictly linear model it replaced (c0 carrying the decode intercept a_d:
    # decode-regime line for decode batches, a_d + c_p·N for prefill-only iterations).
    charged = model_gemm_ms(profile, n)
    linear_prefill = decode["intercept_ms"] + prefill["slope_ms"] * n
    linear_decode = decode["intercept_ms"] + decode["slope_ms"] * n
    regimes = {"decode": (n >= DECODE_FIT_MIN_TOKENS) & (n <= max_num_seqs),
               "prefill": (n >= PREFILL_FIT_MIN_TOKENS) & (n <= model.max_model_len)}
    provenance["model_fit"] = {r: _errors(charged[m], t_ms[m]) for r, m in regimes.items()}
    provenance["linear_model_fit"] = {"decode": _errors(linear_decode[regimes["decode"]], t_ms[regimes["decode"]]),
                                      "prefill": _errors(linear_prefill[regimes["prefill"]],
                                                         t_ms[regimes["prefill"]])}
    # Over(+)/under(−)charge of a prefill-only iteration, now and under the strictly linear model.
    sizes = np.array([max_batched_tokens, 1024, 4096], dtype=float)
    measured = np.interp(sizes, n, t_ms)
    provenance["prefill_only_overcharge"] = {
        str(int(x)): float(v) for x, v in zip(sizes, model_gemm_ms(profile, sizes) / measured - 1.0)}
    provenance["prefill_only_overcharge_linear"] = {
        str(int(x)): float((decode["intercept_ms"] + prefill["slope_ms"] * x) / m - 1.0)
        for x, m in zip(sizes, measured)}
    return profile


PROFILES: dict[str, Profile] = {name: build_profile(spec) for name, spec in PROFILE_SPECS.items()}
DEFAULT_PROFILE = "a100_40gb_llama2_7b"


# --------------------------------------------------------------------------------------------
# Lookup, fitting, persistence
# --------------------------------------------------------------------------------------------


def get_profile(name_or_path: str | Path | Profile) -> Profile:
    """A registered profile by name, or one saved by :func:`save_profile` (a path to its JSON)."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    key = str(name_or_path)
    if key in PROFILES:
        return PROFILES[key]
    path = Path(key)
    if not path.is_file() and not path.is_absolute():
        from ..core.config import project_root

        if (project_root() / path).is_file():
            path = project_root() / path
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise ParameterError("simulation.profile", key, "an existing profile JSON file or one of "
                                 + ", ".join(PROFILES))
        return load_profile(path)
    raise ParameterError("simulation.profile", key,
                         "one of " + ", ".join(PROFILES) + " (or a path to a profile JSON)")


FIT_COLUMNS = ("prefill_tokens", "decode_seqs", "context_tokens", "iteration_s")
FLOOR_MODES = ("auto", "base", "fit", "none")
# Knee candidates tried when the floor is fitted: a geometric grid of this many values between the
# rows' second-smallest and second-largest token counts, plus those token counts when there are at
# most this many of them.
FLOOR_KNEE_GRID = 200


def _nnls(a: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of ``a·coef ≈ y`` with row weights ``w``: (coef, weighted SSE)."""
    from scipy.optimize import nnls

    coef, _ = nnls(a * w[:, None], y * w)
    return coef, float(np.sum(((a @ coef - y) * w) ** 2))


def _knee_candidates(tokens: np.ndarray) -> np.ndarray:
    """Knees at which a floor is estimable from rows with these token counts N = P + B: at least two
    distinct N strictly below the knee (where the floor term is non-zero and not constant) and at
    least two at or above it (where it is 0) — otherwise the floor column is a combination of the
    intercept and the token columns, or zero. Empty when there are fewer than 4 distinct N."""
    u = np.unique(tokens)
    if len(u) < 4:
        return np.empty(0)
    lo, hi = u[1], u[-2]
    parts = [u[2:-1]] if len(u) <= FLOOR_KNEE_GRID + 3 else []
    if hi > max(lo, 1.0):
        parts.append(np.geomspace(max(lo, 1.0), hi, FLOOR_KNEE_GRID))
    cand = np.unique(np.concatenate(parts)) if parts else np.empty(0)
    return cand[(cand > lo) & (cand <= hi)]


def _bic(sse: float, n: int, k: int) -> float:
    """Bayesian information criterion of a least-squares fit with k parameters (lower is better)."""
    return n * math.log(max(sse, 1e-300) / n) + k * math.log(n)


def fit_profile(rows: pl.DataFrame, base: Profile | str, name: str, *, relative: bool = False,
                floor: str = "auto") -> Profile:
    """Fit a profile's iteration-time coefficients to measured iterations.

    ``rows``: one row per iteration with ``prefill_tokens, decode_seqs, context_tokens,
    iteration_s``. ``relative=True`` weights rows by 1/iteration_s (minimises relative error).
    Memory fields (KV blocks, block size, max_num_seqs, max_batched_tokens) come from ``base``.

    The linear coefficients (c0, c_prefill, c_decode, c_kv) >= 0 are fitted by non-negative least
    squares (scipy ``nnls``). The floor term ``floor_s·max(0, 1 − N/floor_tokens)`` (N =
    prefill_tokens + decode_seqs) is linear in ``floor_s`` once the knee ``floor_tokens`` is fixed,
    which gives three ways to treat it:

    * ``"base"``: floor_s and floor_tokens held at ``base``'s values; the floor term is subtracted
      from iteration_s and the four linear coefficients are fitted;
    * ``"fit"``: for each candidate knee (:func:`_knee_candidates`: a geometric grid between the
      rows' token counts, and the counts themselves; only knees with >= 2 distinct N on each side,
      where the floor is estimable) the four coefficients and floor_s are fitted by NNLS; the knee
      with the smallest residual wins. DataError when the rows have fewer than 4 distinct N.
      Near the ends of the data a hinge is almost collinear with c0 and the token slopes, so with
      noisy data this can return a floor the data does not need — use ``"auto"`` unless the floor
      is known to be there;
    * ``"none"``: floor_s = 0 (the strictly linear model);
    * ``"auto"`` (default): "fit the floor if the data identifies it, else hold the base floor":
      the candidates ``"base"`` (4 parameters), ``"none"`` (4) and, when estimable, ``"fit"``
      (6: the four, floor_s and the knee) are compared by BIC, n·ln(SSE/n) + k·ln(n), ties going
      to ``"base"``. A fitted floor must thus cut the residual by a factor exp(2·ln(n)/n) (3 % at
      n = 400 rows) to be chosen; data that cannot tell the floor apart from c0 (e.g. only small N)
      keeps the base's floor; data covering both sides of the base's knee without a floor gets
      none.

    ``provenance`` records the mode used, each candidate's BIC and the fit errors.
    """
    check_choice("floor", floor, FLOOR_MODES)
    base = get_profile(base)
    missing = [c for c in FIT_COLUMNS if c not in rows.columns]
    if missing:
        raise DataError("fit_profile rows", f"missing columns {missing}; expected {list(FIT_COLUMNS)}")
    x = rows.select(FIT_COLUMNS[:3]).to_numpy().astype(float)
    y = rows["iteration_s"].to_numpy().astype(float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise DataError("fit_profile rows", "non-finite values or iteration_s <= 0")
    tokens = x[:, 0] + x[:, 1]
    n = len(y)
    knees = _knee_candidates(tokens) if floor in ("auto", "fit") else np.empty(0)
    if floor == "fit" and not len(knees):
        raise DataError("fit_profile rows", f"{len(np.unique(tokens))} distinct token counts (prefill_tokens + "
                        "decode_seqs); fitting the floor needs at least 4 (use floor='base' or 'none')")
    if n < 4:
        raise DataError("fit_profile rows", f"{n} rows; need at least 4 to fit 4 coefficients")
    a = np.column_stack([np.ones(n), x])
    w = 1.0 / y if relative else np.ones_like(y)
    # candidate -> (c0, c_p, c_d, c_kv), floor_s, floor_tokens, weighted SSE, parameters
    cands: dict[str, tuple] = {}
    if floor in ("auto", "base"):
        coef, sse = _nnls(a, y - base.floor_time(tokens), w)
        cands["base"] = (coef, base.floor_s, base.floor_tokens, sse, 4)
    if floor in ("auto", "none"):
        coef, sse = _nnls(a, y, w)
        cands["none"] = (coef, 0.0, 0.0, sse, 4)
    if len(knees) and n >= 6:
        best = None
        for knee in knees:
            coef5, sse = _nnls(np.column_stack([a, np.maximum(0.0, 1.0 - tokens / knee)]), y, w)
            if best is None or sse < best[-2]:
                best = (coef5[:4], float(coef5[4]), float(knee) if coef5[4] > 0 else 0.0, sse, 6)
        cands["fit"] = best
    if floor == "fit" and "fit" not in cands:
        raise DataError("fit_profile rows", f"{n} rows; fitting the floor needs at least 6")
    bic = {m: _bic(c[3], n, c[4]) for m, c in cands.items()}
    mode = floor if floor != "auto" else min(bic, key=lambda m: (bic[m], ("base", "none", "fit").index(m)))
    coef, floor_s, floor_tokens, _, _ = cands[mode]
    fitted = dataclasses.replace(
        base, name=name, c0_s=float(coef[0]), c_prefill_s=float(coef[1]), c_decode_s=float(coef[2]),
        c_kv_s=float(coef[3]), floor_s=float(floor_s), floor_tokens=float(floor_tokens),
        notes=f"fitted to {n} measured iterations; memory fields of {base.name}", provenance={})
    pred = fitted.iteration_time(x[:, 0], x[:, 1], x[:, 2])
    prov = {"fitted_from_rows": n, "base": base.name, "method": "scipy.optimize.nnls"
            + (" (relative weights)" if relative else ""),
            "floor_requested": floor, "floor_mode": mode,
            "floor": {"base": f"floor_s, floor_tokens held at {base.name}'s values",
                      "fit": f"floor_s by NNLS at the best of {len(knees)} candidate knees",
                      "none": "no floor (strictly linear)"}[mode],
            "floor_bic": bic, "distinct_token_counts": int(len(np.unique(tokens))),
            **_errors(pred, y)}
    return dataclasses.replace(fitted, provenance=prov)


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write ``profile`` as JSON (format version :data:`FORMAT_VERSION`: name, fields, notes,
    provenance)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1, default=_json_default) + "\n")
    return path


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_profile(path: str | Path) -> Profile:
    """Read a profile written by :func:`save_profile`; DataError names what is wrong.

    Files of format version 1 (before the floor term) have no ``floor_s``/``floor_tokens``: they
    load with floor_s = 0, i.e. the strictly linear model their coefficients were fitted for.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(path, f"not a readable profile JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or "fields" not in data:
        raise DataError(path, f"not a {FORMAT} file (expected keys format, name, fields)")
    version = data.get("version", 1)
    if isinstance(version, bool) or version not in range(1, FORMAT_VERSION + 1):
        raise DataError(path, f"format version {version!r}; this portbench reads versions 1 to {FORMAT_VERSION}")
    known = {f.name for f in dataclasses.fields(Profile)} - {"name", "notes", "provenance"}
    fields = dict(data["fields"])
    unknown, missing = set(fields) - known, {"kv_capacity_blocks", "c0_s", "c_prefill_s", "c_decode_s",
                                             "c_kv_s", "gpu", "model"} - set(fields)
    if unknown or missing:
        raise DataError(path, f"unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")
    for c in ("c0_s", "c_prefill_s", "c_decode_s", "c_kv_s", "floor_s", "floor_tokens"):
        v = fields.get(c, 0.0)        # floor fields absent in version-1 files: no floor
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise DataError(path, f"{c} = {v!r}; expected a finite number >= 0", column=c)
        fields[c] = float(v)
    if fields["floor_s"] > 0 and fields["floor_tokens"] <= 0:
        raise DataError(path, f"floor_tokens = {fields['floor_tokens']!r} with floor_s > 0; expected the "
                        "knee (> 0 tokens)", column="floor_tokens")
    for c in ("kv_capacity_blocks", "block_size", "max_num_seqs", "max_batched_tokens"):
        v = fields.get(c, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise DataError(path, f"{c} = {v!r}; expected a positive integer", column=c)
    return Profile(name=str(data.get("name", path.stem)), notes=str(data.get("notes", "")),
                   provenance=dict(data.get("provenance") or {}), **fields)


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def calibration_table(profile_name: str) -> pl.DataFrame:
    """Token-linear time per num_tokens: the rows the profile was calibrated on vs the model.

    Columns: ``num_tokens`` (N = prefill tokens + decode sequences of an iteration),
    ``measured_ms`` (whole-model GEMM-path time; derived rows for profiles without direct
    measurements, see ``basis``), ``prefill_fit_ms`` / ``decode_fit_ms`` (the two regime lines),
    ``model_ms`` (what the profile charges the token-linear path of an iteration of N tokens,
    :func:`model_gemm_ms`: max of the two lines through the floor term — the same for prefill and
    decode tokens), ``linear_prefill_ms`` (what the strictly linear model without the floor charged a
    prefill-only iteration: decode intercept + c_prefill·N), ``*_rel_err``, and ``regime``
    ("decode" for N <= max_num_seqs, "prefill" for N in the prefill fit range, else "outside").
    """
    p = get_profile(profile_name)
    spec = PROFILE_SPECS.get(p.name)
    if spec is None:
        raise ParameterError("profile_name", profile_name, "one of " + ", ".join(PROFILE_SPECS))
    n, t_ms, basis = gemm_curve(spec.gpu, spec.model)
    pf, df = p.provenance["prefill_fit"], p.provenance["decode_fit"]
    prefill_fit = pf["intercept_ms"] + pf["slope_ms"] * n
    decode_fit = df["intercept_ms"] + df["slope_ms"] * n
    model = model_gemm_ms(p, n)
    linear_prefill = df["intercept_ms"] + pf["slope_ms"] * n
    regime = np.where(n <= df["hi"], "decode", np.where((n >= pf["lo"]) & (n <= pf["hi"]), "prefill", "outside"))
    return pl.DataFrame({
        "profile": [p.name] * len(n), "basis": [basis] * len(n), "num_tokens": n.astype(np.int64),
        "measured_ms": t_ms, "prefill_fit_ms": prefill_fit, "decode_fit_ms": decode_fit,
        "model_ms": model, "linear_prefill_ms": linear_prefill,
        "prefill_fit_rel_err": prefill_fit / t_ms - 1, "decode_fit_rel_err": decode_fit / t_ms - 1,
        "model_rel_err": model / t_ms - 1, "linear_prefill_rel_err": linear_prefill / t_ms - 1,
        "regime": regime,
    })


def plot_calibration(figures_dir: str | Path, profiles: list[str] | None = None,
                     name: str = "profile_calibration") -> dict[str, str]:
    """Measured vs modelled token-linear time for each profile (one panel each), saved via
    :func:`portbench.figures.save`; returns the PNG/PDF paths."""
    from ..present import figures

    names = list(profiles or PROFILE_SPECS)
    fig, axes = figures.figure(1, len(names), figsize=(4.6 * len(names), 4.0), squeeze=False)
    for ax, pname in zip(axes[0], names):
        t = calibration_table(pname)
        n = t["num_tokens"].to_numpy()
        ax.plot(n, t["measured_ms"], ".", ms=3, color="0.3", label="measured (GEMM path)")
        ax.plot(n, t["decode_fit_ms"], ":", lw=1, label="memory-bound line (N ≤ 256 fit)")
        ax.plot(n, t["prefill_fit_ms"], ":", lw=1, label="compute-bound line (N ≥ 256 fit)")
        ax.plot(n, t["model_ms"], "-", lw=1.8, label="model: max of the two (floor term)")
        ax.axvline(PROFILES[pname].floor_tokens, color="0.6", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens in the iteration, N = P + B")
        ax.set_ylabel("token-linear time per iteration (ms)")
        mf = PROFILES[pname].provenance["model_fit"]
        ax.set_title(f"{pname}\nknee (dashed) {PROFILES[pname].floor_tokens:.0f} tokens\n"
                     f"R² decode-sized {mf['decode']['r2']:.2f}, prefill-sized {mf['prefill']['r2']:.3f}",
                     fontsize="medium")
    axes[0][0].legend(loc="upper left")
    return figures.save(fig, name, figures_dir,
                        description="measured vs modelled token-linear time per iteration for each hardware "
                                    "profile: memory-bound and compute-bound fits and their maximum (the "
                                    "roofline floor)")


def _fit_cell(e: dict) -> str:
    return f"{e['r2']:.3f} / {e['median_abs_rel_err']:.1%} / {e['max_abs_rel_err']:.1%}"


def describe() -> str:
    """A table of the registered profiles: hardware, KV capacity, coefficients, calibration."""
    head = ("| profile | GPU | model | KV tokens | KV blocks | c0 (ms) | c_prefill (µs/token) | "
            "c_decode (µs/seq) | c_kv (ns/token) | floor (ms) / knee (tokens) | "
            "decode-sized fit R² / median / max err | prefill-sized fit R² / median / max err | "
            "chunk iteration (ms) |")
    lines = ["Cost-model profiles: t = c0 + c_prefill·P + c_decode·B + c_kv·C + floor·max(0, 1 − (P + B)/knee), "
             "P = prefill tokens, B = decode sequences, C = context tokens. The floor term makes the "
             "weight GEMMs cost the larger of their memory-bound (weight-read) line and their "
             "compute-bound line, max(a_d + s_d·N, a_p + c_prefill·N) with N = P + B; the knee is "
             "where the two measured lines cross. Fit errors are of that one formula against the "
             "measured rows: decode-sized batches N ≤ max_num_seqs, prefill-sized N ≥ 256.",
             "", head, "|" + "---|" * (head.count("|") - 1)]
    for p in PROFILES.values():
        mf = p.provenance["model_fit"]
        chunk_ms = p.iteration_time(p.max_batched_tokens, 0, p.max_batched_tokens) * 1e3
        lines.append(
            f"| {p.name} | {p.gpu} | {p.model} | {p.kv_capacity_tokens:,} | {p.kv_capacity_blocks:,} | "
            f"{p.c0_s * 1e3:.2f} | {p.c_prefill_s * 1e6:.2f} | {p.c_decode_s * 1e6:.2f} | "
            f"{p.c_kv_s * 1e9:.1f} | {p.floor_s * 1e3:.2f} / {p.floor_tokens:.0f} | "
            f"{_fit_cell(mf['decode'])} | {_fit_cell(mf['prefill'])} | {chunk_ms:.1f} |")
    lines.append("")
    for p in PROFILES.values():
        pv = p.provenance
        over = ", ".join(f"{k} tok {v:+.0%} (linear model without floor: "
                         f"{pv['prefill_only_overcharge_linear'][k]:+.0%})"
                         for k, v in pv["prefill_only_overcharge"].items())
        lin = pv["linear_model_fit"]["prefill"]
        lines.append(
            f"- {p.name}: {p.notes}. KV {pv['kv']['kv_bytes_per_token'] / 1024:.0f} KiB/token. "
            f"Token-linear basis: {pv['token_linear_basis']}. eta_mem "
            f"{pv['eta_mem']:.2f} (measured), eta_flop {pv['eta_flop']:.2f} (measured). Prefill-only "
            f"iteration charged vs measured: {over}; over all prefill-sized rows the linear model's "
            f"prefill-only line had {_fit_cell(lin)}. Prefill attention FLOPs left out: "
            f"{pv['prefill_attention_flop_share']:.0%} of a {pv['model_spec']['max_model_len']:,}-token "
            f"prefill. Isolated request 1,000+200 tokens: "
            f"{p.isolated_service_s(1000, 200):.2f} s.")
    tc = transfer_check()
    lines += ["", f"FLOP-ratio transfer check (A100 Llama-2-7B rows -> Llama-3-8B vs measured): "
              f"prefill regime median |err| {tc['prefill_median_abs_rel_err']:.1%}, integrated "
              f"{tc['prefill_integrated_rel_err']:+.1%}; decode regime median |err| "
              f"{tc['decode_median_abs_rel_err']:.1%}.",
              "Calibrated on the measured rows: the compute-bound line (c0's intercept, c_prefill, the "
              "GEMM part of c_decode) and the memory-bound line (floor, knee). Roofline (not measured): "
              "c_kv, LM head (read in c0, compute in c_decode), prefill attention (ignored); assumed: "
              f"engine overhead {ENGINE_OVERHEAD_S * 1e3:.1f} ms/iteration, non-torch reserve "
              f"{NON_TORCH_RESERVE_BYTES / 2**30:.1f} GiB; vLLM gpu_memory_utilization {GPU_MEMORY_UTILIZATION}."]
    return "\n".join(lines)
