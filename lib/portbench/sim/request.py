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
    ranked it by, preemptive policies). The rest is engine bookkeeping.
    """

    __slots__ = ("id", "arrival_s", "prompt_tokens", "output_tokens", "tenant", "generated", "prefilled",
                 "prefill_target", "blocks", "state", "preemptions", "pauses", "first_token_s", "finish_s",
                 "waiting_since", "rank", "never_fits", "chunk", "gbase", "cver", "key", "mark")

    def __init__(self, rid: int, arrival_s: float, prompt: int, output: int, tenant):
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
        self.key = None
        self.mark = -1

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
    """

    n: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tenant: list
    profile: Any
    rng: np.random.Generator
    slo: Mapping | None = None


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


def requests_from_window(window_df, profile, rng, slo=None) -> tuple[list[Request], RunContext]:
    arr, pro, out, ten = _window_arrays(window_df)
    reqs = [Request(i, arr[i], pro[i], out[i], ten[i]) for i in range(len(arr))]
    ctx = RunContext(n=len(reqs), arrival_s=np.asarray(arr, dtype=float), prompt_tokens=np.asarray(pro),
                     output_tokens=np.asarray(out), tenant=ten, profile=profile, rng=rng, slo=slo)
    return reqs, ctx
