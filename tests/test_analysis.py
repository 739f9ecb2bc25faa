"""portbench.study.analysis on planted run tables: planted effects are found, noise is not, statistical ties resolve
what the windows resolve, and the tables, summary.json and CIs are consistent with each other and with scipy /
statsmodels."""

from __future__ import annotations

import json
import warnings

import numpy as np
import polars as pl
import pytest
import scipy.stats as st
from statsmodels.stats.multitest import multipletests

import planted
from portbench import params
from portbench.present import plots_analysis, text
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
             "analysis.headline_metrics": ["e2e_mean", "slo_medium"], "analysis.study_preset.metric": "e2e_mean"}
        o.update(overrides)
        return tmp_params("papermill_params/default.yaml", **o)
    return make


def load_analysis(P):
    """``analysis.load`` as a notebook opens it: the manifest loaded once (a planted runs file does not need one)."""
    manifest, why = analysis.stage_manifest(P.paths, required=P.analysis.runs_file is None)
    return analysis.load(P, manifest, manifest_error=why)


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
    # Holm over every test: no false discovery among the noise (BH, the default, allows a share of them)
    P = params_for(small_runs(REVERSAL + INCONSISTENT), **{"analysis.correction": "holm", "analysis.family": "all"})
    A = analysis.compute(P.analysis_inputs)
    rev = A["reversals"]
    assert rev.height == 6 * 3 * 2 * 4                    # pairs x source pairs x regions x metrics
    assert set(rev["panel"]) == {"study"}
    r = _row(rev, "fcfs", "sarathi", "azure", "burstgpt", "overload", "e2e_mean")
    assert r["diff_1"] > 0 > r["diff_2"]                 # fcfs better on Azure (lower e2e), worse on BurstGPT
    assert r["reversal"] and r["significant"] and r["practical"]
    assert r["stage"] == "significant_and_practical"
    assert min(r["rel_1"], r["rel_2"]) > 0.3 and r["effect_1"] == r["rel_1"] and r["scale"] == "ratio"
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

    # large but inconsistent: big effects with opposite signs, yet not significant
    inc = rev.filter((pl.col("region") == "busy") & (pl.col("metric") == "slo_medium") & (pl.col("b") == "las")
                     & (pl.col("source_1") == "azure") & (pl.col("source_2") == "bailian"))
    assert inc.height == 3
    assert inc["reversal"].all() and (inc["min_effect"] >= 0.05).all()   # large and reversed in sign...
    assert not inc["significant"].any()                                  # ...but not consistent across windows
    assert set(inc["stage"]) == {"sign"}


def test_side_tests_are_wilcoxon_over_windows_and_reused_by_every_source_pair(params_for):
    df = small_runs(REVERSAL)
    P = params_for(df)
    A = analysis.compute(P.analysis_inputs)
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
    tie = A["tie_pairs"].filter((pl.col("a") == "fcfs") & (pl.col("b") == "sarathi") & (pl.col("source") == "azure")
                                & (pl.col("region") == "overload") & (pl.col("metric") == "e2e_mean")).row(0, named=True)
    assert tie["p"] == t["p"]                                     # the tie rule uses the same test


@pytest.mark.parametrize("correction", ["holm", "fdr_bh"])
@pytest.mark.parametrize("family", ["all", "per_metric", "per_region"])
def test_adjusted_p_values_equal_statsmodels_called_directly(params_for, correction, family):
    """BH (default) and Holm, per family, equal statsmodels' multipletests on the family's raw p-values."""
    P = params_for(small_runs(REVERSAL, skill=None), **{"analysis.correction": correction,
                                                        "analysis.family": family})
    t = analysis.compute(P.analysis_inputs)["pairwise_tests"]
    key = {"all": None, "per_metric": "metric", "per_region": "region"}[family]
    groups = [t] if key is None else [g for _, g in t.group_by(key)]
    assert len(groups) == {"all": 1, "per_metric": len(METRICS), "per_region": len(REGIONS)}[family]
    for g in groups:
        assert np.allclose(g["p_adj"].to_numpy(), multipletests(g["p"].to_numpy(), method=correction)[1])
        assert g.height == 6 * 3 * (len(REGIONS) if family != "per_region" else len(METRICS)) * (
            len(METRICS) if family == "all" else 1)
    assert set(t["family"]) == ({"all"} if key is None else set(t[key]))


def test_default_family_is_bh_per_metric(tmp_params):
    a = analysis.settings(tmp_params("papermill_params/default.yaml").analysis)
    assert (a["correction"], a["family"]) == ("fdr_bh", "per_metric")
    assert a["headline_metrics"] == ["ttft_p90", "tpot_p90", "e2e_mean", "slo_medium"]
    assert a["ties"] == "significance" and a["study_preset"] == {"metric": "ttft_p99", "regions": 4, "correction": "holm"}


def test_reversal_counts_recomputed_from_side_tests_match_the_table(params_for):
    P = params_for(small_runs(REVERSAL, skill=None))
    A = analysis.compute(P.analysis_inputs)
    p = A.summary["parameters"]
    again = analysis.reversal_counts(A, correction=p["correction"], family=p["family"], alpha=p["alpha"],
                                     delta=p["delta"], delta_absolute=p["delta_absolute"])
    for k in ("sign_reversals", "significant", "significant_and_practical"):
        assert again[k] == A.summary["reversals"][k]["value"]
    every = analysis.reversal_counts(A, correction=p["correction"], family=p["family"], alpha=p["alpha"],
                                     delta=p["delta"], delta_absolute=p["delta_absolute"], headline=False)
    assert every["significant_and_practical"] == A.summary["reversals"]["all_metrics"]["significant_and_practical"]["value"]


def test_practical_size_is_absolute_for_proportions_and_relative_for_latencies(params_for):
    """slo_medium near 0: 0.05 vs 0.065 is a 26% relative effect but 1.5 percentage points -> not practical;
    the same planted reversal on a latency is practical."""
    effects = []
    for metric in ("slo_medium", "e2e_mean"):
        effects += [planted.Effect("fcfs", "azure", "overload", metric, 0.6, 0.02),
                    planted.Effect("fcfs", "burstgpt", "overload", metric, -0.6, 0.02)]
    df = small_runs(effects)
    low = {"slo_medium": pl.col("slo_medium") * 0.1}                  # proportions near 0.05
    P = params_for(df.with_columns(**low))
    A = analysis.compute(P.analysis_inputs)
    slo = _row(A["reversals"], "fcfs", "sarathi", "azure", "burstgpt", "overload", "slo_medium")
    e2e = _row(A["reversals"], "fcfs", "sarathi", "azure", "burstgpt", "overload", "e2e_mean")
    assert slo["scale"] == "proportion" and slo["delta"] == 0.05
    assert slo["reversal"] and slo["significant"] and min(slo["rel_1"], slo["rel_2"]) > 0.2   # large relative...
    assert slo["effect_1"] == pytest.approx(abs(slo["mean_a_1"] - slo["mean_b_1"]))
    assert max(slo["effect_1"], slo["effect_2"]) < 0.05 and not slo["practical"]              # ...small in points
    assert e2e["practical"] and e2e["stage"] == "significant_and_practical"
    old = analysis.legacy_reversal_counts(A)       # the old design: relative delta on every metric
    assert old["delta_absolute"] is None and old["comparisons"] == A["reversals"].height


def test_study_preset_counts_pairs_times_source_pairs_times_regions(params_for):
    regions = {"light": 0.3, "busy": 0.7, "near_saturation": 0.9, "overload": 1.2, "severe": 2.0}
    df = planted.make_runs(schedulers=SCHEDS, regions=regions, metrics=METRICS, n_windows=12, replicates=1,
                           effects=REVERSAL, noise_sd=0.05, seed=3)
    A = analysis.compute(params_for(df, **{"analysis.study_preset.regions": 3,
                                           "analysis.study_preset.metric": "e2e_mean"}).analysis_inputs)
    pre = A.summary["reversals"]["study_preset"]
    assert pre["available"] and pre["regions"] == ["near_saturation", "overload", "severe"]   # the heaviest three
    assert pre["comparisons"] == 6 * 3 * 3                      # pairs x source pairs x regions
    assert pre["side_tests"] == 6 * 3 * 3                       # pairs x sources x regions, one Holm family
    # recomputed by hand: one Holm family over the preset's side tests
    t = A["pairwise_tests"].filter((pl.col("metric") == "e2e_mean") & pl.col("region").is_in(pre["regions"]))
    p_adj = multipletests(t["p"].to_numpy(), method="holm")[1]
    sig = stats.side_significant(p_adj, t["test_direction"].to_numpy(), t["diff"].to_numpy(), 0.05)
    side = dict(zip(zip(t["a"], t["b"], t["source"], t["region"]), sig))
    rev = A["reversals"].filter((pl.col("metric") == "e2e_mean") & pl.col("region").is_in(pre["regions"]))
    n_sig = sum(bool(r["reversal"] and side[(r["a"], r["b"], r["source_1"], r["region"])]
                     and side[(r["a"], r["b"], r["source_2"], r["region"])]) for r in rev.iter_rows(named=True))
    assert pre["significant"] == n_sig and pre["sign_reversals"] == int(rev["reversal"].sum())
    assert pre["significant_and_practical"] >= 1 and pre["rate"] == pytest.approx(
        pre["significant_and_practical"] / pre["comparisons"], rel=1e-5)


# --------------------------------------------------------------------------- statistical ties

def _tie_runs(effects, **kw):
    return planted.make_runs(schedulers=SCHEDS, regions=REGIONS, metrics=METRICS, n_windows=20, replicates=1,
                             effects=effects, skill=EQUAL, **kw)


def test_consistent_small_difference_is_resolved_and_noisy_large_one_is_tied(params_for):
    """sarathi 0.5% better than fcfs on every window (no noise): resolved. las about 3% better on average but with
    noise of sd 30% per window: tied. The old 1% tolerance gets the first wrong."""
    effects = [planted.Effect("sarathi", "azure", "busy", "e2e_mean", 0.005),
               planted.Effect("las", "azure", "busy", "e2e_mean", 0.03, 0.3)]
    df = _tie_runs(effects, noise_sd=0.0, replicate_sd=0.0, seed=4)
    A = analysis.compute(params_for(df).analysis_inputs)
    tp = A["tie_pairs"].filter((pl.col("source") == "azure") & (pl.col("region") == "busy")
                               & (pl.col("metric") == "e2e_mean"))
    pair = lambda a, b: tp.filter((pl.col("a") == a) & (pl.col("b") == b)).row(0, named=True)  # noqa: E731
    small = pair("fcfs", "sarathi")
    assert 0.004 < small["effect"] < 0.006 and small["resolved"]
    noisy = pair("sjf_oracle", "las")
    assert 0.02 < noisy["effect"] < 0.06 and not noisy["resolved"]      # a 3-5% mean difference, but noisy
    rk = A["rankings"].filter((pl.col("source") == "azure") & (pl.col("region") == "busy")
                              & (pl.col("metric") == "e2e_mean"))
    g = dict(zip(rk["scheduler"], rk["group"]))
    # las has the best mean but is resolved from nobody; the scan from the best puts it with sarathi, and
    # sarathi (resolved from fcfs and sjf_oracle) closes the group: {las, sarathi}, {fcfs, sjf_oracle}
    assert g["las"] == g["sarathi"] == 1 and g["fcfs"] == g["sjf_oracle"] == 2
    assert pair("fcfs", "las")["conflict"]                        # unresolved, yet in different groups
    assert A.summary["ties"]["conflicts"]["value"] >= 2
    tol = analysis.compute(params_for(df, **{"analysis.ties": "tolerance"}).analysis_inputs)
    gt = dict(tol["rankings"].filter((pl.col("source") == "azure") & (pl.col("region") == "busy")
                                     & (pl.col("metric") == "e2e_mean")).select("scheduler", "group").iter_rows())
    assert gt["sarathi"] == gt["fcfs"]                            # the tolerance ties the resolved 0.5%...


def test_tie_groups_are_a_partition_of_pairwise_tied_runs(params_for):
    A = analysis.compute(params_for(small_runs(REVERSAL, skill=None)).analysis_inputs)
    tp, rk = A["tie_pairs"], A["rankings"]
    # within a group every pair is tied (no chaining); groups are contiguous in the mean order
    within = tp.filter(~pl.col("separated"))
    assert not within["resolved"].any()
    for (_, _, _), g in rk.group_by(["source", "region", "metric"]):
        order = g.sort("group_mean", descending=True) if g["direction"][0] == "higher" else g.sort("group_mean")
        assert order["group"].to_list() == sorted(order["group"].to_list())
        assert g["n_groups"][0] == g["group"].max() and set(g["group"]) == set(range(1, g["group"].max() + 1))
        sizes = g.group_by("group").agg(pl.len(), pl.col("n_tied").first())
        assert (sizes["len"] == sizes["n_tied"]).all()
    conflicts = tp.filter(pl.col("conflict"))
    assert (~conflicts["resolved"] & conflicts["separated"]).all()
    assert A.summary["ties"]["conflicts"]["value"] == tp.filter(
        pl.col("conflict") & pl.col("metric").is_in(["e2e_mean", "slo_medium"])).height


def test_exact_ties_and_tolerance_rules_are_sensitivity_rows(params_for):
    A = analysis.compute(params_for(small_runs(REVERSAL, skill=None)).analysis_inputs)
    rules = analysis.tie_rule_table(A)
    assert rules["tie_rule"].to_list() == ["significance", "significance_practical", "tolerance", "exact"]
    assert rules.filter(pl.col("chosen"))["tie_rule"].to_list() == ["significance"]
    exact = analysis.compute(params_for(small_runs(REVERSAL, skill=None), **{"analysis.ties": "exact"}).analysis_inputs)
    assert rules.filter(pl.col("tie_rule") == "exact")["tau_b"][0] == pytest.approx(
        exact.summary["cross_source"]["tau_b"]["value"], rel=1e-5)


def test_cross_region_tie_rule_rows_match_an_analysis_under_that_rule(params_for):
    A = analysis.compute(params_for(small_runs(REVERSAL, skill=None)).analysis_inputs)
    rules = analysis.tie_rule_table(A, section="cross_region")
    assert rules["tie_rule"].to_list() == ["significance", "significance_practical", "tolerance", "exact"]
    cr = A.summary["cross_region"]
    ch = rules.filter(pl.col("chosen")).row(0, named=True)
    assert ch["tau_b"] == cr["tau_b"]["value"] and ch["tau_b_extreme"] == cr["extreme_regions"]["tau_b"]["value"]
    assert ch["defined"] == cr["conditions"]["defined"] and ch["total"] == cr["conditions"]["total"]
    for rule in ("exact", "tolerance"):
        other = analysis.compute(params_for(small_runs(REVERSAL, skill=None), **{"analysis.ties": rule}).analysis_inputs)
        row = rules.filter(pl.col("tie_rule") == rule).row(0, named=True)
        oc = other.summary["cross_region"]
        assert row["tau_b"] == pytest.approx(oc["tau_b"]["value"], rel=1e-5, nan_ok=True)
        assert row["defined"] == oc["conditions"]["defined"]
        assert row["tau_b_extreme"] == pytest.approx(oc["extreme_regions"]["tau_b"]["value"], rel=1e-5, nan_ok=True)
    md = text.tie_rule_markdown(rules, A.summary["parameters"], "cross_region")
    assert f"**{ch['tau_b']:.2f} over {ch['defined']} of {ch['total']} conditions" in md and "lightest vs heaviest" in md


def test_least_agreeing_condition_is_not_named_on_a_point_estimate_its_interval_does_not_support():
    from portbench.study.analysis.agreement import _least_agreeing

    tau = np.array([-0.5, -0.2, 0.3, np.nan])
    hi = np.array([1.0, -0.1, 0.4, -0.9])          # the lowest tau has an interval reaching 1; the NaN is undefined
    resolved = np.array([2, 40, 30, 0])
    ok = np.ones(4, bool)
    assert _least_agreeing(tau, hi, resolved, ok) == (1,)
    assert _least_agreeing(tau, np.full(4, np.nan), resolved, ok) == (0,)     # no CIs: the lowest tau
    assert _least_agreeing(tau, hi, resolved, np.array([True, False, True, True])) == (2,)
    # equal upper bounds: the lower tau, then more resolved pairs
    assert _least_agreeing(np.array([0.1, 0.0, 0.0]), np.array([0.2, 0.2, 0.2]), np.array([5, 5, 9]),
                           np.ones(3, bool)) == (2,)
    assert _least_agreeing(tau, hi, resolved, np.zeros(4, bool)) is None


def test_vtc_is_na_in_every_comparison_that_involves_a_source_without_tenants(params_for):
    """Azure's tenant metrics are undefined in every run (no tenants): every comparison involving Azure leaves
    vtc out on both sides -- rank agreement, reversals and the study preset -- and equals an analysis of the
    runs without vtc; BurstGPT vs Bailian keeps it."""
    rng = np.random.default_rng(0)
    df = planted.make_runs(schedulers=SCHEDS + ("vtc",), regions=REGIONS, metrics=METRICS, n_windows=12, replicates=1,
                           effects=REVERSAL, noise_sd=0.05, seed=5)
    none = (df["source"] == "azure").to_numpy()
    df = df.with_columns(pl.Series("tenant_service_gap", np.where(none, np.nan, rng.uniform(100, 200, df.height))),
                         pl.Series("tenant_jain", np.where(none, np.nan, rng.uniform(0.5, 1.0, df.height))))
    over = {"analysis.metrics": list(METRICS) + ["tenant_service_gap", "tenant_jain"], "analysis.bootstrap": 50,
            "analysis.study_preset.regions": 2}
    A = analysis.compute(params_for(df, **over).analysis_inputs)
    B = analysis.compute(params_for(df.filter(pl.col("scheduler") != "vtc"), **over).analysis_inputs)
    key = ["source_1", "source_2", "region", "metric"]
    cols = ["tau", "ci_low", "ci_high", "concordant", "discordant", "n_items"]
    a = A["cross_source_tau"].sort(key)
    az = a.filter(pl.col("source_1") == "azure")
    assert az.select(cols).equals(B["cross_source_tau"].sort(key).filter(pl.col("source_1") == "azure").select(cols))
    assert set(az["n_items"]) == {4} and set(a.filter(pl.col("source_1") == "burstgpt")["n_items"]) == {5}
    cr = A["cross_region_tau"].filter(pl.col("source") == "azure").sort("metric", "region_1", "region_2")
    assert cr.select(cols).equals(B["cross_region_tau"].filter(pl.col("source") == "azure")
                                  .sort("metric", "region_1", "region_2").select(cols))
    assert A["cross_source_w"].select("W").equals(B["cross_source_w"].select("W"))        # Azure is in the panel
    na = A.summary["cross_source"]["na_schedulers"]
    assert na["dropped"] == ["vtc"] and na["sources"] == ["azure"] and na["n_items"] == 4
    assert na["headline_conditions"] == 2 * 2 * 2           # regions x headline metrics x the source pairs with Azure
    top = A["top1"].filter(pl.col("source") == "azure")
    assert not top["winner"].str.contains("vtc").any() and not top["runner_up"].str.contains("vtc").any()
    # reversals: no vtc test on Azure, and the families hold exactly the tests that exist
    t = A["pairwise_tests"]
    assert t.filter((pl.col("source") == "azure") & ((pl.col("a") == "vtc") | (pl.col("b") == "vtc"))).height == 0
    for m in t["metric"].unique().to_list():
        f = t.filter((pl.col("metric") == m) & pl.col("p").is_not_nan())      # tenant metrics: none on Azure
        assert f.height and np.allclose(f["p_adj"].to_numpy(), multipletests(f["p"].to_numpy(), method="fdr_bh")[1])
    pre = A.summary["reversals"]["study_preset"]
    assert pre["comparisons"] == 2 * (6 + 6 + 10)           # regions x (pairs of 4 twice, pairs of 5 once)
    assert pre["not_applicable"] == 2 * (4 + 4) and pre["side_tests"] == 2 * (6 + 10 + 10)
    rev = A["reversals"].filter((pl.col("metric") == "e2e_mean") & pl.col("region").is_in(pre["regions"]))
    assert pre["comparisons"] == rev.height and pre["sign_reversals"] == int(rev["reversal"].sum())
    assert "vtc" in text.na_schedulers_markdown(na, {"azure": "Azure"}) and "other 4 schedulers" in \
        text.na_schedulers_markdown(na, {"azure": "Azure"})


# --------------------------------------------------------------------------- orientation, cross-metric

def test_lower_is_better_metrics_are_ranked_by_the_smallest_mean(params_for):
    P = params_for(small_runs(skill={"fcfs": 1.0, "sarathi": 0.5, "sjf_oracle": 0.0, "las": -0.5}))
    rk = analysis.compute(P.analysis_inputs)["rankings"]
    for metric in METRICS:
        g = rk.filter((pl.col("source") == "azure") & (pl.col("region") == "busy") & (pl.col("metric") == metric))
        order = g.sort("rank")["scheduler"].to_list()
        assert order == ["fcfs", "sarathi", "sjf_oracle", "las"], metric
        means = g.sort("rank")["mean"].to_numpy()
        if analysis.metric_direction(metric) == "lower":
            assert np.all(np.diff(means) > 0), metric         # best = smallest latency
        else:
            assert np.all(np.diff(means) < 0), metric


def test_pairwise_top1_rate_on_a_crafted_table(params_for):
    """Three headline metrics; fcfs wins under throughput and e2e_mean, sarathi (by far) under slo_medium, in every
    condition: of the 3 metric pairs per condition, 2 change the top-1 -> rate 2/3; the all-metrics rule says 1."""
    skill = {"fcfs": 1.0, "sarathi": 0.0, "sjf_oracle": -0.5, "las": -1.0}
    flip = [planted.Effect("sarathi", s, r, "slo_medium", 3.0) for s in planted.SOURCES for r in REGIONS]
    P = params_for(small_runs(flip, skill=skill),
                   **{"analysis.headline_metrics": ["throughput_tok_s", "e2e_mean", "slo_medium"]})
    A = analysis.compute(P.analysis_inputs)
    cm = A.summary["cross_metric"]
    pt = cm["pairwise_top1_change_rate"]
    assert pt["count"] == 3 * len(REGIONS) * 3 and pt["changed"] == 2 * 3 * len(REGIONS)
    assert pt["value"] == pytest.approx(2 / 3) and pt["undefined"] == 0
    assert cm["all_metrics_top1_change_rate"]["value"] == 1.0
    tp = A["top1_pairs"]
    assert tp.height == 3 * len(REGIONS) * 3
    assert set(tp.filter(pl.col("metric_2") == "slo_medium")["winners_2"]) == {"sarathi"}
    assert not tp.filter((pl.col("metric_1") == "throughput_tok_s") & (pl.col("metric_2") == "e2e_mean"))[
        "top1_changes"].any()
    # without the flip no pair changes
    A0 = analysis.compute(params_for(small_runs(skill=skill),
                                     **{"analysis.headline_metrics": ["throughput_tok_s", "e2e_mean", "slo_medium"]}).analysis_inputs)
    assert A0.summary["cross_metric"]["pairwise_top1_change_rate"]["value"] == 0.0


# --------------------------------------------------------------------------- bootstrap CIs

def test_bootstrap_ci_of_cross_source_tau_equals_scipy_on_every_resample(params_for):
    """End-to-end spot-check: rebuild the resamples, keep the analysis' tie groups, order them by their resampled
    group means and compute tau with scipy on each resample."""
    P = params_for(small_runs(skill=None), **{"analysis.bootstrap": 150})
    A = analysis.compute(P.analysis_inputs)
    cube = cube_of(analysis.load_runs(P.analysis, P.plan_settings, None), P)
    r, m = cube.regions.index("overload"), cube.metrics.index("e2e_mean")
    rk = A["rankings"].filter((pl.col("region") == "overload") & (pl.col("metric") == "e2e_mean"))
    vals = {}
    for s in ("azure", "bailian"):
        idx = stats.bootstrap_indices(len(cube.windows[s]), 150, analysis._source_rng(0, s))
        b = stats.bootstrap_means(cube.oriented(s)[r, m], idx)                     # (K, B)
        grp = dict(zip(*rk.filter(pl.col("source") == s).select("scheduler", "group")))
        lab = np.array([grp[k] for k in cube.schedulers])
        vals[s] = np.stack([[b[lab == lab[k], j].mean() for k in range(len(lab))] for j in range(150)])  # (B, K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        taus = np.array([st.kendalltau(vals["azure"][j], vals["bailian"][j]).statistic for j in range(150)])
    row = A["cross_source_tau"].filter((pl.col("region") == "overload") & (pl.col("metric") == "e2e_mean")
                                       & (pl.col("source_1") == "azure") & (pl.col("source_2") == "bailian"))
    lo, hi = np.nanquantile(taus, [0.025, 0.975])
    assert row["ci_low"][0] == pytest.approx(lo) and row["ci_high"][0] == pytest.approx(hi)
    assert row["n_boot_valid"][0] == np.sum(~np.isnan(taus))
    ga = rk.filter(pl.col("source") == "azure").sort("scheduler")
    gb = rk.filter(pl.col("source") == "bailian").sort("scheduler")
    assert row["tau"][0] == pytest.approx(st.kendalltau(ga["group_mean"], gb["group_mean"]).statistic)
    assert row["tau_max"][0] == pytest.approx(stats.tau_b_max(ga["rank"].to_numpy(), gb["rank"].to_numpy()))
    assert row["tau_norm"][0] == pytest.approx(row["tau"][0] / row["tau_max"][0])


def test_kendall_w_across_sources_matches_the_rankings_table(params_for):
    A = analysis.compute(params_for(small_runs(skill=None)).analysis_inputs)
    rk = A["rankings"].filter((pl.col("region") == "busy") & (pl.col("metric") == "ttft_p99"))
    ranks = np.stack([rk.filter(pl.col("source") == s).sort("scheduler")["rank"].to_numpy()
                      for s in planted.SOURCES])
    w = A["cross_source_w"].filter((pl.col("region") == "busy") & (pl.col("metric") == "ttft_p99"))["W"][0]
    assert w == pytest.approx(stats.kendall_w(ranks)) or (np.isnan(w) and np.isnan(stats.kendall_w(ranks)))


def test_undefined_and_all_tied_conditions_are_counted_not_dropped(params_for):
    """Every scheduler identical on BurstGPT at busy load: its rankings there are all tied; the conditions are
    counted as all_tied, with the reason, and left out of the means."""
    df = small_runs(REVERSAL)
    same = df.filter((pl.col("source") == "burstgpt") & (pl.col("region") == "busy") & (pl.col("scheduler") == "fcfs"))
    rest = df.filter(~((pl.col("source") == "burstgpt") & (pl.col("region") == "busy")))
    copies = [same.with_columns(pl.lit(k).alias("scheduler")) for k in SCHEDS]
    A = analysis.compute(params_for(pl.concat([rest] + copies).sort("source", "window_id", "region", "scheduler")).analysis_inputs)
    c = A.summary["cross_source"]["conditions"]
    assert c["total"] == 3 * len(REGIONS) * 2                         # source pairs x regions x headline metrics
    assert c["all_tied"] >= 2 * 2                                   # burstgpt's two pairs x two headline metrics
    assert c["all_tied_rankings_by_source"]["burstgpt"] == 2
    assert c["defined"] + c["all_tied"] + c["missing"] == c["total"]
    assert A.summary["cross_source"]["tau_b"]["count"] == c["defined"]
    t = A["cross_source_tau"].filter((pl.col("region") == "busy") & (pl.col("source_2") == "burstgpt"))
    assert set(t["status"]) == {"all_tied"} and t["tau"].is_nan().all()


# --------------------------------------------------------------------------- panels

def test_panels_report_each_available_panel_and_name_missing_sources(params_for):
    srcs = ("azure", "burstgpt", "bailian", "azure_code", "mooncake")
    prov = {s: ("standin" if s in ("burstgpt", "bailian") else "real") for s in srcs}
    df = planted.make_runs(schedulers=SCHEDS, regions=REGIONS, metrics=METRICS, n_windows=12, replicates=1,
                           effects=REVERSAL, noise_sd=0.05, sources=srcs, provenance=prov, seed=2)
    panels = {"study": ["azure", "burstgpt", "bailian"], "real": ["azure", "azure_code", "mooncake"],
              "future": ["azure", "splitwise"]}
    A = analysis.compute(params_for(df, **{"analysis.panels": panels}).analysis_inputs)
    P = A.summary["panels"]
    # the headline is the first available all-real panel; the study's panel (with stand-ins) is reported beside it.
    # The headline panel leads every per-panel section and table (consumers such as the validation's case
    # selection take the first panel's rows)
    assert list(P) == ["real", "study", "future"] and A.summary["headline_panel"] == "real"
    for name in ("reversals", "cross_source_tau"):
        assert A[name]["panel"][0] == "real", name
    assert P["study"]["available"] and not P["study"]["all_real"]
    assert P["real"]["available"] and P["real"]["all_real"]
    assert not P["future"]["available"] and P["future"]["reason"] == "not available: sources missing (splitwise)"
    for key in ("cross_source", "cross_region", "reversals", "cross_metric"):
        assert P["real"][key]["available"] and P["future"][key]["available"] is False
    assert "fewer than two SLO metrics" in P["real"]["slo_sensitivity"]["reason"]
    assert A.summary["cross_source"] == P["real"]["cross_source"]
    # with every source real (the official files present) the study's panel, first in the list, is the headline
    allreal = analysis.compute(params_for(df.with_columns(pl.lit("real").alias("provenance")),
                                          **{"analysis.panels": panels}).analysis_inputs)
    assert allreal.summary["headline_panel"] == "study"
    t = A["cross_source_tau"]
    assert set(t["panel"]) == {"study", "real"}
    assert set(t.filter(pl.col("panel") == "real").select("source_1", "source_2").unique().rows()) == {
        ("azure", "azure_code"), ("azure", "mooncake"), ("azure_code", "mooncake")}
    # families are per panel: the real panel's BH is over its own sources' side tests
    pt = A["pairwise_tests"].filter((pl.col("panel") == "real") & (pl.col("metric") == "e2e_mean"))
    assert set(pt["source"]) == {"azure", "azure_code", "mooncake"}
    assert np.allclose(pt["p_adj"].to_numpy(), multipletests(pt["p"].to_numpy(), method="fdr_bh")[1])
    assert P["real"]["reversals"]["comparisons"]["value"] == 6 * 3 * len(REGIONS) * 2
    tab = analysis.panels_table(A)
    assert tab["available"].to_list() == [True, True, False]


def test_a_panel_with_absent_sources_is_not_an_error(params_for):
    A = analysis.compute(params_for(small_runs(skill=None)).analysis_inputs)     # default panels: real needs azure_code, mooncake
    real = A.summary["panels"]["real"]
    assert real["available"] is False and "azure_code" in real["reason"] and "mooncake" in real["reason"]
    assert real["cross_source"]["available"] is False and A.summary["headline_panel"] == "study"


# --------------------------------------------------------------------------- power

def test_power_warning_fires_when_five_windows_cannot_reach_alpha(params_for):
    df = planted.make_runs(schedulers=SCHEDS, regions=REGIONS, metrics=METRICS, n_windows=5, replicates=1,
                           effects=REVERSAL, seed=1)
    with pytest.warns(analysis.ResolutionWarning, match=r"2/2\^5 = 0.0625"):
        A = analysis.compute(params_for(df).analysis_inputs)
    res = A.summary["power"]["resolution"]["by_source"]["azure"]
    assert res["min_p"] == 0.0625 and not res["reaches_alpha"]
    assert len(A.summary["power"]["warnings"]) == 3
    assert A.summary["reversals"]["significant"]["value"] == 0      # zero by construction, and said so
    assert A.summary["ties"]["headline"]["all_tied"] == A.summary["ties"]["headline"]["rankings"]


def test_no_power_warning_with_six_windows(params_for):
    df = planted.make_runs(schedulers=SCHEDS, regions=REGIONS, metrics=METRICS, n_windows=6, replicates=1, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", analysis.ResolutionWarning)
        A = analysis.compute(params_for(df).analysis_inputs)
    res = A.summary["power"]["resolution"]
    assert res["by_source"]["azure"]["reaches_alpha"] and not res["by_source"]["azure"]["reaches_alpha_over_m"]
    assert any("Holm cannot reject" in n for n in res["notes"])   # noted, not a warning: BH may still reject


def test_minimal_detectable_effect_matches_the_normal_approximation(params_for):
    """Gaussian log-ratio noise of sd s between every pair: the Wilcoxon MDE at n = 40, alpha = 0.05, power 0.8 is
    about (1.96 + 0.84) s / sqrt(0.955 n) (asymptotic relative efficiency 3/pi)."""
    df = planted.make_runs(schedulers=SCHEDS, regions={"busy": 0.7}, metrics=("e2e_mean",), n_windows=40,
                           replicates=1, skill=EQUAL, noise_sd=0.05, replicate_sd=0.0, window_sd=0.3, seed=4)
    A = analysis.compute(params_for(df, **{"analysis.metrics": ["e2e_mean"], "analysis.headline_metrics": ["e2e_mean"],
                                           "analysis.bootstrap": 0}).analysis_inputs)
    d = A.summary["power"]["by_metric"]["e2e_mean"]
    sd = 0.05 * np.sqrt(2)                                       # log-ratio of two schedulers' noise
    expect = 2.8 * sd / np.sqrt(3 / np.pi * 40)
    assert d["null_pairs"] == 6 * 3 and d["windows"] == 40
    assert expect * 0.7 < d["mde"] < expect * 1.4
    assert d["mde_family"] > d["mde"]


# --------------------------------------------------------------------------- summary.json and files

def test_summary_json_has_the_required_keys_and_agrees_with_the_tables(params_for):
    P = params_for(small_runs(REVERSAL + INCONSISTENT, skill=None))
    summary = plots_analysis.run(P, figures=False, progress=False)
    on_disk = json.loads(analysis.summary_path(P.paths.results_dir).read_text())
    assert on_disk == json.loads(json.dumps(summary, default=str))
    for key in ("headline_metrics", "cross_source", "cross_region", "reversals", "cross_metric", "slo_sensitivity",
                "power", "panels", "ties", "figures", "provenance", "parameters"):
        assert key in on_disk, key
    assert on_disk["headline_metrics"] == ["e2e_mean", "slo_medium"]
    cs = on_disk["cross_source"]
    for key in ("tau_b", "tau_b_norm", "discordance"):
        assert {"value", "ci", "count", "definition"} <= set(cs[key]), key
    assert {"total", "defined", "all_tied"} <= set(cs["conditions"])
    rv = on_disk["reversals"]
    assert rv["family"] == "per_metric" and rv["correction"] == "fdr_bh"
    assert {"relative", "absolute"} <= set(rv["delta"])
    assert {"comparisons", "sign_reversals", "significant", "significant_and_practical", "rate"} <= set(rv["study_preset"])
    for key in ("comparisons", "sign_reversals", "significant", "significant_and_practical", "by_region",
                "by_metric", "by_scheduler_pair", "by_source_pair", "most_dramatic", "secondary", "all_metrics"):
        assert key in rv, key
    cm = on_disk["cross_metric"]
    assert {"value", "ci", "count"} <= set(cm["pairwise_top1_change_rate"])
    assert "all_metrics_top1_change_rate" in cm
    assert {"resolution", "by_metric", "warnings"} <= set(on_disk["power"])
    assert on_disk["panels"]["study"]["cross_source"] == cs
    assert on_disk["provenance"]["azure"]["provenance"] == "real"
    assert on_disk["provenance"]["burstgpt"]["label"] == "BurstGPT (stand-in)"

    d = analysis.analysis_dir(P.paths.results_dir)
    rev = pl.read_parquet(d / "reversals.parquet").filter(pl.col("headline"))
    assert rv["comparisons"]["value"] == rev.height
    assert rv["sign_reversals"]["value"] == rev["reversal"].sum()
    assert rv["significant"]["value"] == (rev["reversal"] & rev["significant"]).sum()
    sp = rev.filter(pl.col("reversal") & pl.col("significant") & pl.col("practical"))
    assert rv["significant_and_practical"]["value"] == sp.height
    if sp.height:
        assert rv["most_dramatic"]["strength"] == pytest.approx(sp["strength"].max(), rel=1e-5)
    assert sum(v["significant_and_practical"] for v in rv["by_region"].values()) == sp.height
    assert sum(v["comparisons"] for v in rv["by_source_pair"].values()) == rev.height

    cst = pl.read_parquet(d / "cross_source_tau.parquet").filter(pl.col("metric").is_in(["e2e_mean", "slo_medium"]))
    assert cs["tau_b"]["value"] == pytest.approx(cst["tau"].drop_nans().mean(), rel=1e-5)
    assert cs["tau_b"]["count"] == cst["tau"].drop_nans().len() == cs["conditions"]["defined"]
    assert cs["tau_b_norm"]["value"] == pytest.approx(cst["tau_norm"].drop_nans().mean(), rel=1e-5)
    assert cs["discordance"]["value"] == pytest.approx(
        cst["discordant"].sum() / (cst["concordant"].sum() + cst["discordant"].sum()), rel=1e-5)
    assert cs["tau_b"]["ci"][0] <= cs["tau_b"]["ci"][1]
    for name in analysis.TABLES:
        df = pl.read_parquet(d / f"{name}.parquet")
        assert df.columns == list(analysis.COLUMNS[name]), name
        if name != "power_curves":
            assert any(c.startswith("provenance") for c in df.columns), name


def test_load_reuses_the_tables_and_recomputes_when_the_runs_change(params_for):
    P = params_for(small_runs(skill=None))
    A1 = load_analysis(P)
    A2 = load_analysis(P)
    assert A2.meta["fingerprint"] == A1.meta["fingerprint"]
    assert A2["reversals"].equals(A1["reversals"])
    P = params_for(small_runs(skill=None, seed=1))        # same results folder, new runs
    A3 = load_analysis(P)
    assert A3.meta["fingerprint"] != A1.meta["fingerprint"]


def test_one_source_only_gives_no_cross_source_numbers_and_no_error(params_for):
    df = small_runs(skill=None).filter(pl.col("source") == "azure")
    A = analysis.compute(params_for(df).analysis_inputs)
    assert A.summary["cross_source"]["available"] is False
    assert A["reversals"].height == 0 and A.summary["headline_panel"] == "study"
    assert A.summary["panels"]["study"]["reason"].startswith("not available: sources missing")
    assert A.skipped == [s for s in params.load().source_names() if s != "azure"]   # configured, not run


def test_missing_columns_and_mixed_provenance_are_clear_errors(params_for):
    df = small_runs(skill=None)
    with pytest.raises(DataError, match="window_id"):
        analysis.compute(params_for(df.drop("window_id")).analysis_inputs)
    bad = df.with_columns(pl.when(pl.col("window_id") == "azure-00").then(pl.lit("standin"))
                          .otherwise(pl.col("provenance")).alias("provenance"))
    with pytest.raises(DataError, match="mixed provenance"):
        analysis.compute(params_for(bad).analysis_inputs)
    with pytest.raises(DataError, match="absent"):
        analysis.compute(params_for(df.drop("ttft_p99")).analysis_inputs)


@pytest.mark.parametrize("key,value", [("alpha", 1.5), ("delta", -0.1), ("delta_absolute", 1.5),
                                       ("correction", "bonferroni"), ("family", "per_pair"), ("bootstrap", -1),
                                       ("metrics", ["nope"]), ("cd_conditions", ["azure/busy"]),
                                       ("headline_metrics", ["nope"]), ("headline_metrics", ["e2e_mean", "e2e_mean"]),
                                       ("ties", "fuzzy"), ("tie_correction", "bonferroni"),
                                       ("rank_tolerance", 1.0), ("rank_tolerance", -0.01), ("rank_tolerance", "1%"),
                                       ("rank_tolerance", True), ("rank_tolerance", None),
                                       ("rank_tolerance", float("nan")), ("panels", {"one": ["azure"]}),
                                       ("panels", ["azure", "burstgpt"]), ("study_preset", {"metric": "nope"}),
                                       ("study_preset", {"regions": 0}), ("study_preset", {"correction": "none"}),
                                       ("power", {"windows": 1}), ("power", {"target": 1.0})])
def test_bad_analysis_parameters_are_rejected(tmp_params, key, value):
    with pytest.raises(ParameterError, match=f"analysis.{key}"):
        tmp_params("papermill_params/default.yaml", **{f"analysis.{key}": value})


def test_headline_metrics_must_be_analysed(tmp_params):
    with pytest.raises(ParameterError, match=r"analysis.headline_metrics\[0\]"):
        tmp_params("papermill_params/default.yaml", **{"analysis.metrics": ["e2e_mean"],
                                                       "analysis.headline_metrics": ["ttft_p90"]})


def test_tail_table_puts_p90_p95_p99_side_by_side(params_for):
    tails = ["ttft_p90", "ttft_p95", "ttft_p99", "e2e_mean"]
    df = planted.make_runs(schedulers=SCHEDS, regions=REGIONS, metrics=tuple(tails), n_windows=12, replicates=1, seed=5)
    A = analysis.compute(params_for(df, **{"analysis.metrics": tails, "analysis.headline_metrics": ["ttft_p90"],
                                           "analysis.study_preset.metric": "ttft_p99"}).analysis_inputs)
    t = analysis.tail_table(A)
    assert t["metric"].to_list() == ["ttft_p90", "ttft_p95", "ttft_p99"]
    assert (t["comparisons"] == 6 * 3 * len(REGIONS)).all()
    chk = analysis.tail_check(A, "fcfs", "las", "busy", "ttft_p99")
    assert set(chk["metric"]) == {"ttft_p90", "ttft_p95", "ttft_p99"} and (chk["windows"] == 12).all()


@pytest.mark.slow
def test_every_figure_is_saved_and_indexed(params_for):
    from portbench.present import plots_analysis

    P = params_for(small_runs(REVERSAL, skill=None))
    A = load_analysis(P)
    index = plots_analysis.make_all(P.paths, P.analysis, A, close=True)
    summary = analysis.write_summary(P, A)
    assert len(index) >= 18 and summary["figures"] == index
    from pathlib import Path

    for f in index:
        png = Path(f["file"]) if Path(f["file"]).is_absolute() else Path(P.paths.root) / f["file"]
        assert png.is_file() and png.with_suffix(".pdf").is_file() and f["description"]


# --------------------------------------------------------------------------- what ports (issue #25)

def test_what_ports_finds_the_planted_reversal_and_not_the_inconsistent_one(params_for):
    P = params_for(small_runs(REVERSAL + INCONSISTENT))
    A = analysis.compute(P.analysis_inputs)
    ports = A["ports"].filter(pl.col("kind") == "across_sources")
    row = ports.filter((pl.col("a") == "fcfs") & (pl.col("b") == "sarathi") & (pl.col("source_1") == "azure")
                       & (pl.col("source_2") == "burstgpt") & (pl.col("region_1") == "overload")
                       & (pl.col("metric") == "e2e_mean")).row(0, named=True)
    assert (row["side_1"], row["side_2"], row["four_way"]) == ("a", "b", "reversal")
    inc = ports.filter((pl.col("b") == "las") & (pl.col("source_1") == "azure") & (pl.col("source_2") == "bailian")
                       & (pl.col("region_1") == "busy") & (pl.col("metric") == "slo_medium"))
    assert inc.height == 3 and "reversal" not in set(inc["four_way"])
    h = A.summary["headline"]
    fw = h["four_way"]["across_sources"]
    counts = ports.group_by("four_way").len()
    assert fw["total"] == ports.filter(pl.col("four_way") != "n/a").height
    assert {r["four_way"]: r["len"] for r in counts.iter_rows(named=True)}["reversal"] == fw["reversal"]["count"] >= 1
    assert sum(fw[k]["share"] for k in stats.FOUR_WAY) == pytest.approx(1.0, abs=1e-5)
    c = h["concordance"]["across_sources"]
    assert c["n"] == fw["same_order"]["count"] + fw["reversal"]["count"]
    assert c["value"] == pytest.approx(fw["same_order"]["count"] / c["n"], abs=1e-5)
    assert c["ci"][0] <= c["ci"][1] and set(h["concordance"]) == {"across_sources", "across_regions"}
    assert A.summary["analysis_plan"]["sha256"] and A.summary["analysis_plan"]["deviations"]["headline_metrics"]
    assert {"without_predictor_policies", "matched_congestion"} <= set(A.summary["controls"])
    assert A["ports"].columns == list(analysis.COLUMNS["ports"])
    # intervals both ways: the plan's block bootstrap, the ordinary window bootstrap beside it
    assert h["interval_method"] == "block" and set(h["block_lengths"]) >= set(h["sources"])
    assert all(len(h["concordance"][k]["ci_window"]) == 2 for k in h["concordance"])
    mc = A.summary["controls"]["matched_congestion"]
    assert mc["max_ratio"] == 2.0 and isinstance(mc["unmatched"], list)


def test_the_core_analysis_equals_the_whole_one_on_what_it_computes(params_for):
    """``compute(core=True)`` (the engine-sensitivity comparison's analysis) skips the headline bootstrap, the
    multiverse, power, Friedman and hardware blocks; what it does compute -- the per-panel sections, the tables and
    the sensitivity table's numbers -- is the whole analysis' own, and each skipped block says it was not computed."""
    from portbench.study import engine_sensitivity

    df = small_runs(REVERSAL + INCONSISTENT)
    P = params_for(df, **{"analysis.bootstrap": 0})
    whole = analysis.compute(P.analysis_inputs, df)
    core = analysis.compute(P.analysis_inputs, df, core=True)
    for key in analysis.PANEL_SECTIONS:
        assert json.dumps(core.summary[key], sort_keys=True, default=str) == \
            json.dumps(whole.summary[key], sort_keys=True, default=str), key
    for name, table in core.tables.items():
        assert table.equals(whole.tables[name]), name
    assert engine_sensitivity.headline_numbers(core) == engine_sensitivity.headline_numbers(whole)
    skipped = analysis.results.CORE_SKIPPED
    assert {k for k in whole.summary if k not in core.summary or core.summary[k] != whole.summary[k]} - set(skipped) \
        <= {"figures"}
    assert all(core.summary[k]["available"] is False for k in skipped)
    assert "ports" not in core.tables and "ports" in whole.tables     # the headline block's table: skipped by the core
