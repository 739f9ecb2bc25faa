"""Agreement between metrics and between SLO definitions, top-1 changes, Friedman / Nemenyi."""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import polars as pl

from .. import stats
from .columns import COLUMNS
from .agreement import pair_table
from .common import (_empty, _mean_with_ci, _rate_with_ci, _stat, aggregate, available_panels, compare_all,
                     condition_ci, pairs_of)
from .cube import Analysis, Cube
from .ties import Ranking, Restricted



def _cross_metric(cube: Cube, rk: Ranking, panels: dict, head: list[int], tables,
                  red: Restricted | None = None) -> dict[str, dict]:
    """Agreement between metrics per (source, region): tau-b, tau-b / tau-b,max and discordance between every
    two metrics' rankings; for every pair of headline metrics, whether the top-1 (the best tie group) changes;
    and the all-metrics rule (no scheduler best under every metric). Summaries per panel. A source of
    ``red.sources`` is ranked without its n/a schedulers (``red``)."""
    S, R, M = cube.sources, cube.regions, cube.metrics
    mpairs = list(combinations(range(len(M)), 2))
    hpairs = list(combinations(head, 2))
    has_boot = all(rk.boot[s] is not None for s in S)
    per: dict[str, dict] = {}
    rows, crows, trows, prows = [], [], [], []
    full_cube, full_rk = cube, rk
    for s in S:
        cube, rk = (red.cube, red.rk) if red and red.uses(s) else (full_cube, full_rk)
        K = cube.schedulers
        Kn = np.asarray(K)
        V, Bt = rk.values[s], rk.boot[s] if has_boot else None                 # (R, M, K[, B])
        pr = pairs_of(compare_all(V, Bt), mpairs)                              # (R, Q[, B])
        if mpairs:
            rows.append(pair_table(pr, ("region", R), "mpair", M, mpairs, ("metric_1", "metric_2"), s,
                                   cube.provenance[s], len(K), "cross_metric_tau"))
        mask = stats.top1_mask(V, axis=-1)                                       # (R, M, K): the best tie group
        tied = rk.n_groups(s) <= 1                                               # (R, M): all tied (or missing)
        mb = stats.top1_mask(Bt, axis=2) if has_boot else None                   # (R, M, K, B)
        # pairwise top-1 change over the headline metric pairs
        defined = np.stack([~tied[:, i] & ~tied[:, j] for i, j in hpairs], axis=1) if hpairs else np.zeros((len(R), 0), bool)
        change = (np.stack([~np.any(mask[:, i] & mask[:, j], axis=-1) for i, j in hpairs], axis=1)
                  if hpairs else np.zeros((len(R), 0), bool)) & defined
        change_b = (np.stack([~np.any(mb[:, i] & mb[:, j], axis=1) for i, j in hpairs], axis=1)
                    if has_boot and hpairs else None)                            # (R, H, B)
        allm = stats.top1_changes(mask)                                          # (R,)
        allm_b = stats.top1_changes(np.transpose(mb, (0, 3, 1, 2))) if has_boot else None   # (R, B)
        per[s] = {"pr": pr, "defined": defined, "change": change, "change_b": change_b, "all": allm, "all_b": allm_b}
        for r, region in enumerate(R):
            for q, (i, j) in enumerate(hpairs):
                prows.append({"source": s, "provenance": cube.provenance[s], "region": region, "metric_1": M[i],
                              "metric_2": M[j], "winners_1": "+".join(Kn[mask[r, i]]),
                              "winners_2": "+".join(Kn[mask[r, j]]), "defined": bool(defined[r, q]),
                              "top1_changes": bool(change[r, q])})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            hq = [q for q, (i, j) in enumerate(mpairs) if i in head and j in head]
            ct = np.nanmean(pr["tau"][:, hq], axis=-1) if hq else np.full(len(R), np.nan)
            cn = np.nanmean(pr["tau_norm"][:, hq], axis=-1) if hq else np.full(len(R), np.nan)
        common = [",".join(Kn[np.all(mask[r], axis=0)]) for r in range(len(R))]
        distinct = [int(np.any(mask[r], axis=0).sum()) for r in range(len(R))]
        crows.append(pl.DataFrame({"source": s, "provenance": cube.provenance[s], "region": R, "mean_tau": ct,
                                   "mean_tau_norm": cn, "headline_pairs_defined": defined.sum(axis=1),
                                   "headline_pairs_changed": change.sum(axis=1), "top1_changes": allm,
                                   "common_winners": common, "n_distinct_winners": distinct}))
        trows.append(_top1_rows(s, cube, rk, mask))
    cube, rk = full_cube, full_rk
    tables["cross_metric_tau"] = pl.concat(rows) if rows else _empty("cross_metric_tau")
    tables["cross_metric_conditions"] = pl.concat(crows).select(list(COLUMNS["cross_metric_conditions"]))
    tables["top1"] = pl.concat(trows).select(list(COLUMNS["top1"]))
    tables["top1_pairs"] = (pl.DataFrame(prows).select(list(COLUMNS["top1_pairs"])) if prows else _empty("top1_pairs"))

    out: dict[str, dict] = {}
    for name, p in available_panels(panels, out):
        srcs = [s for s in p["sources"] if s in S]
        sec: dict = {"available": True, "sources": srcs, "n_conditions": len(srcs) * len(R), "n_metrics": len(M),
                     "headline_metrics": [M[k] for k in head],
                     "definition": "agreement between the scheduler rankings under different metrics (same source "
                                   "and region; statistical ties)"}
        defined = np.stack([per[s]["defined"] for s in srcs])                   # (S, R, H)
        change = np.stack([per[s]["change"] for s in srcs])
        nd = int(defined.sum())
        rate = change.sum() / nd if nd else float("nan")
        ci: tuple = (float("nan"), float("nan"))
        if has_boot and nd:
            cb = np.stack([per[s]["change_b"] for s in srcs])                    # (S, R, H, B)
            ci = stats.percentile_ci((cb & defined[..., None]).sum(axis=(0, 1, 2)) / nd)
        per_cond_changed = change.sum(axis=-1).ravel().astype(float)             # per (source, region)
        per_cond_defined = defined.sum(axis=-1).ravel().astype(float)
        sec["pairwise_top1_change_rate"] = _stat(
            rate, "for each (source, region) and each pair of headline metrics whose rankings both resolve a best "
                  "group: whether the two best groups (the schedulers tied for best) have no scheduler in common; "
                  "the fraction of such (condition, metric pair) cases", nd, ci, changed=int(change.sum()),
            undefined=int(defined.size - nd), metric_pairs=len(hpairs),
            ci_conditions=list(condition_ci(per_cond_changed, per_cond_defined)))
        allm = np.stack([per[s]["all"] for s in srcs])
        allm_b = np.stack([per[s]["all_b"] for s in srcs]) if has_boot else None
        r_, rci, nchg = _rate_with_ci(allm, allm_b)
        sec["all_metrics_top1_change_rate"] = _stat(
            r_, f"fraction of (source, region) conditions in which no scheduler is best (or tied best) under every "
                f"one of the {len(M)} metrics (the old rule; secondary)", allm.size, rci, changed=nchg)
        prs = {k: np.stack([per[s]["pr"][k] for s in srcs]) for k in per[srcs[0]]["pr"]}   # (S, R, Q[, B])
        head_pairs = np.array([i in head and j in head for i, j in mpairs], bool)
        shape = prs["tau"].shape
        sec.update(aggregate(prs, np.broadcast_to(head_pairs, shape), f"(source, region, headline metric pair) conditions of "
                                                                f"panel {name}"))
        sec["all_metrics"] = aggregate(prs, np.ones(shape, bool), "(source, region, metric pair) conditions, every metric")
        out[name] = sec
    return out


def _top1_pairs_rate(top1_pairs: pl.DataFrame) -> float:
    d = top1_pairs.filter(pl.col("defined"))
    return float(d["top1_changes"].mean()) if d.height else float("nan")


def winner_counts(top1: pl.DataFrame, n_schedulers: int | None = None) -> pl.DataFrame:
    """Per metric and scheduler: conditions where it is top-1 (a tie for best counts for each tied
    scheduler; conditions where every scheduler ties -- one tie group -- are left out and counted in
    ``all_tied``). ``n_schedulers`` is not needed (kept for callers): a source whose n/a schedulers are left
    out ranks fewer."""
    every = pl.col("n_groups") == 1
    all_tied = top1.group_by("metric").agg(every.sum().alias("all_tied"))
    return (top1.filter(~every)
            .with_columns(pl.col("winner").str.split("+").alias("scheduler")).explode("scheduler")
            .group_by(["metric", "scheduler"]).agg(pl.len().alias("wins"))
            .join(all_tied, on="metric", how="right")
            .sort(["metric", "wins", "scheduler"], descending=[False, True, False], nulls_last=True))


def top_winners(A: "Analysis") -> pl.DataFrame:
    """Per metric: the most frequent top-1 scheduler, its wins, and the all-tied conditions."""
    n = len(A.summary["parameters"]["schedulers"])
    return winner_counts(A["top1"], n).group_by("metric", maintain_order=True).first() \
        .select("metric", pl.col("scheduler").alias("most_frequent_winner"), "wins", "all_tied")


def _top1_rows(s: str, cube: Cube, rk: Ranking, mask) -> pl.DataFrame:
    K = np.asarray(cube.schedulers)
    with warnings.catch_warnings():            # a metric undefined in every window of a cell: its mean is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        means_s = np.nanmean(cube.oriented(s), axis=-1) if cube.values[s].shape[-1] else np.full(mask.shape, np.nan)
    groups = rk.n_groups(s)
    rows = []
    for r, region in enumerate(cube.regions):
        for m, metric in enumerate(cube.metrics):
            mk = mask[r, m]
            x = means_s[r, m]
            if np.isnan(x).all():   # the metric is undefined here (e.g. tenant metrics without tenants): n/a
                continue
            others = np.where(mk, np.nan, x)
            ru = int(np.nanargmax(others)) if not np.isnan(others).all() else None
            raw_best = cube.sign[m] * np.max(x[mk]) if mk.any() else np.nan   # the best of the tied winners
            raw_ru = cube.sign[m] * x[ru] if ru is not None else np.nan
            rows.append({"source": s, "provenance": cube.provenance[s], "region": region, "metric": metric,
                         "winner": "+".join(K[mk]), "n_tied": int(mk.sum()), "n_groups": int(groups[r, m]),
                         "runner_up": K[ru] if ru is not None else "",
                         "margin_rel": float(stats.relative_effect(raw_best, raw_ru))})
    return pl.DataFrame(rows)


def _slo_sensitivity(cube: Cube, rk: Ranking, panels: dict, tables, red: Restricted | None = None) -> dict[str, dict]:
    """How much the ranking depends on the SLO definition: tau-b between the rankings under every two
    ``slo_*`` metrics per (source, region), Kendall's W across them, top-1 changes; summaries per panel. A
    source of ``red.sources`` is ranked without its n/a schedulers (``red``)."""
    S, R = cube.sources, cube.regions
    idx = [i for i, m in enumerate(cube.metrics) if m.startswith("slo_")]
    names = [cube.metrics[i] for i in idx]
    if len(idx) < 2:
        tables["slo_tau"], tables["slo_conditions"] = _empty("slo_tau"), _empty("slo_conditions")
        return {name: {"available": False, "reason": f"fewer than two SLO metrics among {cube.metrics}",
                       "slo_metrics": names} for name in panels}
    has_boot = all(rk.boot[s] is not None for s in S)
    pairs = list(combinations(range(len(idx)), 2))
    per: dict[str, dict] = {}
    rows, crows = [], []
    for s in S:
        rks = red.rk if red and red.uses(s) else rk
        K = np.asarray(red.cube.schedulers if red and red.uses(s) else cube.schedulers)
        V = rks.values[s][:, idx]                                                # (R, L, K)
        Bt = rks.boot[s][:, idx] if has_boot else None
        pr = pairs_of(compare_all(V, Bt), pairs)
        W = stats.kendall_w(stats.ranks_best_first(V, axis=-1))
        Wb = stats.kendall_w(stats.ranks_best_first(np.transpose(Bt, (0, 3, 1, 2)), axis=-1)) if has_boot else None
        mask = stats.top1_mask(V, axis=-1)
        change = stats.top1_changes(mask)
        change_b = stats.top1_changes(np.transpose(stats.top1_mask(Bt, axis=2), (0, 3, 1, 2))) if has_boot else None
        per[s] = {"pr": pr, "W": W, "Wb": Wb, "change": change, "change_b": change_b}
        rows.append(pair_table(pr, ("region", R), "spair", names, pairs, ("slo_1", "slo_2"), s, cube.provenance[s],
                               len(K), "slo_tau"))
        wlo, whi = stats.percentile_ci(Wb) if Wb is not None else (np.full(len(R), np.nan),) * 2
        winners = ["; ".join(f"{names[l]}={'+'.join(K[mask[r, l]])}" for l in range(len(names))) for r in range(len(R))]
        crows.append(pl.DataFrame({"source": s, "provenance": cube.provenance[s], "region": R, "W": W,
                                   "ci_low": wlo, "ci_high": whi, "top1_changes": change, "winners": winners}))
    tables["slo_tau"] = pl.concat(rows)
    tables["slo_conditions"] = pl.concat(crows).select(list(COLUMNS["slo_conditions"]))
    out: dict[str, dict] = {}
    for name, p in available_panels(panels, out):
        srcs = [s for s in p["sources"] if s in S]
        prs = {k: np.stack([per[s]["pr"][k] for s in srcs]) for k in per[srcs[0]]["pr"]}
        W = np.stack([per[s]["W"] for s in srcs])
        Wb = np.stack([per[s]["Wb"] for s in srcs]) if has_boot else None
        wv, wci, wn = _mean_with_ci(W, Wb)
        r_, rci, nchg = _rate_with_ci(np.stack([per[s]["change"] for s in srcs]),
                                      np.stack([per[s]["change_b"] for s in srcs]) if has_boot else None)
        sec = {"available": True, "sources": srcs, "slo_metrics": names, "n_conditions": len(srcs) * len(R),
               "definition": "how much the scheduler ranking depends on the SLO definition used by SLO-attainment metrics"}
        sec.update(aggregate(prs, np.ones(prs["tau"].shape, bool), "(source, region, SLO pair) conditions"))
        sec["kendall_w"] = _stat(wv, "Kendall's W across the SLO definitions' rankings, averaged over source x region",
                                 wn, wci)
        sec["top1_change_rate"] = _stat(r_, "fraction of (source, region) conditions where no scheduler is best (or "
                                            "tied best) under every SLO definition", len(srcs) * len(R), rci, changed=nchg)
        out[name] = sec
    return out


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
        out = [tuple(c.split("/")) for c in want]          # settings(): "source/region/metric"
        return [c for c in out if len(c) == 3 and c[0] in cube.sources and c[1] in cube.regions and c[2] in cube.metrics]
    md = rv.get("most_dramatic")
    if md:
        region, metric = md["region"], md["metric"]
    else:
        heads = [m for m in cfg["headline_metrics"] if m in cube.metrics] or cube.metrics
        region, metric = cube.regions[-1], heads[0]
    return [(s, region, metric) for s in cube.sources]
