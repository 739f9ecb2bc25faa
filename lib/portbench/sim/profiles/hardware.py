"""Hardware and model specifications (public data sheets and model configs) and the KV capacity
they leave for the cache on a vLLM replica."""

from __future__ import annotations

from dataclasses import dataclass

from .costmodel import DTYPE_BYTES

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
