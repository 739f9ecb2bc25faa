"""The column dictionary of every analysis table (what each column means), and the table names."""

from __future__ import annotations


import polars as pl




from ...core.config import FAMILIES  # noqa: F401  (re-exported)


# Notebooks whose figures show the analysis (plots_analysis saves them under these folders).
FIGURE_NOTEBOOKS = ("04_cross_workload", "05_cross_region", "06_reversals", "07_cross_metric")


STAGES = ("sign", "significant", "significant_and_practical")


SCHEMA = "portbench.summary/2"


_KEYS = {
    "source": "workload source (azure, burstgpt, bailian)",
    "provenance": "real = windows cut from the official trace; standin = labelled synthetic stand-in",
    "region": "operating region (offered load rho relative to the window's capacity)",
    "rho": "offered load of the region, relative to the window's capacity",
    "metric": "metric name (metric registry)",
    "direction": "which way is better for the metric: higher | lower",
    "scheduler": "scheduling policy",
}


_TAU = {
    "tau": "Kendall tau-b between the two rankings (scipy.stats.kendalltau; tied schedulers = one tie group, "
           "analysis.ties); NaN if a ranking is all ties",
    "ci_low": "2.5th percentile of tau over the bootstrap resamples (windows resampled within each source; tie "
              "groups fixed, re-ordered by their resampled means)",
    "ci_high": "97.5th percentile of tau over the bootstrap resamples",
    "tau_max": "largest tau-b the two rankings' tie structures allow (comonotone arrangement, stats.tau_b_max)",
    "tau_norm": "tau / tau_max: 1 = no pair resolved in both rankings is discordant",
    "norm_ci_low": "2.5th percentile of tau / tau_max over the bootstrap resamples",
    "norm_ci_high": "97.5th percentile of tau / tau_max over the bootstrap resamples",
    "concordant": "scheduler pairs resolved (in different tie groups) in both rankings and ordered alike",
    "discordant": "scheduler pairs resolved in both rankings and ordered oppositely",
    "discordance": "discordant / (concordant + discordant); NaN when no pair is resolved in both",
    "groups_1": "tie groups of the first ranking (1 = all tied, n_items = fully resolved)",
    "groups_2": "tie groups of the second ranking",
    "status": "defined | all_tied (a ranking ties every scheduler: tau undefined) | missing (a value is missing)",
    "n_items": "number of schedulers ranked",
    "n_boot_valid": "bootstrap resamples where tau was defined",
}


_W = {
    "W": "Kendall's W (coefficient of concordance, tie-corrected) across the rankings; 0 = none, 1 = identical",
    "ci_low": "2.5th percentile of W over the bootstrap resamples",
    "ci_high": "97.5th percentile of W over the bootstrap resamples",
    "n_rankings": "number of rankings compared (raters)",
    "n_items": "number of schedulers ranked",
}


COLUMNS: dict[str, dict[str, str]] = {
    "window_values": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"],
        "window_id": "frozen window id (manifest)", "region": _KEYS["region"], "metric": _KEYS["metric"],
        "scheduler": _KEYS["scheduler"],
        "value": "metric value of the window, averaged over its replicates (NaN = missing / non-finite)",
        "n_replicates": "replicates averaged",
    },
    "rankings": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "rho": _KEYS["rho"], "metric": _KEYS["metric"], "direction": _KEYS["direction"],
        "scheduler": _KEYS["scheduler"],
        "mean": "mean of the per-window values over windows (metric's unit)",
        "sd": "standard deviation of the per-window values over windows",
        "n_windows": "windows with a value",
        "rank": "rank among the schedulers, 1 = best; a tie group (analysis.ties) shares the average rank it spans",
        "group": "tie group, 1 = the best group (schedulers the tests cannot tell apart share a group)",
        "n_groups": "tie groups in this ranking (1 = all tied)",
        "n_tied": "schedulers in this tie group (1 = resolved from every other)",
        "group_mean": "mean of the group members' means (the value the ranking uses; metric's unit)",
        "ci_low": "2.5th percentile of the mean over the bootstrap resamples",
        "ci_high": "97.5th percentile of the mean over the bootstrap resamples",
    },
    "cross_source_tau": {
        "panel": "panel of sources (analysis.panels)", "region": _KEYS["region"], "metric": _KEYS["metric"],
        "source_1": "first source", "source_2": "second source",
        "provenance_1": "provenance of source_1", "provenance_2": "provenance of source_2", **_TAU,
    },
    "cross_source_w": {"panel": "panel of sources (analysis.panels)", "region": _KEYS["region"], "metric": _KEYS["metric"],
                       "provenance": "provenance of every source compared, 'source:provenance' comma-joined", **_W},
    "cross_region_tau": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "metric": _KEYS["metric"],
        "region_1": "first region (lighter load)", "region_2": "second region (heavier load)", **_TAU,
    },
    "cross_region_w": {"source": _KEYS["source"], "provenance": _KEYS["provenance"],
                       "metric": _KEYS["metric"], **_W},
    "pairwise_tests": {
        "panel": "panel whose family corrected this test (a source in two panels has a row in each)",
        "a": "scheduler a", "b": "scheduler b (pairs are unordered; a comes first in scheduler order)",
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"], "direction": _KEYS["direction"], "scale": "ratio | proportion | count (metric registry)",
        "headline": "the metric is a headline metric (analysis.headline_metrics)",
        "mean_a": "mean of a over the windows where both have a value (metric's unit)",
        "mean_b": "mean of b over the same windows",
        "diff": "oriented mean difference over windows: positive = a better than b",
        "rel_effect": "|mean_a - mean_b| / ((|mean_a| + |mean_b|) / 2): symmetric relative difference",
        "effect": "effect on the metric's scale: rel_effect (ratio), |mean_a - mean_b| (proportion), "
                  "|mean_a - mean_b| / window size (count)",
        "delta": "practical threshold of the metric (analysis.delta or analysis.delta_absolute)",
        "n_windows": "windows with both values", "n_nonzero": "windows with a non-zero difference",
        "statistic": "Wilcoxon signed-rank statistic min(R+, R-) (scipy)",
        "test_direction": "sign(R+ - R-) of the oriented differences: +1 = a ranks better",
        "method": "how scipy computed p: exact | permutation | asymptotic | all_zero (p = 1)",
        "p": "two-sided Wilcoxon signed-rank p-value (scipy.stats.wilcoxon, zeros dropped)",
        "p_adj": "p adjusted for multiple comparisons within the family (statsmodels multipletests)",
        "family": "the family this test was corrected in",
        "significant": "p_adj < alpha and the test's direction agrees with the sign of diff",
    },
    "reversals": {
        "panel": "panel of sources (analysis.panels); families are corrected within a panel",
        "a": "scheduler a", "b": "scheduler b",
        "source_1": "first source of the pair", "source_2": "second source of the pair",
        "provenance_1": "provenance of source_1", "provenance_2": "provenance of source_2",
        "region": _KEYS["region"], "metric": _KEYS["metric"], "direction": _KEYS["direction"],
        "scale": "ratio | proportion | count (how the effect is sized)",
        "headline": "the metric is a headline metric (counted in the headline numbers)",
        "delta": "practical threshold of the metric: relative (ratio) or absolute (proportion, count)",
        "mean_a_1": "mean of a on source_1", "mean_b_1": "mean of b on source_1",
        "diff_1": "oriented mean difference on source_1: positive = a better than b",
        "rel_1": "relative effect on source_1 (symmetric relative difference)",
        "effect_1": "effect on source_1 on the metric's scale (see pairwise_tests.effect)",
        "p_1": "raw Wilcoxon p-value on source_1", "p_adj_1": "adjusted p-value on source_1",
        "n_1": "windows paired on source_1",
        "mean_a_2": "mean of a on source_2", "mean_b_2": "mean of b on source_2",
        "diff_2": "oriented mean difference on source_2", "rel_2": "relative effect on source_2",
        "effect_2": "effect on source_2 on the metric's scale",
        "p_2": "raw Wilcoxon p-value on source_2", "p_adj_2": "adjusted p-value on source_2",
        "n_2": "windows paired on source_2",
        "min_rel": "smaller of rel_1 and rel_2 (relative effects)",
        "min_effect": "smaller of effect_1 and effect_2 (how large the reversal is on its weaker side)",
        "strength": "min_effect / delta: the weaker side's effect in multiples of the practical threshold",
        "reversal": "diff_1 and diff_2 have strictly opposite signs",
        "significant": "both sides reject after correction (p_adj < alpha, test direction = sign of diff)",
        "practical": "both effects are at least delta (relative for ratio metrics, absolute for proportions)",
        "stage": "furthest stage reached: none | sign | significant | significant_and_practical "
                 "(significant and practical both require the sign reversal)",
    },
    "cross_metric_tau": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric_1": "first metric", "metric_2": "second metric", **_TAU,
    },
    "cross_metric_conditions": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "mean_tau": "mean tau-b over the pairs of headline metrics of the condition (where defined)",
        "mean_tau_norm": "mean tau-b / tau-b,max over the same pairs",
        "headline_pairs_defined": "pairs of headline metrics whose rankings both resolve a best group",
        "headline_pairs_changed": "of those, pairs whose best groups share no scheduler (the top-1 changes)",
        "top1_changes": "all-metrics rule: no scheduler is best (or tied best) under every metric",
        "common_winners": "schedulers best under every metric ('' if none)",
        "n_distinct_winners": "distinct schedulers that are best under at least one metric",
    },
    "top1": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"], "winner": "best scheduler(s), '+'-joined when tied",
        "n_tied": "how many schedulers are tied for best (size of the best tie group)",
        "n_groups": "tie groups of the ranking (1 = all tied: no winner)",
        "runner_up": "best scheduler among the others",
        "margin_rel": "relative effect between the best winner's mean and the runner-up's",
    },
    "top1_pairs": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric_1": "first headline metric", "metric_2": "second headline metric",
        "winners_1": "best tie group under metric_1, '+'-joined", "winners_2": "best tie group under metric_2",
        "defined": "both rankings resolve a best group (neither ranking is all tied)",
        "top1_changes": "defined and the two best groups share no scheduler",
    },
    "tie_pairs": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"], "a": "scheduler a", "b": "scheduler b",
        "diff": "oriented mean difference over windows: positive = a better than b",
        "effect": "effect on the metric's scale (relative, or absolute for proportions)",
        "delta": "practical threshold of the metric",
        "n_nonzero": "windows with a non-zero difference (the Wilcoxon sample size)",
        "p": "two-sided Wilcoxon signed-rank p-value over windows",
        "p_tie": "p adjusted within the ranking's scheduler pairs (analysis.tie_correction); NaN for the "
                 "tolerance and exact rules",
        "resolved": "the tie rule tells a and b apart",
        "group_a": "tie group of a (1 = best)", "group_b": "tie group of b",
        "separated": "a and b are in different tie groups",
        "conflict": "not resolved, yet in different groups (non-transitive resolution: see stats.tie_partition)",
    },
    "slo_tau": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "slo_1": "first SLO metric", "slo_2": "second SLO metric", **_TAU,
    },
    "slo_conditions": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "W": "Kendall's W across the SLO definitions' rankings",
        "ci_low": "2.5th percentile of W over the bootstrap resamples",
        "ci_high": "97.5th percentile of W over the bootstrap resamples",
        "top1_changes": "no scheduler is best (or tied best, within rank_tolerance) under every SLO definition",
        "winners": "best scheduler under each SLO definition, 'slo=winner; ...'",
    },
    "ports": {
        "kind": "across_sources (two sources, same region) | across_regions (two regions of one source)",
        "panel": "the panel whose sources are compared",
        "source_1": "first side's source", "source_2": "second side's source (= source_1 across regions)",
        "provenance_1": "provenance of source_1 (real | standin)", "provenance_2": "provenance of source_2",
        "region_1": "first side's region", "region_2": "second side's region (= region_1 across sources)",
        "metric": "headline metric", "a": "scheduler a", "b": "scheduler b",
        "side_1": "first side's class: a / b (strongly ordered, that scheduler better) | equivalent (TOST at +-delta) "
                  "| undetermined | n/a",
        "side_2": "second side's class",
        "four_way": "same_order | reversal (strong on both, opposite) | one_side | neither | n/a",
    },
    "power_curves": {
        "metric": "headline metric", "region": "operating region, or 'all' (pooled)",
        "effect": "planted effect (relative difference for ratio metrics, absolute for proportions / counts)",
        "power": "fraction of null pairs in which the side test detects the effect at alpha",
        "power_family": "the same at alpha / m (first step of the per-metric family's correction)",
    },
    "friedman": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"],
        "statistic": "Friedman chi-square over windows (blocks) x schedulers (scipy, tie-corrected)",
        "p": "Friedman p-value; 1 when every window ties every scheduler",
        "p_adj": "p adjusted across all conditions (same correction as the reversals)",
        "n_windows": "windows (blocks) with every scheduler present", "k": "schedulers",
        "cd": "Nemenyi critical difference of average ranks at alpha",
    },
    "avg_ranks": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"], "scheduler": _KEYS["scheduler"],
        "avg_rank": "mean over windows of the scheduler's per-window rank (1 = best)",
    },
    "nemenyi": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"], "a": "scheduler a", "b": "scheduler b",
        "p": "Nemenyi post-hoc p-value (scikit-posthocs posthoc_nemenyi_friedman)",
    },
}


TABLES = tuple(COLUMNS)


def columns_table(table: str) -> pl.DataFrame:
    """The column dictionary of an analysis table, for display."""
    return pl.DataFrame({"column": list(COLUMNS[table]), "meaning": list(COLUMNS[table].values())})
