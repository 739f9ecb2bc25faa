"""Rankings and rank agreement between sources and between operating regions (Kendall tau-b, W, bootstrap CIs)."""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import polars as pl

from .. import stats
from .columns import COLUMNS
from .common import _boot_ranks, _empty, _frame, _mean_with_ci, _num, _stat, _tau_points, _tie_note, sensitivity_tolerances, tied_ranks_definition
from .cube import Cube



def _window_values_table(cube: Cube) -> pl.DataFrame:
    frames = []
    for s in cube.sources:
        nrep = np.broadcast_to(cube.n_replicates[s][:, None, :, :], cube.values[s].shape)
        f = _frame({"window_id": cube.windows[s], "region": cube.regions, "metric": cube.metrics,
                    "scheduler": cube.schedulers},
                   value=np.transpose(cube.values[s], (3, 0, 1, 2)),
                   n_replicates=np.transpose(nrep, (3, 0, 1, 2)))
        frames.append(f.with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance")))
    cols = list(COLUMNS["window_values"])
    return pl.concat(frames).select(cols)


def _rankings_table(cube: Cube, means, boot, tol: float) -> pl.DataFrame:
    frames = []
    for s in cube.sources:
        raw = cube.values[s]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(raw, axis=-1)
            sd = np.nanstd(raw, axis=-1, ddof=1) if raw.shape[-1] > 1 else np.full(mean.shape, np.nan)
        n = (~np.isnan(raw)).sum(axis=-1)
        rank = stats.tolerant_ranks(means[s], tol, axis=-1)
        n_tied = np.sum(rank[..., :, None] == rank[..., None, :], axis=-1)
        if boot[s] is not None:
            lo, hi = stats.percentile_ci(boot[s] * cube.sign[None, :, None, None])
        else:
            lo = hi = np.full(mean.shape, np.nan)
        f = _frame({"region": cube.regions, "metric": cube.metrics, "scheduler": cube.schedulers},
                   mean=mean, sd=sd, n_windows=n, rank=rank, n_tied=n_tied, ci_low=lo, ci_high=hi)
        f = f.with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                           pl.col("region").replace_strict(cube.rho, return_dtype=pl.Float64).alias("rho"),
                           pl.col("metric").replace_strict(dict(zip(cube.metrics, cube.directions)),
                                                           return_dtype=pl.Utf8).alias("direction"))
        frames.append(f)
    return pl.concat(frames).select(list(COLUMNS["rankings"]))


def _rank_ties(cube: Cube, means, tol: float) -> dict:
    """How often the rank tolerance ties schedulers, and how wide single linkage makes a tie group."""
    n_cond = changed = all_tied = all_tied_exact = groups = chained = 0
    widest, chains = None, []
    K = np.asarray(cube.schedulers)
    for s in cube.sources:
        rk = stats.tolerant_ranks(means[s], tol, axis=-1)                    # (R, M, K)
        ex = stats.ranks_best_first(means[s], axis=-1)
        spread = stats.tie_group_spread(means[s], tol, axis=-1)
        for r, region in enumerate(cube.regions):
            for m, metric in enumerate(cube.metrics):
                x = rk[r, m]
                if np.isnan(x).any():
                    continue
                n_cond += 1
                changed += bool(np.any(x != ex[r, m]))
                all_tied += bool(np.all(x == x[0]))
                all_tied_exact += bool(np.all(ex[r, m] == ex[r, m][0]))
                for v in np.unique(x):
                    members = x == v
                    if members.sum() < 2:
                        continue
                    groups += 1
                    sp = float(spread[r, m][members][0])
                    entry = {"source": s, "region": region, "metric": metric, "spread": _num(sp),
                             "schedulers": K[members].tolist()}
                    if widest is None or sp > widest[0]:
                        widest = (sp, entry)
                    if tol > 0 and sp >= tol:
                        chained += 1
                        chains.append((sp, entry))
    chains.sort(key=lambda e: -e[0])
    note = _tie_note(tol)
    return {
        "definition": "ties made by the rank tolerance in the rankings of scheduler means (every source x region "
                      f"x metric): {tied_ranks_definition(tol)}",
        "rank_tolerance": tol,
        "conditions_with_new_ties": _stat(changed, f"conditions whose ranking has a tie that exact ranks do not "
                                                   f"have ({note})", n_cond,
                                          rate=(changed / n_cond if n_cond else None)),
        "all_tied": _stat(all_tied, f"conditions where every scheduler is tied ({note}; tau-b undefined there)",
                          n_cond, exact=all_tied_exact),
        "tie_groups": _stat(groups, "tie groups of two or more schedulers, over every condition", n_cond),
        "chained_groups": _stat(chained, "tie groups whose best and worst means differ by at least the tolerance "
                                         "(single linkage chained several smaller gaps)", groups,
                                rate=(chained / groups if groups else None)),
        "max_group_spread": _stat(widest[0] if widest else 0.0, "largest relative difference between the best and "
                                  "the worst mean of one tie group", groups,
                                  where=widest[1] if widest else None),
        "widest_chains": [e for _, e in chains[:5]],
    }


def _cross_source_tau_points(cube: Cube, means, tol: float) -> np.ndarray:
    """scipy tau-b between every source pair's practically tied rankings: (R, M, source pairs)."""
    S, R, M = cube.sources, cube.regions, cube.metrics
    pairs = list(combinations(range(len(S)), 2))
    rk = {s: stats.tolerant_ranks(means[s], tol, axis=-1) for s in S}
    tau = np.full((len(R), len(M), len(pairs)), np.nan)
    for q, (i, j) in enumerate(pairs):
        tau[:, :, q] = _tau_points(rk[S[i]], rk[S[j]], (len(R), len(M)))
    return tau


def _cross_source(cube: Cube, means, boot, tables, tol: float) -> dict:
    S, R, M = cube.sources, cube.regions, cube.metrics
    pairs = list(combinations(range(len(S)), 2))
    has_boot = all(boot[s] is not None for s in S)
    pair_names = [f"{S[i]}|{S[j]}" for i, j in pairs]
    tau = _cross_source_tau_points(cube, means, tol)
    tau_b = np.full((len(R), len(M), len(pairs), boot[S[0]].shape[-1] if has_boot else 0), np.nan)
    ranks_b = {s: _boot_ranks(boot[s], tol) for s in S} if has_boot else {}           # (R, M, K, B)
    signs_b = {s: stats.pair_signs(ranks_b[s], axis=2) for s in S} if has_boot else {}  # (R, M, B, P)
    for q, (i, j) in enumerate(pairs):
        if has_boot:
            tau_b[:, :, q, :] = stats.tau_b_from_signs(signs_b[S[i]], signs_b[S[j]])
    lo, hi = stats.percentile_ci(tau_b) if has_boot else (np.full(tau.shape, np.nan),) * 2
    nvalid = (~np.isnan(tau_b)).sum(axis=-1)
    rows = []
    for q, (i, j) in enumerate(pairs):
        f = _frame({"region": R, "metric": M}, tau=tau[:, :, q], ci_low=lo[:, :, q], ci_high=hi[:, :, q],
                   n_boot_valid=nvalid[:, :, q])
        rows.append(f.with_columns(pl.lit(S[i]).alias("source_1"), pl.lit(S[j]).alias("source_2"),
                                   pl.lit(cube.provenance[S[i]]).alias("provenance_1"),
                                   pl.lit(cube.provenance[S[j]]).alias("provenance_2"),
                                   pl.lit(len(cube.schedulers)).alias("n_items")))
    cols = list(COLUMNS["cross_source_tau"])
    tables["cross_source_tau"] = pl.concat(rows).select(cols) if rows else _empty("cross_source_tau")

    # Kendall's W across sources
    if len(S) >= 2:
        ranks = np.stack([stats.tolerant_ranks(means[s], tol, axis=-1) for s in S], axis=2)  # (R, M, S, K)
        W = stats.kendall_w(ranks)
        if has_boot:
            rb = np.stack([ranks_b[s] for s in S], axis=2)                                # (R, M, S, K, B)
            Wb = stats.kendall_w(np.moveaxis(rb, -1, 2))                                    # (R, M, B)
            wlo, whi = stats.percentile_ci(Wb)
        else:
            Wb, wlo, whi = None, np.full(W.shape, np.nan), np.full(W.shape, np.nan)
        tables["cross_source_w"] = _frame({"region": R, "metric": M}, W=W, ci_low=wlo, ci_high=whi,
                                          n_rankings=len(S), n_items=len(cube.schedulers)) \
            .with_columns(pl.lit(",".join(f"{s}:{cube.provenance[s]}" for s in S)).alias("provenance")) \
            .select(list(COLUMNS["cross_source_w"]))
    else:
        W, Wb = np.full((len(R), len(M)), np.nan), None
        tables["cross_source_w"] = _empty("cross_source_w")

    defn = (f"Kendall tau-b between two sources' scheduler rankings (same region and metric; {_tie_note(tol)}), "
            "averaged over every region x metric x source pair where defined")
    tb = tau_b if has_boot else None
    out: dict = {"definition": "agreement between the scheduler rankings of different workload sources",
                 "n_conditions": len(R) * len(M), "n_source_pairs": len(pairs)}
    if not pairs:
        out["available"] = False
        out["reason"] = "fewer than two sources in the runs table"
        return out
    v, ci, n = _mean_with_ci(tau, tb)
    out["mean_tau"] = _stat(v, defn, n, ci, undefined=int(np.isnan(tau).sum()))
    # sensitivity to the rank tolerance (point estimates only): the mean over the conditions defined at that
    # tolerance, and over the conditions defined at every tolerance compared (the same set for every row)
    tols = sensitivity_tolerances(tol)
    taus = {t: tau if t == tol else _cross_source_tau_points(cube, means, t) for t in tols}
    common = np.all([~np.isnan(taus[t]) for t in tols], axis=0)

    def _means_by_region(tt, sel):
        return {name: _num(tt[r][sel[r]].mean()) if sel[r].any() else None for r, name in enumerate(R)}

    out["by_rank_tolerance"] = {}
    for t in tols:
        tt = taus[t]
        sel = ~np.isnan(tt)
        out["by_rank_tolerance"][f"{t:g}"] = _stat(
            float(tt[sel].mean()) if sel.any() else None,
            f"mean tau-b as mean_tau but with rank_tolerance = {t:g} ({_tie_note(t)}); point estimate, no bootstrap",
            int(sel.sum()), rank_tolerance=t, undefined=int((~sel).sum()), chosen=bool(t == tol),
            by_region=_means_by_region(tt, sel),
            common_value=float(tt[common].mean()) if common.any() else None, common_count=int(common.sum()),
            common_by_region=_means_by_region(tt, common))
    out["by_source_pair"] = {}
    for q, name in enumerate(pair_names):
        m = np.zeros(tau.shape, bool)
        m[:, :, q] = True
        v, ci, n = _mean_with_ci(tau, tb, m)
        i, j = pairs[q]
        out["by_source_pair"][name] = _stat(v, f"mean tau between {cube.label(S[i])} and {cube.label(S[j])} "
                                               "over regions x metrics", n, ci)
    out["by_region"] = {}
    for r, name in enumerate(R):
        m = np.zeros(tau.shape, bool)
        m[r] = True
        v, ci, n = _mean_with_ci(tau, tb, m)
        out["by_region"][name] = _stat(v, f"mean tau over metrics x source pairs in region {name}", n, ci)
    out["by_metric"] = {}
    for k, name in enumerate(M):
        m = np.zeros(tau.shape, bool)
        m[:, k] = True
        v, ci, n = _mean_with_ci(tau, tb, m)
        out["by_metric"][name] = _stat(v, f"mean tau over regions x source pairs for metric {name}", n, ci)
    bp = {k: d["value"] for k, d in out["by_source_pair"].items() if d["value"] is not None}
    if bp:
        worst = min(bp, key=bp.get)
        out["least_agreeing_pair"] = {"pair": worst.split("|"), "mean_tau": bp[worst]}
    if not np.isnan(tau).all():
        r, k, q = np.unravel_index(np.nanargmin(tau), tau.shape)
        i, j = pairs[q]
        out["lowest"] = {"source_1": S[i], "source_2": S[j], "region": R[r], "metric": M[k],
                         "tau": _num(tau[r, k, q]), "ci": [_num(lo[r, k, q]), _num(hi[r, k, q])]}
    out["fraction_tau_ci_below_0.5"] = _stat(
        float(np.mean(hi[~np.isnan(hi)] < 0.5)) if has_boot and (~np.isnan(hi)).any() else None,
        "fraction of (region, metric, source pair) conditions whose tau CI lies entirely below 0.5",
        int((~np.isnan(hi)).sum()))
    if len(S) >= 2:
        v, ci, n = _mean_with_ci(W, Wb)
        out["kendall_w"] = _stat(v, f"Kendall's W across the {len(S)} sources' rankings (tie-corrected; "
                                    f"{_tie_note(tol)}), averaged over region x metric", n, ci)
    return out


def _cross_region(cube: Cube, means, boot, tables, tol: float) -> dict:
    S, R, M = cube.sources, cube.regions, cube.metrics
    rpairs = list(combinations(range(len(R)), 2))
    has_boot = all(boot[s] is not None for s in S)
    rows, wrows = [], []
    tau_all = np.full((len(S), len(M), len(rpairs)), np.nan)
    tau_all_b = np.full((len(S), len(M), len(rpairs), boot[S[0]].shape[-1] if has_boot else 0), np.nan)
    W_all = np.full((len(S), len(M)), np.nan)
    W_all_b = np.full((len(S), len(M), tau_all_b.shape[-1]), np.nan)
    for si, s in enumerate(S):
        mm = stats.tolerant_ranks(np.transpose(means[s], (1, 0, 2)), tol, axis=-1)   # (M, R, K) ranks
        rb = _boot_ranks(boot[s], tol) if has_boot else None                      # (R, M, K, B)
        for q, (i, j) in enumerate(rpairs):
            tau_all[si, :, q] = _tau_points(mm[:, i], mm[:, j], (len(M),))
        if has_boot and rpairs:
            sg = np.transpose(stats.pair_signs(rb, axis=2), (1, 2, 0, 3))        # (M, B, R, P)
            tm = stats.tau_b_matrix(sg)                                          # (M, B, R, R)
            ii, jj = zip(*rpairs)
            tau_all_b[si] = np.moveaxis(tm[:, :, list(ii), list(jj)], 1, -1)     # (M, Q, B)
        if len(R) >= 2:
            W_all[si] = stats.kendall_w(mm)
            if has_boot:
                W_all_b[si] = stats.kendall_w(np.transpose(rb, (1, 3, 0, 2)))    # (M, B, R, K)
        lo, hi = stats.percentile_ci(tau_all_b[si]) if has_boot else (np.full(tau_all[si].shape, np.nan),) * 2
        nvalid = (~np.isnan(tau_all_b[si])).sum(axis=-1)
        if rpairs:
            f = _frame({"metric": M, "region_pair": [f"{R[i]}|{R[j]}" for i, j in rpairs]},
                       tau=tau_all[si], ci_low=lo, ci_high=hi, n_boot_valid=nvalid)
            f = f.with_columns(pl.col("region_pair").str.split("|").list.get(0).alias("region_1"),
                               pl.col("region_pair").str.split("|").list.get(1).alias("region_2"),
                               pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                               pl.lit(len(cube.schedulers)).alias("n_items"))
            rows.append(f.select(list(COLUMNS["cross_region_tau"])))
        wlo, whi = stats.percentile_ci(W_all_b[si]) if has_boot else (np.full(len(M), np.nan),) * 2
        wrows.append(_frame({"metric": M}, W=W_all[si], ci_low=wlo, ci_high=whi, n_rankings=len(R),
                            n_items=len(cube.schedulers))
                     .with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"))
                     .select(list(COLUMNS["cross_region_w"])))
    tables["cross_region_tau"] = pl.concat(rows) if rows else _empty("cross_region_tau")
    tables["cross_region_w"] = pl.concat(wrows)
    out: dict = {"definition": "agreement between the scheduler rankings of different operating regions "
                               "(same source and metric)",
                 "n_conditions": len(S) * len(M), "n_region_pairs": len(rpairs)}
    if not rpairs:
        out["available"] = False
        out["reason"] = "fewer than two regions"
        return out
    tb = tau_all_b if has_boot else None
    v, ci, n = _mean_with_ci(tau_all, tb)
    out["mean_tau"] = _stat(v, f"Kendall tau-b between two regions' rankings ({_tie_note(tol)}), averaged over "
                               "every region pair x source x metric where defined", n, ci,
                            undefined=int(np.isnan(tau_all).sum()))
    q_ext = rpairs.index((0, len(R) - 1))
    m = np.zeros(tau_all.shape, bool)
    m[:, :, q_ext] = True
    v, ci, n = _mean_with_ci(tau_all, tb, m)
    out["extreme_regions_tau"] = _stat(v, f"mean tau between the lightest ({R[0]}) and the heaviest "
                                          f"({R[-1]}) region over sources x metrics", n, ci,
                                       regions=[R[0], R[-1]])
    adj = [q for q, (i, j) in enumerate(rpairs) if j == i + 1]
    m = np.zeros(tau_all.shape, bool)
    m[:, :, adj] = True
    v, ci, n = _mean_with_ci(tau_all, tb, m)
    out["adjacent_regions_tau"] = _stat(v, "mean tau between neighbouring regions (next load level) "
                                           "over sources x metrics", n, ci)
    out["by_source"] = {}
    for si, s in enumerate(S):
        m = np.zeros(tau_all.shape, bool)
        m[si] = True
        v, ci, n = _mean_with_ci(tau_all, tb, m)
        out["by_source"][s] = _stat(v, f"mean tau between regions on {cube.label(s)} over region pairs x metrics",
                                    n, ci)
    v, ci, n = _mean_with_ci(W_all, W_all_b if has_boot else None)
    out["kendall_w"] = _stat(v, f"Kendall's W across the {len(R)} regions' rankings, averaged over "
                                "sources x metrics", n, ci)
    if not np.isnan(tau_all).all():
        si, k, q = np.unravel_index(np.nanargmin(tau_all), tau_all.shape)
        out["lowest"] = {"source": S[si], "metric": M[k], "region_1": R[rpairs[q][0]],
                         "region_2": R[rpairs[q][1]], "tau": _num(tau_all[si, k, q])}
    return out
