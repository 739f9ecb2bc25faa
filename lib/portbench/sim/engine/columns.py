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
set-ups to the same records, counters and step log. What does not depend on the scheduler is kept in a
:class:`Window`, which a campaign's shard builds once and every run on the window reuses.
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
    service_s: np.ndarray        # the records' isolated service times


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


def service_times(eng: Engine, profile, pro: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The requests' isolated service times (the records' ``service_s``): prompt ``pro`` and output ``out`` alone
    on the engine's profile, prompts chunked by its token budget where its batching chunks them."""
    n = pro.shape[0]
    svc = (profile.isolated_service_s(pro, out, eng.B if eng.mode.chunked else None) if hasattr(profile, "prefill_s")
           else profile.isolated_service_s(pro, out)) if n else np.zeros(0)
    return np.asarray(svc, dtype=float).reshape(n)


class Window:
    """A window table with the part of :func:`prepare` that does not depend on the scheduler computed once and
    kept: the checked columns, the context limit's clipping, the arrival order, the prompt-hash ids, the
    prediction columns, the tenants (and their index), the never-fits flags and the isolated service times,
    each for the settings it depends on. Every scheduler x replicate of a campaign's shard runs on the same
    scaled window (:class:`~portbench.study.campaign.engines.SimEngine` holds one per shard), so this set-up is
    paid once per (window, region), not once per run: ``simulate(Window(df), ...)`` gives the records of
    ``simulate(df, ...)``, bit for bit. The arrays are shared by the runs (and the records of their results):
    nothing may write into them."""

    __slots__ = ("df", "_base", "_memo")

    def __init__(self, df):
        self.df = df
        self._base: tuple | None = None
        self._memo: dict = {}

    def base(self):
        """``(arrival, prompt, trace output, tenant Series, hash lens, hash values)`` of a window the column
        set-up reads, else None (:func:`_window`, :func:`_hashes`)."""
        if self._base is None:
            w = _window(self.df)
            h = _hashes(self.df) if w is not None else None
            self._base = (None,) if w is None or h is None else (*w, *h)
        return None if self._base[0] is None else self._base

    def prime(self, profile, horizon_s: float) -> "Window":
        """Compute now what every run on the window reads (a campaign's shard computes it in its first run):
        the checked columns, the context limit of ``profile``, the order, the arrivals by ``horizon_s``, the
        predictions, tenants and prompt-hash ids. Returns the window."""
        b = self.base()
        if b is not None:
            self.limited(int(getattr(profile, "max_model_len", 0) or 0))
            self.n_arrivable(float(horizon_s))
            self.predictions()
            self.tenant_codes()
            self.tenant_index()
            if b[4] is not None and b[4].any():
                self.hash_ids()
        return self

    def _get(self, key, make):
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = make()
        return v

    def limited(self, mml: int) -> tuple[np.ndarray, np.ndarray]:
        """``(output, refused)`` under the context limit ``mml`` (0: none; requests_from_window)."""
        def make():
            _, pro, trace_out = self._base[:3]
            refused = pro >= mml if mml else np.zeros(pro.shape[0], bool)
            refused.flags.writeable = False      # the records' column, shared by the runs' results
            if not mml:
                return trace_out, refused
            return np.where(~refused & (pro + trace_out > mml), mml - pro, trace_out), refused
        return self._get(("limit", mml), make)

    def predictions(self) -> dict:
        """The prediction columns (:func:`~portbench.sim.request._prediction_arrays`; a bad column raises each time)."""
        return self._get("pred", lambda: _prediction_arrays(self.df, self._base[0].shape[0]))

    def tenants(self) -> list:
        return self._get("tenants", lambda: self._base[3].to_list())

    def tenant_codes(self) -> tuple[list, np.ndarray]:
        """``(sorted tenants, each request's index into them)`` (VTC's counter order)."""
        def make():
            ten = self.tenants()
            tix = {t: i for i, t in enumerate(sorted(set(ten)))}
            return list(tix), np.fromiter((tix[t] for t in ten), np.int64, len(ten))
        return self._get("tcodes", make)

    def tenant_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``numpy.unique`` of the tenants as strings with ``return_inverse`` (:func:`portbench.sim.metrics.compute`'s
        ``tenant_index``)."""
        return self._get("tindex", lambda: np.unique(self._base[3].cast(str).to_numpy(), return_inverse=True))

    def order(self) -> tuple[np.ndarray, np.ndarray]:
        """``(arrival order, sorted arrival times)`` ((arrival, id))."""
        def make():
            arr = self._base[0]
            order = np.argsort(arr, kind="stable")
            return order, arr[order]
        return self._get("order", make)

    def n_arrivable(self, H: float) -> int:
        return self._get(("arrivable", H), lambda: int(np.searchsorted(self.order()[1], H, side="right"))
                         if not math.isinf(H) else self._base[0].shape[0])

    def never_fits(self, mml: int, cap_tokens: int) -> np.ndarray:
        def make():
            out, refused = self.limited(mml)
            return refused | (self._base[1] + out > cap_tokens)
        return self._get(("never", mml, cap_tokens), make)

    def hash_ids(self) -> tuple[np.ndarray, np.ndarray]:
        return self._get("hids", lambda: hash_ids(self._base[4], self._base[5]))

    def service_s(self, eng: Engine, profile, out: np.ndarray) -> np.ndarray:
        """The requests' isolated service times (the records' ``service_s``) for this engine's profile and token
        budget (:func:`service_times`)."""
        key = ("svc", id(profile), eng.B if eng.mode.chunked else None, id(out))
        v = self._memo.get(key)
        if v is None:       # the profile and the output array are held with it: their ids stay theirs
            v = self._memo[key] = (service_times(eng, profile, self._base[1], out), profile, out)
            v[0].flags.writeable = False         # the records' column, shared by the runs' results
        return v[0]


def prepare(window_df, sched, profile, H: float, rng, slo, settings, *, hash_block_tokens, marks,
            record_iterations: bool, check_contract: bool) -> Prepared | None:
    """:class:`Prepared` for the compiled loop (:func:`portbench.sim.engine.compiled.run`), the
    policy reset with the run's context; None when the reference set-up must run (module docstring).
    ``window_df``: the window table, or a :class:`Window` of it (its scheduler-independent set-up kept for
    the next run)."""
    win = window_df if isinstance(window_df, Window) else Window(window_df)
    b = win.base()
    if b is None:
        return None
    arr, pro, trace_out, ten, lens, _ = b
    static = bool(getattr(sched, "static_priority", False))
    keys = STATIC_KEYS.get(type(sched).priority) if static else None
    if static and keys is None:
        return None
    n = arr.shape[0]
    mml = int(getattr(profile, "max_model_len", 0) or 0)
    out, refused = win.limited(mml)          # the context limit (requests_from_window)
    ctx = RunContext(n=n, arrival_s=arr, prompt_tokens=pro, output_tokens=out, tenant=list(win.tenants()),
                     profile=profile, rng=rng, slo=slo, **win.predictions())
    sched.reset(ctx)
    eng = Engine([], sched, profile, H, False, record_iterations, False, check_contract, settings=settings,
                 hash_block_tokens=hash_block_tokens, marks=marks)
    if lens is not None and lens.any():      # any(r.hashes for r in reqs)
        eng._init_prefix_cache(settings, cast(Any, _HASHED), hash_block_tokens)
    order, arr_t = win.order()
    eng.arr_t = cast(Any, arr_t)          # an array where the reference keeps a list (read-only here)
    eng.n_arrivable = win.n_arrivable(H)
    never = win.never_fits(mml, eng.cap * eng.bs)
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
        names, codes = win.tenant_codes()
        if names == sorted(sched._counter):
            tenant = codes
        else:                    # pragma: no cover - vtc's counter holds the window's tenants
            tix = {t: i for i, t in enumerate(sorted(sched._counter))}
            tenant = np.fromiter((tix[t] for t in ctx.tenant), np.int64, n)
    hoff, hid = win.hash_ids() if eng.pc_on else (np.zeros(n + 1, np.int64), np.zeros(0, np.int64))
    cols_ = Columns(prompt=pro, output=out, target=pro.copy(), generated=np.zeros(n, np.int64),
                    prefilled=np.zeros(n, np.int64), high=np.zeros(n, np.int64), rank=rank,
                    never_fits=never.astype(np.int64), arrival=arr, tenant=tenant, order=order, arr_t=arr_t,
                    suffix=suffix, hoff=hoff, hid=hid)
    return Prepared(eng, cols_, ten, refused, trace_out, win.service_s(eng, profile, out))
