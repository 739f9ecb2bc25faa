"""Pairwise reversals between sources: side tests, multiple-comparison correction, practical size, verdicts."""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import polars as pl

from .. import stats
from .columns import COLUMNS, FAMILIES
from .common import _empty, _frame, _num, _stat
from .cube import Analysis, Cube



def _family_definition(family: str) -> str:
    return {"all": "every side test (scheduler pair x source x region x metric) corrected together",
            "per_metric": "side tests corrected separately within each metric",
            "per_region": "side tests corrected separately within each region"}[family]


def _reversals(cube: Cube, cfg: dict, tables) -> dict:
    S, R, M, K = cube.sources, cube.regions, cube.metrics, cube.schedulers
    ia, ib = np.triu_indices(len(K), 1)
    side = {}
    for s in S:
        raw = cube.values[s]
        xo = cube.oriented(s)
        d = xo[:, :, ia, :] - xo[:, :, ib, :]                         # (R, M, P, W)
        both = ~np.isnan(d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ma = np.nanmean(np.where(both, raw[:, :, ia, :], np.nan), axis=-1)
            mb = np.nanmean(np.where(both, raw[:, :, ib, :], np.nan), axis=-1)
            diff = np.nanmean(d, axis=-1)
        test = stats.paired_wilcoxon(d)
        side[s] = {"mean_a": ma, "mean_b": mb, "diff": diff, "rel": stats.relative_effect(ma, mb),
                   "test": test}
    # multiple-comparison correction over the family, on the distinct side tests
    p_all = np.stack([side[s]["test"].pvalue for s in S])              # (S, R, M, P)
    fam = cfg["family"]
    if fam == "all":
        groups, fam_label = np.zeros(p_all.shape, int), np.full(p_all.shape, "all", dtype=object)
    elif fam == "per_metric":
        groups = np.broadcast_to(np.arange(len(M))[None, None, :, None], p_all.shape)
        fam_label = np.asarray(M, dtype=object)[groups]
    else:
        groups = np.broadcast_to(np.arange(len(R))[None, :, None, None], p_all.shape)
        fam_label = np.asarray(R, dtype=object)[groups]
    p_adj = stats.adjust_pvalues(p_all, cfg["correction"], groups).reshape(p_all.shape)
    alpha, delta = cfg["alpha"], cfg["delta"]
    for si, s in enumerate(S):
        side[s]["p_adj"] = p_adj[si]
        side[s]["sig"] = stats.side_significant(p_adj[si], side[s]["test"].direction, side[s]["diff"], alpha)

    pair_a, pair_b = np.asarray(K, dtype=object)[ia], np.asarray(K, dtype=object)[ib]
    dims = {"region": R, "metric": M, "pair": list(range(len(ia)))}

    def _pair_cols(f):
        return f.with_columns(pl.col("pair").replace_strict(dict(enumerate(pair_a)), return_dtype=pl.Utf8).alias("a"),
                              pl.col("pair").replace_strict(dict(enumerate(pair_b)), return_dtype=pl.Utf8).alias("b"))

    direction_of = dict(zip(M, cube.directions))
    frames = []
    for si, s in enumerate(S):
        t = side[s]["test"]
        f = _frame(dims, mean_a=side[s]["mean_a"], mean_b=side[s]["mean_b"], diff=side[s]["diff"],
                   rel_effect=side[s]["rel"], n_windows=t.n, n_nonzero=t.n_nonzero, statistic=t.statistic,
                   test_direction=t.direction, method=t.method.astype(str), p=t.pvalue, p_adj=side[s]["p_adj"],
                   family=fam_label[si].astype(str), significant=side[s]["sig"])
        f = _pair_cols(f).with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                                       pl.col("metric").replace_strict(direction_of, return_dtype=pl.Utf8)
                                       .alias("direction"))
        frames.append(f.select(list(COLUMNS["pairwise_tests"])))
    tables["pairwise_tests"] = pl.concat(frames)

    rframes = []
    for i, j in combinations(range(len(S)), 2):
        s1, s2 = S[i], S[j]
        a1, a2 = side[s1], side[s2]
        v = stats.reversal_verdicts(a1["diff"], a2["diff"], a1["sig"], a2["sig"], a1["rel"], a2["rel"], delta)
        stg = stats.stage(v["reversal"], v["significant"], v["practical"])
        f = _frame(dims, mean_a_1=a1["mean_a"], mean_b_1=a1["mean_b"], diff_1=a1["diff"], rel_1=a1["rel"],
                   p_1=a1["test"].pvalue, p_adj_1=a1["p_adj"], n_1=a1["test"].n,
                   mean_a_2=a2["mean_a"], mean_b_2=a2["mean_b"], diff_2=a2["diff"], rel_2=a2["rel"],
                   p_2=a2["test"].pvalue, p_adj_2=a2["p_adj"], n_2=a2["test"].n,
                   min_rel=np.fmin(a1["rel"], a2["rel"]), reversal=v["reversal"],
                   significant=v["significant"], practical=v["practical"], stage=stg.astype(str))
        f = _pair_cols(f).with_columns(
            pl.lit(s1).alias("source_1"), pl.lit(s2).alias("source_2"),
            pl.lit(cube.provenance[s1]).alias("provenance_1"), pl.lit(cube.provenance[s2]).alias("provenance_2"),
            pl.col("metric").replace_strict(direction_of, return_dtype=pl.Utf8).alias("direction"))
        rframes.append(f.select(list(COLUMNS["reversals"])))
    rev = pl.concat(rframes) if rframes else _empty("reversals")
    tables["reversals"] = rev
    return reversal_summary(rev, cfg, {s: cube.label(s) for s in S}, n_side_tests=int(np.isfinite(p_all).sum()))


def _stage_masks(rev: pl.DataFrame) -> dict[str, pl.Expr]:
    return {"sign_reversals": pl.col("reversal"),
            "significant": pl.col("reversal") & pl.col("significant"),
            "significant_and_practical": pl.col("reversal") & pl.col("significant") & pl.col("practical")}


def breakdown(rev: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Counts and rates of each stage per group (``by`` columns of the reversal table)."""
    masks = _stage_masks(rev)
    return (rev.group_by(by).agg([pl.len().alias("comparisons")] +
                                 [m.sum().alias(n) for n, m in masks.items()])
            .with_columns([(pl.col(n) / pl.col("comparisons")).alias(f"{n}_rate") for n in masks])
            .sort(["significant_and_practical", "significant", "sign_reversals"] + by,
                  descending=[True, True, True] + [False] * len(by)))


def reversal_summary(rev: pl.DataFrame, cfg: dict, labels: dict, n_side_tests: int | None = None) -> dict:
    """The ``reversals`` section of summary.json, computed from the reversal table."""
    n = rev.height
    masks = _stage_masks(rev)
    counts = {k: int(rev.select(m.sum()).item()) if n else 0 for k, m in masks.items()}
    defs = {
        "sign_reversals": "the oriented mean differences of a vs b on the two sources have opposite signs",
        "significant": f"sign reversal and both sides' Wilcoxon tests reject at alpha = {cfg['alpha']} after "
                       f"{cfg['correction']} correction ({_family_definition(cfg['family'])}), each in the "
                       "direction of its mean difference",
        "significant_and_practical": f"significant reversal whose relative effect is at least delta = "
                                     f"{cfg['delta']} on both sides",
    }
    out: dict = {
        "definition": "scheduler a beats b on one source and loses to it on the other (same region and metric)",
        "parameters": {k: cfg[k] for k in ("alpha", "delta", "correction", "family")},
        "comparisons": _stat(n, "scheduler pairs x source pairs x regions x metrics compared"),
        "side_tests": _stat(n_side_tests, "distinct paired tests (scheduler pair x source x region x metric), "
                                          "each adjusted once in its family"),
    }
    for k, c in counts.items():
        out[k] = _stat(c, defs[k], n, rate=(c / n if n else None))
    bys = {"by_region": ["region"], "by_metric": ["metric"], "by_scheduler_pair": ["a", "b"],
           "by_source_pair": ["source_1", "source_2"]}
    for key, by in bys.items():
        out[key] = {}
        if not n:
            continue
        for row in breakdown(rev, by).iter_rows(named=True):
            name = "|".join(str(row[c]) for c in by)
            out[key][name] = {"comparisons": row["comparisons"], **{k: row[k] for k in masks},
                              "significant_and_practical_rate": _num(row["significant_and_practical_rate"])}
    sp = rev.filter(masks["significant_and_practical"]) if n else rev
    if sp.height:
        best = sp.sort(["min_rel", "region", "metric", "a", "b"], descending=[True, False, False, False, False]).row(0, named=True)
        out["most_dramatic"] = {
            **{k: _num(v) if isinstance(v, (float, int)) and not isinstance(v, bool) else v for k, v in best.items()},
            "label_1": labels.get(best["source_1"], best["source_1"]),
            "label_2": labels.get(best["source_2"], best["source_2"]),
            "definition": "the significant-and-practical reversal with the largest smaller-side relative effect "
                          "(min_rel)",
        }
    else:
        out["most_dramatic"] = None
    return out


def reversal_counts(A: Analysis, *, correction: str, family: str, alpha: float, delta: float) -> dict:
    """Reversal counts at each stage under other correction / family / alpha / delta settings,
    recomputed from the stored side tests (``pairwise_tests``) — for the sensitivity table."""
    t = A["pairwise_tests"]
    groups = {"all": np.zeros(t.height, int), "per_metric": t["metric"].to_numpy(),
              "per_region": t["region"].to_numpy()}[family]
    p_adj = stats.adjust_pvalues(t["p"].to_numpy(), correction, groups)
    sig = stats.side_significant(p_adj, t["test_direction"].to_numpy(), t["diff"].to_numpy(), alpha)
    side = t.select("a", "b", "source", "region", "metric").with_columns(pl.Series("sig", sig))
    rev = A["reversals"].select("a", "b", "source_1", "source_2", "region", "metric", "reversal", "rel_1", "rel_2")
    keys = ["a", "b", "region", "metric"]
    rev = (rev.join(side.rename({"source": "source_1", "sig": "sig_1"}), on=keys + ["source_1"], how="left")
           .join(side.rename({"source": "source_2", "sig": "sig_2"}), on=keys + ["source_2"], how="left"))
    sp = rev["reversal"] & rev["sig_1"] & rev["sig_2"]
    practical = (rev["rel_1"] >= delta) & (rev["rel_2"] >= delta)
    return {"correction": correction, "family": family, "alpha": alpha, "delta": delta,
            "comparisons": rev.height, "sign_reversals": int(rev["reversal"].sum()),
            "significant": int(sp.sum()), "significant_and_practical": int((sp & practical).sum())}


def reversal_sensitivity(A: Analysis) -> pl.DataFrame:
    """Reversal counts under both corrections x the three families (alpha, delta as chosen), and
    under half and double delta — how much the headline count depends on these choices."""
    p = A.summary["parameters"]
    rows = [reversal_counts(A, correction=c, family=f, alpha=p["alpha"], delta=p["delta"])
            for c in stats.CORRECTIONS for f in FAMILIES]
    rows += [reversal_counts(A, correction=p["correction"], family=p["family"], alpha=p["alpha"], delta=d)
             for d in (p["delta"] / 2, p["delta"] * 2)]
    return pl.DataFrame(rows).unique(maintain_order=True)
