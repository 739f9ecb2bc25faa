"""The engine's step time on a grid of fixed shapes, and the cost model fitted to per-shape medians.

Whole-run latencies integrate the CPU's heavy step-time tails; the median of a fixed-shape step is
precise to a few percent from tens of repetitions even on a loaded machine. So the timing side of the
validation measures shapes, not runs:

* **Grid** (:func:`grid`, ``validation.step_grid``; engine tokens): decode-only steps (batch B x
  context C per sequence, the pairs the KV cache holds: long contexts with small batches, as replays run them), prefill-only steps (P new tokens after Cc tokens already in the prefix
  cache) and mixed steps (B decodes at the smallest decode context, or at the context a ``[B, P, C]`` triple
  names, + a P-token prompt chunk).
* **Measurement** (:func:`measure`, needs vLLM): an **in-process** engine (``LLMEngine`` with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no process hop in the timing), the same settings as the replay
  engine, prefix caching on. Per shape the engine state is built (requests prefilled until the batch
  decodes; a prefix prefilled and cached), then ``steps_per_shape`` steps are timed around
  ``LLMEngine.step()``; the shape each step really had comes from the scheduler's own record
  (:class:`portbench.vllm.StepRecords`). ``rounds`` interleaved rounds visit the shapes in a seeded random order,
  the **reference shape** (the first decode shape) before each round and after every third shape, so that
  drift of the machine's speed shows (``drift``: the reference's per-round medians).
* **Fit** (:func:`fit`): non-negative least squares (relative errors) of the cost model ``c0 + c_p P + c_d B + c_kv C +
  c_attn A`` (A = attention pairs of the prompt chunks, ``profiles.costmodel.attention_pairs``) to the
  per-shape medians -- the attention coefficient is estimated, not inherited. Per shape: the median
  with its distribution-free 95 % interval (order statistics), the fit's relative error with the
  interval it implies, and the leave-one-shape-out error (the fit without that shape: an honest
  prediction error).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import polars as pl
from scipy import optimize
from scipy import stats as sst

from ..sim.profiles import Profile
from ..sim.profiles.costmodel import attention_pairs
from .replay import ITERATION_LOG_ENV

MIXED_DECODE_CONTEXT = None   # mixed steps decode at the grid's smallest decode context
TARGET_SHAPE_ERROR = 0.05      # per-shape median error target (issue: <= 5 %)


@dataclass(frozen=True)
class Shape:
    """One fixed step shape (engine tokens)."""

    kind: str                  # decode | prefill | mixed
    decode_batch: int = 0
    decode_context: int = 0
    prefill_tokens: int = 0
    cached_context: int = 0

    @property
    def name(self) -> str:
        if self.kind == "decode":
            return f"decode B={self.decode_batch} C={self.decode_context}"
        if self.kind == "prefill":
            return f"prefill P={self.prefill_tokens} cached={self.cached_context}"
        return f"mixed B={self.decode_batch} C={self.decode_context} + P={self.prefill_tokens}"

    def model_inputs(self) -> tuple[int, int, int, int]:
        """(P, B, C, A) as the cost model counts them for this shape's step."""
        b, c, p, cc = self.decode_batch, self.decode_context, self.prefill_tokens, self.cached_context
        ctx = b * (c + 1) + (cc + p if p else 0)
        return p, b, ctx, int(attention_pairs(p, cc)) if p else 0


def grid(g, kv_tokens: int | None = None) -> list[Shape]:
    """The shapes of ``validation.step_grid`` (the first is the reference shape). ``kv_tokens``: the engine's KV
    cache in tokens; a decode shape whose batch cannot hold its context there -- ``B x (C + 1 + steps_per_shape)``
    tokens -- is left out (the grid's product of batches and contexts pairs long contexts with small batches only:
    the shapes the replays visit, a few sequences with thousands of tokens each)."""
    fits = (lambda b, c: True) if not kv_tokens else (
        lambda b, c: int(b) * (int(c) + 1 + int(g.steps_per_shape)) <= int(kv_tokens))
    out = [Shape("decode", b, c) for b in g.decode_batches for c in g.decode_contexts if b > 0 and fits(b, c)]
    out += [Shape("prefill", prefill_tokens=p, cached_context=cc) for p in g.prefill_tokens for cc in g.cached_contexts
            if p > 0]
    cm = min(g.decode_contexts)
    out += [Shape("mixed", int(x[0]), int(x[2]) if len(x) > 2 else cm, int(x[1])) for x in g.mixed
            if fits(x[0], x[2] if len(x) > 2 else cm)]
    return out


def schedule(shapes: Sequence[Shape], rounds: int, seed: int) -> list[tuple[int, int]]:
    """``(round, shape index)`` in measurement order: per round the reference (index 0) first, the others
    in a seeded random order, the reference again after every third."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(int(rounds)):
        out.append((r, 0))
        for k, i in enumerate(rng.permutation(np.arange(1, len(shapes)))):
            out.append((r, int(i)))
            if (k + 1) % 3 == 0:
                out.append((r, 0))
    return out


# --------------------------------------------------------------------------- measurement (vLLM)


class _Driver:
    """Builds each shape's state in an in-process ``LLMEngine`` and times its steps."""

    def __init__(self, engine, vocab: int, block_size: int, seed: int, log_reader):
        self.e, self.vocab, self.bs = engine, int(vocab), int(block_size)
        self.rng = np.random.default_rng(seed)
        self.n = 0
        self.read_log = log_reader

    def _tokens(self, n: int) -> list[int]:
        return [int(x) for x in self.rng.integers(10, self.vocab, size=int(n))]

    def _add(self, tokens: list[int], max_tokens: int) -> str:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        self.n += 1
        rid = f"grid-{self.n}"
        sp = SamplingParams(max_tokens=int(max_tokens), ignore_eos=True, temperature=0.0, detokenize=False)
        self.e.add_request(rid, TokensPrompt(prompt_token_ids=tokens), sp)
        return rid

    def _step(self) -> tuple[float, dict | None]:
        t = time.perf_counter()
        self.e.step()
        dt = time.perf_counter() - t
        return dt, self.read_log()

    def _drain(self, ids: list[str]) -> None:
        if ids:
            self.e.abort_request(ids)
        for _ in range(1000):
            if not self.e.has_unfinished_requests():
                return
            self.e.step()

    def _decode_batch(self, b: int, c: int, extra: int) -> list[str]:
        """b requests of c-token prompts, stepped until every one decodes."""
        ids = [self._add(self._tokens(c), 10_000) for _ in range(b)]
        for _ in range(10_000):
            _, rec = self._step()
            if rec and rec.get("prefill_tokens", 1) == 0 and rec.get("decode_seqs") == b:
                break
        return ids

    def measure(self, s: Shape, k: int) -> list[dict]:
        rows = []
        if s.kind == "decode":
            ids = self._decode_batch(s.decode_batch, s.decode_context, k)
            for _ in range(k):
                dt, rec = self._step()
                rows.append(_row(s, dt, rec))
            self._drain(ids)
        elif s.kind == "prefill":
            prefix = self._tokens(s.cached_context)
            if s.cached_context:
                self._add(prefix, 1)
                self._drain([])
            for _ in range(k):
                self._add(prefix + self._tokens(s.prefill_tokens), 1)
                dt, rec = self._step()
                rows.append(_row(s, dt, rec))
                self._drain([])
        else:
            ids = self._decode_batch(s.decode_batch, s.decode_context, k)
            for _ in range(k):
                self._add(self._tokens(s.prefill_tokens), 1)
                dt, rec = self._step()
                rows.append(_row(s, dt, rec))
            self._drain(ids)
        return rows


def _row(s: Shape, dt: float, rec: dict | None) -> dict:
    p, b, c, a = s.model_inputs()
    rec = rec or {}
    return {"shape": s.name, "kind": s.kind, "step_wall_s": dt, "iteration_s": rec.get("iteration_s", math.nan),
            "prefill_tokens": int(rec.get("prefill_tokens", p)), "decode_seqs": int(rec.get("decode_seqs", b)),
            "context_tokens": int(rec.get("context_tokens", c)), "attention_pairs": a,
            "planned_prefill": p, "planned_decode": b, "as_planned": bool(rec) and
            int(rec.get("prefill_tokens", -1)) == p and int(rec.get("decode_seqs", -1)) == b}


def measure(spec, shapes: Sequence[Shape], *, rounds: int, steps_per_shape: int, seed: int, log_path,
            vocab: int) -> tuple[pl.DataFrame, float]:
    """Time the grid on an in-process engine built from ``spec`` (:class:`.replay.EngineSpec`; prefix
    caching forced on). Returns (one row per timed step, engine start-up seconds)."""
    saved = {k: os.environ.get(k) for k in spec.env}
    os.environ.update({k: str(v) for k, v in spec.env.items()})   # before torch is imported (its thread pool)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ[ITERATION_LOG_ENV] = str(log_path)
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    if "OMP_NUM_THREADS" in spec.env:
        torch.set_num_threads(int(spec.env["OMP_NUM_THREADS"]))
    kw = {**dataclasses.replace(spec, enable_prefix_caching=True).engine_kwargs()}
    t = time.perf_counter()
    engine = LLMEngine.from_engine_args(EngineArgs(**kw))
    startup = time.perf_counter() - t
    fh = open(log_path)   # noqa: SIM115 - closed below

    def last_record():
        rec = None
        for line in fh:
            d = json.loads(line)
            if d.get("event") != "init":
                rec = d
        return rec

    try:
        threads = torch.get_num_threads()
        drv = _Driver(engine, vocab, spec.block_size or 32, seed, last_record)
        drv._drain([])
        rows = []
        for r, i in schedule(shapes, rounds, seed):
            for row in drv.measure(shapes[i], steps_per_shape):
                rows.append({**row, "round": r, "reference": i == 0, "torch_threads": threads})
    finally:
        fh.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.environ.pop(ITERATION_LOG_ENV, None)
        engine.engine_core.shutdown()
        del engine
    return pl.DataFrame(rows), startup


# --------------------------------------------------------------------------- analysis (no vLLM)


def median_ci(x, level: float = 0.95) -> tuple[float, float, float]:
    """Median of ``x`` and its distribution-free interval from order statistics (binomial); NaN bounds when
    ``x`` is too short for the level."""
    x = np.sort(np.asarray(x, float)[np.isfinite(x)])
    n = x.size
    if n == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(x))
    lo_k = int(sst.binom.ppf((1 - level) / 2, n, 0.5)) - 1
    hi_k = n - lo_k - 1
    if lo_k < 0 or hi_k >= n:
        return med, math.nan, math.nan
    return med, float(x[lo_k]), float(x[hi_k])


def shape_table(rows: pl.DataFrame, time_column: str = "step_wall_s") -> pl.DataFrame:
    """Per shape: the model inputs (medians of what the scheduler recorded), the median step time and its
    95 % interval, the number of steps and their CV."""
    out = []
    for (name,), g in rows.group_by(["shape"], maintain_order=True):
        y = g[time_column].to_numpy().astype(float)
        med, lo, hi = median_ci(y)
        out.append({"shape": name, "kind": g["kind"][0], "steps": g.height,
                    "as_planned_share": float(g["as_planned"].mean()),
                    "prefill_tokens": float(g["prefill_tokens"].median()), "decode_seqs": float(g["decode_seqs"].median()),
                    "context_tokens": float(g["context_tokens"].median()),
                    "attention_pairs": float(g["attention_pairs"].median()),
                    "median_s": med, "lo_s": lo, "hi_s": hi,
                    "cv": float(np.std(y, ddof=1) / np.mean(y)) if y.size > 1 else math.nan})
    return pl.DataFrame(out)


X_COLUMNS = ("prefill_tokens", "decode_seqs", "context_tokens", "attention_pairs")


def _nnls(t: pl.DataFrame) -> np.ndarray:
    """Coefficients minimising the squared *relative* errors of the medians (rows / median), >= 0."""
    a = np.column_stack([np.ones(t.height), *[t[c].to_numpy().astype(float) for c in X_COLUMNS]])
    y = t["median_s"].to_numpy().astype(float)
    a, w = a / y[:, None], np.ones_like(y)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)           # columns of very different magnitudes
    coef, _ = optimize.nnls(a / scale, w)
    return coef / scale


def _predict(coef: np.ndarray, t: pl.DataFrame) -> np.ndarray:
    a = np.column_stack([np.ones(t.height), *[t[c].to_numpy().astype(float) for c in X_COLUMNS]])
    return a @ coef


def fit(table: pl.DataFrame, base: Profile, name: str) -> tuple[Profile, pl.DataFrame, dict]:
    """NNLS of the cost model (attention term included) to the per-shape medians; returns the profile
    (memory fields from ``base``, no floor), the table with ``predicted_s``, ``rel_err`` (and its interval
    from the median's) and ``loo_rel_err``, and a summary (coefficients, R² over shapes, errors)."""
    coef = _nnls(table)
    pred = _predict(coef, table)
    med = table["median_s"].to_numpy().astype(float)
    loo = np.full(table.height, math.nan)
    if table.height > 6:
        for i in range(table.height):
            keep = np.arange(table.height) != i
            c = _nnls(table.filter(pl.Series(keep)))
            loo[i] = _predict(c, table[i:i + 1])[0] / med[i] - 1
    out = table.with_columns(pl.Series("predicted_s", pred), pl.Series("rel_err", pred / med - 1),
                             pl.Series("rel_err_lo", pred / table["hi_s"].to_numpy() - 1),
                             pl.Series("rel_err_hi", pred / table["lo_s"].to_numpy() - 1),
                             pl.Series("loo_rel_err", loo))
    sst_ = float(np.sum((med - med.mean()) ** 2))
    r2 = 1 - float(np.sum((med - pred) ** 2)) / sst_ if sst_ > 0 else math.nan
    prof = dataclasses.replace(base, name=name, c0_s=float(coef[0]), c_prefill_s=float(coef[1]),
                               c_decode_s=float(coef[2]), c_kv_s=float(coef[3]), c_attn_s=float(coef[4]),
                               floor_s=0.0, floor_tokens=0.0,
                               notes=f"fitted to the medians of {table.height} fixed step shapes (validation.steps)")
    absr = np.abs(out["rel_err"].to_numpy())
    summ = {"shapes": int(table.height), "r2": r2,
            "coefficients": {"c0_s": float(coef[0]), "c_prefill_s": float(coef[1]), "c_decode_s": float(coef[2]),
                             "c_kv_s": float(coef[3]), "c_attn_s": float(coef[4])},
            "median_abs_rel_err": float(np.median(absr)), "max_abs_rel_err": float(absr.max()),
            "max_abs_loo_rel_err": float(np.nanmax(np.abs(loo))) if np.isfinite(loo).any() else math.nan,
            "target": TARGET_SHAPE_ERROR, "shapes_within_target": int((absr <= TARGET_SHAPE_ERROR).sum())}
    return prof, out, summ


def drift(rows: pl.DataFrame, time_column: str = "step_wall_s") -> dict:
    """The reference shape's median per round and their spread (max/min - 1): the machine's speed drift
    over the measurement."""
    ref = rows.filter(pl.col("reference"))
    if ref.height == 0:
        return {"per_round_median_s": [], "spread": math.nan}
    med = ref.group_by("round").agg(pl.col(time_column).median()).sort("round")[time_column].to_list()
    return {"per_round_median_s": med, "spread": float(max(med) / min(med) - 1) if med and min(med) > 0 else math.nan}


def speed_band(rows: pl.DataFrame, quantiles: tuple[float, float] = (0.1, 0.9),
               time_column: str = "step_wall_s") -> dict:
    """The machine's speed states as the step grid met them: per visit of a shape (its steps in one round) the
    visit's median step time over the shape's median over all rounds; ``lo``/``hi`` = the ``quantiles`` of those
    ratios over every visit (the reference shape's included). Measured before any replay, so a band of the
    prediction scaled by them is a prediction interval for the machine's speed, not a fit
    to the replays. NaN bounds without two rounds."""
    how = (f"quantiles {quantiles[0]:g} / {quantiles[1]:g} over the step grid's shape visits (one shape's steps in one "
           "round) of the visit's median step time / the shape's median over all rounds")
    if rows.height == 0 or rows["round"].n_unique() < 2:
        return {"lo": math.nan, "hi": math.nan, "visits": 0, "how": how}
    per = rows.group_by(["shape", "round"]).agg(pl.col(time_column).median().alias("m"))
    per = per.join(per.group_by("shape").agg(pl.col("m").median().alias("all")), on="shape")
    r = (per["m"] / per["all"]).to_numpy().astype(float)
    r = r[np.isfinite(r) & (r > 0)]
    if r.size < 2:
        return {"lo": math.nan, "hi": math.nan, "visits": int(r.size), "how": how}
    return {"lo": float(np.quantile(r, quantiles[0])), "hi": float(np.quantile(r, quantiles[1])),
            "visits": int(r.size), "quantiles": list(quantiles), "how": how}


def repeat_cv(rows: pl.DataFrame, time_column: str = "step_wall_s") -> dict:
    """The engine's measured repeat noise: per round the machine's speed -- the median over shapes of the
    shape's median step time in that round over its median in all rounds -- and the relative standard deviation
    of those speeds over the rounds (the same work timed at different moments, as two replays of one window are;
    every shape counts, so one slow step of the small reference shape does not decide it; each shape's round
    medians are divided by their mean over the rounds). A whole run's
    latencies scale with the machine's speed during that run, so this is what the power calculation takes as
    ``noise_cv``. ``cv`` is NaN with fewer than two rounds."""
    how = "relative SD over the step grid's rounds of the round's speed (median over shapes of round median / mean)"
    if rows.height == 0 or rows["round"].n_unique() < 2:
        return {"cv": math.nan, "rounds": int(rows["round"].n_unique()) if rows.height else 0, "how": how}
    per = rows.group_by(["shape", "round"]).agg(pl.col(time_column).median().alias("m"))
    # over the mean of the shape's round medians (a median of 3 rounds would be one of them: ratios of exactly 1)
    per = per.join(per.group_by("shape").agg(pl.col("m").mean().alias("all")), on="shape")
    speed = per.group_by("round").agg((pl.col("m") / pl.col("all")).median().alias("f")).sort("round")["f"].to_numpy()
    speed = speed[np.isfinite(speed)]
    cv = float(np.std(speed, ddof=1) / np.mean(speed)) if speed.size >= 2 and np.mean(speed) > 0 else math.nan
    return {"cv": cv, "rounds": int(speed.size), "per_round_speed": speed.tolist(), "how": how}
