"""GPU cost model for the simulator: linear iteration time and KV-cache capacity.

(Work in progress: the Profile dataclass API is stable; coefficients are being calibrated.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Profile:
    """One GPU + model cost model.

    Iteration time = c0_s + c_prefill_s*prefill_tokens + c_decode_s*decode_seqs + c_kv_s*context_tokens.
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
    notes: str = ""
    provenance: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV cache capacity in tokens (= blocks x block_size)."""
        return int(self.kv_capacity_blocks) * int(self.block_size)

    def iteration_time(self, prefill_tokens, decode_seqs, context_tokens):
        """Duration (s) of one engine iteration (scalars or numpy arrays)."""
        return (self.c0_s + self.c_prefill_s * np.asarray(prefill_tokens, dtype=float)
                + self.c_decode_s * np.asarray(decode_seqs, dtype=float)
                + self.c_kv_s * np.asarray(context_tokens, dtype=float))

    def isolated_service_s(self, prompt_tokens, output_tokens):
        """Isolated service time: one prefill of the whole prompt, then output-1 single-seq decodes."""
        p = np.asarray(prompt_tokens, dtype=float)
        o = np.asarray(output_tokens, dtype=float)
        k = o - 1.0
        prefill = self.c0_s + self.c_prefill_s * p + self.c_kv_s * p
        # decode j=1..k: context = p + j
        decode = k * (self.c0_s + self.c_decode_s) + self.c_kv_s * (k * p + k * (k + 1) / 2)
        return prefill + decode
