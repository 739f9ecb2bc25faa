"""The attribution's numbers: hybrid rankings vs A and B, Shapley decomposition with bootstrap CIs,
interaction, reversal tracing; tables, the ``attribution`` section of ``summary.json``, files."""

from __future__ import annotations

import json
import warnings
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from ...core import io as fileio
from ...core.config import TIE_RULES, AnalysisConfig, SimulationConfig
from ...core.errors import DataError
from ...core.provenance import label
from .. import stats
from ..analysis import ties as analysis_ties
from ..analysis.common import _num, _stat
from ..analysis.cube import settings
from ..analysis.reversals import _groups as reversal_groups
from ..analysis.sections import write_section
from . import rankings, robustness
from .design import Design
from ...data import hybrids
from .runs import (LOAD_CHECK, LOAD_DEFINITION, STEADY_REQUESTS, UTILISATION_DEFINITION, AttributionRuns, attribution_dir,
                   window_part)
from .game import grouped, interaction, shapley, singles, smallest_sets

SECTION = "attribution"
TABLES = ("hybrid_agreement", "shapley", "conditions", "rankings", "tracing", "hybrids", "load")
DEFINITION = ("counterfactual attribution of the disagreement between two sources' scheduler rankings: hybrids of "
              "A's windows take one or more properties of B's; the distance between A's ranking and each hybrid's "
              "is split over the properties by Shapley values (the average effect of swapping a property over every "
              "order of swapping them)")


@dataclass
class Attribution:
    """The attribution's tables (polars) and its ``summary.json`` section."""

    tables: dict
    summary: dict

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.tables[name]


def _rng(seed: int, pair: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(pair.encode()), 17])


def _ci(boot, axis=-1):
    if boot is None:
        return np.nan, np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return stats.percentile_ci(boot, axis=axis)


def _share(num, den):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _pair_compute(sim: SimulationConfig, analysis: AnalysisConfig, window_size: int, design: Design,
                  runs: pl.DataFrame, pair: str) -> dict:
    """Every array of one pair: ranks, comparisons with A and B, distances, Shapley values, bootstrap. Subsets
    that differ only in ``load`` (the identity) have the same runs: each is ranked once, as its representative
    (the subset without ``load``), and ``names[mask]`` is the representative's cube source."""
    masks = design.masks
    rep = {m: min(x for x in masks if window_part(design, x) == window_part(design, m)) for m in masks}
    cube = rankings.hybrid_cube(runs.filter(pl.col("mask").is_in(sorted(set(rep.values())))), sim, design.metrics)
    names = [f"h{rep[m]}" for m in masks]
    missing = sorted({n for n in names if n not in cube.sources})
    if missing:
        raise ValueError(f"attribution {pair}: subsets {missing} have no runs")
    W = len(cube.windows[names[0]])
    B = design.bootstrap
    idx = stats.bootstrap_indices(W, B, _rng(design.seed, pair)) if B > 0 else None
    pts, bts = rankings.ranks(cube, analysis, window_size, idx)
    uniq = list(dict.fromkeys(names))                 # compared once per distinct hybrid, then indexed by subset
    at = np.array([uniq.index(n) for n in names])

    def both(X):                                      # comparisons of every subset with A (h0) and with B (full)
        return tuple({k: v[at] for k, v in c.items()} for c in rankings.compare_to(X, (at[0], at[-1])))

    Pu = np.stack([pts[n] for n in uniq])                                   # (U, R, M, K)
    P = Pu[at]                                                              # (H, R, M, K)
    vs_a, vs_b = both(Pu)
    v = rankings.distance(vs_a, design.distance)                            # (H, R, M)
    g = design.subgame(v)                           # the game on the players that can matter (design.active)
    out = {"cube": cube, "names": names, "P": P, "vs_a": vs_a, "vs_b": vs_b, "v": v, "phi": shapley(g),
           "singles": singles(g), "interaction": interaction(g), "W": W, "B": B}
    if idx is not None:
        Bu = np.stack([np.moveaxis(bts[n], -1, -2) for n in uniq])         # (U, R, M, B, K)
        vs_a_b, vs_b_b = both(Bu)
        vb = rankings.distance(vs_a_b, design.distance)                     # (H, R, M, B)
        gb = design.subgame(vb)
        out.update(vs_a_b=vs_a_b, vs_b_b=vs_b_b, vb=vb, phi_b=shapley(gb), singles_b=singles(gb),
                   interaction_b=interaction(gb))
    return out


def _condition_tables(design: Design, pair: str, meta: dict, c: dict) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    cube = c["cube"]
    R, M = cube.regions, cube.metrics
    has_b = "vb" in c
    rows_h, rows_s, rows_c = [], [], []
    for h, mask in enumerate(design.masks):
        for r, reg in enumerate(R):
            for m, met in enumerate(M):
                row = {**meta, "mask": mask, "hybrid": design.code(mask), "swap": ",".join(design.swap(mask)),
                       "region": reg, "metric": met}
                for side, key in (("a", "vs_a"), ("b", "vs_b")):
                    cm = c[key]
                    row.update({f"tau_vs_{side}": cm["tau"][h, r, m], f"tau_norm_vs_{side}": cm["tau_norm"][h, r, m],
                                f"discordance_vs_{side}": cm["discordance"][h, r, m],
                                f"top1_kept_vs_{side}": cm["top1_kept"][h, r, m],
                                f"distance_vs_{side}": rankings.distance(cm, design.distance)[h, r, m]})
                    if has_b:
                        lo, hi = _ci(rankings.distance(c[f"{key}_b"], design.distance)[h, r, m])
                        row[f"distance_vs_{side}_ci_low"], row[f"distance_vs_{side}_ci_high"] = lo, hi
                    else:
                        row[f"distance_vs_{side}_ci_low"] = row[f"distance_vs_{side}_ci_high"] = np.nan
                rows_h.append(row)
    total = c["v"][-1]
    total_b = c["vb"][-1] if has_b else None
    for r, reg in enumerate(R):
        for m, met in enumerate(M):
            tl, th = _ci(total_b[r, m]) if has_b else (np.nan, np.nan)
            il, ih = _ci(c["interaction_b"][r, m]) if has_b else (np.nan, np.nan)
            rows_c.append({**meta, "region": reg, "metric": met, "disagreement": total[r, m], "disagreement_ci_low": tl,
                           "disagreement_ci_high": th, "sum_of_singles": c["singles"][:, r, m].sum(),
                           "interaction": c["interaction"][r, m], "interaction_ci_low": il, "interaction_ci_high": ih,
                           "interact": bool(has_b and (il > 0 or ih < 0))})
            for i, player in enumerate(design.active_names):
                share = _share(c["phi"][i, r, m], total[r, m])
                if has_b:
                    pl_, ph = _ci(c["phi_b"][i, r, m])
                    sl, sh = _ci(_share(c["phi_b"][i, r, m], total_b[r, m]))
                    gl, gh = _ci(c["singles_b"][i, r, m])
                else:
                    pl_ = ph = sl = sh = gl = gh = np.nan
                rows_s.append({**meta, "region": reg, "metric": met, "player": player, "phi": c["phi"][i, r, m],
                               "phi_ci_low": pl_, "phi_ci_high": ph, "share": float(share), "share_ci_low": sl,
                               "share_ci_high": sh, "single": c["singles"][i, r, m], "single_ci_low": gl,
                               "single_ci_high": gh, "disagreement": total[r, m]})
    return pl.DataFrame(rows_h), pl.DataFrame(rows_s), pl.DataFrame(rows_c)


def _rankings_table(design: Design, meta: dict, c: dict) -> pl.DataFrame:
    """Every subset's scheduler means (raw units, over the attribution windows) and ranks (1 = best)."""
    cube = c["cube"]
    frames = []
    for h, mask in enumerate(design.masks):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(cube.values[c["names"][h]], axis=-1)                  # (R, M, K)
        R, M, K = np.meshgrid(np.arange(len(cube.regions)), np.arange(len(cube.metrics)),
                              np.arange(len(cube.schedulers)), indexing="ij")
        frames.append(pl.DataFrame({
            **{k: [v] * R.size for k, v in meta.items()}, "mask": [mask] * R.size, "hybrid": [design.code(mask)] * R.size,
            "region": [cube.regions[i] for i in R.ravel()], "metric": [cube.metrics[i] for i in M.ravel()],
            "scheduler": [cube.schedulers[i] for i in K.ravel()], "mean": mean.ravel(),
            "rank": c["P"][h].ravel()}))
    return pl.concat(frames)


def representativeness(rk: pl.DataFrame, analysis_rankings: pl.DataFrame | None, a: str, b: str) -> dict:
    """How well the attribution's reduced design reproduces the study's rankings: Kendall tau-b between the
    ranking of A (and of B, the full swap) on the attribution windows and the analysis' ranking of that source
    (every window and replicate), averaged over the attribution's regions x metrics."""
    need = {"source", "region", "metric", "scheduler", "rank"}
    if analysis_rankings is None or not need <= set(analysis_rankings.columns):
        return {}
    out = {}
    full = int(rk["mask"].max())
    for side, src, mask in (("a", a, 0), ("b", b, full)):
        ours = rk.filter(pl.col("mask") == mask).select("region", "metric", "scheduler", "rank")
        theirs = analysis_rankings.filter(pl.col("source") == src).select(
            "region", "metric", "scheduler", pl.col("rank").alias("rank_study"))
        j = ours.join(theirs, on=["region", "metric", "scheduler"], how="inner")
        taus = [stats.kendall_tau(g["rank"].to_numpy(), g["rank_study"].to_numpy())
                for _, g in j.group_by(["region", "metric"], maintain_order=True)]
        taus = [t for t in taus if np.isfinite(t)]
        out[side] = _stat(float(np.mean(taus)) if taus else None,
                          f"mean Kendall tau-b between {src}'s ranking on the attribution's windows and the study's "
                          "ranking of it (every window and replicate), over the attribution's regions x metrics",
                          len(taus))
    return out


FLOAT_NOISE = 1e-9   # relative differences below this are floating-point rounding


def endpoint_check(ar: AttributionRuns, campaign_runs: pl.DataFrame | None) -> dict:
    """The two ends of every pair against the campaign's own runs (same window, region, scheduler, replicate):
    the subset that swaps nothing must equal A's runs bit for bit. The full swap is B's requests with B's
    arrival pattern scaled to A's rate before the region's rescaling (so arrival times differ from B's by
    rounding), run with A's seeds (common random numbers across the hybrids): schedulers that draw no random
    number match B's runs to rounding, the others (``schedulers_beyond_rounding``) are another replicate of B."""
    if campaign_runs is None or campaign_runs.height == 0:
        return {}
    design = ar.design
    metrics = [m for m in design.metrics if m in campaign_runs.columns]
    keys = ["window_id", "region", "scheduler", "replicate"]
    out = {}
    for a, b in design.pairs:
        pair = f"{a}|{b}"
        runs = ar.runs.filter(pl.col("pair") == pair)
        res = {}
        for side, mask, wcol in (("a", 0, "window_id"), ("b", design.full, "window_b")):
            ours = runs.filter(pl.col("mask") == mask).select([pl.col(wcol).alias("window_id")] + keys[1:] + metrics)
            j = ours.join(campaign_runs.select(keys + metrics), on=keys, how="inner", suffix="_campaign")
            if j.height == 0:
                continue
            x = j.select(metrics).to_numpy().astype(float)
            y = j.select([f"{m}_campaign" for m in metrics]).to_numpy().astype(float)
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.where(same, 0.0, np.abs(x - y) / np.maximum(np.abs(x), np.abs(y)))
            worst = np.nanmax(rel, axis=1) if rel.size else np.zeros(0)
            beyond = sorted(set(j["scheduler"].to_numpy()[worst > FLOAT_NOISE].tolist()))
            ok = worst <= FLOAT_NOISE
            res[side] = {"runs": j.height, "identical": int(same.all(axis=1).sum()),
                         "within_rounding": int(ok.sum()), "schedulers_beyond_rounding": beyond,
                         "max_relative_difference": _num(float(np.nanmax(rel))) if rel.size else None,
                         "max_relative_difference_others": _num(float(worst[ok].max())) if ok.any() else None}
        out[pair] = res
    return out


def _pooled(c: dict, design: Design) -> dict:
    """Pair-level numbers pooled over every region x metric: shares = sum of phi / sum of the disagreement
    (conditions where it is defined), mean disagreement, mean interaction; bootstrap CIs of each."""
    total = c["v"][-1]                                                      # (R, M)
    ok = np.isfinite(total)
    has_b = "vb" in c
    out: dict = {"n_conditions": int(ok.sum())}
    den = total[ok].sum()
    out["disagreement"] = (float(total[ok].mean()) if ok.any() else np.nan,
                           _ci(np.nanmean(c["vb"][-1][ok], axis=0)) if has_b and ok.any() else (np.nan, np.nan))
    out["interaction"] = (float(c["interaction"][ok].mean()) if ok.any() else np.nan,
                          _ci(np.nanmean(c["interaction_b"][ok], axis=0)) if has_b and ok.any() else (np.nan, np.nan))
    out["sum_of_singles"] = float(c["singles"][:, ok].sum(axis=0).mean()) if ok.any() else np.nan
    # the interaction as a share of the disagreement, beside the Shapley shares (pooled like them)
    out["interaction_share"] = (float(c["interaction"][ok].sum() / den) if den > 0 else np.nan,
                                _ci(_share(np.nansum(c["interaction_b"][ok], axis=0), np.nansum(c["vb"][-1][ok], axis=0)))
                                if has_b and ok.any() else (np.nan, np.nan))
    out["players"] = {}
    for i, p in enumerate(design.active_names):
        phi = c["phi"][i][ok]
        share = float(phi.sum() / den) if den > 0 else np.nan
        if has_b and ok.any():
            pb = c["phi_b"][i][ok]                                          # (n, B)
            db = c["vb"][-1][ok]
            s_ci = _ci(_share(np.nansum(pb, axis=0), np.nansum(db, axis=0)))
            p_ci = _ci(np.nanmean(pb, axis=0))
            g_ci = _ci(np.nanmean(c["singles_b"][i][ok], axis=0))
        else:
            s_ci = p_ci = g_ci = (np.nan, np.nan)
        out["players"][p] = {"share": share, "share_ci": s_ci, "phi": float(phi.mean()) if ok.any() else np.nan,
                             "phi_ci": p_ci, "single": float(c["singles"][i][ok].mean()) if ok.any() else np.nan,
                             "single_ci": g_ci}
    return out


TRACE_SCHEMA = {"pair": pl.String, "a": pl.String, "b": pl.String, "region": pl.String, "metric": pl.String,
                "sign_a": pl.Float64, "sign_b": pl.Float64, "n_windows": pl.Int64, "holds_on_a": pl.Boolean,
                "holds_on_b": pl.Boolean, "status": pl.String, "minimal_sets": pl.String, "minimal_size": pl.Int64,
                "rel_effect": pl.Float64, "p_adj": pl.Float64, "sign_sets": pl.String}
TRACE_STATUS = {
    "traced": "traced",
    "outside": "outside the attribution design",
    "few": "too few windows to test",
    "not_a": "not significant-and-practical on A's attribution windows",
    "not_b": "not significant-and-practical between A and the full swap on these windows",
}


def min_wilcoxon_p(n: int) -> float:
    """The smallest two-sided p-value a Wilcoxon signed-rank test can give on ``n`` paired windows (all of one
    sign, no ties): 2 / 2^n."""
    return 2.0 / 2.0 ** n if n > 0 else 1.0


def _side_verdicts(analysis: AnalysisConfig, window_size: int, cube, names: list[str]) -> dict:
    """The analysis' side tests (:func:`portbench.study.analysis.ties.side_tests`) of every hybrid, their
    p-values adjusted as the analysis adjusts them (``analysis.correction`` within ``analysis.family``, the
    hybrids of the pair in the place of the sources), significance and the practical thresholds."""
    st = settings(analysis, window_size)
    side = analysis_ties.side_tests(cube, st["window_size"])
    srcs = list(dict.fromkeys(names))                 # each simulated hybrid once (subsets differing in load share it)
    p_all = np.stack([side[n]["test"].pvalue for n in srcs])                           # (S, R, M, P)
    groups, _ = reversal_groups(st["family"], p_all.shape, cube.metrics, cube.regions)
    p_adj = stats.adjust_pvalues(p_all, st["correction"], groups).reshape(p_all.shape)
    at = [srcs.index(n) for n in names]
    sig = np.stack([stats.side_significant(p_adj[at[h]], side[n]["test"].direction, side[n]["diff"], st["alpha"])
                    for h, n in enumerate(names)])
    return {"diff": np.stack([side[n]["diff"] for n in names]), "effect": np.stack([side[n]["effect"] for n in names]),
            "rel": np.stack([side[n]["rel"] for n in names]), "n": np.stack([side[n]["test"].n for n in names]),
            "p_adj": p_adj[at], "sig": sig, "delta": analysis_ties.deltas(cube, st), "alpha": st["alpha"]}


def trace_reversals(reversals: pl.DataFrame | None, design: Design, pair: str, a: str, b: str, c: dict,
                    analysis: AnalysisConfig | None = None, window_size: int | None = None) -> pl.DataFrame:
    """Reversal tracing. For every significant-and-practical reversal of the analysis between ``a`` and ``b``
    in the attribution's regions and metrics, with the analysis' own definition of a reversal applied on the
    attribution's windows (the hybrids of the pair in the place of the sources; ``analysis`` (the section) gives
    the alpha, correction, family and practical thresholds, ``window_size`` the side tests' window size):

    * it must hold between A and the full swap there: A's side test rejects in A's direction, the full swap's in
      B's, both effects at least delta (else status ``not_a`` / ``not_b``); with too few windows for any
      Wilcoxon test to reject (``2 / 2^n >= alpha``: n <= 5 at alpha = 0.05) it is ``too few windows to test``;
    * a set of swapped players **reproduces** it when the hybrid that swaps that set and A form a
      significant-and-practical reversal in the same direction; ``minimal_sets``: every smallest such set
      (players joined by '&'), with the first one's relative effect and adjusted p;
    * ``sign_sets``: the smallest sets whose hybrid only shows B's sign of the mean difference (no test), for
      comparison -- a weaker statement, and the only one possible where the windows are too few."""
    if reversals is None or reversals.height == 0:
        return pl.DataFrame(schema=TRACE_SCHEMA)
    if analysis is None or window_size is None:
        raise ValueError("trace_reversals needs the analysis section (alpha, correction, family and thresholds) "
                         "and the window size")
    rv = reversals
    if "stage" in rv.columns:
        rv = rv.filter(pl.col("stage") == "significant_and_practical")
    else:
        rv = rv.filter(pl.col("reversal") & pl.col("significant") & pl.col("practical"))
    rv = rv.filter(((pl.col("source_1") == a) & (pl.col("source_2") == b)) |
                   ((pl.col("source_1") == b) & (pl.col("source_2") == a)))
    rv = rv.unique(subset=["a", "b", "source_1", "source_2", "region", "metric"], maintain_order=True)
    cube = c["cube"]
    sv = _side_verdicts(analysis, window_size, cube, c["names"]) if rv.height else None
    K = len(cube.schedulers)
    pair_index = {(int(i), int(j)): p for p, (i, j) in enumerate(zip(*np.triu_indices(K, 1)))}
    rows = []
    for r in rv.iter_rows(named=True):
        on_a = r["source_1"] == a
        sa = float(np.sign(r["diff_1"] if on_a else r["diff_2"]))
        sb = float(np.sign(r["diff_2"] if on_a else r["diff_1"]))
        base = {"pair": pair, "a": r["a"], "b": r["b"], "region": r["region"], "metric": r["metric"],
                "sign_a": sa, "sign_b": sb}
        empty = {"minimal_sets": None, "minimal_size": None, "rel_effect": None, "p_adj": None}
        if r["region"] not in cube.regions or r["metric"] not in cube.metrics:
            rows.append({**base, "n_windows": None, "holds_on_a": None, "holds_on_b": None,
                         "status": TRACE_STATUS["outside"], "sign_sets": None, **empty})
            continue
        ri, mi = cube.regions.index(r["region"]), cube.metrics.index(r["metric"])
        ka, kb = cube.schedulers.index(r["a"]), cube.schedulers.index(r["b"])
        p = pair_index[(min(ka, kb), max(ka, kb))]
        orient = 1.0 if ka < kb else -1.0            # side tests are of the lower-index scheduler minus the other
        diff = orient * sv["diff"][:, ri, mi, p]                                      # (H,)
        ok = sv["sig"][:, ri, mi, p] & (sv["effect"][:, ri, mi, p] >= sv["delta"][mi])
        n = int(sv["n"][0, ri, mi, p])
        sign_sets = smallest_sets(np.sign(diff) == sb)
        sign_txt = " | ".join(design.players_of(m) for m in sign_sets) if np.sign(diff[0]) == sa else None
        if min_wilcoxon_p(n) >= sv["alpha"]:
            rows.append({**base, "n_windows": n, "holds_on_a": None, "holds_on_b": None, "status": TRACE_STATUS["few"],
                         "sign_sets": sign_txt, **empty})
            continue
        hit = ok & (np.sign(diff) == sb)
        holds_a = bool(ok[0] and np.sign(diff[0]) == sa)
        holds_b = bool(hit[-1])
        if not holds_a or not holds_b:
            rows.append({**base, "n_windows": n, "holds_on_a": holds_a, "holds_on_b": holds_b,
                         "status": TRACE_STATUS["not_a" if not holds_a else "not_b"], "sign_sets": sign_txt, **empty})
            continue
        sets = smallest_sets(hit)
        first = sets[0]
        rows.append({**base, "n_windows": n, "holds_on_a": True, "holds_on_b": True, "status": TRACE_STATUS["traced"],
                     "minimal_sets": " | ".join(design.players_of(m) for m in sets),
                     "minimal_size": int(bin(first).count("1")), "rel_effect": float(sv["rel"][first, ri, mi, p]),
                     "p_adj": float(sv["p_adj"][first, ri, mi, p]), "sign_sets": sign_txt})
    return pl.DataFrame(rows, schema=TRACE_SCHEMA)


REPRODUCES = ("a set of swapped players reproduces a reversal when the hybrid that swaps it and A, on A's "
              "attribution windows, form a significant-and-practical reversal in the analysis' sense (opposite signs of "
              "the mean oriented difference, both paired Wilcoxon tests rejecting at analysis.alpha after "
              "analysis.correction within analysis.family, the pair's hybrids in the place of the sources, and both "
              "effects at least the metric's practical threshold)")


def joint_group(design: Design, c: dict) -> dict | None:
    """The joint (prompt, output) pairs (:data:`portbench.data.hybrids.JOINT`) as one group: the hybrid that
    swaps them (its distance to A's and B's ranking, pooled over the conditions) and its Shapley share in the
    two-group game {joint, the rest} (same subsets: no extra run), with bootstrap CIs; None when the players do
    not allow it (a player mixes a joint property with another)."""
    joint = next((m for m in design.masks if set(design.swap(m)) == set(hybrids.JOINT)), None)
    if joint is None:
        return None
    rest = design.full ^ joint
    total = c["v"][-1]
    ok = np.isfinite(total)
    if not ok.any():
        return None

    def pooled_share(v):                                            # v: the 4-valued grouped game (4, n[, B])
        phi = shapley(v)
        return np.nansum(phi[0], axis=0) / np.nansum(v[-1], axis=0)

    g = grouped(c["v"], [joint, rest])[:, ok]
    share = float(pooled_share(g)) if np.nansum(g[-1]) > 0 else np.nan
    out = {"hybrid": design.code(joint), "players": design.players_of(joint),
           "distance_vs_a": _num(float(np.nanmean(c["v"][joint][ok]))),
           "distance_vs_b": _num(float(np.nanmean(rankings.distance(c["vs_b"], design.distance)[joint][ok]))),
           "top1_kept_vs_a": _num(float(np.nanmean(c["vs_a"]["top1_kept"][joint][ok]))),
           "share": _num(share), "share_ci": [None, None],
           "members_share": _num(float(np.nansum([np.nansum(c["phi"][j][ok]) for j, i in enumerate(design.active)
                                                   if joint >> i & 1])
                                       / np.nansum(total[ok])) if np.nansum(total[ok]) > 0 else None)}
    if "vb" in c:
        gb = grouped(c["vb"], [joint, rest])[:, ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            lo, hi = _ci(pooled_share(gb))
        out["share_ci"] = [_num(lo), _num(hi)]
    return out


def _load_summary(load: pl.DataFrame, design: Design) -> dict:
    """Per region: A's and B's achieved utilisation in the 200-request windows and in steady state, and the
    range of the hybrids' finite-window utilisation (``load`` table)."""
    out = {}
    for r in design.regions:
        lr = load.filter(pl.col("region") == r)
        if lr.height == 0:
            continue
        a = lr.filter(pl.col("mask") == 0)
        b = lr.filter(pl.col("mask") == lr["mask"].max())
        out[r] = {"a_window": _num(a["utilisation_window"][0]), "b_window": _num(b["utilisation_window"][0]),
                  "a_steady": _num(a["utilisation_steady"][0]), "b_steady": _num(b["utilisation_steady"][0]),
                  "hybrids_window_min": _num(lr["utilisation_window"].min()),
                  "hybrids_window_max": _num(lr["utilisation_window"].max())}
    return out


def cost_summary(cost: dict) -> dict:
    """The measured cost and the planned runs (:func:`.design.cost_plan`), and from them the one estimate every
    text states: CPU-seconds of this design and CPU-hours of the full design at the measured CPU rate (an upper
    bound: the heavy regions cost more per run than the light ones it adds, and replicates of a policy that
    draws no random number are copied, not simulated)."""
    out = {k: (_num(v) if isinstance(v, float) else v) for k, v in cost.items() if k != "plan"}
    plan = cost.get("plan") or {}
    rate = cost.get("runs_per_cpu_s")
    out["plan"] = plan
    if rate and plan:
        out["design_cpu_s"] = _num(plan["design"]["simulated_runs"] / rate)
        out["full_cpu_h"] = _num(plan["full"]["simulated_runs"] / rate / 3600)
    return out


DROPPED = ("the identity swap: both sources run at the region's rho on their own sustainable throughput, so a player "
           "that swaps only the load changes no run and has Shapley value 0 by construction; the game is on the "
           "players that can matter (leaving a dummy player out changes no other player's value)")


def _robustness(sim: SimulationConfig, analysis: AnalysisConfig, window_size: int, design: Design, runs: pl.DataFrame,
                pair: str, c: dict) -> dict:
    """:func:`.robustness.pair_robustness` of one pair: point estimates under every other tie rule (from the same
    runs, no bootstrap), and the chosen rule's arrays ``c`` (with its bootstrap)."""
    chosen = str(getattr(analysis, "ties", "tolerance"))
    point = replace(design, bootstrap=0)
    by_rule = {}
    for rule in TIE_RULES if hasattr(analysis, "ties") else (chosen,):
        cr = c if rule == chosen else _pair_compute(sim, replace(analysis, ties=rule), window_size, point, runs, pair)
        by_rule[rule] = (cr["phi"], cr["v"][-1])
    boot = (c["phi_b"], c["vb"][-1]) if "vb" in c else None
    return robustness.pair_robustness(design.active_names, c["cube"].metrics, chosen, by_rule, boot)


def _labels(a, pa, b, pb):
    return label(a, pa), label(b, pb)


def compute(sim: SimulationConfig, analysis: AnalysisConfig, window_size: int, ar: AttributionRuns,
            reversals: pl.DataFrame | None = None, analysis_rankings: pl.DataFrame | None = None,
            campaign_runs: pl.DataFrame | None = None) -> Attribution:
    """Every attribution table and the summary section from the runs of :func:`~.runs.run`, ranked as the analysis
    ranks (the ``simulation`` and ``analysis`` sections, ``windows.size`` for the side tests). Optional, from the
    study: ``reversals`` (the analysis' reversal table: tracing), ``analysis_rankings`` (its rankings table:
    how representative the reduced design is) and ``campaign_runs`` (the campaign's runs: both ends checked)."""
    design = ar.design
    hyb, shp, cond, rks, trc, pairs, robust = [], [], [], [], [], {}, {}
    for a, b in design.pairs:
        pair = f"{a}|{b}"
        runs = ar.runs.filter(pl.col("pair") == pair)
        pa, pb = runs["provenance_a"][0], runs["provenance_b"][0]
        la, lb = _labels(a, pa, b, pb)
        meta = {"pair": pair, "source_a": a, "provenance_a": pa, "source_b": b, "provenance_b": pb}
        c = _pair_compute(sim, analysis, window_size, design, runs, pair)
        robust[pair] = _robustness(sim, analysis, window_size, design, runs, pair, c)
        h, s, cd = _condition_tables(design, pair, meta, c)
        rk = _rankings_table(design, meta, c)
        rks.append(rk)
        hyb.append(h)
        shp.append(s)
        cond.append(cd)
        t = trace_reversals(reversals, design, pair, a, b, c, analysis, window_size)
        trc.append(t)
        po = _pooled(c, design)
        share_sorted = sorted(po["players"].items(), key=lambda kv: -(kv[1]["share"] if np.isfinite(kv[1]["share"])
                                                                      else -np.inf))
        inter_v, inter_ci = po["interaction"]
        dis_v, dis_ci = po["disagreement"]
        interact = bool(np.isfinite(inter_ci[0]) and (inter_ci[0] > 0 or inter_ci[1] < 0))
        hsum = {}
        for mask in design.masks:
            sel = h.filter(pl.col("mask") == mask)
            hsum[design.code(mask)] = {
                "swap": list(design.swap(mask)),
                "players": [p for i, p in enumerate(design.player_names) if mask >> i & 1],
                "tau_vs_a": _num(sel["tau_vs_a"].drop_nans().mean()), "tau_vs_b": _num(sel["tau_vs_b"].drop_nans().mean()),
                "tau_norm_vs_a": _num(sel["tau_norm_vs_a"].drop_nans().mean()),
                "discordance_vs_a": _num(sel["discordance_vs_a"].drop_nans().mean()),
                "top1_kept_vs_a": _num(sel["top1_kept_vs_a"].drop_nans().mean()),
                "distance_vs_a": _num(sel["distance_vs_a"].drop_nans().mean()),
                "distance_vs_b": _num(sel["distance_vs_b"].drop_nans().mean())}
        pairs[pair] = {
            "source_a": a, "source_b": b, "label_a": la, "label_b": lb, "provenance_a": pa, "provenance_b": pb,
            "all_real": pa == "real" and pb == "real",
            "n_windows": c["W"], "windows": [list(x) for x in ar.windows.get(pair, [])],
            "regions": c["cube"].regions, "metrics": c["cube"].metrics,
            "disagreement": _stat(dis_v, f"mean over region x metric of the ranking distance ({design.distance}) "
                                         f"between A's ranking and the hybrid that swaps every property (= B)",
                                  po["n_conditions"], dis_ci),
            "shares": {p: {"value": _num(d["share"]), "ci": [_num(d["share_ci"][0]), _num(d["share_ci"][1])],
                           "phi": _num(d["phi"]), "phi_ci": [_num(d["phi_ci"][0]), _num(d["phi_ci"][1])],
                           "single": _num(d["single"]), "single_ci": [_num(d["single_ci"][0]), _num(d["single_ci"][1])]}
                       for p, d in po["players"].items()},
            "largest_share": share_sorted[0][0] if share_sorted and np.isfinite(share_sorted[0][1]["share"]) else None,
            "interaction_share": _stat(po["interaction_share"][0], "the interaction (full swap minus the sum of the "
                                       "single swaps) as a share of the disagreement, pooled like the Shapley shares: "
                                       "how much of the A -> B move no single swap accounts for (negative: the single "
                                       "swaps overlap or offset)", po["n_conditions"], po["interaction_share"][1]),
            "interaction": _stat(inter_v, "mean over region x metric of (full swap) - (sum of the single swaps' "
                                          "distances): 0 when the properties' effects add up", po["n_conditions"],
                                 inter_ci, sum_of_singles=po["sum_of_singles"], interact=interact,
                                 relative=_num(inter_v / dis_v) if dis_v and np.isfinite(dis_v) and dis_v > 0 else None),
            "by_condition": {f"{r['region']}/{r['metric']}": {
                "disagreement": _num(r["disagreement"]),
                "disagreement_ci": [_num(r["disagreement_ci_low"]), _num(r["disagreement_ci_high"])],
                "interaction": _num(r["interaction"]), "interact": r["interact"],
                "shares": {x["player"]: {"value": _num(x["share"]), "ci": [_num(x["share_ci_low"]), _num(x["share_ci_high"])]}
                           for x in s.filter((pl.col("region") == r["region"]) & (pl.col("metric") == r["metric"]))
                           .iter_rows(named=True)}}
                for r in cd.iter_rows(named=True)},
            "hybrids": hsum,
            "representative": representativeness(rk, analysis_rankings, a, b),
            "reversals": {"significant_and_practical": t.height,
                          **{k: int((t["status"] == v).sum()) if t.height else 0 for k, v in TRACE_STATUS.items()}},
            "joint": joint_group(design, c),
            "load": _load_summary(ar.load.filter(pl.col("pair") == pair), design),
        }
    tables = {"hybrid_agreement": pl.concat(hyb), "shapley": pl.concat(shp), "conditions": pl.concat(cond),
              "rankings": pl.concat(rks), "tracing": pl.concat(trc), "hybrids": ar.hybrids, "load": ar.load}
    summary = {
        "definition": DEFINITION,
        "design": {"pairs": [list(p) for p in design.pairs], "players": design.player_names,
                   "players_in_game": design.active_names,
                   "players_dropped": {p: DROPPED for p in design.dropped_names},
                   "subsets_per_pair": 2 ** design.k, "regions": design.regions, "windows_per_source": design.windows,
                   "replicates": len(design.replicates), "schedulers": list(design.schedulers),
                   "metrics": list(design.metrics), "metrics_from": design.metrics_note, "bootstrap": design.bootstrap,
                   "seed": design.seed, "distance": design.distance, "ties": rankings.tie_rule(analysis),
                   "load": LOAD_DEFINITION, "utilisation": UTILISATION_DEFINITION, "load_check": LOAD_CHECK,
                   "steady_requests": STEADY_REQUESTS,
                   "joint": hybrids.JOINT_DESCRIPTION, "runs": ar.runs.height,
                   "reproduces": REPRODUCES},
        "frozen": ar.frozen,
        "pairs": pairs,
        "robustness": robustness.summarise(robust),
        "endpoints": endpoint_check(ar, campaign_runs),
        "cost": cost_summary(ar.cost),
    }
    return Attribution(tables=tables, summary=summary)


def write(results_dir: Path, A: Attribution) -> dict[str, str]:
    """Write every table under ``{results_dir}/attribution/``, the section for ``summary.json``
    (:func:`portbench.study.analysis.sections.write_section`) and ``attribution/summary.json``."""
    out = attribution_dir(results_dir)
    paths = fileio.write_tables(out, A.tables)
    fileio.write_json(out / "summary.json", A.summary)
    paths["section"] = str(write_section(results_dir, SECTION, A.summary))
    return paths


def load(results_dir: Path) -> Attribution:
    """The tables and section written by :func:`write` under ``results_dir`` (DataError naming the command when
    absent)."""
    out = attribution_dir(results_dir)
    if not (out / "summary.json").is_file():
        raise DataError(out, "no attribution results; run `portbench attribute` (notebook 09)")
    return Attribution(tables={t: pl.read_parquet(out / f"{t}.parquet") for t in TABLES
                               if (out / f"{t}.parquet").is_file()},
                       summary=json.loads(Path(out / "summary.json").read_text()))
