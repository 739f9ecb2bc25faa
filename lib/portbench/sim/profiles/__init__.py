"""Hardware x model cost model of one serving iteration, and the KV-cache capacity.

One engine iteration (one forward pass over the scheduled batch) takes

    t = c0_s + c_prefill_s·P + c_decode_s·B + c_kv_s·C + c_attn_s·A + floor_s·max(0, 1 − N/floor_tokens)

with N = P + B, where

* ``P`` = ``prefill_tokens``: prompt tokens computed in this iteration (whole prompts or chunks),
  summed over the batch;
* ``B`` = ``decode_seqs``: sequences that generate one token in this iteration;
* ``N`` = P + B: the tokens the weight GEMMs process in this iteration (a decode is one token);
* ``C`` = ``context_tokens``: Σ over every scheduled sequence (prefill and decode) of the tokens in
  its KV cache *after* this iteration (prompt tokens prefilled so far, this chunk included, plus
  generated tokens) — the KV the attention kernels read (decode attention: linear in the context);
* ``A`` = ``attention_pairs``: Σ over the iteration's prompt chunks of new × (cached + new) causal
  token pairs, new·cached + new·(new+1)/2 (:func:`attention_pairs`) — prefill attention, quadratic
  in the chunk's context.

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
* **Still roofline (not in the measured rows):** decode attention / KV read ``c_kv_s`` = bytes per KV
  token / (HBM bandwidth x eta_mem); prefill attention ``c_attn_s`` = 4·layers·heads·head_dim FLOPs
  per token pair / the FLOP rate the GEMMs achieve (the measured prefill slope; an assumption: the
  attention kernel reaches the GEMM efficiency eta_flop); its share of a whole prompt's GEMM time is
  in each profile's provenance (``attention.prefill_share_of_gemm``: ~8 % at 4 k tokens, ~27 % at
  14 k, ~48 % at 25 k); the LM-head weight read (in c0) and LM-head compute per sequence (in
  c_decode); eta_mem is the weight-streaming efficiency *measured* on the same GPU from the N=1 rows
  (an assumption: paged-attention kernels stream as efficiently as the GEMVs). The KV read and LM
  head are added to the max(), not overlapped with it (a small overcharge for large decode batches).
  Swap copies: ``swap_s_per_block`` = a block's KV bytes / (PCIe datasheet rate x
  :data:`PCIE_EFFICIENCY`).
* **Assumed:** the engine's per-iteration CPU overhead (scheduling, sampling) ``ENGINE_OVERHEAD_S``;
  host memory for swapped KV (:data:`HOST_SWAP_BYTES`).
* **vLLM's defaults:** ``max_batched_tokens`` (V1's ``max_num_batched_tokens``) and ``max_num_seqs``
  of each GPU (:class:`GPUSpec`); ``max_model_len`` = the model's context (Llama-3.1-8B: 131,072),
  at most the KV capacity (vLLM's start-up check).

The package: :mod:`.costmodel` (the :class:`Profile` and closed-form decode runs), :mod:`.hardware`
(GPU and model specs, KV capacity), :mod:`.calibration` (the named profiles from the measured rows),
:mod:`.fit` (fitting to measured iterations, JSON files, :func:`get_profile`).
"""

from .calibration import (CALIBRATION_TOLERANCE, DECODE_CALIBRATION_TOLERANCE, ENGINE_OVERHEAD_S, PROFILE_SPECS,
                          PROFILES, ProfileSpec, build_profile, calibration_table, gemm_curve, model_gemm_ms,
                          transfer_check)
from .costmodel import DTYPE_BYTES, Profile, attention_pairs, decode_run_s, first_k_reaching, last_k_within
from .fit import FIT_COLUMNS, FLOOR_MODES, fit_profile, get_profile, load_profile, save_profile
from .hardware import (BLOCK_SIZE, GPU_MEMORY_UTILIZATION, GPUS, HOST_SWAP_BYTES, MAX_BATCHED_TOKENS, MAX_NUM_SEQS,
                       MODELS, NON_TORCH_RESERVE_BYTES, PCIE_EFFICIENCY, SARATHI_TOKEN_BUDGET, GPUSpec, ModelSpec,
                       kv_capacity)

DEFAULT_PROFILE = "a100_40gb_llama3_1_8b"

__all__ = ["HOST_SWAP_BYTES", "PCIE_EFFICIENCY", "SARATHI_TOKEN_BUDGET", "attention_pairs", "BLOCK_SIZE", "CALIBRATION_TOLERANCE", "DECODE_CALIBRATION_TOLERANCE", "DEFAULT_PROFILE", "DTYPE_BYTES",
           "ENGINE_OVERHEAD_S", "FIT_COLUMNS", "FLOOR_MODES", "GPUS", "GPU_MEMORY_UTILIZATION", "MAX_BATCHED_TOKENS",
           "MAX_NUM_SEQS", "MODELS", "NON_TORCH_RESERVE_BYTES", "PROFILES", "PROFILE_SPECS", "GPUSpec", "ModelSpec",
           "Profile", "ProfileSpec", "build_profile", "calibration_table", "decode_run_s", "first_k_reaching",
           "fit_profile", "gemm_curve", "get_profile", "kv_capacity", "last_k_within", "load_profile",
           "model_gemm_ms", "save_profile", "transfer_check"]
