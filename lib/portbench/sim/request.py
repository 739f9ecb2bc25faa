"""A request as the engine and the schedulers see it, and what a scheduler may look at when a run starts.

:class:`Request` is one window row's simulation state (only the engine writes it);
:class:`RunContext` is handed to :meth:`~portbench.sim.schedulers.BaseScheduler.reset`;
:func:`requests_from_window` builds both from a window table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ..core.errors import DataError

NOT_ARRIVED, WAITING, RUNNING, PAUSED, FINISHED, REJECTED = -1, 0, 1, 2, 3, 4
STATE_NAMES = {NOT_ARRIVED: "not_arrived", WAITING: "waiting", RUNNING: "running", PAUSED: "paused",
               FINISHED: "finished", REJECTED: "rejected"}
WINDOW_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "tenant")
# Optional columns of the table a run is given (never of the frozen window table): the window's frozen
# predictions (portbench.data.predictors) -- the only output-length information non-oracle policies see.
PREDICTION_COLUMNS = ("predicted_output", "ltr_score")
_NAN = float("nan")


class Request:
    """One request's simulation state (schedulers read it; only the engine writes it).

    ``id`` (window row), ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (the truth: only
    oracle policies should read it), ``tenant``, ``generated`` (tokens streamed so far; for
    requests in the decode batch it is brought up to date before any scheduler hook sees them),
    ``prefilled`` / ``prefill_target`` (progress of the current prefill: P + g tokens),
    ``blocks`` (KV blocks held), ``state`` (WAITING, RUNNING, PAUSED, FINISHED, REJECTED),
    ``preemptions`` (recompute evictions), ``pauses``, ``first_token_s``, ``finish_s``,
    ``waiting_since`` (arrival or last eviction), ``key`` (the (priority, id) the engine last
    ranked it by, preemptive policies), ``refused`` (prompt longer than the context limit),
    ``trace_output_tokens`` (the trace's output length; ``output_tokens`` is clipped to
    ``max_model_len − prompt``), ``hashes`` (prompt block hashes, prefix caching), ``swapped``
    (KV in host memory), ``admitted_s`` (first admission). The rest is engine bookkeeping.
    """

    __slots__ = ("id", "arrival_s", "prompt_tokens", "output_tokens", "tenant", "generated", "prefilled",
                 "prefill_target", "blocks", "state", "preemptions", "pauses", "first_token_s", "finish_s",
                 "waiting_since", "rank", "never_fits", "chunk", "gbase", "cver", "key", "mark",
                 "refused", "trace_output_tokens", "hashes", "nshared", "hit", "swapped", "swap_blocks",
                 "high", "admitted_s", "swaps")

    def __init__(self, rid: int, arrival_s: float, prompt: int, output: int, tenant, hashes=None):
        self.id = rid
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt
        self.output_tokens = output
        self.tenant = tenant
        self.generated = 0
        self.prefilled = 0
        self.prefill_target = prompt
        self.blocks = 0
        self.state = NOT_ARRIVED
        self.preemptions = 0
        self.pauses = 0
        self.first_token_s = _NAN
        self.finish_s = _NAN
        self.waiting_since = arrival_s
        self.rank = 0
        self.never_fits = False
        self.chunk = 0
        self.gbase = 0
        self.cver = 0
        self.key: Any = None
        self.mark = -1
        self.refused = False          # prompt >= max_model_len: refused at arrival (vLLM: HTTP 400)
        self.trace_output_tokens = output
        self.hashes = hashes          # prompt block hashes (one per hash block of tokens) or None
        self.nshared = 0              # prefix-cache entries this request references
        self.hit = 0                  # cache entries hit at its last admission
        self.swapped = False          # its KV is in host memory (swap preemption)
        self.swap_blocks = 0
        self.high = 0                 # highest prompt position ever computed (work accounting)
        self.admitted_s = _NAN        # first admission
        self.swaps = 0

    @property
    def resident(self) -> bool:
        """Holds KV blocks (running or paused)."""
        return self.state == RUNNING or self.state == PAUSED

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def decoding(self) -> bool:
        """Resident with its prefill complete (its next iteration is a decode)."""
        return (self.state == RUNNING or self.state == PAUSED) and self.prefilled == self.prefill_target

    def __repr__(self) -> str:
        return (f"Request(id={self.id}, state={STATE_NAMES[self.state]}, P={self.prompt_tokens}, "
                f"O={self.output_tokens}, g={self.generated}, prefilled={self.prefilled}/"
                f"{self.prefill_target}, blocks={self.blocks})")


@dataclass
class RunContext:
    """What a scheduler may look at when a run starts (:meth:`BaseScheduler.reset`).

    Arrays are indexed by request id (= the row of the window table). ``rng`` is the run's only
    source of randomness (``numpy.random.default_rng(seed)``); ``slo`` is the SLO definition the
    run was given (``{"ttft_s", "tpot_s"}``, for deadline-based policies) or None.
    ``predicted_output`` (tokens, > 0) and ``ltr_score`` (lower = predicted shorter) are the window's
    frozen predictions when the run was given them (columns :data:`PREDICTION_COLUMNS`), else None:
    ``sjf_predicted``, ``ltr`` and ``edf`` read only these, never ``output_tokens``.
    """

    n: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tenant: list
    profile: Any
    rng: np.random.Generator
    slo: Mapping | None = None
    predicted_output: np.ndarray | None = None
    ltr_score: np.ndarray | None = None


def _prediction_arrays(window_df, n: int) -> dict:
    """The optional prediction columns as float arrays (checked: finite; predicted_output > 0)."""
    out = {}
    cols = window_df.columns if isinstance(window_df, pl.DataFrame) else list(window_df)
    for name in PREDICTION_COLUMNS:
        if name not in cols:
            continue
        col = window_df[name]
        v = np.asarray(col.cast(pl.Float64).to_numpy() if isinstance(col, pl.Series) else col, dtype=float)
        if v.shape != (n,) or not np.isfinite(v).all() or (name == "predicted_output" and (v <= 0).any()):
            raise DataError("window", f"{name} must be {n} finite values" + (" > 0" if name == "predicted_output"
                                                                              else ""), column=name)
        out[name] = v
    return out


def _window_arrays(window_df) -> tuple[list, list, list, list]:
    if isinstance(window_df, pl.DataFrame):
        missing = [c for c in WINDOW_COLUMNS[:3] if c not in window_df.columns]
        if missing:
            raise DataError("window", f"missing columns {missing}; expected {list(WINDOW_COLUMNS)}")
        arr = window_df["arrival_s"].cast(pl.Float64).to_list()
        pro = window_df["prompt_tokens"].cast(pl.Int64).to_list()
        out = window_df["output_tokens"].cast(pl.Int64).to_list()
        ten = (window_df["tenant"].cast(pl.Utf8).to_list() if "tenant" in window_df.columns
               else ["t0"] * window_df.height)
    else:  # a mapping of sequences
        arr = [float(x) for x in window_df["arrival_s"]]
        pro = [int(x) for x in window_df["prompt_tokens"]]
        out = [int(x) for x in window_df["output_tokens"]]
        ten = [str(x) for x in window_df["tenant"]] if "tenant" in window_df else ["t0"] * len(arr)
    for name, col in (("arrival_s", arr), ("prompt_tokens", pro), ("output_tokens", out)):
        if any(v is None for v in col):
            raise DataError("window", "null values", column=name)
    if any(not math.isfinite(a) or a < 0 for a in arr):
        raise DataError("window", "arrival_s must be finite and >= 0", column="arrival_s")
    if any(p <= 0 for p in pro) or any(o <= 0 for o in out):
        raise DataError("window", "prompt_tokens and output_tokens must be > 0")
    return arr, pro, out, ten


def _window_hashes(window_df) -> list | None:
    """The optional ``block_hashes`` column (one list of ints per request, one hash per hash block of
    prompt tokens), or None."""
    if isinstance(window_df, pl.DataFrame):
        if "block_hashes" not in window_df.columns:
            return None
        col = window_df["block_hashes"]
        if not isinstance(col.dtype, pl.List):
            raise DataError("window", f"block_hashes must be a list of integer hashes per request, got {col.dtype}",
                            column="block_hashes")
        return [tuple(v) if v is not None else () for v in col.to_list()]
    if "block_hashes" in window_df:
        return [tuple(v) if v is not None else () for v in window_df["block_hashes"]]
    return None


def requests_from_window(window_df, profile, rng, slo=None, max_model_len: int = 0
                         ) -> tuple[list[Request], RunContext]:
    """The window's requests and the scheduler's :class:`RunContext`. With ``max_model_len`` > 0 the
    context limit is applied as vLLM applies it: a prompt of ``max_model_len`` tokens or more is
    refused (``refused``), the output is clipped to ``max_model_len − prompt`` (``output_tokens``;
    the trace's value stays in ``trace_output_tokens``); schedulers see the clipped lengths."""
    arr, pro, out, ten = _window_arrays(window_df)
    hashes = _window_hashes(window_df)
    reqs = [Request(i, arr[i], pro[i], out[i], ten[i], hashes[i] if hashes is not None else None)
            for i in range(len(arr))]
    if max_model_len:
        for r in reqs:
            if r.prompt_tokens >= max_model_len:
                r.refused = True
            elif r.prompt_tokens + r.output_tokens > max_model_len:
                r.output_tokens = max_model_len - r.prompt_tokens
    ctx = RunContext(n=len(reqs), arrival_s=np.asarray(arr, dtype=float), prompt_tokens=np.asarray(pro),
                     output_tokens=np.asarray([r.output_tokens for r in reqs], dtype=np.int64),
                     tenant=ten, profile=profile, rng=rng, slo=slo, **_prediction_arrays(window_df, len(reqs)))
    return reqs, ctx
