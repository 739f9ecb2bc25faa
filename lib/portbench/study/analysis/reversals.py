"""Pairwise reversals between the sources of a panel: side tests, multiple-comparison families, practical
size on the metric's scale, verdicts; the original study's design as a named preset."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import polars as pl

from ...core.config import FAMILIES
from ...sim import schedulers as scheduler_registry
from .. import stats
from .columns import COLUMNS
from .common import _empty, _frame, _num, _stat, available_panels
from .cube import Analysis, Cube


def _family_definition(family: str) -> str:
    return {"all": "every side test of every metric (scheduler pair x source x region x metric) corrected together",
            "per_metric": "one family per metric: its side tests (scheduler pair x source x region) corrected together",
            "per_region": "one family per region: its side tests corrected together"}[family]


TENANT_METRICS = ("tenant_service_gap", "tenant_jain")


def tenant_na(cube: Cube) -> dict[str, set[str]]:
    """Per source, the schedulers whose comparisons are n/a there: those that use tenants, on a source
    whose tenant metrics are undefined in every run (no tenants in the trace, ``simulation.tenant_model:
    trace``). Needs the tenant metrics in the cube (else nothing is n/a)."""
    mi = [cube.metrics.index(m) for m in TENANT_METRICS if m in cube.metrics]
    if not mi:
        return {}
    users = {k for k in cube.schedulers
             if k in scheduler_registry.SCHEDULERS and "tenant" in scheduler_registry.uses(k)}
    return {s: users for s in cube.sources if users and np.isnan(cube.values[s][:, mi]).all()}


def _defined(f: pl.DataFrame, na: dict, *sources: str) -> pl.DataFrame:
    """Rows of a tests / reversals frame that exist: a comparison is n/a where a scheduler uses
    information the source lacks (``tenant_na``) or a side's mean difference is undefined."""
    keep = pl.lit(True)
    for s in sources:
        bad = sorted(na.get(s, ()))
        if bad:
            keep = keep & ~(pl.col("a").is_in(bad) | pl.col("b").is_in(bad))
    return f.filter(keep)


def na_pairs(cube: Cube, na: dict, source: str) -> np.ndarray:
    """(P,) scheduler pairs (``np.triu_indices`` order) that are n/a on ``source`` (``tenant_na``)."""
    bad = na.get(source, set())
    ia, ib = np.triu_indices(len(cube.schedulers), 1)
    K = np.asarray(cube.schedulers, dtype=object)
    return np.isin(K[ia], list(bad)) | np.isin(K[ib], list(bad))


def _p_defined(cube: Cube, side: dict, na: dict, s: str) -> np.ndarray:
    """``s``'s side-test p-values (R, M, P) with the n/a pairs' set to NaN: they are no test, so they are
    left out of every correction family."""
    p = side[s]["test"].pvalue
    bad = na_pairs(cube, na, s)
    return np.where(bad[None, None, :], np.nan, p) if bad.any() else p


def _delta_definition(cfg: dict) -> dict:
    return {"relative": cfg["delta"], "absolute": cfg["delta_absolute"],
            "definition": f"practical size on the metric's scale: a relative difference of at least "
                          f"{cfg['delta']:.0%} for ratio metrics (latencies, throughput, slowdown; "
                          f"|a - b| / ((|a| + |b|) / 2)), an absolute difference of at least "
                          f"{100 * cfg['delta_absolute']:g} percentage points for proportions (SLO attainment, "
                          f"fairness) and for completed requests (points of the {cfg['window_size']}-request window)"}


def _groups(family: str, shape, M: list, R: list):
    if family == "all":
        return np.zeros(shape, int), np.full(shape, "all", dtype=object)
    if family == "per_metric":
        g = np.broadcast_to(np.arange(len(M))[None, None, :, None], shape)
        return g, np.asarray(M, dtype=object)[g]
    g = np.broadcast_to(np.arange(len(R))[None, :, None, None], shape)
    return g, np.asarray(R, dtype=object)[g]


def _panel_reversals(cube: Cube, side: dict, delta: np.ndarray, cfg: dict, name: str, srcs: list[str],
                     head: list[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The side-test rows and the reversal rows of one panel (families within the panel)."""
    R, M, K = cube.regions, cube.metrics, cube.schedulers
    ia, ib = np.triu_indices(len(K), 1)
    na = tenant_na(cube)
    p_all = np.stack([_p_defined(cube, side, na, s) for s in srcs])           # (S, R, M, P); n/a pairs NaN
    groups, fam_label = _groups(cfg["family"], p_all.shape, M, R)
    p_adj = stats.adjust_pvalues(p_all, cfg["correction"], groups).reshape(p_all.shape)
    sig = {s: stats.side_significant(p_adj[i], side[s]["test"].direction, side[s]["diff"], cfg["alpha"])
           for i, s in enumerate(srcs)}
    pair_a, pair_b = np.asarray(K, dtype=object)[ia], np.asarray(K, dtype=object)[ib]
    dims: dict[str, list] = {"region": R, "metric": M, "pair": list(range(len(ia)))}
    meta = {m: (d, sc, float(delta[k]), k in head) for k, (m, d, sc) in enumerate(zip(M, cube.directions, cube.scales))}

    def _cols(f):
        return f.with_columns(
            pl.col("pair").replace_strict(dict(enumerate(pair_a)), return_dtype=pl.Utf8).alias("a"),
            pl.col("pair").replace_strict(dict(enumerate(pair_b)), return_dtype=pl.Utf8).alias("b"),
            pl.col("metric").replace_strict({m: v[0] for m, v in meta.items()}, return_dtype=pl.Utf8).alias("direction"),
            pl.col("metric").replace_strict({m: v[1] for m, v in meta.items()}, return_dtype=pl.Utf8).alias("scale"),
            pl.col("metric").replace_strict({m: v[2] for m, v in meta.items()}, return_dtype=pl.Float64).alias("delta"),
            pl.col("metric").replace_strict({m: v[3] for m, v in meta.items()}, return_dtype=pl.Boolean).alias("headline"),
            pl.lit(name).alias("panel"))

    frames = []
    for i, s in enumerate(srcs):
        t, sd = side[s]["test"], side[s]
        f = _frame(dims, mean_a=sd["mean_a"], mean_b=sd["mean_b"], diff=sd["diff"], rel_effect=sd["rel"],
                   effect=sd["effect"], n_windows=t.n, n_nonzero=t.n_nonzero, statistic=t.statistic,
                   test_direction=t.direction, method=t.method.astype(str), p=t.pvalue, p_adj=p_adj[i],
                   family=fam_label[i].astype(str), significant=sig[s])
        frames.append(_cols(f).with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"))
                      .select(list(COLUMNS["pairwise_tests"])))
    tests = pl.concat(frames)
    if na:   # e.g. vtc on a trace without tenants: its comparisons there are n/a
        tests = pl.concat([_defined(tests.filter(pl.col("source") == s), na, s) for s in srcs])

    rframes = []
    dm = delta[None, :, None]
    for i, j in combinations(range(len(srcs)), 2):
        s1, s2 = srcs[i], srcs[j]
        a1, a2 = side[s1], side[s2]
        v = stats.reversal_verdicts(a1["diff"], a2["diff"], sig[s1], sig[s2], a1["effect"], a2["effect"], dm)
        stg = stats.stage(v["reversal"], v["significant"], v["practical"])
        min_eff = np.fmin(a1["effect"], a2["effect"])
        with np.errstate(invalid="ignore", divide="ignore"):
            strength = np.where(dm > 0, min_eff / dm, np.nan)
        f = _frame(dims, mean_a_1=a1["mean_a"], mean_b_1=a1["mean_b"], diff_1=a1["diff"], rel_1=a1["rel"],
                   effect_1=a1["effect"], p_1=a1["test"].pvalue, p_adj_1=p_adj[i], n_1=a1["test"].n,
                   mean_a_2=a2["mean_a"], mean_b_2=a2["mean_b"], diff_2=a2["diff"], rel_2=a2["rel"],
                   effect_2=a2["effect"], p_2=a2["test"].pvalue, p_adj_2=p_adj[j], n_2=a2["test"].n,
                   min_rel=np.fmin(a1["rel"], a2["rel"]), min_effect=min_eff, strength=strength,
                   reversal=v["reversal"], significant=v["significant"], practical=v["practical"], stage=stg.astype(str))
        f = _cols(f).with_columns(
            pl.lit(s1).alias("source_1"), pl.lit(s2).alias("source_2"),
            pl.lit(cube.provenance[s1]).alias("provenance_1"), pl.lit(cube.provenance[s2]).alias("provenance_2"))
        f = _defined(f, na, s1, s2).filter(pl.col("diff_1").is_not_nan() & pl.col("diff_2").is_not_nan())
        rframes.append(f.select(list(COLUMNS["reversals"])))
    return tests, (pl.concat(rframes) if rframes else _empty("reversals"))


def _stage_masks() -> dict[str, pl.Expr]:
    return {"sign_reversals": pl.col("reversal"),
            "significant": pl.col("reversal") & pl.col("significant"),
            "significant_and_practical": pl.col("reversal") & pl.col("significant") & pl.col("practical")}


def breakdown(rev: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Counts and rates of each stage per group (``by`` columns of the reversal table)."""
    masks = _stage_masks()
    return (rev.group_by(by).agg([pl.len().alias("comparisons")] +
                                 [m.sum().alias(n) for n, m in masks.items()])
            .with_columns([(pl.col(n) / pl.col("comparisons")).alias(f"{n}_rate") for n in masks])
            .sort(["significant_and_practical", "significant", "sign_reversals"] + by,
                  descending=[True, True, True] + [False] * len(by)))


def _counts(rev: pl.DataFrame, defs: dict, what: str) -> dict:
    n = rev.height
    out = {"comparisons": _stat(n, what)}
    for k, m in _stage_masks().items():
        c = int(rev.select(m.sum()).item()) if n else 0
        out[k] = _stat(c, defs[k], n, rate=(c / n if n else None))
    return out


def _definitions(cfg: dict, correction: str, family_text: str) -> dict:
    return {
        "sign_reversals": "the oriented mean differences of a vs b on the two sources have opposite signs",
        "significant": f"sign reversal and both sides' Wilcoxon tests reject at alpha = {cfg['alpha']} after "
                       f"{correction} correction ({family_text}), each in the direction of its mean difference",
        "significant_and_practical": "significant reversal whose effect is at least delta on both sides (relative "
                                     "for ratio metrics, percentage points for proportions)",
    }


def reversal_summary(rev: pl.DataFrame, cfg: dict, labels: dict, n_side_tests: int | None = None) -> dict:
    """The ``reversals`` section of one panel, computed from its reversal table: the headline counts (over
    the headline metrics), secondary and all-metric counts, breakdowns and the most dramatic reversal."""
    defs = _definitions(cfg, cfg["correction"], _family_definition(cfg["family"]))
    head = rev.filter(pl.col("headline")) if rev.height else rev
    out: dict = {
        "definition": "scheduler a beats b on one source and loses to it on the other (same region and metric)",
        "family": cfg["family"], "family_definition": _family_definition(cfg["family"]),
        "correction": cfg["correction"], "alpha": cfg["alpha"], "delta": _delta_definition(cfg),
        "metrics": sorted(set(head["metric"])) if head.height else [],
        **_counts(head, defs, "scheduler pairs x source pairs x regions x headline metrics compared"),
        "side_tests": _stat(n_side_tests, "distinct paired tests (scheduler pair x source x region x metric), "
                                          "each adjusted once in its family"),
        "secondary": _counts(rev.filter(~pl.col("headline")) if rev.height else rev, defs,
                             "comparisons of the secondary metrics"),
        "all_metrics": _counts(rev, defs, "comparisons of every metric"),
    }
    masks = _stage_masks()
    bys = {"by_region": (head, ["region"]), "by_metric": (rev, ["metric"]), "by_scheduler_pair": (head, ["a", "b"]),
           "by_source_pair": (head, ["source_1", "source_2"])}
    for key, (tab, by) in bys.items():
        out[key] = {}
        if not tab.height:
            continue
        for row in breakdown(tab, by).iter_rows(named=True):
            name = "|".join(str(row[c]) for c in by)
            out[key][name] = {"comparisons": row["comparisons"], **{k: row[k] for k in masks},
                              "significant_and_practical_rate": _num(row["significant_and_practical_rate"])}
    sp = head.filter(masks["significant_and_practical"]) if head.height else head
    if sp.height:
        best = sp.sort(["strength", "region", "metric", "a", "b"], descending=[True, False, False, False, False]).row(0, named=True)
        out["most_dramatic"] = {
            **{k: _num(v) if isinstance(v, (float, int)) and not isinstance(v, bool) else v for k, v in best.items()},
            "label_1": labels.get(best["source_1"], best["source_1"]),
            "label_2": labels.get(best["source_2"], best["source_2"]),
            "definition": "the significant-and-practical reversal of a headline metric whose smaller side is the "
                          "largest multiple of delta (strength = min(effect_1, effect_2) / delta)",
        }
    else:
        out["most_dramatic"] = None
    return out


def study_preset(cube: Cube, side: dict, delta: np.ndarray, cfg: dict, srcs: list[str]) -> dict:
    """The original study's design on one panel: the preset metric, the heaviest ``regions`` regions, every
    scheduler pair x source pair, one family of side tests corrected with the preset's correction. As in the
    default reversals, a comparison involving a scheduler that is n/a on one of its sources (``tenant_na``:
    ``vtc`` without tenants) is n/a: neither compared nor in the correction family."""
    pre = cfg["study_preset"]
    metric, n_reg = pre["metric"], pre["regions"]
    na = tenant_na(cube)
    out = {"metric": metric, "correction": pre["correction"], "alpha": cfg["alpha"],
           "definition": f"the original study's design: one metric ({metric}), the {n_reg} heaviest regions, "
                         f"{len(cube.schedulers) * (len(cube.schedulers) - 1) // 2} scheduler pairs x "
                         f"{len(srcs) * (len(srcs) - 1) // 2} source pairs; its {len(srcs)} x regions x pairs side "
                         f"tests corrected together ({pre['correction']}); comparisons involving a scheduler that is "
                         "n/a on a source (vtc without tenants) left out, as in the default reversals"}
    if metric not in cube.metrics:
        return {**out, "available": False, "reason": f"metric {metric} is not among the analysed metrics"}
    m = cube.metrics.index(metric)
    regions = cube.regions[-n_reg:]                         # cube.regions are sorted by offered load
    ri = [cube.regions.index(r) for r in regions]
    p = np.stack([_p_defined(cube, side, na, s)[ri, m] for s in srcs])          # (S, N, P); n/a pairs NaN
    p_adj = stats.adjust_pvalues(p, pre["correction"]).reshape(p.shape)
    sig = {s: stats.side_significant(p_adj[i], side[s]["test"].direction[ri, m], side[s]["diff"][ri, m], cfg["alpha"])
           for i, s in enumerate(srcs)}
    tot = {"comparisons": 0, "sign_reversals": 0, "significant": 0, "significant_and_practical": 0}
    n_na = 0
    for i, j in combinations(range(len(srcs)), 2):
        a1, a2 = side[srcs[i]], side[srcs[j]]
        v = stats.reversal_verdicts(a1["diff"][ri, m], a2["diff"][ri, m], sig[srcs[i]], sig[srcs[j]],
                                    a1["effect"][ri, m], a2["effect"][ri, m], delta[m])
        ok = np.broadcast_to(~(na_pairs(cube, na, srcs[i]) | na_pairs(cube, na, srcs[j]))[None, :], v["reversal"].shape)
        n_na += int((~ok).sum())
        tot["comparisons"] += int(ok.sum())
        tot["sign_reversals"] += int((v["reversal"] & ok).sum())
        tot["significant"] += int((v["reversal"] & v["significant"] & ok).sum())
        tot["significant_and_practical"] += int((v["reversal"] & v["significant"] & v["practical"] & ok).sum())
    n = tot["comparisons"]
    return {**out, "available": True, "regions": regions, "delta": float(delta[m]), "scale": cube.scales[m], **tot,
            "rate": _num(tot["significant_and_practical"] / n) if n else None,
            "side_tests": int(np.isfinite(p).sum()), "not_applicable": n_na,
            "not_applicable_definition": "comparisons left out because a scheduler is n/a on one of the two sources "
                                         "(" + "; ".join(f"{', '.join(sorted(v))} on {k}" for k, v in na.items()
                                                         if k in srcs) + ")" if n_na else "none"}


def _reversals(cube: Cube, side: dict, delta: np.ndarray, cfg: dict, panels: dict, head: list[int],
               tables) -> dict[str, dict]:
    """Per panel: the reversal section (with the study preset); tables get one block of rows per panel."""
    out: dict[str, dict] = {}
    tframes, rframes = [], []
    labels = {s: cube.label(s) for s in cube.sources}
    for name, p in available_panels(panels, out):
        srcs = p["sources"]
        tests, rev = _panel_reversals(cube, side, delta, cfg, name, srcs, head)
        tframes.append(tests)
        rframes.append(rev)
        n_side = int(np.isfinite(tests["p"].to_numpy()).sum())
        out[name] = {"available": True, "sources": srcs, **reversal_summary(rev, cfg, labels, n_side),
                     "study_preset": study_preset(cube, side, delta, cfg, srcs)}
    tables["pairwise_tests"] = pl.concat(tframes) if tframes else _empty("pairwise_tests")
    tables["reversals"] = pl.concat(rframes) if rframes else _empty("reversals")
    return out


def reversal_counts(A: Analysis, *, correction: str, family: str, alpha: float, delta: float,
                    delta_absolute: float | None = None, panel: str | None = None, headline: bool = True) -> dict:
    """Reversal counts at each stage under other correction / family / alpha / delta settings, recomputed
    from the stored side tests (``pairwise_tests``) of one panel (default: the headline panel) — for the
    sensitivity table. Counts over the headline metrics (``headline``) or every metric. ``delta_absolute``
    None: the relative effect against ``delta`` on every metric (the old design)."""
    panel = panel or A.summary["headline_panel"]
    t = A["pairwise_tests"].filter(pl.col("panel") == panel)
    groups = {"all": np.zeros(t.height, int), "per_metric": t["metric"].to_numpy(),
              "per_region": t["region"].to_numpy()}[family]
    p_adj = stats.adjust_pvalues(t["p"].to_numpy(), correction, groups)
    sig = stats.side_significant(p_adj, t["test_direction"].to_numpy(), t["diff"].to_numpy(), alpha)
    side = t.select("a", "b", "source", "region", "metric").with_columns(pl.Series("sig", sig))
    rev = A["reversals"].filter(pl.col("panel") == panel)
    if headline:
        rev = rev.filter(pl.col("headline"))
    rev = rev.select("a", "b", "source_1", "source_2", "region", "metric", "scale", "reversal", "effect_1", "effect_2",
                     "rel_1", "rel_2")
    keys = ["a", "b", "region", "metric"]
    rev = (rev.join(side.rename({"source": "source_1", "sig": "sig_1"}), on=keys + ["source_1"], how="left")
           .join(side.rename({"source": "source_2", "sig": "sig_2"}), on=keys + ["source_2"], how="left"))
    sp = rev["reversal"].to_numpy() & rev["sig_1"].to_numpy() & rev["sig_2"].to_numpy()
    with np.errstate(invalid="ignore"):
        if delta_absolute is None:
            practical = (rev["rel_1"].to_numpy() >= delta) & (rev["rel_2"].to_numpy() >= delta)
        else:
            d = np.where(rev["scale"].to_numpy() == "ratio", delta, delta_absolute)
            practical = (rev["effect_1"].to_numpy() >= d) & (rev["effect_2"].to_numpy() >= d)
    return {"metrics": "headline" if headline else "all", "correction": correction, "family": family, "alpha": alpha,
            "delta": delta, "delta_absolute": delta_absolute, "comparisons": rev.height, "sign_reversals": int(rev["reversal"].sum()),
            "significant": int(sp.sum()), "significant_and_practical": int((sp & practical).sum())}


def reversal_sensitivity(A: Analysis, panel: str | None = None) -> pl.DataFrame:
    """Headline reversal counts under both corrections x the three families (alpha, delta as chosen), and
    under half and double delta — how much the headline count depends on these choices."""
    p = A.summary["parameters"]
    base = dict(alpha=p["alpha"], delta=p["delta"], delta_absolute=p["delta_absolute"], panel=panel)
    rows = [reversal_counts(A, correction=c, family=f, **base) for c in stats.CORRECTIONS for f in FAMILIES]
    for k in (0.5, 2.0):
        rows.append(reversal_counts(A, correction=p["correction"], family=p["family"], alpha=p["alpha"],
                                    delta=p["delta"] * k, delta_absolute=p["delta_absolute"] * k, panel=panel))
    rows.append(legacy_reversal_counts(A, panel))
    return pl.DataFrame(rows, schema_overrides={"delta_absolute": pl.Float64}).unique(maintain_order=True)


def legacy_reversal_counts(A: Analysis, panel: str | None = None) -> dict:
    """The old design on today's tests: every metric, one family (Holm), a relative delta on every metric."""
    p = A.summary["parameters"]
    return reversal_counts(A, correction="holm", family="all", alpha=p["alpha"], delta=p["delta"], delta_absolute=None,
                           panel=panel, headline=False)


def tail_table(A: Analysis, panel: str | None = None) -> pl.DataFrame:
    """Every tail metric at p90 / p95 / p99 side by side: cross-source tau-b, tau-b / tau-b,max and
    discordance, and the significant-and-practical reversals (every tail metric is secondary unless it is a
    headline metric; families as chosen)."""
    panel = panel or A.summary["headline_panel"]
    sec = A.summary["panels"][panel]
    cs, rv = sec["cross_source"], sec["reversals"]
    rows = []
    for fam in ("ttft", "tpot", "e2e"):
        for q in ("p90", "p95", "p99"):
            m = f"{fam}_{q}"
            if m not in (cs.get("by_metric") or {}):
                continue
            c, r = cs["by_metric"][m], (rv.get("by_metric") or {}).get(m, {})
            rows.append({"metric": m, "family": fam, "quantile": q, "tau_b": c["tau_b"]["value"],
                         "tau_b_norm": c["tau_b_norm"]["value"], "discordance": c["discordance"]["value"],
                         "defined": c["conditions"]["defined"], "all_tied": c["conditions"]["all_tied"],
                         "comparisons": r.get("comparisons"), "sign_reversals": r.get("sign_reversals"),
                         "significant_and_practical": r.get("significant_and_practical")})
    schema = {"metric": pl.Utf8, "family": pl.Utf8, "quantile": pl.Utf8, "tau_b": pl.Float64, "tau_b_norm": pl.Float64,
              "discordance": pl.Float64, "defined": pl.Int64, "all_tied": pl.Int64, "comparisons": pl.Int64,
              "sign_reversals": pl.Int64, "significant_and_practical": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def tail_check(A: Analysis, a: str, b: str, region: str, metric: str) -> pl.DataFrame:
    """The pair (a, b) in ``region`` at the other percentiles of ``metric``'s family: per source, windows where
    a is better, the two means and the effect — does a tail reversal hold below p99?"""
    fam = metric.rsplit("_", 1)[0]
    names = [f"{fam}_{q}" for q in ("p90", "p95", "p99")]
    wv = A["window_values"].filter(pl.col("metric").is_in(names) & (pl.col("region") == region)
                                   & pl.col("scheduler").is_in([a, b]))
    if not wv.height:
        return pl.DataFrame()
    piv = wv.pivot(on="scheduler", index=["source", "metric", "window_id"], values="value")
    lower = A.summary["data"]["directions"].get(metric, "lower") == "lower"
    better = (pl.col(a) < pl.col(b)) if lower else (pl.col(a) > pl.col(b))
    return (piv.group_by(["source", "metric"]).agg(better.sum().alias(f"windows_{a}_better"), pl.len().alias("windows"),
                                                   pl.col(a).mean().alias(f"mean_{a}"), pl.col(b).mean().alias(f"mean_{b}"))
            .sort(["source", "metric"]))
