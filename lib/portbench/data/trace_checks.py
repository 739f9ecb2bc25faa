"""Trace hygiene: quantised timestamps (issue #25).

A trace whose arrival times sit on a coarse grid (Mooncake's on 3 s) puts many requests at the same instant:
bursts the service never saw, which change light-load queueing (and so rankings). :func:`timestamp_check`
measures it on any arrival column -- an official source's, a stand-in's or a user's:

* ``distinct_ratio``: distinct arrival times / requests (1 = every request has its own time);
* ``zero_gap_share``: share of consecutive gaps (sorted arrivals) that are exactly zero;
* ``grid_step_s``: the grid the non-zero gaps sit on -- the median of the smallest non-zero gaps (those within
  2 :data:`GRID_TOL` of the smallest) when at least :data:`GRID_SHARE` of the non-zero gaps are whole multiples
  of it (within :data:`GRID_TOL` of a step), else None;
* ``quantised``: ``zero_gap_share >= ZERO_GAP_FLAG`` or a grid step of at least :data:`MIN_STEP_S`.

:func:`jitter_arrivals` spreads the arrivals that share a grid point uniformly over the grid cell that
follows it (seeded), keeping their order -- the ``arrival_jitter`` sensitivity.
"""

from __future__ import annotations

import zlib

import numpy as np

ZERO_GAP_FLAG = 0.2      # quantised when at least this share of consecutive gaps is zero
GRID_SHARE = 0.99        # a grid: at least this share of the non-zero gaps are whole multiples of the step
GRID_TOL = 0.01          # tolerance of "a whole multiple", in steps (Mooncake's grid points are 3 s +- a few ms)
MIN_STEP_S = 0.1         # a grid coarser than this counts as quantised even without zero gaps


def _from_gaps(gaps: np.ndarray, requests: int, distinct: int) -> dict:
    if requests < 2 or gaps.size == 0:
        return {"requests": int(requests), "distinct_ratio": None, "zero_gap_share": None, "grid_step_s": None,
                "quantised": False}
    zero = float(np.mean(gaps == 0))
    nz = gaps[gaps > 0]
    step = None
    if nz.size:
        s0 = float(nz.min())
        s = float(np.median(nz[nz <= s0 * (1 + 2 * GRID_TOL)]))      # the step: the smallest gaps' median
        k = nz / s
        if np.mean(np.abs(k - np.round(k)) <= GRID_TOL) >= GRID_SHARE:
            step = s
    return {"requests": int(requests), "distinct_ratio": float(distinct / requests), "zero_gap_share": zero,
            "grid_step_s": step, "quantised": bool(zero >= ZERO_GAP_FLAG or (step is not None and step >= MIN_STEP_S))}


def timestamp_check(arrival_s) -> dict:
    """The quantisation measures of one arrival column (seconds; module docstring)."""
    return windows_check([arrival_s])


def sorted_timestamp_check(blocks) -> dict:
    """:func:`timestamp_check` of a non-decreasing, finite arrival column too large to hold at once: ``blocks()``
    gives the column's values in blocks (numpy arrays), and is called three times (counts and the smallest gap;
    the smallest gaps' median; the share of gaps on the grid). The same result as :func:`timestamp_check`; memory:
    one block plus the gaps near the smallest."""
    def gap_blocks():
        last = None
        for x in blocks():
            x = np.asarray(x, dtype=float)
            if x.size:
                yield np.diff(x) if last is None else np.diff(np.r_[last, x])
                last = x[-1]

    n = zeros = nonzero = 0
    s0 = np.inf
    for x in blocks():
        n += len(x)
    for g in gap_blocks():
        zeros += int(np.count_nonzero(g == 0))
        nz = g[g > 0]
        nonzero += nz.size
        if nz.size:
            s0 = min(s0, float(nz.min()))
    if n < 2:
        return _from_gaps(np.zeros(0), n, n)
    out = {"requests": int(n), "distinct_ratio": float((nonzero + 1) / n), "zero_gap_share": zeros / (n - 1),
           "grid_step_s": None, "quantised": False}
    if nonzero:
        small = np.concatenate([g[(g > 0) & (g <= s0 * (1 + 2 * GRID_TOL))] for g in gap_blocks()])
        s = float(np.median(small))
        on_grid = 0
        for g in gap_blocks():
            k = g[g > 0] / s
            on_grid += int(np.count_nonzero(np.abs(k - np.round(k)) <= GRID_TOL))
        if on_grid / nonzero >= GRID_SHARE:
            out["grid_step_s"] = s
    step = out["grid_step_s"]
    out["quantised"] = bool(out["zero_gap_share"] >= ZERO_GAP_FLAG or (step is not None and step >= MIN_STEP_S))
    return out


def jitter_arrivals(arrival_s, step_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrivals spread within their grid cell: each time ``t`` becomes ``t + U(0, step_s)``, the draws sorted
    within each group of equal times so that the requests keep their order (and no request passes the next
    grid point). Returns a new array in the input's order."""
    t = np.asarray(arrival_s, dtype=float)
    if step_s is None or step_s <= 0 or t.size == 0:
        return t.copy()
    u = rng.uniform(0.0, float(step_s), t.size)
    order = np.lexsort((np.arange(t.size), t))           # by time, then by position
    ts = t[order]
    start = np.r_[True, ts[1:] != ts[:-1]]
    grp = np.cumsum(start) - 1
    us = u[order]
    us = us[np.lexsort((us, grp))]                        # sorted draws within each group of equal times
    out = np.empty_like(t)
    out[order] = ts + us
    return out


def windows_check(arrivals) -> dict:
    """:func:`timestamp_check` over several windows' arrival arrays together: gaps within each window pooled
    (the gaps between windows are not gaps of the trace), distinct times counted per window."""
    gaps, distinct, n = [], 0, 0
    for a in arrivals:
        t = np.sort(np.asarray(a, dtype=float))
        t = t[np.isfinite(t)]
        gaps.append(np.diff(t))
        distinct += np.unique(t).size
        n += t.size
    return _from_gaps(np.concatenate(gaps) if gaps else np.zeros(0), n, distinct)


def seeded_rng(seed: int, key: str) -> np.random.Generator:
    """The jitter's random stream of one window: ``seed`` with a stable hash of ``key`` (the window id)."""
    return np.random.default_rng([int(seed), zlib.crc32(str(key).encode())])
