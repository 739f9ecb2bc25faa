"""The compiled core's set-up straight from the window's columns: no :class:`~portbench.sim.request.Request`
objects, no per-request Python loop.

:func:`prepare` does what ``simulate``'s reference set-up does for a run the compiled core supports --
:func:`~portbench.sim.request.requests_from_window` (the checks of the window, the context limit), the
policy's ``reset``, the :class:`~portbench.sim.engine.core.Engine`'s configuration, the static policies'
ranks (:meth:`Engine.prepare_static_ranks`) and the prompt-hash ids -- with numpy on the window's columns, and
returns the engine (holding no requests) with the requests' :class:`~portbench.sim.engine.compiled.Columns`.
The static ranks come from each built-in static policy's key as arrays (:data:`STATIC_KEYS`: the same keys as
its ``priority``, sorted as the reference sorts them: by key, then request id). It returns None, before the
policy is reset (so the run's random generator is untouched), for anything it does not reproduce exactly --
a window that is not a polars DataFrame, bad values (the reference set-up then raises its one message),
null tenants, prompt hashes that are not integer lists without nulls, an empty window, a static policy
without an array key -- and ``simulate`` takes the reference set-up. ``tests/test_compiled_core.py`` holds both
set-ups to the same records, counters and step log.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, NamedTuple, cast

import numpy as np
import polars as pl

from ..request import WINDOW_COLUMNS, RunContext, _prediction_arrays
from ..schedulers.base import BaseScheduler
from ..schedulers.baseline import RandomOrder
from ..schedulers.deadline import _Deadline
from ..schedulers.length import SJFNoisyOracle, SJFOracle, SJFPredicted, SJFPrompt
from .compiled import Columns
from .compiled import dense_hash_ids as hash_ids   # (hoff, hid) from the hashes' lengths and values
from .core import Engine

# a built-in static policy's priority as arrays: the key columns, most significant first (ties: request id)
STATIC_KEYS = {
    BaseScheduler.priority: lambda pol, c: (c.arrival_s,),                            # fcfs, sarathi
    SJFPrompt.priority: lambda pol, c: (c.prompt_tokens, c.arrival_s),
    SJFOracle.priority: lambda pol, c: (c.output_tokens, c.arrival_s),
    SJFPredicted.priority: lambda pol, c: (np.asarray(pol._pred, dtype=float), c.arrival_s),
    SJFNoisyOracle.priority: lambda pol, c: (np.asarray(pol._pred, dtype=float), c.arrival_s),
    _Deadline.priority: lambda pol, c: (np.asarray(pol._deadline, dtype=float), c.arrival_s),
    RandomOrder.priority: lambda pol, c: (np.asarray(pol._u, dtype=float),),
}

_HASHED = (SimpleNamespace(hashes=(0,)),)    # "the window has prompt hashes", for Engine._init_prefix_cache


class Prepared(NamedTuple):
    """What :func:`prepare` returns: the engine (configured, holding no requests), the requests' columns for the
    compiled loop, and the record columns the loop does not produce."""

    engine: Engine
    columns: Columns
    tenant: pl.Series            # the records' tenant column
    refused: np.ndarray          # prompt >= max_model_len
    trace_output: np.ndarray     # the trace's output lengths (before the context limit's clipping)


def _window(window_df):
    """``(arrival, prompt, output, tenant Series)`` of a valid window table, else None."""
    if not isinstance(window_df, pl.DataFrame) or not window_df.height:
        return None
    if any(c not in window_df.columns for c in WINDOW_COLUMNS[:3]):
        return None
    try:
        arr = window_df["arrival_s"].cast(pl.Float64)
        pro = window_df["prompt_tokens"].cast(pl.Int64)
        out = window_df["output_tokens"].cast(pl.Int64)
        ten = (window_df["tenant"].cast(pl.Utf8) if "tenant" in window_df.columns
               else pl.Series("tenant", ["t0"] * window_df.height, dtype=pl.Utf8))
    except pl.exceptions.PolarsError:
        return None
    if arr.null_count() or pro.null_count() or out.null_count() or ten.null_count():
        return None
    a, p, o = arr.to_numpy().copy(), pro.to_numpy().copy(), out.to_numpy().copy()
    if not (np.isfinite(a).all() and (a >= 0).all() and (p > 0).all() and (o > 0).all()):
        return None
    return a, p, o, ten.alias("tenant")


def _hashes(window_df):
    """``(lens, flat)`` of the window's ``block_hashes`` column (hashes per request, all hashes in request
    order; ``(None, None)`` without the column), read from its Arrow buffers; None when the column is not
    what the compiled core's vectorised hash ids read (integer lists without null elements)."""
    if "block_hashes" not in window_df.columns:
        return None, None
    col = window_df["block_hashes"]
    if not isinstance(col.dtype, pl.List) or not col.dtype.inner.is_integer():
        return None
    a = col.to_arrow()
    if a.null_count == 0:
        off = a.offsets.to_numpy()
        vals = a.values.slice(int(off[0]), int(off[-1] - off[0]))
        lens = np.diff(off).astype(np.int64)
    else:                          # null lists: lengths 0, their values (if any) left out
        import pyarrow.compute as pc

        vals = a.flatten()
        lens = pc.fill_null(pc.list_value_length(a), 0).to_numpy().astype(np.int64)
    if vals.null_count:
        return None
    return lens, vals.to_numpy()


def prepare(window_df, sched, profile, H: float, rng, slo, settings, *, hash_block_tokens, marks,
            record_iterations: bool, check_contract: bool) -> Prepared | None:
    """:class:`Prepared` for the compiled loop (:func:`portbench.sim.engine.compiled.run`), the
    policy reset with the run's context; None when the reference set-up must run (module docstring)."""
    w = _window(window_df)
    if w is None:
        return None
    hashes = _hashes(window_df)
    if hashes is None:
        return None
    lens, flat = hashes
    static = bool(getattr(sched, "static_priority", False))
    keys = STATIC_KEYS.get(type(sched).priority) if static else None
    if static and keys is None:
        return None
    arr, pro, trace_out, ten = w
    n = arr.shape[0]
    mml = int(getattr(profile, "max_model_len", 0) or 0)
    out = trace_out
    refused = np.zeros(n, bool)
    if mml:                      # the context limit (requests_from_window)
        refused = pro >= mml
        out = np.where(~refused & (pro + trace_out > mml), mml - pro, trace_out)
    ctx = RunContext(n=n, arrival_s=arr, prompt_tokens=pro, output_tokens=out, tenant=ten.to_list(),
                     profile=profile, rng=rng, slo=slo, **_prediction_arrays(window_df, n))
    sched.reset(ctx)
    eng = Engine([], sched, profile, H, False, record_iterations, False, check_contract, settings=settings,
                 hash_block_tokens=hash_block_tokens, marks=marks)
    if lens is not None and lens.any():      # any(r.hashes for r in reqs)
        eng._init_prefix_cache(settings, cast(Any, _HASHED), hash_block_tokens)
    order = np.argsort(arr, kind="stable")          # (arrival, id)
    arr_t = arr[order]
    eng.arr_t = arr_t
    eng.n_arrivable = int(np.searchsorted(arr_t, H, side="right")) if not math.isinf(H) else n
    never = refused | (pro + out > eng.cap * eng.bs)
    rank = np.zeros(n, np.int64)
    suffix = np.zeros(n + 1, np.int64)
    if static:                   # Engine.prepare_static_ranks: dense rank of (key, id)
        cols = keys(sched, ctx)
        by = np.lexsort((np.arange(n),) + tuple(reversed(cols)))
        rank[by] = np.arange(n)
        big = n + 1
        v = np.where(never[order], big, rank[order])
        suffix[:n] = np.minimum.accumulate(v[::-1])[::-1]
        suffix[n] = big
    tenant = None
    if sched.name == "vtc":
        tix = {t: i for i, t in enumerate(sorted(sched._counter))}
        tenant = np.fromiter((tix[t] for t in ctx.tenant), np.int64, n)
    hoff, hid = hash_ids(lens, flat) if eng.pc_on else (np.zeros(n + 1, np.int64), np.zeros(0, np.int64))
    cols_ = Columns(prompt=pro, output=out, target=pro.copy(), generated=np.zeros(n, np.int64),
                    prefilled=np.zeros(n, np.int64), high=np.zeros(n, np.int64), rank=rank,
                    never_fits=never.astype(np.int64), arrival=arr, tenant=tenant, order=order, arr_t=arr_t,
                    suffix=suffix, hoff=hoff, hid=hid)
    return Prepared(eng, cols_, ten, refused, trace_out)
