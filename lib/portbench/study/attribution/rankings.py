"""The hybrids' rankings and their agreement, through the analysis' own definitions.

This module is the attribution's only contact with the ranking statistics, so that they mean here what
they mean in notebooks 04-07:

* **per-window values** — :func:`portbench.study.analysis.build_cube` (replicates averaged within a window;
  metric directions from the registry; schedulers in the study's order);
* **ties** — the analysis' tie rule: statistical ties (``analysis.ties``, the statistics issue's
  :mod:`portbench.study.analysis.ties`) when that module is present, else the relative tolerance
  (:func:`portbench.study.stats.tolerant_ranks` with ``analysis.rank_tolerance``); in the bootstrap the rule
  is applied exactly as the analysis applies it;
* **agreement** — Kendall tau-b (:func:`portbench.study.stats.tau_b_from_signs`, equal to scipy's), tau-b,max
  (``stats.tau_b_max`` when present, else tau-b of the two sorted rank vectors: the comonotone
  arrangement of the two tie structures), tau-b / tau-b,max, the discordance among pairs resolved in
  both rankings, and whether the two rankings share a top-1 scheduler;
* **distance** decomposed by the Shapley values: ``kendall`` = (discordant pairs + half the pairs tied in
  exactly one ranking) / all pairs (Kendall's distance with ties, Fagin et al. 2006, p = 1/2; 0 = the
  same ranking ties included, 1 = exactly reversed; for untied rankings (1 - tau) / 2), or ``tau_b`` =
  1 - tau-b (undefined where a ranking is all tied).
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from ...core.config import AnalysisConfig, SimulationConfig
from .. import stats
from ..analysis import Cube, build_cube, metric_names, settings

try:  # statistical ties (the statistics issue, #11); absent before it lands
    from ..analysis import ties as _ties
except ImportError:  # pragma: no cover - depends on which analysis is installed
    _ties = None


def hybrid_cube(runs: pl.DataFrame, sim: SimulationConfig, metrics) -> Cube:
    """The per-window value cube of one pair's runs, one "source" per subset (``h<mask>``), every
    subset on the same windows (A's window ids)."""
    df = runs.with_columns(pl.format("h{}", pl.col("mask")).alias("source"), pl.lit("hybrid").alias("provenance"),
                           pl.col("rho_region").alias("rho"))
    cube = build_cube(df, metric_spec=list(metrics), all_metrics=metric_names(sim.slo),
                      scheduler_order=sim.schedulers, where="attribution runs")
    wins = {tuple(w) for w in cube.windows.values()}
    if len(wins) != 1:
        raise ValueError("attribution: the subsets of one pair were not run on the same windows")
    return cube


def tie_rule(analysis: AnalysisConfig) -> str:
    """A sentence naming the tie rule in use (for the notebook and summary.json)."""
    if _ties is not None and hasattr(analysis, "ties"):
        return f"the analysis' tie rule analysis.ties = {analysis.ties}"
    tol = float(analysis.rank_tolerance)
    return ("the analysis' tie rule: means within analysis.rank_tolerance = "
            f"{tol:g} of the next-better mean are tied (single linkage)" if tol > 0 else "exact ties only")


def ranks(cube: Cube, analysis: AnalysisConfig, window_size: int, idx: np.ndarray | None) -> tuple[dict, dict]:
    """Ranks (1 = best, ties averaged) of every subset's scheduler means ``{source: (R, M, K)}`` and of every
    bootstrap resample ``{source: (R, M, K, B)}`` (None without ``idx``), under the analysis' tie rule.
    ``idx`` ``(B, W)`` resamples the windows; one matrix for every subset keeps them paired."""
    means, boot = {}, {}
    for s in cube.sources:
        xo = cube.oriented(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means[s] = np.nanmean(xo, axis=-1)
        boot[s] = np.stack([stats.bootstrap_means(xo[r], idx) for r in range(len(cube.regions))]) \
            if idx is not None else None
    if _ties is not None and hasattr(analysis, "ties"):
        st = settings(analysis, window_size)
        side = _ties.side_tests(cube, st["window_size"])
        rk = _ties.rank(st["ties"], cube, means, boot, side, st, _ties.deltas(cube, st))
        points = {s: stats.ranks_best_first(rk.values[s], axis=-1) for s in cube.sources}
        bpts = {s: stats.ranks_best_first(rk.boot[s], axis=2) if rk.boot[s] is not None else None
                for s in cube.sources}
        return points, bpts
    tol = float(analysis.rank_tolerance)
    points = {s: stats.tolerant_ranks(means[s], tol, axis=-1) for s in cube.sources}
    bpts = {s: stats.tolerant_ranks(boot[s], tol, axis=2) if boot[s] is not None else None for s in cube.sources}
    return points, bpts


def _tau_b_max(rx: np.ndarray, ry: np.ndarray) -> np.ndarray:
    f = getattr(stats, "tau_b_max", None)
    if f is not None:
        return f(rx, ry)
    return stats.tau_b(np.sort(rx, axis=-1), np.sort(ry, axis=-1))


def compare(rx, ry) -> dict[str, np.ndarray]:
    """Agreement of rankings ``rx`` and ``ry`` (ranks on the last axis; broadcast over the others):
    ``tau`` (tau-b), ``tau_max``, ``tau_norm``, ``discordant``, ``resolved`` (pairs untied in both),
    ``discordance`` (discordant / resolved), ``tied_one`` (pairs tied in exactly one), ``kendall``
    (the distance of the module docstring), ``top1_kept`` (1.0 when a best scheduler of ``rx`` is a best
    scheduler of ``ry``). NaN where a ranking has a missing value."""
    rx, ry = np.broadcast_arrays(np.asarray(rx, dtype=float), np.asarray(ry, dtype=float))
    return _compare(rx, ry, stats.pair_signs(rx), stats.pair_signs(ry), _tau_b_max(rx, ry))


def compare_to(X, refs) -> list[dict[str, np.ndarray]]:
    """``[compare(X, X[r]) for r in refs]`` for a stack of rankings ``X`` (first axis), with the pair signs of
    ``X`` (and of its sorted ranks, for tau-b,max: tau-b of the two sorted vectors) computed once."""
    X = np.asarray(X, dtype=float)
    sx, ss = stats.pair_signs(X), stats.pair_signs(np.sort(X, axis=-1))
    return [_compare(X, X[r], sx, sx[r], stats.tau_b_from_signs(ss, ss[r])) for r in refs]


def _compare(rx, ry, sx, sy, tmax) -> dict[str, np.ndarray]:
    bad = np.isnan(rx).any(axis=-1) | np.isnan(ry).any(axis=-1)
    prod = sx.astype(np.float64) * sy
    disc = np.sum(prod < 0, axis=-1).astype(float)
    res = np.sum((sx != 0) & (sy != 0), axis=-1).astype(float)
    one = np.sum((sx == 0) ^ (sy == 0), axis=-1).astype(float)
    n_pairs = sx.shape[-1]
    tau = stats.tau_b_from_signs(sx, sy)
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = np.where(tmax > 0, tau / tmax, np.nan)
        discordance = np.where(res > 0, disc / res, np.nan)
        kendall = (disc + 0.5 * one) / n_pairs if n_pairs else np.full(disc.shape, np.nan)
        bx = rx == np.min(rx, axis=-1, keepdims=True)
        by = ry == np.min(ry, axis=-1, keepdims=True)
    top1 = np.any(bx & by, axis=-1).astype(float)
    out = {"tau": tau, "tau_max": tmax, "tau_norm": norm, "discordant": disc, "resolved": res,
           "discordance": discordance, "tied_one": one, "kendall": kendall, "top1_kept": top1}
    return {k: np.where(bad, np.nan, v) for k, v in out.items()}


def distance(cmp: dict, kind: str) -> np.ndarray:
    """The ranking distance decomposed by the attribution: ``kendall`` or ``tau_b`` (1 - tau-b)."""
    if kind == "kendall":
        return cmp["kendall"]
    if kind == "tau_b":
        return 1.0 - cmp["tau"]
    raise ValueError(f"distance {kind!r}: expected kendall or tau_b")
