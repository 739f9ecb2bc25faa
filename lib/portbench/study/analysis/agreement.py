"""Rankings and rank agreement between sources (per panel) and between operating regions: Kendall tau-b,
tau-b / tau-b,max, discordance among pairs resolved on both sides, Kendall's W, bootstrap CIs."""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import polars as pl

from .. import stats
from .columns import COLUMNS
from .common import (_empty, _frame, _mean_with_ci, _num, _stat, aggregate, available_panels, compare_all, pairs_of,
                     unavailable_reason)
from .cube import Cube
from .ties import RULE_TEXT, Ranking, Restricted


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


def pair_table(pr: dict, outer: tuple[str, list], pair: str, names: list, pairs: list, firsts: tuple[str, str],
               source: str, provenance: str, n_items: int, table: str) -> pl.DataFrame:
    """The long tau table of the ranking comparisons ``pr`` (:func:`pairs_of`, axes ``outer`` x ``pairs``):
    a ``pair`` column ``"a|b"`` of ``names``, its two names in the columns ``firsts``, the source, its provenance
    and the number of ranked items, in the columns of ``table``."""
    f = _frame({outer[0]: outer[1], pair: [f"{names[i]}|{names[j]}" for i, j in pairs]}, **_table_cols(pr))
    return f.with_columns(pl.col(pair).str.split("|").list.get(0).alias(firsts[0]),
                          pl.col(pair).str.split("|").list.get(1).alias(firsts[1]),
                          pl.lit(source).alias("source"), pl.lit(provenance).alias("provenance"),
                          pl.lit(n_items).alias("n_items")).select(list(COLUMNS[table]))


def _metric_mask(shape, axis: int, idx) -> np.ndarray:
    m = np.zeros(shape, bool)
    sl: list[slice | list] = [slice(None)] * len(shape)
    sl[axis] = list(idx)
    m[tuple(sl)] = True
    return m


def _merge_pairs(full: dict, red: dict, use, axis: int) -> dict:
    """Entries of two :func:`pairs_of` results: ``red``'s for the pairs (along ``axis``) where ``use``,
    ``full``'s elsewhere (resample entries ``*_b`` have one more, last, axis)."""
    out = {}
    for k, x in full.items():
        shape = [1] * np.ndim(x)
        shape[axis] = len(use)
        out[k] = np.where(np.asarray(use, bool).reshape(shape), red[k], x)
    return out


LEAST_AGREEING = ("the defined condition whose tau-b has the lowest upper bootstrap CI bound (ties: the lower tau-b, "
                  "then more pairs resolved in both rankings); without bootstrap CIs, the lowest tau-b")


def _least_agreeing(tau, ci_high, resolved, mask) -> tuple | None:
    """Index of the least agreeing condition (:data:`LEAST_AGREEING`) among the defined ones in ``mask``:
    a condition whose interval still reaches high values is not called the least agreeing on its point
    estimate alone."""
    tau = np.where(mask, np.asarray(tau, dtype=float), np.nan)
    ok = ~np.isnan(tau)
    if not ok.any():
        return None
    hi = np.where(ok, np.asarray(ci_high, dtype=float), np.nan)
    res = np.where(ok, np.asarray(resolved, dtype=float), 0.0)
    idx = np.argwhere(ok)
    key: list[tuple]
    if np.isfinite(hi[ok]).any():
        idx = np.argwhere(ok & np.isfinite(hi))
        key = [(hi[tuple(i)], tau[tuple(i)], -res[tuple(i)]) for i in idx]
    else:
        key = [(tau[tuple(i)], -res[tuple(i)]) for i in idx]
    return tuple(int(x) for x in idx[min(range(len(idx)), key=lambda n: key[n])])


def _all_tied_reasons(groups: dict[str, np.ndarray], mask_by_source: dict[str, np.ndarray]) -> dict:
    """Rankings that tie every scheduler, per source (over the conditions selected for that source)."""
    return {s: int(((g == 1) & mask_by_source[s]).sum()) for s, g in groups.items()}


def _panel_pairs(rk: Ranking, srcs: list[str], pairs, boot: bool = True, scipy_points: bool = True) -> dict:
    """:func:`compare_all` of the panel's rankings for the source ``pairs``: (R, M, Q[, B])."""
    V = np.stack([rk.values[s] for s in srcs], axis=2)                         # (R, M, S, K)
    Bt = np.stack([rk.boot[s] for s in srcs], axis=2) if boot else None        # (R, M, S, K, B)
    return pairs_of(compare_all(V, Bt, scipy_points=scipy_points), pairs)


def _cross_source_panel(cube: Cube, rk: Ranking, others: dict[str, Ranking], name: str, srcs: list[str],
                        head: list[int], red: Restricted | None = None) -> tuple[dict, pl.DataFrame, pl.DataFrame]:
    """One panel: the tau table rows, the W rows and the summary section. With ``red``, a source pair that
    involves one of ``red.sources`` is compared on the restricted rankings (its n/a schedulers left out on
    both sides), and so is Kendall's W over the panel's sources."""
    R, M = cube.regions, cube.metrics
    pairs = list(combinations(range(len(srcs)), 2))
    has_boot = all(rk.boot[s] is not None for s in srcs)
    use = [bool(red and red.uses(srcs[i], srcs[j])) for i, j in pairs]
    pr = _panel_pairs(rk, srcs, pairs, has_boot)                               # (R, M, Q[, B])
    if any(use):
        pr = _merge_pairs(pr, _panel_pairs(red.rk, srcs, pairs, has_boot), use, axis=2)
    n_items = [len(red.cube.schedulers) if u else len(cube.schedulers) for u in use]
    cols = _table_cols(pr)
    rows = []
    for q, (i, j) in enumerate(pairs):
        f = _frame({"region": R, "metric": M}, **{k: v[:, :, q] for k, v in cols.items()})
        rows.append(f.with_columns(pl.lit(name).alias("panel"), pl.lit(srcs[i]).alias("source_1"),
                                   pl.lit(srcs[j]).alias("source_2"),
                                   pl.lit(cube.provenance[srcs[i]]).alias("provenance_1"),
                                   pl.lit(cube.provenance[srcs[j]]).alias("provenance_2"),
                                   pl.lit(n_items[q]).alias("n_items")).select(list(COLUMNS["cross_source_tau"])))
    tau_table = pl.concat(rows)

    w_rk = red.rk if red and red.uses(*srcs) else rk
    V = np.stack([w_rk.values[s] for s in srcs], axis=2)                      # (R, M, S, K)
    ranks = stats.ranks_best_first(V, axis=-1)                                 # (R, M, S, K)
    W = np.asarray(stats.kendall_w(ranks))
    if has_boot:
        Bt = np.stack([w_rk.boot[s] for s in srcs], axis=2)
        Wb = stats.kendall_w(stats.ranks_best_first(np.moveaxis(Bt, -1, 2), axis=-1))   # (R, M, B)
        wlo, whi = stats.percentile_ci(Wb)
    else:
        Wb, wlo, whi = None, np.full(W.shape, np.nan), np.full(W.shape, np.nan)
    w_table = (_frame({"region": R, "metric": M}, W=W, ci_low=wlo, ci_high=whi, n_rankings=len(srcs),
                      n_items=V.shape[-1])
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
    resolved = pr["concordant"] + pr["discordant"]
    at = _least_agreeing(pr["tau"], cols["ci_high"], resolved, head_mask)
    if at is not None:
        r, k, q = at
        i, j = pairs[q]
        out["lowest"] = {"source_1": srcs[i], "source_2": srcs[j], "region": R[r], "metric": M[k],
                         "tau": _num(pr["tau"][r, k, q]), "tau_norm": _num(pr["tau_norm"][r, k, q]),
                         "ci": [_num(cols["ci_low"][r, k, q]), _num(cols["ci_high"][r, k, q])],
                         "resolved_pairs": _num(resolved[r, k, q]), "discordant": _num(pr["discordant"][r, k, q]),
                         "n_items": n_items[q], "groups": [_num(pr["groups_x"][r, k, q]), _num(pr["groups_y"][r, k, q])],
                         "definition": LEAST_AGREEING}
    out["na_schedulers"] = _na_block(red, head_mask & np.asarray(use, bool)[None, None, :], srcs)
    # sensitivity: the same headline numbers under the other tie rules (point estimates)
    out["by_tie_rule"] = {}
    for rule, other in {rk.rule: rk, **others}.items():
        if rule == rk.rule:
            agg, agg_all = {k: out[k] for k in ("tau_b", "tau_b_norm", "discordance", "conditions")}, out["all_metrics"]
        else:
            po = _panel_pairs(other, srcs, pairs, False, scipy_points=False)
            if any(use):
                po = _merge_pairs(po, _panel_pairs(red.others[rule], srcs, pairs, False, scipy_points=False), use, axis=2)
            agg, agg_all = aggregate(po, head_mask, what), aggregate(po, np.ones(shape, bool), "conditions")
        out["by_tie_rule"][rule] = _rule_row(agg, agg_all, rule, rk.rule)
    return out, tau_table, w_table


def _rule_row(agg: dict, agg_all: dict, rule: str, chosen: str, **extra) -> dict:
    """One ``by_tie_rule`` entry: the headline numbers (and every metric's mean tau-b) under ``rule``."""
    return {"tau_b": agg["tau_b"]["value"], "tau_b_norm": agg["tau_b_norm"]["value"],
            "discordance": agg["discordance"]["value"], "defined": agg["conditions"]["defined"],
            "all_tied": agg["conditions"]["all_tied"], "total": agg["conditions"]["total"],
            "tau_b_all_metrics": agg_all["tau_b"]["value"], "defined_all_metrics": agg_all["conditions"]["defined"],
            "total_all_metrics": agg_all["conditions"]["total"], **extra,
            "chosen": rule == chosen, "definition": RULE_TEXT[rule]}


def _na_block(red: Restricted | None, used, srcs: list[str]) -> dict:
    """The ``na_schedulers`` entry of a section: which schedulers are left out where, and in how many of the
    section's headline conditions (``used``: a boolean mask over them)."""
    here = [s for s in srcs if red and s in red.sources]
    if not here:
        return {"dropped": [], "sources": [], "headline_conditions": 0,
                "definition": "no scheduler is n/a on this panel's sources: every comparison ranks every scheduler"}
    return {"dropped": list(red.dropped), "sources": here, "headline_conditions": int(np.sum(used)),
            "n_items": len(red.cube.schedulers), "definition": red.reason(here)}


def _cross_source(cube: Cube, rk: Ranking, others: dict[str, Ranking], panels: dict, head: list[int],
                  tables, red: Restricted | None = None) -> dict[str, dict]:
    """Per panel: the cross-source section (``available: False`` with the reason for a panel whose
    sources are not all in the runs table). Tables get one block of rows per available panel."""
    out: dict[str, dict] = {}
    taus, ws = [], []
    for name, p in available_panels(panels, out):
        sec, t, w = _cross_source_panel(cube, rk, others, name, p["sources"], head, red)
        out[name] = {"available": True, **sec}
        taus.append(t)
        ws.append(w)
    tables["cross_source_tau"] = pl.concat(taus) if taus else _empty("cross_source_tau")
    tables["cross_source_w"] = pl.concat(ws) if ws else _empty("cross_source_w")
    return out


def _region_pairs(rk: Ranking, s: str, rpairs, boot: bool = True, scipy_points: bool = True) -> dict:
    """:func:`compare_all` of one source's rankings for the region pairs ``rpairs``: (M, Q[, B])."""
    V = np.transpose(rk.values[s], (1, 0, 2))                                    # (M, R, K)
    Bt = np.transpose(rk.boot[s], (1, 0, 2, 3)) if boot else None                # (M, R, K, B)
    return pairs_of(compare_all(V, Bt, scipy_points=scipy_points), rpairs)


def _cross_region(cube: Cube, rk: Ranking, panels: dict, head: list[int], tables,
                  others: dict[str, Ranking] | None = None, red: Restricted | None = None) -> dict[str, dict]:
    """Per source: every region pair's agreement per metric (table); per panel: the summary over its sources,
    and the same headline numbers under the other tie rules (``by_tie_rule``, point estimates). A source of
    ``red.sources`` is compared on the restricted rankings (its n/a schedulers left out)."""
    S, R, M = cube.sources, cube.regions, cube.metrics
    others = others or {}
    rpairs = list(combinations(range(len(R)), 2))
    has_boot = all(rk.boot[s] is not None for s in S)
    of = {s: (red.rk if red and red.uses(s) else rk) for s in S}                 # each source's rankings
    res_by_source, W_all, Wb_all, rows, wrows = {}, {}, {}, [], []
    for s in S:
        V = np.transpose(of[s].values[s], (1, 0, 2))                             # (M, R, K)
        Bt = np.transpose(of[s].boot[s], (1, 0, 2, 3)) if has_boot else None     # (M, R, K, B)
        pr = _region_pairs(of[s], s, rpairs, has_boot)                           # (M, Q[, B])
        res_by_source[s] = pr
        if rpairs:
            rows.append(pair_table(pr, ("metric", M), "region_pair", R, rpairs, ("region_1", "region_2"), s,
                                   cube.provenance[s], V.shape[-1], "cross_region_tau"))
        W_all[s] = stats.kendall_w(stats.ranks_best_first(V, axis=-1)) if len(R) >= 2 else np.full(len(M), np.nan)
        Wb_all[s] = (stats.kendall_w(stats.ranks_best_first(np.moveaxis(Bt, -1, 1), axis=-1))
                     if has_boot and len(R) >= 2 else None)                      # (M, B)
        wlo, whi = stats.percentile_ci(Wb_all[s]) if Wb_all[s] is not None else (np.full(len(M), np.nan),) * 2
        wrows.append(_frame({"metric": M}, W=W_all[s], ci_low=wlo, ci_high=whi, n_rankings=len(R),
                            n_items=V.shape[-1])
                     .with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"))
                     .select(list(COLUMNS["cross_region_w"])))
    tables["cross_region_tau"] = pl.concat(rows) if rows else _empty("cross_region_tau")
    tables["cross_region_w"] = pl.concat(wrows)

    out = {}
    for name, p in panels.items():
        srcs = [s for s in p["sources"] if s in S]
        if not p["available"] or not rpairs:
            out[name] = {"available": False, "sources": p["sources"],
                         "reason": (unavailable_reason(p) if not p["available"]
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
        lo, hi = (stats.percentile_ci(st_["tau_b"]) if "tau_b" in st_ else (np.full(shape, np.nan),) * 2)
        resolved = st_["concordant"] + st_["discordant"]
        at = _least_agreeing(st_["tau"], hi, resolved, head_mask)
        if at is not None:
            si, k, q = at
            sec["lowest"] = {"source": srcs[si], "metric": M[k], "region_1": R[rpairs[q][0]],
                             "region_2": R[rpairs[q][1]], "tau": _num(st_["tau"][si, k, q]),
                             "tau_norm": _num(st_["tau_norm"][si, k, q]), "ci": [_num(lo[si, k, q]), _num(hi[si, k, q])],
                             "resolved_pairs": _num(resolved[si, k, q]), "discordant": _num(st_["discordant"][si, k, q]),
                             "groups": [_num(st_["groups_x"][si, k, q]), _num(st_["groups_y"][si, k, q])],
                             "definition": LEAST_AGREEING}
        used = np.broadcast_to(np.asarray([bool(red and red.uses(s)) for s in srcs])[:, None, None], shape)
        sec["na_schedulers"] = _na_block(red, head_mask & used, srcs)
        # sensitivity: the same headline numbers under the other tie rules (point estimates)
        ext_mask = head_mask & _metric_mask(shape, 2, [q_ext])
        sec["by_tie_rule"] = {}
        for rule, other in {rk.rule: rk, **others}.items():
            if rule == rk.rule:
                agg = {k: sec[k] for k in ("tau_b", "tau_b_norm", "discordance", "conditions")}
                pts = {k: v for k, v in st_.items() if not k.endswith("_b")}
                agg_all, agg_ext = aggregate(pts, np.ones(shape, bool), "conditions"), sec["extreme_regions"]
            else:
                each = [_region_pairs(red.others[rule] if red and red.uses(s) else other, s, rpairs, False,
                                      scipy_points=False) for s in srcs]
                po = {k: np.stack([x[k] for x in each]) for k in each[0]}
                agg = aggregate(po, head_mask, "conditions")
                agg_all, agg_ext = aggregate(po, np.ones(shape, bool), "conditions"), aggregate(po, ext_mask, "conditions")
            sec["by_tie_rule"][rule] = _rule_row(agg, agg_all, rule, rk.rule, tau_b_extreme=agg_ext["tau_b"]["value"],
                                                 defined_extreme=agg_ext["conditions"]["defined"],
                                                 total_extreme=agg_ext["conditions"]["total"])
        out[name] = sec
    return out
