"""Rankings and rank agreement between sources (per panel) and between operating regions: Kendall tau-b,
tau-b / tau-b,max, discordance among pairs resolved on both sides, Kendall's W, bootstrap CIs."""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import polars as pl

from .. import stats
from .columns import COLUMNS
from .common import _empty, _frame, _mean_with_ci, _num, _stat, aggregate, compare_all, pairs_of
from .cube import Cube
from .ties import RULE_TEXT, Ranking


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


def _rankings_table(cube: Cube, boot, rk: Ranking) -> pl.DataFrame:
    frames = []
    for s in cube.sources:
        raw = cube.values[s]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(raw, axis=-1)
            sd = np.nanstd(raw, axis=-1, ddof=1) if raw.shape[-1] > 1 else np.full(mean.shape, np.nan)
        n = (~np.isnan(raw)).sum(axis=-1)
        rank = stats.ranks_best_first(rk.values[s], axis=-1)
        lab = rk.labels[s]
        n_tied = np.sum(lab[..., :, None] == lab[..., None, :], axis=-1)
        if boot[s] is not None:
            lo, hi = stats.percentile_ci(boot[s] * cube.sign[None, :, None, None])
        else:
            lo = hi = np.full(mean.shape, np.nan)
        f = _frame({"region": cube.regions, "metric": cube.metrics, "scheduler": cube.schedulers},
                   mean=mean, sd=sd, n_windows=n, rank=rank, group=np.where(lab >= 0, lab + 1, -1),
                   n_groups=np.broadcast_to(rk.n_groups(s)[..., None], lab.shape), n_tied=n_tied,
                   group_mean=rk.values[s] * cube.sign[None, :, None], ci_low=lo, ci_high=hi)
        f = f.with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                           pl.col("region").replace_strict(cube.rho, return_dtype=pl.Float64).alias("rho"),
                           pl.col("metric").replace_strict(dict(zip(cube.metrics, cube.directions)),
                                                           return_dtype=pl.Utf8).alias("direction"))
        frames.append(f)
    return pl.concat(frames).select(list(COLUMNS["rankings"]))


def _table_cols(res: dict) -> dict:
    """Columns shared by the tau tables, from :func:`compare_all` entries for pairs (boot last)."""
    has = "tau_b" in res
    nan = np.full(res["tau"].shape, np.nan)
    lo, hi = stats.percentile_ci(res["tau_b"]) if has else (nan, nan)
    nlo, nhi = stats.percentile_ci(res["tau_norm_b"]) if has else (nan, nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        disc = res["discordant"] / (res["concordant"] + res["discordant"])
    return {"tau": res["tau"], "ci_low": lo, "ci_high": hi, "tau_max": res["tau_max"], "tau_norm": res["tau_norm"],
            "norm_ci_low": nlo, "norm_ci_high": nhi, "concordant": res["concordant"], "discordant": res["discordant"],
            "discordance": disc, "groups_1": res["groups_x"], "groups_2": res["groups_y"],
            "status": np.asarray(["defined", "all_tied", "missing"], dtype=object)[res["status"]],
            "n_boot_valid": (~np.isnan(res["tau_b"])).sum(axis=-1) if has else np.zeros(res["tau"].shape, int)}


def _metric_mask(shape, axis: int, idx) -> np.ndarray:
    m = np.zeros(shape, bool)
    sl = [slice(None)] * len(shape)
    sl[axis] = list(idx)
    m[tuple(sl)] = True
    return m


def _all_tied_reasons(groups: dict[str, np.ndarray], mask_by_source: dict[str, np.ndarray]) -> dict:
    """Rankings that tie every scheduler, per source (over the conditions selected for that source)."""
    return {s: int(((g == 1) & mask_by_source[s]).sum()) for s, g in groups.items()}


def _cross_source_panel(cube: Cube, rk: Ranking, others: dict[str, Ranking], name: str, srcs: list[str],
                        head: list[int]) -> tuple[dict, pl.DataFrame, pl.DataFrame]:
    """One panel: the tau table rows, the W rows and the summary section."""
    R, M = cube.regions, cube.metrics
    pairs = list(combinations(range(len(srcs)), 2))
    has_boot = all(rk.boot[s] is not None for s in srcs)
    V = np.stack([rk.values[s] for s in srcs], axis=2)                        # (R, M, S, K)
    Bt = np.stack([rk.boot[s] for s in srcs], axis=2) if has_boot else None   # (R, M, S, K, B)
    pr = pairs_of(compare_all(V, Bt), pairs)                                   # (R, M, Q[, B])
    cols = _table_cols(pr)
    rows = []
    for q, (i, j) in enumerate(pairs):
        f = _frame({"region": R, "metric": M}, **{k: v[:, :, q] for k, v in cols.items()})
        rows.append(f.with_columns(pl.lit(name).alias("panel"), pl.lit(srcs[i]).alias("source_1"),
                                   pl.lit(srcs[j]).alias("source_2"),
                                   pl.lit(cube.provenance[srcs[i]]).alias("provenance_1"),
                                   pl.lit(cube.provenance[srcs[j]]).alias("provenance_2"),
                                   pl.lit(len(cube.schedulers)).alias("n_items")).select(list(COLUMNS["cross_source_tau"])))
    tau_table = pl.concat(rows)

    ranks = stats.ranks_best_first(V, axis=-1)                                 # (R, M, S, K)
    W = stats.kendall_w(ranks)
    if has_boot:
        Wb = stats.kendall_w(stats.ranks_best_first(np.moveaxis(Bt, -1, 2), axis=-1))   # (R, M, B)
        wlo, whi = stats.percentile_ci(Wb)
    else:
        Wb, wlo, whi = None, np.full(W.shape, np.nan), np.full(W.shape, np.nan)
    w_table = (_frame({"region": R, "metric": M}, W=W, ci_low=wlo, ci_high=whi, n_rankings=len(srcs),
                      n_items=len(cube.schedulers))
               .with_columns(pl.lit(name).alias("panel"),
                             pl.lit(",".join(f"{s}:{cube.provenance[s]}" for s in srcs)).alias("provenance"))
               .select(list(COLUMNS["cross_source_w"])))

    shape = pr["tau"].shape
    head_mask = _metric_mask(shape, 1, head)
    what = f"(region, headline metric, source pair) conditions of panel {name}"
    out: dict = {"definition": f"agreement between the scheduler rankings of the panel's sources ({', '.join(srcs)}), "
                               "same region and metric; statistical ties",
                 "sources": srcs, "n_source_pairs": len(pairs), "metrics": [M[k] for k in head]}
    out.update(aggregate(pr, head_mask, what))
    groups = {s: rk.n_groups(s) for s in srcs}
    hm = _metric_mask(groups[srcs[0]].shape, 1, head)
    out["conditions"]["all_tied_rankings_by_source"] = _all_tied_reasons(groups, {s: hm for s in srcs})
    out["conditions"]["reason"] = ("a condition is undefined when a source's ranking ties every scheduler (no pair "
                                   "resolved: too few windows, or schedulers that behave identically, e.g. at light "
                                   "load) or a value is missing; such conditions are counted here, not averaged")
    rest = [k for k in range(len(M)) if k not in head]
    out["secondary"] = aggregate(pr, _metric_mask(shape, 1, rest), f"conditions of the secondary metrics, panel {name}")
    out["all_metrics"] = aggregate(pr, np.ones(shape, bool), f"conditions of every metric, panel {name}")
    names = [f"{srcs[i]}|{srcs[j]}" for i, j in pairs]
    out["by_source_pair"] = {n: aggregate(pr, _metric_mask(shape, 2, [q]) & head_mask, f"headline conditions of {n}")
                             for q, n in enumerate(names)}
    out["by_region"] = {r: aggregate(pr, _metric_mask(shape, 0, [k]) & head_mask, f"headline conditions in {r}")
                        for k, r in enumerate(R)}
    out["by_metric"] = {m: aggregate(pr, _metric_mask(shape, 1, [k]), f"conditions of {m}") for k, m in enumerate(M)}
    wv, wci, wn = _mean_with_ci(W, Wb, _metric_mask(W.shape, 1, head))
    out["kendall_w"] = _stat(wv, f"Kendall's W across the {len(srcs)} sources' rankings (tie-corrected, statistical "
                                 "ties), averaged over region x headline metric where defined", wn, wci)
    tau = np.where(head_mask, pr["tau"], np.nan)
    if not np.isnan(tau).all():
        r, k, q = np.unravel_index(np.nanargmin(tau), tau.shape)
        i, j = pairs[q]
        lo, hi = cols["ci_low"], cols["ci_high"]
        out["lowest"] = {"source_1": srcs[i], "source_2": srcs[j], "region": R[r], "metric": M[k],
                         "tau": _num(tau[r, k, q]), "tau_norm": _num(pr["tau_norm"][r, k, q]),
                         "ci": [_num(lo[r, k, q]), _num(hi[r, k, q])]}
    # sensitivity: the same headline numbers under the other tie rules (point estimates)
    out["by_tie_rule"] = {}
    for rule, other in {rk.rule: rk, **others}.items():
        if rule == rk.rule:
            agg, agg_all = {k: out[k] for k in ("tau_b", "tau_b_norm", "discordance", "conditions")}, out["all_metrics"]
        else:
            Vo = np.stack([other.values[s] for s in srcs], axis=2)
            po = pairs_of(compare_all(Vo, scipy_points=False), pairs)
            agg, agg_all = aggregate(po, head_mask, what), aggregate(po, np.ones(shape, bool), "conditions")
        out["by_tie_rule"][rule] = {"tau_b": agg["tau_b"]["value"], "tau_b_norm": agg["tau_b_norm"]["value"],
                                    "discordance": agg["discordance"]["value"], "defined": agg["conditions"]["defined"],
                                    "all_tied": agg["conditions"]["all_tied"], "total": agg["conditions"]["total"],
                                    "tau_b_all_metrics": agg_all["tau_b"]["value"],
                                    "defined_all_metrics": agg_all["conditions"]["defined"],
                                    "total_all_metrics": agg_all["conditions"]["total"],
                                    "chosen": rule == rk.rule, "definition": RULE_TEXT[rule]}
    return out, tau_table, w_table


def _cross_source(cube: Cube, rk: Ranking, others: dict[str, Ranking], panels: dict, head: list[int],
                  tables) -> dict[str, dict]:
    """Per panel: the cross-source section (``available: False`` with the reason for a panel whose
    sources are not all in the runs table). Tables get one block of rows per available panel."""
    out, taus, ws = {}, [], []
    for name, p in panels.items():
        if not p["available"]:
            out[name] = {"available": False, "sources": p["sources"],
                         "reason": f"not available: sources missing ({', '.join(p['missing'])})"}
            continue
        sec, t, w = _cross_source_panel(cube, rk, others, name, p["sources"], head)
        out[name] = {"available": True, **sec}
        taus.append(t)
        ws.append(w)
    tables["cross_source_tau"] = pl.concat(taus) if taus else _empty("cross_source_tau")
    tables["cross_source_w"] = pl.concat(ws) if ws else _empty("cross_source_w")
    return out


def _cross_region(cube: Cube, rk: Ranking, panels: dict, head: list[int], tables) -> dict[str, dict]:
    """Per source: every region pair's agreement per metric (table); per panel: the summary over its sources."""
    S, R, M = cube.sources, cube.regions, cube.metrics
    rpairs = list(combinations(range(len(R)), 2))
    has_boot = all(rk.boot[s] is not None for s in S)
    res_by_source, W_all, Wb_all, rows, wrows = {}, {}, {}, [], []
    for s in S:
        V = np.transpose(rk.values[s], (1, 0, 2))                                # (M, R, K)
        Bt = np.transpose(rk.boot[s], (1, 0, 2, 3)) if has_boot else None        # (M, R, K, B)
        pr = pairs_of(compare_all(V, Bt), rpairs)                                # (M, Q[, B])
        res_by_source[s] = pr
        if rpairs:
            cols = _table_cols(pr)
            f = _frame({"metric": M, "region_pair": [f"{R[i]}|{R[j]}" for i, j in rpairs]}, **cols)
            rows.append(f.with_columns(pl.col("region_pair").str.split("|").list.get(0).alias("region_1"),
                                       pl.col("region_pair").str.split("|").list.get(1).alias("region_2"),
                                       pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                                       pl.lit(len(cube.schedulers)).alias("n_items"))
                        .select(list(COLUMNS["cross_region_tau"])))
        W_all[s] = stats.kendall_w(stats.ranks_best_first(V, axis=-1)) if len(R) >= 2 else np.full(len(M), np.nan)
        Wb_all[s] = (stats.kendall_w(stats.ranks_best_first(np.moveaxis(Bt, -1, 1), axis=-1))
                     if has_boot and len(R) >= 2 else None)                      # (M, B)
        wlo, whi = stats.percentile_ci(Wb_all[s]) if Wb_all[s] is not None else (np.full(len(M), np.nan),) * 2
        wrows.append(_frame({"metric": M}, W=W_all[s], ci_low=wlo, ci_high=whi, n_rankings=len(R),
                            n_items=len(cube.schedulers))
                     .with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"))
                     .select(list(COLUMNS["cross_region_w"])))
    tables["cross_region_tau"] = pl.concat(rows) if rows else _empty("cross_region_tau")
    tables["cross_region_w"] = pl.concat(wrows)

    out = {}
    for name, p in panels.items():
        srcs = [s for s in p["sources"] if s in S]
        if not p["available"] or not rpairs:
            out[name] = {"available": False, "sources": p["sources"],
                         "reason": (f"not available: sources missing ({', '.join(p['missing'])})" if not p["available"]
                                    else "fewer than two regions")}
            continue
        st_ = {k: np.stack([res_by_source[s][k] for s in srcs]) for k in res_by_source[srcs[0]]}   # (S, M, Q[, B])
        shape = st_["tau"].shape
        head_mask = _metric_mask(shape, 1, head)
        sec: dict = {"available": True, "sources": srcs, "n_region_pairs": len(rpairs),
                     "definition": "agreement between the scheduler rankings of two operating regions (same source "
                                   "and metric; statistical ties)", "metrics": [M[k] for k in head]}
        sec.update(aggregate(st_, head_mask, f"(source, headline metric, region pair) conditions of panel {name}"))
        sec["secondary"] = aggregate(st_, _metric_mask(shape, 1, [k for k in range(len(M)) if k not in head]),
                                     "conditions of the secondary metrics")
        q_ext = rpairs.index((0, len(R) - 1))
        sec["extreme_regions"] = aggregate(st_, head_mask & _metric_mask(shape, 2, [q_ext]),
                                           f"headline conditions between the lightest ({R[0]}) and the heaviest "
                                           f"({R[-1]}) region")
        sec["extreme_regions"]["regions"] = [R[0], R[-1]]
        adj = [q for q, (i, j) in enumerate(rpairs) if j == i + 1]
        sec["adjacent_regions"] = aggregate(st_, head_mask & _metric_mask(shape, 2, adj),
                                            "headline conditions between neighbouring regions (next load level)")
        sec["by_source"] = {s: aggregate(st_, head_mask & _metric_mask(shape, 0, [i]), f"headline conditions on {s}")
                            for i, s in enumerate(srcs)}
        Wst = np.stack([W_all[s] for s in srcs])
        Wbst = np.stack([Wb_all[s] for s in srcs]) if all(Wb_all[s] is not None for s in srcs) else None
        wv, wci, wn = _mean_with_ci(Wst, Wbst, _metric_mask(Wst.shape, 1, head))
        sec["kendall_w"] = _stat(wv, f"Kendall's W across the {len(R)} regions' rankings, averaged over "
                                     "sources x headline metrics", wn, wci)
        tau = np.where(head_mask, st_["tau"], np.nan)
        if not np.isnan(tau).all():
            si, k, q = np.unravel_index(np.nanargmin(tau), tau.shape)
            sec["lowest"] = {"source": srcs[si], "metric": M[k], "region_1": R[rpairs[q][0]],
                             "region_2": R[rpairs[q][1]], "tau": _num(tau[si, k, q])}
        out[name] = sec
    return out
