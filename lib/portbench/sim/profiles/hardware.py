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
    pcie_gb_s: float = 32.0  # host link, per direction (GB/s): PCIe 4.0 x16 = 32, PCIe 5.0 x16 = 64
    max_num_batched_tokens: int = 2048   # vLLM 0.32 API-server default on this GPU (V1 token budget)
    max_num_seqs: int = 256              # vLLM 0.32 default cap on running sequences on this GPU

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20


# NVIDIA datasheets: A100 (SXM4) 1,555 GB/s (40 GB HBM2) / 2,039 GB/s (80 GB HBM2e), 312 dense
# FP16 TFLOP/s, PCIe 4.0 x16 (32 GB/s per direction); H100 SXM5 80 GB HBM3 3,352 GB/s ("3.35 TB/s"),
# 989.4 dense FP16 TFLOP/s (1,979 is with 2:4 sparsity), PCIe 5.0 x16 (64 GB/s). Memory: nvidia-smi
# totals 40,960 / 81,920 / 81,559 MiB. vLLM 0.32 engine defaults (vllm/engine/arg_utils.py,
# get_batch_defaults; the OpenAI API server's values, since the study serves arrivals online):
# max_num_batched_tokens 2,048 on the A100 ("other GPUs"), 8,192 on GPUs with >= 70 GiB that are not
# A100s (H100); max_num_seqs 256 on the A100, 1,024 on the H100.
GPUS: dict[str, GPUSpec] = {
    "a100_40gb": GPUSpec("A100-SXM4-40GB", 40960, 1555.0, 312.0, 32.0, 2048, 256),
    "a100_80gb": GPUSpec("A100-SXM4-80GB", 81920, 2039.0, 312.0, 32.0, 2048, 256),
    "h100_80gb": GPUSpec("H100-SXM5-80GB", 81559, 3352.0, 989.4, 64.0, 8192, 1024),
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
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key token) pair of attention, every layer: QKᵀ and AV are one
        multiply-add each per head dimension: 4 · layers · heads · head_dim."""
        return 4 * self.layers * self.heads * self.head_dim

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


# meta-llama/Llama-2-7b-hf, meta-llama/Meta-Llama-3-8B and meta-llama/Llama-3.1-8B config.json.
# Llama-3.1-8B has Llama-3-8B's architecture (same layers, GQA, GEMM shapes and vocabulary) with
# RoPE scaling to a 131,072-token context ("max_position_embeddings": 131072).
MODELS: dict[str, ModelSpec] = {
    "llama2_7b": ModelSpec("Llama-2-7B", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 128, 11008,
                           32000, 4096),
    "llama3_8b": ModelSpec("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 128, 14336,
                           128256, 8192),
    "llama3_1_8b": ModelSpec("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336,
                             128256, 131072),
}


def measured_as(model_key: str) -> str:
    """The model whose measured operator rows stand for ``model_key`` (same GEMM shapes)."""
    return {"llama3_1_8b": "llama3_8b"}.get(model_key, model_key)


# vLLM defaults / engine assumptions.
GPU_MEMORY_UTILIZATION = 0.9   # vLLM's default fraction of device memory it may use


BLOCK_SIZE = 16                # vLLM's default KV block (tokens)


MAX_NUM_SEQS = 256             # vLLM's default cap on running sequences (A100; the H100's is 1,024)


# vLLM V1's default token budget per iteration (max_num_batched_tokens) on the A100 API server; each
# GPU's own default is GPUSpec.max_num_batched_tokens.
MAX_BATCHED_TOKENS = 2048


# Sarathi-Serve's stall-free chunk budget: 512 tokens is its budget for strict TBT targets (and vLLM's
# original chunked-prefill default): a full 512-token chunk iteration stays near the tight TPOT SLO
# (50 ms) on the A100 profiles, where vLLM's default budget gives 100-300 ms stalls. The `sarathi`
# policy carries it as its own token budget (its identity under V1 batching).
SARATHI_TOKEN_BUDGET = 512


# Host<->device copies of KV blocks (swap preemption) reach this fraction of the link's datasheet
# rate. ASSUMPTION (pinned-memory cudaMemcpy on PCIe 4.0 x16 measures ~25 of 32 GB/s).
PCIE_EFFICIENCY = 0.8


# Host memory for swapped KV per GPU. ASSUMPTION: 64 GiB -- half of a DGX A100's 1 TB of host memory
# per GPU (128 GB), well above vLLM V0's default swap_space of 4 GiB (which holds only ~32 k tokens of
# Llama-3-8B KV) -- so that swap, where it is chosen, is limited by PCIe time rather than space.
HOST_SWAP_BYTES = 64 * 2**30


# Memory vLLM's profiling run cannot give to the KV cache besides weights and activations: CUDA
# context, cuBLAS/NCCL workspaces, CUDA-graph pools. ASSUMPTION (vLLM logs show ~0.5–1.5 GiB).
NON_TORCH_RESERVE_BYTES = 2**30


def activation_reserve_bytes(model: ModelSpec, profile_tokens: int, max_num_seqs: int) -> int:
    """Peak non-KV memory of vLLM's profiling forward pass: activations of ``profile_tokens``
    tokens, FP32 logits of ``max_num_seqs`` sampled rows, and :data:`NON_TORCH_RESERVE_BYTES`."""
    logits = max_num_seqs * model.vocab * 4
    return profile_tokens * model.activation_bytes_per_token + logits + NON_TORCH_RESERVE_BYTES


def kv_capacity(gpu: GPUSpec, model: ModelSpec, *, block_size: int = BLOCK_SIZE,
                max_num_seqs: int = MAX_NUM_SEQS, profile_tokens: int | None = None,
                utilization: float = GPU_MEMORY_UTILIZATION) -> dict[str, int | float]:
    """KV blocks = floor((memory x utilization − weights − activation reserve) / (bytes per KV
    token x block_size)); vLLM V1's profiling pass runs ``profile_tokens`` = max_num_batched_tokens
    tokens (default: the GPU's vLLM default budget)."""
    budget = gpu.memory_bytes * utilization
    tokens = int(profile_tokens or gpu.max_num_batched_tokens)
    reserve = activation_reserve_bytes(model, tokens, max_num_seqs)
    free = budget - model.weight_bytes - reserve
    blocks = int(free // (model.kv_bytes_per_token * block_size))
    return {"memory_bytes": gpu.memory_bytes, "utilization": utilization, "budget_bytes": budget,
            "weight_bytes": model.weight_bytes, "activation_reserve_bytes": reserve, "profile_tokens": tokens,
            "kv_bytes_per_token": model.kv_bytes_per_token, "kv_free_bytes": free,
            "kv_capacity_blocks": blocks, "kv_capacity_tokens": blocks * block_size}
