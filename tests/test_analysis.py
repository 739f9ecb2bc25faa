"""portbench.study.analysis on planted run tables: planted effects are found, noise is not, and the tables,
summary.json and CIs are consistent with each other and with scipy / statsmodels."""

from __future__ import annotations

import json
import warnings

import numpy as np
import polars as pl
import pytest
import scipy.stats as st
from statsmodels.stats.multitest import multipletests

import planted
from portbench.present import plots_analysis
from portbench.study import analysis, stats
from portbench.core.errors import DataError, ParameterError

SCHEDS = ("fcfs", "sarathi", "sjf_oracle", "las")
REGIONS = {"busy": 0.7, "overload": 1.2}
METRICS = ("throughput_tok_s", "slo_medium", "e2e_mean", "ttft_p99")
EQUAL = {k: 0.0 for k in SCHEDS}

# fcfs much better than sarathi on Azure, much worse on BurstGPT, consistently across windows
REVERSAL = [planted.Effect("fcfs", "azure", "overload", "e2e_mean", 0.5, 0.05),
            planted.Effect("fcfs", "burstgpt", "overload", "e2e_mean", -0.5, 0.05)]
# las: large mean shift in opposite directions on two sources, but inconsistent across windows
INCONSISTENT = [planted.Effect("las", "azure", "busy", "slo_medium", 0.6, 2.5),
                planted.Effect("las", "bailian", "busy", "slo_medium", -0.6, 2.5)]


def small_runs(effects=(), skill=EQUAL, seed=0, **kw):
    return planted.make_runs(schedulers=SCHEDS, regions=REGIONS, metrics=METRICS, n_windows=20, replicates=2,
                             effects=effects, skill=skill, noise_sd=0.05, seed=seed, **kw)


@pytest.fixture()
def params_for(tmp_params, tmp_path):
    def make(df, **overrides):
        path = planted.write_runs(tmp_path / "results", df)
        o = {"analysis.runs_file": str(path), "analysis.metrics": list(METRICS), "analysis.bootstrap": 200,
             "analysis.headline_metrics": ["e2e_mean"]}
        o.update(overrides)
        return tmp_params("papermill_params/default.yaml", **o)
    return make


def cube_of(runs, P):
    return analysis.build_cube(runs, metric_spec=P.analysis.metrics, all_metrics=analysis.metric_names(P.simulation.slo),
                               scheduler_order=P.simulation.schedulers)


def _row(rev, a, b, s1, s2, region, metric):
    r = rev.filter((pl.col("a") == a) & (pl.col("b") == b) & (pl.col("source_1") == s1) & (pl.col("source_2") == s2)
                   & (pl.col("region") == region) & (pl.col("metric") == metric))
    assert r.height == 1
    return r.row(0, named=True)


# --------------------------------------------------------------------------- reversals

def test_planted_reversal_is_significant_and_practical_and_noise_is_not(params_for):
    P = params_for(small_runs(REVERSAL + INCONSISTENT))
    A = analysis.compute(P)
    rev = A["reversals"]
    assert rev.height == 6 * 3 * 2 * 4                    # pairs x source pairs x regions x metrics
    r = _row(rev, "fcfs", "sarathi", "azure", "burstgpt", "overload", "e2e_mean")
    assert r["diff_1"] > 0 > r["diff_2"]                 # fcfs better on Azure (lower e2e), worse on BurstGPT
    assert r["reversal"] and r["significant"] and r["practical"]
    assert r["stage"] == "significant_and_practical"
    assert min(r["rel_1"], r["rel_2"]) > 0.3
    md = A.summary["reversals"]["most_dramatic"]
    assert (md["a"], md["region"], md["metric"]) == ("fcfs", "overload", "e2e_mean")

    # noise only: every significant side test involves a planted scheduler in its planted cell
    tests = A["pairwise_tests"].filter(pl.col("significant"))
    planted_cells = {(e.scheduler, e.source, e.region, e.metric) for e in REVERSAL}
    for t in tests.iter_rows(named=True):
        assert {(t["a"], t["source"], t["region"], t["metric"]),
                (t["b"], t["source"], t["region"], t["metric"])} & planted_cells, t
    noise = rev.filter(~((pl.col("region") == "overload") & (pl.col("metric") == "e2e_mean")
                         & ((pl.col("a") == "fcfs") | (pl.col("b") == "fcfs"))))
    assert noise.filter(pl.col("significant")).height == 0

    # large but inconsistent: big relative effects with opposite signs, yet not significant
    inc = rev.filter((pl.col("region") == "busy") & (pl.col("metric") == "slo_medium") & (pl.col("b") == "las")
                     & (pl.col("source_1") == "azure") & (pl.col("source_2") == "bailian"))
    assert inc.height == 3
    assert inc["reversal"].all() and (inc["min_rel"] >= 0.05).all()   # large and reversed in sign...
    assert not inc["significant"].any()                              # ...but not consistent across windows
    assert set(inc["stage"]) == {"sign"}


def test_side_tests_are_wilcoxon_over_windows_and_reused_by_every_source_pair(params_for):
    df = small_runs(REVERSAL)
    P = params_for(df)
    A = analysis.compute(P)
    t = A["pairwise_tests"].filter((pl.col("a") == "fcfs") & (pl.col("b") == "sarathi") & (pl.col("source") == "azure")
                                   & (pl.col("region") == "overload") & (pl.col("metric") == "e2e_mean")).row(0, named=True)
    w = (df.filter((pl.col("source") == "azure") & (pl.col("region") == "overload"))
         .group_by(["window_id", "scheduler"]).agg(pl.col("e2e_mean").mean())
         .pivot(on="scheduler", index="window_id", values="e2e_mean").sort("window_id"))
    d = -(w["fcfs"].to_numpy() - w["sarathi"].to_numpy())        # lower is better -> oriented difference
    assert t["diff"] == pytest.approx(d.mean())
    assert t["p"] == pytest.approx(st.wilcoxon(d).pvalue)
    assert t["mean_a"] == pytest.approx(w["fcfs"].mean()) and t["n_windows"] == 20
    rev = A["reversals"]
    for s2 in ("burstgpt", "bailian"):
        r = _row(rev, "fcfs", "sarathi", "azure", s2, "overload", "e2e_mean")
        assert (r["p_1"], r["p_adj_1"], r["diff_1"]) == (t["p"], t["p_adj"], t["diff"])


@pytest.mark.parametrize("correction", ["holm", "fdr_bh"])
@pytest.mark.parametrize("family", ["all", "per_metric", "per_region"])
def test_adjusted_p_values_equal_statsmodels_called_directly(params_for, correction, family):
    P = params_for(small_runs(REVERSAL, skill=None), **{"analysis.correction": correction,
                                                        "analysis.family": family})
    t = analysis.compute(P)["pairwise_tests"]
    key = {"all": None, "per_metric": "metric", "per_region": "region"}[family]
    groups = [t] if key is None else [g for _, g in t.group_by(key)]
    for g in groups:
        assert np.allclose(g["p_adj"].to_numpy(), multipletests(g["p"].to_numpy(), method=correction)[1])
    assert set(t["family"]) == ({"all"} if key is None else set(t[key]))


def test_reversal_counts_recomputed_from_side_tests_match_the_table(params_for):
    P = params_for(small_runs(REVERSAL, skill=None))
    A = analysis.compute(P)
    p = A.summary["parameters"]
    again = analysis.reversal_counts(A, correction=p["correction"], family=p["family"], alpha=p["alpha"],
                                     delta=p["delta"])
    for k in ("sign_reversals", "significant", "significant_and_practical"):
        assert again[k] == A.summary["reversals"][k]["value"]


# --------------------------------------------------------------------------- orientation, cross-metric

def test_lower_is_better_metrics_are_ranked_by_the_smallest_mean(params_for):
    P = params_for(small_runs(skill={"fcfs": 1.0, "sarathi": 0.5, "sjf_oracle": 0.0, "las": -0.5}))
    rk = analysis.compute(P)["rankings"]
    for metric in METRICS:
        g = rk.filter((pl.col("source") == "azure") & (pl.col("region") == "busy") & (pl.col("metric") == metric))
        order = g.sort("rank")["scheduler"].to_list()
        assert order == ["fcfs", "sarathi", "sjf_oracle", "las"], metric
        means = g.sort("rank")["mean"].to_numpy()
        if analysis.metric_direction(metric) == "lower":
            assert np.all(np.diff(means) > 0), metric         # best = smallest latency
        else:
            assert np.all(np.diff(means) < 0), metric


def test_top1_change_is_detected_on_a_crafted_table_and_not_on_a_consistent_one(params_for):
    skill = {"fcfs": 1.0, "sarathi": 0.0, "sjf_oracle": -0.5, "las": -1.0}
    P = params_for(small_runs(skill=skill))
    cm = analysis.compute(P).summary["cross_metric"]
    assert cm["top1_change_rate"]["value"] == 0.0 and cm["conditions"] == 6
    # sarathi becomes the clear winner under slo_medium everywhere: the winner depends on the metric
    flip = [planted.Effect("sarathi", s, r, "slo_medium", 3.0) for s in planted.SOURCES for r in REGIONS]
    A = analysis.compute(params_for(small_runs(flip, skill=skill)))
    assert A.summary["cross_metric"]["top1_change_rate"]["value"] == 1.0
    top = A["top1"].filter(pl.col("metric") == "slo_medium")
    assert set(top["winner"]) == {"sarathi"}
    assert A["cross_metric_conditions"]["top1_changes"].all()


# --------------------------------------------------------------------------- bootstrap CIs

@pytest.mark.parametrize("tol", [0.0, 0.01])
def test_bootstrap_ci_of_cross_source_tau_equals_scipy_on_every_resample(params_for, tol):
    """End-to-end spot-check: rebuild the resamples, rank each one (practically tied ranks, one vector at a
    time) and compute tau with scipy on each."""
    P = params_for(small_runs(skill=None), **{"analysis.bootstrap": 150, "analysis.rank_tolerance": tol})
    A = analysis.compute(P)
    cube = cube_of(analysis.load_runs(P), P)
    r, m = cube.regions.index("overload"), cube.metrics.index("e2e_mean")
    boot = {}
    for s in ("azure", "bailian"):
        idx = stats.bootstrap_indices(len(cube.windows[s]), 150, analysis._source_rng(0, s))
        boot[s] = stats.bootstrap_means(cube.oriented(s)[r, m], idx)             # (K, B)

    def rank(v):
        return stats.tolerant_ranks(v, tol)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        taus = np.array([st.kendalltau(rank(boot["azure"][:, b]), rank(boot["bailian"][:, b])).statistic
                         for b in range(150)])
    row = A["cross_source_tau"].filter((pl.col("region") == "overload") & (pl.col("metric") == "e2e_mean")
                                       & (pl.col("source_1") == "azure") & (pl.col("source_2") == "bailian"))
    lo, hi = np.nanquantile(taus, [0.025, 0.975])
    assert row["ci_low"][0] == pytest.approx(lo) and row["ci_high"][0] == pytest.approx(hi)
    assert row["n_boot_valid"][0] == np.sum(~np.isnan(taus))
    means = {s: np.nanmean(cube.oriented(s)[r, m], axis=-1) for s in ("azure", "bailian")}
    assert row["tau"][0] == pytest.approx(st.kendalltau(rank(means["azure"]), rank(means["bailian"])).statistic)


def test_kendall_w_across_sources_matches_the_rankings_table(params_for):
    A = analysis.compute(params_for(small_runs(skill=None)))
    rk = A["rankings"].filter((pl.col("region") == "busy") & (pl.col("metric") == "ttft_p99"))
    ranks = np.stack([rk.filter(pl.col("source") == s).sort("scheduler")["rank"].to_numpy()
                      for s in planted.SOURCES])
    w = A["cross_source_w"].filter((pl.col("region") == "busy") & (pl.col("metric") == "ttft_p99"))["W"][0]
    assert w == pytest.approx(stats.kendall_w(ranks))


# --------------------------------------------------------------------------- summary.json and files

def test_summary_json_has_the_required_keys_and_agrees_with_the_tables(params_for):
    P = params_for(small_runs(REVERSAL + INCONSISTENT, skill=None))
    summary = plots_analysis.run(P, figures=False, progress=False)
    on_disk = json.loads(analysis.summary_path(P.paths.results_dir).read_text())
    assert on_disk == json.loads(json.dumps(summary, default=str))
    for key in ("cross_source", "cross_region", "reversals", "cross_metric", "slo_sensitivity", "figures",
                "provenance", "parameters"):
        assert key in on_disk, key
    rv = on_disk["reversals"]
    for key in ("comparisons", "sign_reversals", "significant", "significant_and_practical", "by_region",
                "by_metric", "by_scheduler_pair", "by_source_pair", "most_dramatic"):
        assert key in rv, key
    assert {"mean_tau", "top1_change_rate", "conditions"} <= set(on_disk["cross_metric"])
    for key in ("alpha", "delta", "correction", "family", "bootstrap", "rank_tolerance", "tied_ranks"):
        assert key in on_disk["parameters"]
    assert on_disk["parameters"]["rank_tolerance"] == 0.01 and "0.01" in on_disk["parameters"]["tied_ranks"]
    assert {"conditions_with_new_ties", "all_tied", "tie_groups", "chained_groups", "max_group_spread"} \
        <= set(on_disk["rank_ties"])
    sens = on_disk["cross_source"]["by_rank_tolerance"]
    assert [v["rank_tolerance"] for v in sens.values()] == [0.0, 0.005, 0.01, 0.02]
    assert sens["0.01"]["chosen"] and sens["0.01"]["value"] == on_disk["cross_source"]["mean_tau"]["value"]
    assert on_disk["provenance"]["azure"]["provenance"] == "real"
    assert on_disk["provenance"]["burstgpt"]["label"] == "BurstGPT (stand-in)"

    d = analysis.analysis_dir(P.paths.results_dir)
    rev = pl.read_parquet(d / "reversals.parquet")
    assert rv["comparisons"]["value"] == rev.height
    assert rv["sign_reversals"]["value"] == rev["reversal"].sum()
    assert rv["significant"]["value"] == (rev["reversal"] & rev["significant"]).sum()
    sp = rev.filter(pl.col("reversal") & pl.col("significant") & pl.col("practical"))
    assert rv["significant_and_practical"]["value"] == sp.height
    assert rv["most_dramatic"]["min_rel"] == pytest.approx(sp["min_rel"].max(), rel=1e-5)
    assert sum(v["significant_and_practical"] for v in rv["by_region"].values()) == sp.height
    assert sum(v["comparisons"] for v in rv["by_source_pair"].values()) == rev.height
    for col in ("reversal", "significant", "practical", "p_1", "p_adj_1", "rel_1", "diff_2"):
        assert col in rev.columns

    cmc = pl.read_parquet(d / "cross_metric_conditions.parquet")
    cm = on_disk["cross_metric"]
    assert cm["conditions"] == cmc.height == 3 * len(REGIONS)
    assert cm["top1_change_rate"]["value"] == pytest.approx(cmc["top1_changes"].mean())
    assert cm["mean_tau"]["value"] == pytest.approx(cmc["mean_tau"].drop_nans().mean(), rel=1e-5)
    cst = pl.read_parquet(d / "cross_source_tau.parquet")
    mt = on_disk["cross_source"]["mean_tau"]
    assert mt["value"] == pytest.approx(cst["tau"].drop_nans().mean(), rel=1e-5)
    assert mt["count"] == cst["tau"].drop_nans().len()
    assert mt["ci"][0] <= mt["ci"][1]
    for name in analysis.TABLES:
        df = pl.read_parquet(d / f"{name}.parquet")
        assert df.columns == list(analysis.COLUMNS[name]), name
        assert any(c.startswith("provenance") for c in df.columns), name


def test_load_reuses_the_tables_and_recomputes_when_the_runs_change(params_for):
    P = params_for(small_runs(skill=None))
    A1 = analysis.load(P)
    A2 = analysis.load(P)
    assert A2.meta["fingerprint"] == A1.meta["fingerprint"]
    assert A2["reversals"].equals(A1["reversals"])
    P = params_for(small_runs(skill=None, seed=1))        # same results folder, new runs
    A3 = analysis.load(P)
    assert A3.meta["fingerprint"] != A1.meta["fingerprint"]


def test_one_source_only_gives_no_cross_source_numbers_and_no_error(params_for):
    df = small_runs(skill=None).filter(pl.col("source") == "azure")
    A = analysis.compute(params_for(df))
    assert A.summary["cross_source"]["available"] is False
    assert A["reversals"].height == 0 and A.summary["reversals"]["most_dramatic"] is None
    assert A.summary["cross_metric"]["conditions"] == len(REGIONS)
    assert A.skipped == ["burstgpt", "bailian"]


def test_missing_columns_and_mixed_provenance_are_clear_errors(params_for):
    df = small_runs(skill=None)
    with pytest.raises(DataError, match="window_id"):
        analysis.compute(params_for(df.drop("window_id")))
    bad = df.with_columns(pl.when(pl.col("window_id") == "azure-00").then(pl.lit("standin"))
                          .otherwise(pl.col("provenance")).alias("provenance"))
    with pytest.raises(DataError, match="mixed provenance"):
        analysis.compute(params_for(bad))
    with pytest.raises(DataError, match="absent"):
        analysis.compute(params_for(df.drop("ttft_p99")))


@pytest.mark.parametrize("key,value", [("alpha", 1.5), ("delta", -0.1), ("correction", "bonferroni"),
                                       ("family", "per_pair"), ("bootstrap", -1), ("metrics", ["nope"]),
                                       ("cd_conditions", ["azure/busy"]), ("headline_metrics", ["nope"]),
                                       ("rank_tolerance", 1.0), ("rank_tolerance", -0.01), ("rank_tolerance", "1%"),
                                       ("rank_tolerance", True), ("rank_tolerance", None),
                                       ("rank_tolerance", float("nan"))])
def test_bad_analysis_parameters_are_rejected(tmp_params, key, value):
    with pytest.raises(ParameterError, match=f"analysis.{key}"):
        tmp_params("papermill_params/default.yaml", **{f"analysis.{key}": value})


def test_rank_tolerance_parameter_default_and_accepted_values(tmp_params):
    assert analysis.settings(tmp_params("papermill_params/default.yaml").analysis)["rank_tolerance"] == 0.01
    for ok in (0, 0.0, 0.05, 0.999):
        P = tmp_params("papermill_params/default.yaml", **{"analysis.rank_tolerance": ok})
        assert analysis.settings(P.analysis)["rank_tolerance"] == float(ok)


# --------------------------------------------------------------------------- practically tied ranks

def test_negligible_differences_are_ties_not_disagreements(params_for):
    """Azure: the schedulers differ by ~1e-5 (relative) in one condition; BurstGPT and Bailian: by ~20%, in
    the opposite / the same order. Exact ranks call Azure vs BurstGPT a complete disagreement (tau = -1);
    at tolerance 0.01 Azure's ranking is all ties, so tau is undefined (n/a), not a disagreement."""
    order = ("fcfs", "sarathi", "sjf_oracle", "las")
    effects = ([planted.Effect(k, "azure", "busy", "e2e_mean", 1e-5 * i) for i, k in enumerate(order)]
               + [planted.Effect(k, "burstgpt", "busy", "e2e_mean", -0.2 * i) for i, k in enumerate(order)]
               + [planted.Effect(k, "bailian", "busy", "e2e_mean", -0.2 * i) for i, k in enumerate(order)])
    df = planted.make_runs(schedulers=SCHEDS, regions=REGIONS, metrics=METRICS, n_windows=20, replicates=2,
                           effects=effects, skill=EQUAL, noise_sd=0.0, replicate_sd=0.0)  # only the planted differences

    def cell(A, table, **keys):
        t = A[table]
        for k, v in keys.items():
            t = t.filter(pl.col(k) == v)
        return t

    exact = analysis.compute(params_for(df, **{"analysis.rank_tolerance": 0.0}))
    tol = analysis.compute(params_for(df, **{"analysis.rank_tolerance": 0.01}))
    az = dict(region="busy", metric="e2e_mean", source="azure")
    rk0 = cell(exact, "rankings", **az).sort("scheduler")
    rel = rk0["mean"].max() / rk0["mean"].min() - 1
    assert 1e-6 < rel < 1e-4                                               # a negligible but real difference
    assert sorted(rk0["rank"]) == [1.0, 2.0, 3.0, 4.0]                     # exact ranks order it
    assert cell(tol, "rankings", **az)["rank"].to_list() == [2.5] * 4      # tied at 1%
    assert cell(tol, "rankings", **az)["n_tied"].to_list() == [4] * 4

    pair = dict(region="busy", metric="e2e_mean", source_1="azure", source_2="burstgpt")
    assert cell(exact, "cross_source_tau", **pair)["tau"][0] == pytest.approx(-1.0)   # spurious disagreement
    t = cell(tol, "cross_source_tau", **pair).row(0, named=True)
    assert np.isnan(t["tau"]) and t["n_boot_valid"] == 0                 # undefined, in every resample too
    ok = dict(region="busy", metric="e2e_mean", source_1="burstgpt", source_2="bailian")
    assert cell(tol, "cross_source_tau", **ok)["tau"][0] == pytest.approx(1.0)        # 20% differences kept
    assert cell(exact, "cross_source_tau", **ok)["tau"][0] == pytest.approx(1.0)
    assert np.isnan(cell(tol, "cross_source_w", region="busy", metric="e2e_mean")["W"][0])

    # counted as undefined, not averaged; the sensitivity recomputes the exact-rank mean
    cs = tol.summary["cross_source"]
    tau_tab = tol["cross_source_tau"]["tau"].to_numpy()
    assert cs["mean_tau"]["undefined"] == int(np.isnan(tau_tab).sum())
    assert cs["by_rank_tolerance"]["0"]["value"] == exact.summary["cross_source"]["mean_tau"]["value"]
    assert cs["by_rank_tolerance"]["0"]["undefined"] == exact.summary["cross_source"]["mean_tau"]["undefined"]
    assert cs["by_rank_tolerance"]["0.01"]["value"] == cs["mean_tau"]["value"]
    # top-1: every Azure scheduler is tied for best at 1% (all tied: left out of the winner counts)
    top = cell(tol, "top1", **az).row(0, named=True)
    assert top["n_tied"] == 4 and top["winner"] == "+".join(SCHEDS)
    assert cell(exact, "top1", **az)["n_tied"][0] == 1
    # the reversal tests and Friedman do not use the rank tolerance
    assert tol["reversals"].equals(exact["reversals"]) and tol["friedman"].equals(exact["friedman"])
    assert tol["avg_ranks"].equals(exact["avg_ranks"])
    assert tol.summary["rank_ties"]["all_tied"]["value"] >= tol.summary["rank_ties"]["all_tied"]["exact"] + 1


def test_tolerance_zero_reproduces_the_exact_rank_analysis(params_for):
    """rank_tolerance = 0 gives the ranks of scipy.stats.rankdata and tau on the raw means (exact ties only)."""
    df = small_runs(skill=None)
    A = analysis.compute(params_for(df, **{"analysis.rank_tolerance": 0.0}))
    cube = cube_of(df, params_for(df))
    for s in cube.sources:
        means = np.nanmean(cube.oriented(s), axis=-1)
        rk = A["rankings"].filter(pl.col("source") == s)["rank"].to_numpy().reshape(means.shape)
        assert np.array_equal(rk, st.rankdata(-means, axis=-1))
    t = A["cross_source_tau"].filter((pl.col("source_1") == "azure") & (pl.col("source_2") == "bailian"))
    ma = np.nanmean(cube.oriented("azure"), axis=-1)
    mb = np.nanmean(cube.oriented("bailian"), axis=-1)
    ref = [st.kendalltau(ma[r, m], mb[r, m]).statistic for r in range(len(cube.regions))
           for m in range(len(cube.metrics))]
    assert np.allclose(t["tau"].to_numpy(), ref, equal_nan=True)
    assert list(A.summary["cross_source"]["by_rank_tolerance"]) == ["0"]


@pytest.mark.slow
def test_every_figure_is_saved_and_indexed(params_for):
    from portbench.present import plots_analysis

    P = params_for(small_runs(REVERSAL, skill=None))
    A = analysis.load(P)
    index = plots_analysis.make_all(P, A, close=True)
    summary = analysis.write_summary(P, A)
    assert len(index) >= 15 and summary["figures"] == index
    from pathlib import Path

    for f in index:
        png = Path(f["file"]) if Path(f["file"]).is_absolute() else Path(P.paths.root) / f["file"]
        assert png.is_file() and png.with_suffix(".pdf").is_file() and f["description"]
