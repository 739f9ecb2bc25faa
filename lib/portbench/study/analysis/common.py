"""Helpers shared by the analysis modules: long tables from arrays, summary numbers with counts and CIs, tie definitions."""

from __future__ import annotations

import math
import warnings
import zlib

import numpy as np
import polars as pl

from .. import stats
from .columns import COLUMNS



def _frame(dims: dict[str, list], **arrays) -> pl.DataFrame:
    """A long table from arrays whose axes are ``dims`` (in order, C order flattening)."""
    shape = tuple(len(v) for v in dims.values())
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    cols = {name: np.asarray(vals, dtype=object)[g.ravel()].tolist() if len(vals) else []
            for (name, vals), g in zip(dims.items(), grids)}
    for name, arr in arrays.items():
        a = np.asarray(arr)
        cols[name] = np.broadcast_to(a, shape).ravel() if a.shape != shape else a.ravel()
    return pl.DataFrame(cols)


def _num(x):
    """JSON-safe number (NaN -> None, numpy scalars -> Python)."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else float(f"{x:.6g}")


def _stat(value, definition: str, count=None, ci=None, **extra) -> dict:
    out = {"value": _num(value), "definition": definition}
    if count is not None:
        out["count"] = _num(count)
    if ci is not None:
        out["ci"] = [_num(ci[0]), _num(ci[1])]
    out.update({k: (_num(v) if isinstance(v, (float, int, np.floating, np.integer)) else v)
                for k, v in extra.items()})
    return out


def _mean_with_ci(point, boot, mask=None) -> tuple[float, tuple, int]:
    """Mean of the defined ``point`` values (optionally within ``mask``) and its bootstrap CI.

    ``boot`` has the shape of ``point`` plus a last resample axis (or is None).
    """
    point = np.asarray(point, dtype=float)
    sel = ~np.isnan(point) if mask is None else (~np.isnan(point) & mask)
    n = int(sel.sum())
    if n == 0:
        return float("nan"), (float("nan"), float("nan")), 0
    value = float(point[sel].mean())
    if boot is None:
        return value, (float("nan"), float("nan")), n
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        bm = np.nanmean(np.asarray(boot)[sel], axis=0)
    lo, hi = stats.percentile_ci(bm)
    return value, (float(lo), float(hi)), n


def _rate_with_ci(point, boot) -> tuple[float, tuple, int]:
    """Fraction of True in ``point`` with the bootstrap CI of the fraction (boot: extra last axis)."""
    point = np.asarray(point, dtype=float)
    value = float(point.mean()) if point.size else float("nan")
    if boot is None or point.size == 0:
        return value, (float("nan"), float("nan")), int(point.sum())
    bm = np.asarray(boot, dtype=float).reshape(-1, np.asarray(boot).shape[-1]).mean(axis=0)
    lo, hi = stats.percentile_ci(bm)
    return value, (float(lo), float(hi)), int(point.sum())


def _tau_points(x1, x2, lead_shape) -> np.ndarray:
    """scipy Kendall tau-b for every leading index; ``x1``/``x2`` (..., K)."""
    out = np.full(lead_shape, np.nan)
    for idx in np.ndindex(*lead_shape):
        out[idx] = stats.kendall_tau(x1[idx], x2[idx])
    return out


def _source_rng(seed: int, source: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(source.encode())])


def _empty(table: str) -> pl.DataFrame:
    return pl.DataFrame({c: [] for c in COLUMNS[table]})


def tied_ranks_definition(tol: float) -> str:
    """How scheduler means are ranked (for summary.json and the notebooks' method text)."""
    base = ("schedulers are ranked by their mean over windows, 1 = best (direction from the metric registry); "
            "tied schedulers share the average of the ranks they span")
    if tol == 0:
        return base + "; rank_tolerance = 0: only exactly equal means are tied"
    return (base + f"; practically tied ranks with rank_tolerance = {tol:g}: sorted best first, a new tie group "
            f"starts wherever the relative gap |x - y| / ((|x| + |y|) / 2) to the next-better mean is at least "
            f"{tol:g} ({100 * tol:g}%), so means closer than that are tied (single linkage: a chain of small gaps "
            "can tie means that differ by more than the tolerance end to end; see rank_ties)")


def _tie_note(tol: float) -> str:
    return "exact ranks" if tol == 0 else f"means within {100 * tol:g}% tied"


def sensitivity_tolerances(tol: float) -> list[float]:
    """The rank tolerances of the sensitivity table: 0 (exact ranks), half, the chosen one, double."""
    return sorted({0.0, tol / 2, tol, tol * 2})


def _boot_ranks(b, tol: float):
    return None if b is None else stats.tolerant_ranks(b, tol, axis=2)     # (R, M, K, B)
