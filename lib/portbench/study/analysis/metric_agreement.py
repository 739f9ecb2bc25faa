"""Agreement between metrics and between SLO definitions, top-1 changes, Friedman / Nemenyi."""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import polars as pl

from .. import stats
from .columns import COLUMNS
from .common import _boot_ranks, _empty, _frame, _mean_with_ci, _rate_with_ci, _stat, _tau_points, _tie_note
from .cube import Analysis, Cube, _cd_parts



def _cross_metric(cube: Cube, means, boot, tables, tol: float) -> dict:
    S, R, M, K = cube.sources, cube.regions, cube.metrics, cube.schedulers
    mpairs = list(combinations(range(len(M)), 2))
    has_boot = all(boot[s] is not None for s in S)
    rows, crows, trows = [], [], []
    change = np.zeros((len(S), len(R)), bool)
    change_b = []
    cond_tau = np.full((len(S), len(R)), np.nan)
    cond_tau_b = []
    for si, s in enumerate(S):
        tau = np.full((len(R), len(mpairs)), np.nan)
        rk = stats.tolerant_ranks(means[s], tol, axis=-1)                           # (R, M, K)
        for q, (i, j) in enumerate(mpairs):
            tau[:, q] = _tau_points(rk[:, i], rk[:, j], (len(R),))
        if has_boot and mpairs:
            sg = np.transpose(stats.pair_signs(_boot_ranks(boot[s], tol), axis=2), (0, 2, 1, 3))  # (R, B, M, P)
            tm = stats.tau_b_matrix(sg)                                             # (R, B, M, M)
            ii, jj = zip(*mpairs)
            tb = np.moveaxis(tm[:, :, list(ii), list(jj)], 1, -1)                   # (R, Q, B)
            lo, hi = stats.percentile_ci(tb)
            nvalid = (~np.isnan(tb)).sum(axis=-1)
        else:
            tb = None
            lo = hi = np.full(tau.shape, np.nan)
            nvalid = np.zeros(tau.shape, int)
        if mpairs:
            f = _frame({"region": R, "mpair": [f"{M[i]}|{M[j]}" for i, j in mpairs]}, tau=tau, ci_low=lo,
                       ci_high=hi, n_boot_valid=nvalid)
            rows.append(f.with_columns(pl.col("mpair").str.split("|").list.get(0).alias("metric_1"),
                                       pl.col("mpair").str.split("|").list.get(1).alias("metric_2"),
                                       pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                                       pl.lit(len(K)).alias("n_items")).select(list(COLUMNS["cross_metric_tau"])))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ct = np.nanmean(tau, axis=-1) if mpairs else np.full(len(R), np.nan)
            ctb = np.nanmean(tb, axis=1) if tb is not None else None                 # (R, B)
        cond_tau[si] = ct
        if ctb is not None:
            cond_tau_b.append(ctb)
        mask = stats.top1_mask(means[s], axis=-1, tolerance=tol)                     # (R, M, K)
        change[si] = stats.top1_changes(mask)
        if has_boot:
            mb = stats.top1_mask(boot[s], axis=2, tolerance=tol)                     # (R, M, K, B)
            change_b.append(stats.top1_changes(np.transpose(mb, (0, 3, 1, 2))))      # (R, B)
        clo, chi = stats.percentile_ci(ctb) if ctb is not None else (np.full(len(R), np.nan),) * 2
        common = [",".join(np.asarray(K)[np.all(mask[r], axis=0)]) for r in range(len(R))]
        distinct = [int(np.any(mask[r], axis=0).sum()) for r in range(len(R))]
        crows.append(pl.DataFrame({"source": s, "provenance": cube.provenance[s], "region": R, "mean_tau": ct,
                                   "ci_low": clo, "ci_high": chi,
                                   "n_metric_pairs": (~np.isnan(tau)).sum(axis=-1) if mpairs else np.zeros(len(R), int),
                                   "top1_changes": change[si], "common_winners": common,
                                   "n_distinct_winners": distinct}))
        trows.append(_top1_rows(s, cube, means[s], mask))
    tables["cross_metric_tau"] = pl.concat(rows) if rows else _empty("cross_metric_tau")
    tables["cross_metric_conditions"] = pl.concat(crows).select(list(COLUMNS["cross_metric_conditions"]))
    tables["top1"] = pl.concat(trows).select(list(COLUMNS["top1"]))
    cb = np.stack(cond_tau_b) if cond_tau_b else None
    chb = np.stack(change_b) if change_b else None
    v, ci, n = _mean_with_ci(cond_tau, cb)
    r, rci, nchg = _rate_with_ci(change, chb)
    winners = {}
    for row in winner_counts(tables["top1"], len(K)).iter_rows(named=True):
        winners.setdefault(row["metric"], {"all_tied": row["all_tied"]})[row["scheduler"]] = row["wins"]
    return {
        "definition": "agreement between the scheduler rankings under different metrics (same source and region)",
        "conditions": len(S) * len(R),
        "n_metrics": len(M),
        "mean_tau": _stat(v, "mean over (source, region) conditions of the mean Kendall tau-b between every pair "
                             f"of metric rankings ({_tie_note(tol)})", n, ci),
        "top1_change_rate": _stat(r, "fraction of (source, region) conditions in which no scheduler is best "
                                     f"(or tied best; {_tie_note(tol)}) under every metric", len(S) * len(R), rci,
                                  changed=nchg),
        "winners_by_metric": winners,
    }


def winner_counts(top1: pl.DataFrame, n_schedulers: int) -> pl.DataFrame:
    """Per metric and scheduler: conditions where it is top-1 (a tie for best counts for each tied
    scheduler; conditions where every scheduler ties are left out and counted in ``all_tied``)."""
    all_tied = top1.group_by("metric").agg((pl.col("n_tied") == n_schedulers).sum().alias("all_tied"))
    return (top1.filter(pl.col("n_tied") < n_schedulers)
            .with_columns(pl.col("winner").str.split("+").alias("scheduler")).explode("scheduler")
            .group_by(["metric", "scheduler"]).agg(pl.len().alias("wins"))
            .join(all_tied, on="metric", how="right")
            .sort(["metric", "wins"], descending=[False, True], nulls_last=True))


def top_winners(A: "Analysis") -> pl.DataFrame:
    """Per metric: the most frequent top-1 scheduler, its wins, and the all-tied conditions."""
    n = len(A.summary["parameters"]["schedulers"])
    return winner_counts(A["top1"], n).group_by("metric", maintain_order=True).first() \
        .select("metric", pl.col("scheduler").alias("most_frequent_winner"), "wins", "all_tied")


def _top1_rows(s: str, cube: Cube, means_s, mask) -> pl.DataFrame:
    K = np.asarray(cube.schedulers)
    rows = []
    for r, region in enumerate(cube.regions):
        for m, metric in enumerate(cube.metrics):
            mk = mask[r, m]
            x = means_s[r, m]
            others = np.where(mk, np.nan, x)
            ru = int(np.nanargmax(others)) if not np.isnan(others).all() else None
            raw_best = cube.sign[m] * np.max(x[mk]) if mk.any() else np.nan   # the best of the tied winners
            raw_ru = cube.sign[m] * x[ru] if ru is not None else np.nan
            rows.append({"source": s, "provenance": cube.provenance[s], "region": region, "metric": metric,
                         "winner": "+".join(K[mk]), "n_tied": int(mk.sum()),
                         "runner_up": K[ru] if ru is not None else "",
                         "margin_rel": float(stats.relative_effect(raw_best, raw_ru))})
    return pl.DataFrame(rows)


def _slo_sensitivity(cube: Cube, means, boot, tables, tol: float) -> dict:
    S, R = cube.sources, cube.regions
    idx = [i for i, m in enumerate(cube.metrics) if m.startswith("slo_")]
    names = [cube.metrics[i] for i in idx]
    if len(idx) < 2:
        tables["slo_tau"], tables["slo_conditions"] = _empty("slo_tau"), _empty("slo_conditions")
        return {"available": False, "reason": f"fewer than two SLO metrics among {cube.metrics}",
                "slo_metrics": names}
    has_boot = all(boot[s] is not None for s in S)
    pairs = list(combinations(range(len(idx)), 2))
    rows, crows = [], []
    tau_all = np.full((len(S), len(R), len(pairs)), np.nan)
    tau_all_b, W_all, W_all_b, change, change_b = [], np.full((len(S), len(R)), np.nan), [], np.zeros((len(S), len(R)), bool), []
    for si, s in enumerate(S):
        ms = means[s][:, idx]                                                       # (R, L, K)
        rk = stats.tolerant_ranks(ms, tol, axis=-1)
        for q, (i, j) in enumerate(pairs):
            tau_all[si, :, q] = _tau_points(rk[:, i], rk[:, j], (len(R),))
        W_all[si] = stats.kendall_w(rk)
        mask = stats.top1_mask(ms, axis=-1, tolerance=tol)
        change[si] = stats.top1_changes(mask)
        if has_boot:
            bs = boot[s][:, idx]                                                    # (R, L, K, B)
            rbs = _boot_ranks(bs, tol)
            sg = np.transpose(stats.pair_signs(rbs, axis=2), (0, 2, 1, 3))         # (R, B, L, P)
            tm = stats.tau_b_matrix(sg)
            ii, jj = zip(*pairs)
            tb = np.moveaxis(tm[:, :, list(ii), list(jj)], 1, -1)                  # (R, Q, B)
            tau_all_b.append(tb)
            wb = stats.kendall_w(np.transpose(rbs, (0, 3, 1, 2)))                  # (R, B)
            W_all_b.append(wb)
            change_b.append(stats.top1_changes(np.transpose(stats.top1_mask(bs, axis=2, tolerance=tol),
                                                            (0, 3, 1, 2))))
            lo, hi = stats.percentile_ci(tb)
            nvalid = (~np.isnan(tb)).sum(axis=-1)
            wlo, whi = stats.percentile_ci(wb)
        else:
            lo = hi = np.full((len(R), len(pairs)), np.nan)
            nvalid = np.zeros((len(R), len(pairs)), int)
            wlo = whi = np.full(len(R), np.nan)
        f = _frame({"region": R, "spair": [f"{names[i]}|{names[j]}" for i, j in pairs]}, tau=tau_all[si],
                   ci_low=lo, ci_high=hi, n_boot_valid=nvalid)
        rows.append(f.with_columns(pl.col("spair").str.split("|").list.get(0).alias("slo_1"),
                                   pl.col("spair").str.split("|").list.get(1).alias("slo_2"),
                                   pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                                   pl.lit(len(cube.schedulers)).alias("n_items")).select(list(COLUMNS["slo_tau"])))
        K = np.asarray(cube.schedulers)
        winners = ["; ".join(f"{names[l]}={'+'.join(K[mask[r, l]])}" for l in range(len(names)))
                   for r in range(len(R))]
        crows.append(pl.DataFrame({"source": s, "provenance": cube.provenance[s], "region": R, "W": W_all[si],
                                   "ci_low": wlo, "ci_high": whi, "top1_changes": change[si], "winners": winners}))
    tables["slo_tau"] = pl.concat(rows)
    tables["slo_conditions"] = pl.concat(crows).select(list(COLUMNS["slo_conditions"]))
    tb = np.stack(tau_all_b) if tau_all_b else None
    v, ci, n = _mean_with_ci(tau_all, tb)
    wv, wci, wn = _mean_with_ci(W_all, np.stack(W_all_b) if W_all_b else None)
    r, rci, nchg = _rate_with_ci(change, np.stack(change_b) if change_b else None)
    return {
        "definition": "how much the scheduler ranking depends on the SLO definition used by SLO-attainment metrics",
        "available": True, "slo_metrics": names, "conditions": len(S) * len(R),
        "mean_tau": _stat(v, f"mean Kendall tau-b between the rankings under two SLO definitions ({_tie_note(tol)}), "
                             "over every SLO pair x source x region", n, ci),
        "kendall_w": _stat(wv, "Kendall's W across the SLO definitions' rankings, averaged over source x region",
                           wn, wci),
        "top1_change_rate": _stat(r, "fraction of (source, region) conditions where no scheduler is best (or tied "
                                     f"best; {_tie_note(tol)}) under every SLO definition", len(S) * len(R), rci,
                                  changed=nchg),
    }


def _friedman(cube: Cube, cfg: dict, tables, rv: dict) -> dict:
    S, R, M, K = cube.sources, cube.regions, cube.metrics, cube.schedulers
    rows, arows = [], []
    for s in S:
        xo = cube.oriented(s)
        for r, region in enumerate(R):
            for m, metric in enumerate(M):
                block = xo[r, m].T                                              # (W, K)
                stat_, p = stats.friedman(block)
                comp = block[~np.isnan(block).any(axis=1)]
                avg = stats.window_ranks(comp, axis=1).mean(axis=0) if comp.shape[0] else np.full(len(K), np.nan)
                cd = stats.nemenyi_cd(len(K), comp.shape[0], cfg["alpha"]) if comp.shape[0] else float("nan")
                rows.append({"source": s, "provenance": cube.provenance[s], "region": region, "metric": metric,
                             "statistic": stat_, "p": p, "n_windows": comp.shape[0], "k": len(K), "cd": cd})
                arows.append(pl.DataFrame({"source": s, "provenance": cube.provenance[s], "region": region,
                                           "metric": metric, "scheduler": K, "avg_rank": avg}))
    fr = pl.DataFrame(rows)
    fr = fr.with_columns(pl.Series("p_adj", stats.adjust_pvalues(fr["p"].to_numpy(), cfg["correction"])))
    tables["friedman"] = fr.select(list(COLUMNS["friedman"]))
    tables["avg_ranks"] = pl.concat(arows).select(list(COLUMNS["avg_ranks"]))
    conds = cd_conditions(cfg, cube, rv)
    nrows = []
    for s, region, metric in conds:
        block = cube.oriented(s)[R.index(region), M.index(metric)].T
        nm = stats.nemenyi(block, K)
        for i, j in combinations(range(len(K)), 2):
            nrows.append({"source": s, "provenance": cube.provenance[s], "region": region, "metric": metric,
                          "a": K[i], "b": K[j], "p": float(nm.iloc[i, j])})
    tables["nemenyi"] = pl.DataFrame(nrows).select(list(COLUMNS["nemenyi"])) if nrows else _empty("nemenyi")
    defined = fr.filter(pl.col("p_adj").is_not_nan())
    n_rej = int((defined["p_adj"] < cfg["alpha"]).sum())
    return {"definition": "Friedman test over windows (blocks) x schedulers per (source, region, metric), "
                          f"{cfg['correction']}-adjusted across conditions",
            "rejected": _stat(n_rej, f"conditions where the schedulers differ (adjusted p < {cfg['alpha']})",
                              defined.height, rate=(n_rej / defined.height if defined.height else None)),
            "cd_conditions": [list(c) for c in conds]}


def cd_conditions(cfg: dict, cube: Cube, rv: dict) -> list[tuple[str, str, str]]:
    """(source, region, metric) triples for critical-difference diagrams.

    ``auto``: the region and metric of the most dramatic reversal, on every source (so the diagrams
    show the reversal); without one, the heaviest region under the first headline metric.
    """
    want = cfg["cd_conditions"]
    if want != "auto":
        out = [_cd_parts(c) for c in want]
        return [c for c in out if c[0] in cube.sources and c[1] in cube.regions and c[2] in cube.metrics]
    md = rv.get("most_dramatic")
    if md:
        region, metric = md["region"], md["metric"]
    else:
        heads = [m for m in cfg["headline_metrics"] if m in cube.metrics] or cube.metrics
        region, metric = cube.regions[-1], heads[0]
    return [(s, region, metric) for s in cube.sources]
