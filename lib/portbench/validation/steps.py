"""The engine's step time on a grid of fixed shapes, and the cost model fitted to per-shape medians.

Whole-run latencies integrate the CPU's heavy step-time tails; the median of a fixed-shape step is
precise to a few percent from tens of repetitions even on a loaded machine. So the timing side of the
validation measures shapes, not runs:

* **Grid** (:func:`grid`, ``validation.step_grid``; engine tokens): decode-only steps (batch B x
  context C per sequence, the pairs the KV cache holds: long contexts with small batches, as replays run them), prefill-only steps (P new tokens after Cc tokens already in the prefix
  cache) and mixed steps (B decodes at the smallest decode context, or at the context a ``[B, P, C]`` triple
  names, + a P-token prompt chunk).
* **Measurement** (:func:`measure`, needs vLLM): on the replays' own engine, before any replay -- vLLM's
  ``AsyncLLM`` with its engine core in a process of its own and this process as its client
  (:class:`.replay.Replayer`) -- and by the replays' clock: the engine's own step record (:mod:`.engine_scheduler`:
  ``schedule()`` to the end of ``update_from_output()``) plus its loop's gap to the next step
  (:func:`.replay.with_step_time`). An in-process ``LLMEngine.step()`` is not that engine: on a small CPU the
  engine core's step there runs alone, while behind ``AsyncLLM`` it shares the cores with its own output and socket
  threads and with the client's output handling, which preempt it every step -- the same decode shape measured
  both ways in one session, alternating, took markedly longer behind ``AsyncLLM``, most for the cheap decode steps,
  and a table measured in process under-predicted the replays' own decode steps. Per shape the client builds the
  engine state by sending requests as the replay's client does (``FINAL_ONLY`` outputs): a decode batch of B
  requests with C-token prompts runs until the step log shows the timed steps, after :data:`DECODE_SETTLE_STEPS`
  untimed ones (then it is aborted); a prefill step
  is a 1-token request of P new tokens after a Cc-token prefix cached by an earlier request (prefix caching on; an
  engine without it runs no such shape); a mixed step is such a request sent while a decode batch runs. The shape
  each timed step really had comes from the scheduler's own record. ``rounds`` interleaved rounds visit the shapes
  in a seeded random order, the **reference shape** (the first decode shape) before each round and after every
  third shape, so that drift of the machine's speed shows (``drift``: the reference's per-round medians).
* **Fit** (:func:`fit`): non-negative least squares (relative errors) of the cost model ``c0 + c_p P + c_d B + c_kv C +
  c_attn A`` (A = attention pairs of the prompt chunks, ``profiles.costmodel.attention_pairs``) to the
  per-shape medians -- the attention coefficient is estimated, not inherited. Per shape: the median
  with its distribution-free 95 % interval (order statistics), the fit's relative error with the
  interval it implies, and the leave-one-shape-out error (the fit without that shape: an honest
  prediction error).
"""

from __future__ import annotations

import dataclasses
import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import polars as pl
from scipy import optimize
from scipy import stats as sst

from ..core.errors import PortbenchError
from ..sim.profiles import Profile
from ..sim.profiles.costmodel import attention_pairs
from .policies import request_id
from .replay import read_iteration_log, with_step_time

MIXED_DECODE_CONTEXT = None   # mixed steps decode at the grid's smallest decode context
TARGET_SHAPE_ERROR = 0.05      # per-shape median error target (issue: <= 5 %)
# decode steps of a new batch left untimed: the first few decode steps after a batch's prefill run slower than the
# ones after them (measured on the replays' engine, alternating with replay-like request streams), and most of the
# replays' decode steps follow others of the same batch
DECODE_SETTLE_STEPS = 4


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


def grid(g, kv_tokens: int | None = None, prefix_caching: bool = True) -> list[Shape]:
    """The shapes of ``validation.step_grid`` (the first is the reference shape). ``kv_tokens``: the engine's KV
    cache in tokens; a decode shape whose batch cannot hold its context there -- ``B x (C + 1 + DECODE_SETTLE_STEPS + steps_per_shape)``
    tokens -- is left out (the grid's product of batches and contexts pairs long contexts with small batches only:
    the shapes the replays visit, a few sequences with thousands of tokens each). Without ``prefix_caching`` (the
    engine's) the prefill shapes after a cached context are left out: that engine cannot run them."""
    fits = (lambda b, c: True) if not kv_tokens else (
        lambda b, c: int(b) * (int(c) + 1 + DECODE_SETTLE_STEPS + int(g.steps_per_shape)) <= int(kv_tokens))
    out = [Shape("decode", b, c) for b in g.decode_batches for c in g.decode_contexts if b > 0 and fits(b, c)]
    out += [Shape("prefill", prefill_tokens=p, cached_context=cc) for p in g.prefill_tokens for cc in g.cached_contexts
            if p > 0 and (prefix_caching or not cc)]
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

POLL_S = 0.02          # how often the driver reads the engine's step log while a decode batch runs
SHAPE_TIMEOUT_S = 60.0  # the most one shape's state may take to build (a shape the engine never runs is left out)


class _Driver:
    """Builds each shape's state in the replays' engine (``AsyncLLM``, :class:`.replay.Replayer`) by sending requests
    as a client does, and reads the steps' times from the engine's own step log (:mod:`.engine_scheduler`)."""

    def __init__(self, r, vocab: int, seed: int, log_path, max_model_len: int, budget: int):
        self.r, self.vocab, self.mml, self.budget = r, int(vocab), int(max_model_len), int(budget)
        self.rng = np.random.default_rng(seed)
        self.n = 0
        self.fh = open(log_path)   # noqa: SIM115 - closed by close()
        self.log: list[dict] = []  # every step row the engine logged, in order
        self.partial = ""          # the start of a line the engine was still writing

    def close(self) -> None:
        self.fh.close()

    def _read(self) -> int:
        """Read the step rows logged since the last call (a line the engine is still writing waits for the next
        call); returns the number of rows read so far."""
        while True:
            line = self.fh.readline()
            if not line:
                break
            self.partial += line
            if not self.partial.endswith("\n"):
                break
            d, self.partial = json.loads(self.partial), ""
            if d.get("event") is None and (d.get("prefill_tokens") or d.get("decode_seqs")):
                self.log.append(d)
        return len(self.log)

    def _tokens(self, n: int) -> list[int]:
        return [int(x) for x in self.rng.integers(10, self.vocab, size=int(n))]

    def _send(self, tokens: list[int], max_tokens: int) -> tuple[str, asyncio.Task]:
        """One request as the replay's client sends it (FINAL_ONLY: no per-token work in the client)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.n += 1
        rid = request_id("fcfs", "grid", self.n)
        sp = SamplingParams(max_tokens=int(max_tokens), ignore_eos=True, temperature=0.0, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)

        async def go():
            async for _ in self.r.engine.generate(TokensPrompt(prompt_token_ids=tokens), sp, request_id=rid):
                pass
        return rid, asyncio.ensure_future(go())

    async def _decode_batch(self, b: int, c: int, until_steps: int) -> tuple[list[str], list[asyncio.Task], int]:
        """b requests of c-token prompts, running until the engine has logged ``until_steps`` decode-only steps of
        the b sequences, or has begun to preempt them (a batch at the KV cache's limit: its growing contexts no
        longer fit); returns their ids, tasks and the log index from which their steps count."""
        start = self._read()
        sent = [self._send(self._tokens(c), max(1, self.mml - c - 1)) for _ in range(b)]
        t = time.monotonic()
        while time.monotonic() - t < SHAPE_TIMEOUT_S and not all(x.done() for _, x in sent):
            await asyncio.sleep(POLL_S)
            self._read()
            new = self.log[start:]
            if (sum(1 for d in new if d["prefill_tokens"] == 0 and d["decode_seqs"] == b) >= until_steps
                    or any(d.get("preempted") for d in new)):
                break
        return [i for i, _ in sent], [x for _, x in sent], start

    async def _end(self, ids: list[str], tasks: list[asyncio.Task]) -> None:
        await self.r.engine.abort(ids)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _one_step_request(self, tokens: list[int]) -> int:
        """Send a 1-token request and wait for it; returns the log index of its first scheduled step."""
        start = self._read()
        _, task = self._send(tokens, 1)
        await task
        self._read()
        return next((start + j for j, d in enumerate(self.log[start:]) if d["prefill_tokens"] > 0), -1)

    async def measure(self, s: Shape, k: int) -> list[int]:
        """The log indices of ``k`` steps of shape ``s`` (fewer when the engine did not run it)."""
        if s.kind == "decode":
            ids, tasks, start = await self._decode_batch(s.decode_batch, s.decode_context,
                                                         DECODE_SETTLE_STEPS + k + 1)
            await self._end(ids, tasks)
            self._read()
            idx = []
            for j, d in enumerate(self.log[start:]):
                if d.get("preempted"):
                    break
                if d["prefill_tokens"] == 0 and d["decode_seqs"] == s.decode_batch:
                    idx.append(start + j)
            # the settled steps; a batch the engine began to preempt early gives what it ran
            return idx[min(DECODE_SETTLE_STEPS, max(0, len(idx) - k)):][:k]
        if s.kind == "prefill":
            prefix = self._tokens(s.cached_context)
            if s.cached_context:
                await self._one_step_request(prefix)
            idx = [await self._one_step_request(prefix + self._tokens(s.prefill_tokens)) for _ in range(k)]
            return [i for i in idx if i >= 0]
        ids, tasks, _ = await self._decode_batch(s.decode_batch, s.decode_context, 2)
        idx = [await self._one_step_request(self._tokens(s.prefill_tokens)) for _ in range(k)]
        await self._end(ids, tasks)
        self._read()
        return [i for i in idx if i >= 0 and self.log[i]["decode_seqs"] == s.decode_batch]


def _row(s: Shape, rec: dict) -> dict:
    p, b, c, a = s.model_inputs()
    return {"shape": s.name, "kind": s.kind, "step_s": float(rec["step_s"]), "iteration_s": float(rec["iteration_s"]),
            "gap_s": rec.get("gap_s"), "cpu_s": float(rec.get("cpu_s", math.nan)),
            "prefill_tokens": int(rec["prefill_tokens"]), "decode_seqs": int(rec["decode_seqs"]),
            "context_tokens": int(rec["context_tokens"]), "attention_pairs": a,
            "planned_prefill": p, "planned_decode": b,
            "as_planned": int(rec["prefill_tokens"]) == p and int(rec["decode_seqs"]) == b}


def measure(r, shapes: Sequence[Shape], *, rounds: int, steps_per_shape: int, seed: int, vocab: int) -> pl.DataFrame:
    """Time the grid on the replays' running engine ``r`` (an open :class:`.replay.Replayer` that logs its steps):
    vLLM's ``AsyncLLM``, its engine core in a process of its own, this process its client. A step's time is what the
    replays' steps are measured by (:func:`.replay.with_step_time`: the engine's logged step plus its loop's gap to
    the next step). Returns one row per timed step."""
    log_path = r.iteration_log
    if log_path is None or not r.spec.record_iterations:
        raise PortbenchError("the step grid needs an engine that logs its steps (Replayer with an iteration log)")
    inits, _ = read_iteration_log(log_path)
    init = inits[-1] if inits else {}
    drv = _Driver(r, vocab, seed, log_path, int(init.get("max_model_len") or r.spec.resolved_max_model_len()),
                  int(init.get("max_num_batched_tokens") or r.spec.max_batched_tokens or 0))
    try:
        timed = []
        for rnd, i in schedule(shapes, rounds, seed):
            for j in r.run(drv.measure(shapes[i], steps_per_shape)):
                timed.append((j, rnd, i))
    finally:
        drv.close()
    _, logged = read_iteration_log(log_path)
    st = with_step_time(logged).to_dicts()
    return pl.DataFrame([{**_row(shapes[i], st[j]), "round": rnd, "reference": i == 0}
                         for j, rnd, i in timed if j < len(st)])


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


def shape_table(rows: pl.DataFrame, time_column: str = "step_s") -> pl.DataFrame:
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


def drift(rows: pl.DataFrame, time_column: str = "step_s") -> dict:
    """The reference shape's median per round and their spread (max/min - 1): the machine's speed drift
    over the measurement."""
    ref = rows.filter(pl.col("reference"))
    if ref.height == 0:
        return {"per_round_median_s": [], "spread": math.nan}
    med = ref.group_by("round").agg(pl.col(time_column).median()).sort("round")[time_column].to_list()
    return {"per_round_median_s": med, "spread": float(max(med) / min(med) - 1) if med and min(med) > 0 else math.nan}


def repeat_cv(rows: pl.DataFrame, time_column: str = "step_s") -> dict:
    """The engine's measured repeat noise: per round the machine's speed -- the median over shapes of the
    shape's median step time in that round over its median in all rounds -- and the relative standard deviation
    of those speeds over the rounds (the same work timed at different moments, as two replays of one window are;
    every shape counts, so one slow step of the small reference shape does not decide it; each shape's round
    medians are divided by their mean over the rounds). A whole run's
    latencies scale with the machine's speed during that run, so this is what the power calculation takes as
    ``noise_cv`` (:func:`.prereg.power`). ``cv`` is NaN with fewer than two rounds."""
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
