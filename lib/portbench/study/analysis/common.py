"""Helpers shared by the analysis modules: long tables from arrays, summary numbers with counts and CIs,
the comparison of two rankings (tau-b, tau-b,max, discordance) and its aggregation, panels of sources."""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Iterator

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
    out.update({k: (_num(v) if isinstance(v, (float, int, np.floating, np.integer))
                    else [_num(x) for x in v] if isinstance(v, (list, tuple)) and all(
                        isinstance(x, (float, int, np.floating, np.integer)) for x in v) and v else v)
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


def _ratio_with_ci(num, den, num_boot, den_boot, mask) -> tuple[float, tuple, int]:
    """Pooled ratio sum(num) / sum(den) over ``mask`` and its bootstrap CI (boot: extra last axis)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    sel = mask & ~np.isnan(num) & ~np.isnan(den)
    total = float(den[sel].sum())
    value = float(num[sel].sum()) / total if total > 0 else float("nan")
    if num_boot is None or total == 0:
        return value, (float("nan"), float("nan")), int(total)
    nb = np.nansum(np.asarray(num_boot)[sel], axis=0)
    db = np.nansum(np.asarray(den_boot)[sel], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo, hi = stats.percentile_ci(np.where(db > 0, nb / db, np.nan))
    return value, (float(lo), float(hi)), int(total)


COND_BOOT = 1000  # resamples of the condition bootstrap (ci_conditions), seeded with 0


def condition_ci(values, weights=None, n_boot: int = COND_BOOT) -> tuple[float, float]:
    """Percentile CI of a mean over conditions (``weights``: of a pooled ratio sum(values) / sum(weights))
    when the conditions themselves are resampled with replacement: how much the number depends on which
    conditions were studied. NaN with fewer than two conditions."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float("nan"), float("nan")
    idx = np.random.default_rng(0).integers(0, v.size, (n_boot, v.size))
    if weights is None:
        lo, hi = stats.percentile_ci(v[idx].mean(axis=1))
    else:
        w = np.asarray(weights, dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            lo, hi = stats.percentile_ci(v[idx].sum(axis=1) / w[idx].sum(axis=1))
    return float(lo), float(hi)


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


# --------------------------------------------------------------------------- comparing rankings

def _pair_products(v):
    """Pair signs of rankings ``v`` ``(..., N, K)`` -> (C - D, C + D) between every two rankings
    ``(..., N, N)`` and the untied pairs of each ranking ``(..., N)``; C / D = concordant / discordant
    pairs among those untied in both."""
    s = stats.pair_signs(v).astype(np.float64)                               # (..., N, P)
    a = np.abs(s)
    return s @ np.swapaxes(s, -1, -2), a @ np.swapaxes(a, -1, -2), a.sum(axis=-1)


def _n_groups(v) -> np.ndarray:
    """Distinct values (tie groups) of each ranking along the last axis (0 where a value is missing)."""
    srt = np.sort(v, axis=-1)
    g = 1 + np.sum(np.diff(srt, axis=-1) != 0, axis=-1)
    return np.where(np.isnan(v).any(axis=-1), 0, g)


def compare_all(values, boot=None, *, scipy_points: bool = True) -> dict[str, np.ndarray]:
    """Agreement between every two of N rankings, for every leading index.

    ``values`` ``(..., N, K)``: oriented tie-group values (:func:`portbench.study.stats.group_values`, tied
    schedulers share a value exactly); ``boot`` ``(..., N, K, B)`` the same per bootstrap resample, or None.
    Returns ``(..., N, N)`` matrices (``*_b``: ``(..., N, N, B)``): ``tau`` (Kendall tau-b; scipy for the
    point estimates, the vectorised equivalent for resamples), ``tau_max``
    (:func:`~portbench.study.stats.tau_b_max`), ``tau_norm`` (:func:`~portbench.study.stats.tau_b_norm`: tau / tau_max,
    or tau / |tau_min| when negative), ``concordant`` and
    ``discordant`` (pairs resolved in both rankings), ``groups_x`` / ``groups_y`` (tie groups of the row /
    column ranking) and ``status`` (0 defined, 1 a ranking is all tied, 2 a value is missing).
    """
    v = np.asarray(values, dtype=float)
    lead, N = v.shape[:-2], v.shape[-2]
    dot, both, unt = _pair_products(v)
    with np.errstate(invalid="ignore", divide="ignore"):
        den = np.sqrt(unt[..., :, None] * unt[..., None, :])
        tau = np.where(den > 0, dot / den, np.nan)
        tmax, tmin = _tau_extremes(v, den)
    if scipy_points:
        i, j = np.triu_indices(N, 1)
        for q in range(len(i)):
            t = _tau_points(v[..., i[q], :], v[..., j[q], :], lead)
            tau[..., i[q], j[q]] = tau[..., j[q], i[q]] = t
    g = _n_groups(v)
    miss = g == 0
    status = np.where(miss[..., :, None] | miss[..., None, :], 2,
                      np.where((g[..., :, None] <= 1) | (g[..., None, :] <= 1), 1, 0))
    norm = stats.tau_b_norm(tau, tmax, tmin)
    out = {"tau": tau, "tau_max": tmax, "tau_norm": norm, "concordant": (both + dot) / 2,
           "discordant": (both - dot) / 2, "groups_x": np.broadcast_to(g[..., :, None], tau.shape),
           "groups_y": np.broadcast_to(g[..., None, :], tau.shape), "status": status}
    if boot is not None:
        boot = np.asarray(boot, dtype=float)
        if boot.ndim > 3:            # one leading index at a time: the pair signs of every resample are large
            parts = [_boot_products(boot[i]) for i in range(boot.shape[0])]
            out.update({k: np.stack([p[k] for p in parts]) for k in parts[0]})
        else:
            out.update(_boot_products(boot))
    return out


def _tau_extremes(v, den):
    """tau-b,max and tau-b,min between every two rankings of ``v`` ``(..., N, K)`` (``den``: the tau-b
    denominators): the comonotone and the anti-comonotone arrangement of the sorted values."""
    a = np.abs(stats.pair_signs(np.sort(v, axis=-1)).astype(np.float64))      # untied pairs, rank order
    r = np.abs(stats.pair_signs(np.sort(-v, axis=-1)).astype(np.float64))     # the same, reversed order
    with np.errstate(invalid="ignore", divide="ignore"):
        tmax = np.where(den > 0, (a @ np.swapaxes(a, -1, -2)) / den, np.nan)
        tmin = np.where(den > 0, -(a @ np.swapaxes(r, -1, -2)) / den, np.nan)
    return tmax, tmin


def _boot_products(boot: np.ndarray) -> dict[str, np.ndarray]:
    """The resample entries of :func:`compare_all` for ``boot`` ``(..., N, K, B)``."""
    b = np.moveaxis(boot, -1, -3)                                               # (..., B, N, K)
    dot_b, both_b, unt_b = _pair_products(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        den_b = np.sqrt(unt_b[..., :, None] * unt_b[..., None, :])
        tb = np.where(den_b > 0, dot_b / den_b, np.nan)
    tmb, tminb = _tau_extremes(b, den_b)
    nb = stats.tau_b_norm(tb, tmb, tminb)
    last = lambda x: np.moveaxis(x, -3, -1)                                     # noqa: E731  (..., N, N, B)
    return {"tau_b": last(tb), "tau_norm_b": last(nb), "concordant_b": last((both_b + dot_b) / 2),
            "discordant_b": last((both_b - dot_b) / 2)}


def pairs_of(res: dict, pairs: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """The entries of :func:`compare_all` matrices for the (row, column) ``pairs``, stacked on a new
    last axis (before the resample axis of ``*_b`` entries)."""
    ii, jj = [p[0] for p in pairs], [p[1] for p in pairs]
    out = {}
    for k, x in res.items():
        if k.endswith("_b"):
            out[k] = x[..., ii, jj, :] if pairs else x[..., :0, 0, :]
        else:
            out[k] = x[..., ii, jj] if pairs else x[..., :0, 0]
    return out


def aggregate(res: dict, mask, what: str) -> dict:
    """The summary of many comparisons (``res`` from :func:`compare`, stacked) over ``mask``:
    ``tau_b`` (mean), ``tau_b_norm`` (mean of tau / tau_max), ``discordance`` (pooled: discordant /
    pairs resolved in both, over every condition) with bootstrap CIs, and ``conditions`` (total,
    defined, all_tied, missing). ``what`` names the conditions (for the definitions)."""
    mask = np.asarray(mask, dtype=bool)
    st = np.asarray(res["status"])
    tau_v, tau_ci, tau_n = _mean_with_ci(res["tau"], res.get("tau_b"), mask)
    nv, nci, nn = _mean_with_ci(res["tau_norm"], res.get("tau_norm_b"), mask)
    resolved = res["concordant"] + res["discordant"]
    rb = (res["concordant_b"] + res["discordant_b"]) if "concordant_b" in res else None
    dv, dci, dn = _ratio_with_ci(res["discordant"], resolved, res.get("discordant_b"), rb, mask)
    total = int(mask.sum())
    tsel = mask & ~np.isnan(np.asarray(res["tau"], dtype=float))
    nsel = mask & ~np.isnan(np.asarray(res["tau_norm"], dtype=float))
    dsel = mask & ~np.isnan(resolved)
    return {
        "tau_b": _stat(tau_v, f"mean Kendall tau-b over the {what} where it is defined", tau_n, tau_ci,
                       ci_conditions=list(condition_ci(res["tau"][tsel]))),
        "tau_b_norm": _stat(nv, f"mean of tau-b / tau-b,max over the {what} where it is defined (tau-b,max: "
                                "the largest tau-b the two rankings' tie structures allow, |tau-b,min| for a negative "
                                "tau-b; 1 = no resolved pair is discordant)", nn, nci,
                            ci_conditions=list(condition_ci(res["tau_norm"][nsel]))),
        "discordance": _stat(dv, f"discordant pairs / scheduler pairs resolved in both rankings, pooled over the "
                                 f"{what}", dn, dci, discordant=int(np.nansum(res["discordant"][mask])),
                             ci_conditions=list(condition_ci(res["discordant"][dsel], resolved[dsel]))),
        "conditions": {"total": total, "defined": int(((st == 0) & mask).sum()),
                       "all_tied": int(((st == 1) & mask).sum()), "missing": int(((st == 2) & mask).sum())},
    }


def unavailable_reason(panel: dict) -> str:
    """Why a panel of :func:`panel_sources` is not available (its missing sources)."""
    return f"not available: sources missing ({', '.join(panel['missing'])})"


def unavailable(panel: dict) -> dict:
    """The section of a panel that is not available, in every panel section of ``summary.json``."""
    return {"available": False, "sources": panel["sources"], "reason": unavailable_reason(panel)}


def available_panels(panels: dict, out: dict) -> Iterator[tuple[str, dict]]:
    """The available panels as ``(name, panel)``, in the panels' order; each unavailable one gets its
    :func:`unavailable` section in ``out`` instead (so ``out`` keeps the panels' order)."""
    for name, p in panels.items():
        if not p["available"]:
            out[name] = unavailable(p)
            continue
        yield name, p


def panel_sources(panels: dict, present: list[str], provenance: dict | None = None) -> dict[str, dict]:
    """Which panels can be analysed with the sources ``present``: ``{name: {"sources", "available",
    "missing"}}``. With no configured panel available and at least two sources present, an implicit
    panel ``all`` (every source present) is added, so a study of one's own sources still compares them.
    A source present in no configured panel (a trace of the user's own) joins an implicit panel ``user``, placed
    first: the sources of the panel that would otherwise be the headline (the first available all-real one, by
    ``provenance``, else the first available one) plus the user's sources, so that every cross-source table,
    reversal count and figure answers for it."""
    out: dict[str, dict] = {}
    for name, srcs in panels.items():
        missing = [s for s in srcs if s not in present]
        out[name] = {"sources": list(srcs), "available": not missing, "missing": missing}
    avail = [n for n, p in out.items() if p["available"]]
    if not avail and len(present) >= 2:
        out["all"] = {"sources": list(present), "available": True, "missing": [], "implicit": True}
        return out
    panelled = {s for srcs in panels.values() for s in srcs}
    own = [s for s in present if s not in panelled]
    if own and avail:
        real = [n for n in avail if provenance is not None and all(provenance.get(s) == "real" for s in out[n]["sources"])]
        base = (real or avail)[0]
        user = {"sources": list(out[base]["sources"]) + own, "available": True, "missing": [], "implicit": True,
                "extends": base, "own": own}
        out = {"user": user, **{k: v for k, v in out.items() if k != "user"}}
    return out

def headline_panel_of(panels: dict, provenance: dict) -> str | None:
    """The panel the headline numbers come from: the first available panel whose sources are all real
    (cross-source claims rest first on real data), else the first available one (say, the study's panel with
    stand-ins when no all-real panel can be formed), else the first configured one."""
    avail = [n for n, p in panels.items() if p["available"]]
    real = [n for n in avail if all(provenance.get(s) == "real" for s in panels[n]["sources"])]
    return (real or avail or list(panels) or [None])[0]
