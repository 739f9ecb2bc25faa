"""The cost model of one serving iteration (:class:`Profile`) and decode runs in closed form.

See :mod:`portbench.sim.profiles` for the model and how its coefficients are derived.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ...core.errors import ParameterError

_SCALARS = (int, float)
DTYPE_BYTES = 2  # FP16/BF16 weights, activations and KV cache
FORMAT = "portbench-profile"
# Version 2 added ``floor_s`` and ``floor_tokens``; version-1 files (no floor) still load, with
# floor_s = 0, i.e. exactly the strictly linear model they were written with. Version 3 added
# ``c_attn_s`` (prefill attention), ``max_model_len``, and the swap fields ``kv_bytes_per_token``,
# ``pcie_gb_s``, ``host_kv_blocks``; older files load with 0 for each (no attention term, no
# context limit, no swap).
FORMAT_VERSION = 3


def attention_pairs(new, cached):
    """Token pairs a prefill chunk's causal attention computes: each of the ``new`` tokens attends to
    the ``cached`` tokens before the chunk and to the chunk's tokens up to itself, i.e. new ×
    (cached + new) with the causal mask on the new × new block: ``new·cached + new·(new+1)/2``
    (an integer; scalars or numpy arrays)."""
    return new * cached + new * (new + 1) // 2


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

        t = c0_s + c_prefill_s·P + c_decode_s·B + c_kv_s·C + c_attn_s·A + floor_s·max(0, 1 − (P + B)/floor_tokens)

    Fields:

    * ``c0_s``: seconds every iteration pays (compute-line intercept, LM-head weight read, engine
      overhead);
    * ``c_prefill_s``: seconds per prefill token (compute-bound GEMM slope);
    * ``c_decode_s``: seconds per decoding sequence (GEMM slope of its token + its LM-head row);
    * ``c_kv_s``: seconds per context (KV) token read -- decode attention, linear in the context;
    * ``c_attn_s``: seconds per prefill attention token pair (A = Σ over the iteration's prompt chunks
      of :func:`attention_pairs`: quadratic in the chunk's context); 0 = not modelled;
    * ``floor_s``: the roofline (weight-read) floor, seconds: how far the memory-bound time of the
      weight GEMMs exceeds their compute line at N = P + B = 0. It shrinks linearly with N and is 0
      from ``floor_tokens`` on. 0 = strictly linear model (the default, and what profile JSON
      written before the floor existed loads as);
    * ``floor_tokens``: the knee, in tokens (a float): the N where the memory-bound and
      compute-bound lines cross. Required > 0 when ``floor_s`` > 0. For the named profiles
      ``floor_s/floor_tokens = c_prefill_s − s_d`` (s_d: the measured memory-bound slope), so
      ``c_prefill_s·N + floor term = max(memory-bound line, compute line)`` minus the intercept.
    * memory: ``kv_capacity_blocks`` x ``block_size`` KV tokens, ``max_num_seqs`` running
      sequences, ``max_batched_tokens`` = vLLM's ``max_num_batched_tokens`` (tokens per iteration
      of the V1 scheduler);
    * ``max_model_len``: the context limit the engine enforces (a longer prompt is refused, output
      clipped to ``max_model_len − prompt``); 0 = none;
    * swap preemption: ``kv_bytes_per_token`` (KV bytes of one token, all layers),
      ``pcie_gb_s`` (achieved host<->device copy bandwidth, GB/s) and ``host_kv_blocks`` (host memory
      for swapped KV, in blocks); 0 = no swap (recompute only).

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
    c_attn_s: float = 0.0
    max_model_len: int = 0
    kv_bytes_per_token: int = 0
    pcie_gb_s: float = 0.0
    host_kv_blocks: int = 0
    notes: str = ""
    provenance: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        for f in ("floor_s", "floor_tokens", "c_attn_s", "pcie_gb_s"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                    or not math.isfinite(v) or v < 0:
                raise ParameterError(f"Profile.{f}", v, "a finite number >= 0")
        if self.floor_s > 0 and self.floor_tokens <= 0:
            raise ParameterError("Profile.floor_tokens", self.floor_tokens,
                                 "> 0 when floor_s > 0 (the token count where the floor reaches 0)")
        for f in ("max_model_len", "kv_bytes_per_token", "host_kv_blocks"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ParameterError(f"Profile.{f}", v, "an integer >= 0 (0 = none)")

    @property
    def swap_s_per_block(self) -> float:
        """Seconds to copy one KV block between device and host (0: swap not modelled)."""
        if self.pcie_gb_s <= 0 or self.kv_bytes_per_token <= 0:
            return 0.0
        return self.block_size * self.kv_bytes_per_token / (self.pcie_gb_s * 1e9)

    @property
    def can_swap(self) -> bool:
        """True when the profile gives swap preemption a bandwidth and host memory."""
        return self.host_kv_blocks > 0 and self.swap_s_per_block > 0

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

    def iteration_time(self, prefill_tokens, decode_seqs, context_tokens, attention_pairs=0):
        """Seconds of one iteration (scalars -> float, numpy arrays -> array, broadcast).

        ``context_tokens`` = Σ over the scheduled sequences of their KV tokens *after* this
        iteration (a prefill chunk counts its own tokens; a decode counts the new token).
        ``attention_pairs`` = Σ over the iteration's prompt chunks of :func:`attention_pairs` (0 for
        decode-only iterations). The floor term depends on ``prefill_tokens + decode_seqs`` only.
        """
        if type(prefill_tokens) in _SCALARS and type(decode_seqs) in _SCALARS and type(context_tokens) in _SCALARS \
                and type(attention_pairs) in _SCALARS:
            return (self.c0_s + self.c_prefill_s * prefill_tokens + self.c_decode_s * decode_seqs
                    + self.c_kv_s * context_tokens + self.c_attn_s * attention_pairs
                    + self.floor_time(prefill_tokens + decode_seqs))
        p = np.asarray(prefill_tokens, dtype=float)
        b = np.asarray(decode_seqs, dtype=float)
        t = (self.c0_s + self.c_prefill_s * p + self.c_decode_s * b
             + self.c_kv_s * np.asarray(context_tokens, dtype=float)
             + self.c_attn_s * np.asarray(attention_pairs, dtype=float) + self.floor_time(p + b))
        return float(t) if np.ndim(t) == 0 else t

    def prefill_s(self, prompt_tokens, chunk_tokens=None):
        """Seconds to prefill a prompt alone (no decodes in the batch): one iteration of the whole
        prompt, or -- ``chunk_tokens`` given (vLLM V1's token budget) -- ⌈prompt/chunk⌉ iterations
        of chunks of ``chunk_tokens`` (the last one shorter), each with its context and its
        attention over the cached part (vectorised closed form)."""
        p = np.asarray(prompt_tokens, dtype=float)
        if not chunk_tokens or chunk_tokens <= 0:
            t = self.iteration_time(p, np.zeros_like(p), p, p * (p + 1.0) / 2.0)
            return float(t) if np.ndim(t) == 0 else t
        c = float(chunk_tokens)
        m = np.floor(p / c)                 # full chunks
        r = p - m * c                       # the last, shorter chunk (0: none)
        # full chunk j (0-based): c new tokens, j·c cached; context after it (j+1)·c
        full = (m * (self.c0_s + self.c_prefill_s * c + self.floor_time(c))
                + self.c_kv_s * c * m * (m + 1.0) / 2.0
                + self.c_attn_s * (c * c * m * (m - 1.0) / 2.0 + m * c * (c + 1.0) / 2.0))
        last = np.where(r > 0, self.c0_s + self.c_prefill_s * r + self.floor_time(r) + self.c_kv_s * p
                        + self.c_attn_s * (r * m * c + r * (r + 1.0) / 2.0), 0.0)
        t = full + last
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

    def isolated_service_s(self, prompt_tokens, output_tokens, chunk_tokens=None):
        """Service time of a request alone on the replica (vectorised closed form).

        The prefill of the whole prompt (:meth:`prefill_s`: one iteration, or chunks of
        ``chunk_tokens`` under vLLM V1's token budget; it yields the first token), then
        ``output_tokens − 1`` single-sequence decode iterations (N = 1, so a constant floor term)
        with contexts prompt+1, …, prompt+output−1: Σ_{j=1}^{k} iteration_time(0, 1, p + j), k = output − 1.
        """
        p = np.asarray(prompt_tokens, dtype=float)
        k = np.asarray(output_tokens, dtype=float) - 1.0
        prefill = self.prefill_s(p, chunk_tokens)
        per_decode = self.c0_s + self.c_decode_s + self.floor_time(1.0)
        decode = k * (per_decode + self.c_kv_s * p) + self.c_kv_s * k * (k + 1.0) / 2.0
        t = prefill + decode
        return float(t) if np.ndim(t) == 0 else t

    def formula(self) -> str:
        """The iteration-time formula with this profile's numbers (for reports)."""
        text = (f"{self.c0_s * 1e3:.2f} ms + {self.c_prefill_s * 1e6:.2f} µs × prefill tokens + "
                f"{self.c_decode_s * 1e6:.2f} µs × decode sequences + {self.c_kv_s * 1e9:.1f} ns × "
                "context tokens")
        if self.c_attn_s > 0:
            text += (f" + {self.c_attn_s * 1e9:.2f} ns × prefill attention pairs (new × (cached + new) "
                     "tokens of each prompt chunk, causal)")
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
