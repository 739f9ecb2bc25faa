"""The portability analysis: every table behind notebooks 04-07 and 09, and ``summary.json``.

Input: the campaign's run table (``campaign.load_runs(cfg)``; or ``analysis.runs_file``, a parquet
file with the same columns, e.g. a planted table). Replicates are averaged within each window
first: the window is the unit of pairing and of resampling.

What is computed (see :data:`COLUMNS` for every column of every table):

* **rankings** — per (source, region, metric): each scheduler's mean over windows and its rank
  (1 = best, direction from the metric registry, ties averaged). Ranks are *practically tied*
  (``analysis.rank_tolerance``, :func:`portbench.stats.tolerant_ranks`): sorted best first, a new
  tie group starts wherever the relative gap to the previous mean is at least the tolerance, so
  means that differ negligibly share a rank. Every ranking-based statistic below (tau, W, top-1,
  SLO sensitivity, bump charts, winners) uses these ranks, in the bootstrap too; the reversal
  tests and Friedman / Nemenyi do not (they work on per-window values).
* **cross_source_tau / cross_source_w** — Kendall tau-b between the rankings of two sources (same
  region and metric) with a 95% percentile-bootstrap CI, and Kendall's W across all sources.
* **cross_region_tau / cross_region_w** — the same between operating regions, per source and metric.
* **pairwise_tests** — one Wilcoxon signed-rank test per (scheduler pair, source, region, metric),
  over windows, with its multiple-comparison adjusted p-value; **reversals** — every scheduler pair x
  source pair x region x metric, built from those tests (each test is reused by every source pair).
* **cross_metric_tau / cross_metric_conditions / top1** — agreement between metrics per (source,
  region), and whether the best scheduler depends on the metric.
* **slo_tau / slo_conditions** — the same restricted to the SLO-attainment metrics (one per named
  SLO definition): how much the ranking depends on the SLO definition.
* **friedman / avg_ranks / nemenyi** — Friedman test per condition, per-window average ranks, and
  Nemenyi post-hoc p-values for the critical-difference conditions.

**Bootstrap.** Windows are resampled with replacement independently within each source
(``analysis.bootstrap`` resamples, seeded by ``analysis.seed`` and the source name); one index
matrix per source is shared by every scheduler, region and metric of that source, so the pairing of
schedulers on a window and the dependence between conditions are kept. Every resample recomputes
the scheduler means, the rankings and every tau / W / top-1 statistic derived from them; CIs are
95% percentile intervals. Aggregates (e.g. the mean tau over all conditions) are bootstrapped the
same way, so their CIs account for the shared windows.

**Reversals.** Family of the multiple-comparison correction (``analysis.family``): ``all`` = every
side test (scheduler pair x source x region x metric) is corrected together; ``per_metric`` /
``per_region`` = separately within each metric / region. ``analysis.correction``: ``holm``
(family-wise error) or ``fdr_bh`` (Benjamini-Hochberg false discovery rate). See
:func:`portbench.stats.relative_effect` for the relative effect and ``COLUMNS["reversals"]`` for
the verdicts.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
import warnings
import zlib
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np
import polars as pl

from ..core import figindex
from ..core import io as fileio
from ..core.config import AnalysisConfig, Config
from ..core.errors import DataError, ParameterError, check_choice, check_choices
from ..core.provenance import SOURCES, label
from ..sim import metrics as metric_registry
from ..sim import schedulers as scheduler_registry
from . import campaign, stats

FAMILIES = ("all", "per_metric", "per_region")
# Notebooks whose figures show the analysis (plots_analysis saves them under these folders).
FIGURE_NOTEBOOKS = ("04_cross_workload", "05_cross_region", "06_reversals", "07_cross_metric")
STAGES = ("sign", "significant", "significant_and_practical")
SCHEMA = "portbench.summary/1"

# --------------------------------------------------------------------------- column dictionaries

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
    "tau": "Kendall tau-b between the two rankings (scipy.stats.kendalltau on the practically tied ranks, "
           "analysis.rank_tolerance); NaN if a ranking is all ties",
    "ci_low": "2.5th percentile of tau over the bootstrap resamples (windows resampled within each source)",
    "ci_high": "97.5th percentile of tau over the bootstrap resamples",
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
        "rank": "rank of the mean among the schedulers, 1 = best; means within analysis.rank_tolerance "
                "(relative gap to the next-better mean, chained) are tied and share the average rank",
        "n_tied": "schedulers sharing this rank (size of the tie group; 1 = not tied)",
        "ci_low": "2.5th percentile of the mean over the bootstrap resamples",
        "ci_high": "97.5th percentile of the mean over the bootstrap resamples",
    },
    "cross_source_tau": {
        "region": _KEYS["region"], "metric": _KEYS["metric"],
        "source_1": "first source", "source_2": "second source",
        "provenance_1": "provenance of source_1", "provenance_2": "provenance of source_2", **_TAU,
    },
    "cross_source_w": {"region": _KEYS["region"], "metric": _KEYS["metric"],
                       "provenance": "provenance of every source compared, 'source:provenance' comma-joined", **_W},
    "cross_region_tau": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "metric": _KEYS["metric"],
        "region_1": "first region (lighter load)", "region_2": "second region (heavier load)", **_TAU,
    },
    "cross_region_w": {"source": _KEYS["source"], "provenance": _KEYS["provenance"],
                       "metric": _KEYS["metric"], **_W},
    "pairwise_tests": {
        "a": "scheduler a", "b": "scheduler b (pairs are unordered; a comes first in scheduler order)",
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"], "direction": _KEYS["direction"],
        "mean_a": "mean of a over the windows where both have a value (metric's unit)",
        "mean_b": "mean of b over the same windows",
        "diff": "oriented mean difference over windows: positive = a better than b",
        "rel_effect": "|mean_a - mean_b| / ((|mean_a| + |mean_b|) / 2): symmetric relative difference",
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
        "a": "scheduler a", "b": "scheduler b",
        "source_1": "first source of the pair", "source_2": "second source of the pair",
        "provenance_1": "provenance of source_1", "provenance_2": "provenance of source_2",
        "region": _KEYS["region"], "metric": _KEYS["metric"], "direction": _KEYS["direction"],
        "mean_a_1": "mean of a on source_1", "mean_b_1": "mean of b on source_1",
        "diff_1": "oriented mean difference on source_1: positive = a better than b",
        "rel_1": "relative effect on source_1 (symmetric relative difference)",
        "p_1": "raw Wilcoxon p-value on source_1", "p_adj_1": "adjusted p-value on source_1",
        "n_1": "windows paired on source_1",
        "mean_a_2": "mean of a on source_2", "mean_b_2": "mean of b on source_2",
        "diff_2": "oriented mean difference on source_2", "rel_2": "relative effect on source_2",
        "p_2": "raw Wilcoxon p-value on source_2", "p_adj_2": "adjusted p-value on source_2",
        "n_2": "windows paired on source_2",
        "min_rel": "smaller of rel_1 and rel_2 (how large the reversal is on its weaker side)",
        "reversal": "diff_1 and diff_2 have strictly opposite signs",
        "significant": "both sides reject after correction (p_adj < alpha, test direction = sign of diff)",
        "practical": "both relative effects are at least delta",
        "stage": "furthest stage reached: none | sign | significant | significant_and_practical "
                 "(significant and practical both require the sign reversal)",
    },
    "cross_metric_tau": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric_1": "first metric", "metric_2": "second metric", **_TAU,
    },
    "cross_metric_conditions": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "mean_tau": "mean tau-b over every pair of metric rankings of the condition",
        "ci_low": "2.5th percentile of mean_tau over the bootstrap resamples",
        "ci_high": "97.5th percentile of mean_tau over the bootstrap resamples",
        "n_metric_pairs": "metric pairs with a defined tau",
        "top1_changes": "no scheduler is best (or tied best, within rank_tolerance) under every metric",
        "common_winners": "schedulers best under every metric ('' if none)",
        "n_distinct_winners": "distinct schedulers that are best under at least one metric",
    },
    "top1": {
        "source": _KEYS["source"], "provenance": _KEYS["provenance"], "region": _KEYS["region"],
        "metric": _KEYS["metric"], "winner": "best scheduler(s), '+'-joined when tied",
        "n_tied": "how many schedulers are tied for best (the best tie group, within rank_tolerance)",
        "runner_up": "best scheduler among the others",
        "margin_rel": "relative effect between the best winner's mean and the runner-up's",
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


# --------------------------------------------------------------------------- metric registry

def metric_names(slo) -> list[str]:
    """Every metric the study defines with the SLO definitions ``slo`` (``metrics.metric_names``)."""
    return list(metric_registry.metric_names(slo))


def metric_direction(name: str) -> str:
    """"higher" or "lower" (which way is better), from the metric registry."""
    return metric_registry.direction(name)


def metric_unit(name: str) -> str:
    """The metric's unit (for axis labels), from the metric registry."""
    return metric_registry.metric(name).unit


def metric_label(name: str) -> str:
    """``"ttft_p99 (s, lower is better)"``."""
    unit = metric_unit(name)
    return f"{name} ({unit + ', ' if unit else ''}{metric_direction(name)} is better)"


# --------------------------------------------------------------------------- parameters

def validate(cfg: Config) -> None:
    """Check the ``analysis`` section's names against the metric registry, the sources and the regions
    (the values' types and ranges are checked when the config is built); ParameterError otherwise."""
    a = cfg.analysis
    names = metric_names(cfg.simulation.slo)
    metrics = check_choices("analysis.metrics", a.metrics, names)
    if len(metrics) < 1:
        raise ParameterError("analysis.metrics", a.metrics, "at least one metric")
    for i, m in enumerate(a.headline_metrics):
        check_choice(f"analysis.headline_metrics[{i}]", m, names)
    if a.cd_conditions != "auto":
        regions = list(cfg.simulation.region_loads)
        for i, (src, reg, met) in enumerate(a.cd_conditions):
            check_choice(f"analysis.cd_conditions[{i}] source", src, cfg.source_names())
            if regions:
                check_choice(f"analysis.cd_conditions[{i}] region", reg, regions)
            check_choice(f"analysis.cd_conditions[{i}] metric", met, names)


def _cd_parts(c) -> tuple[str, str, str] | None:
    if isinstance(c, str):
        c = c.split("/")
    if isinstance(c, (list, tuple)) and len(c) == 3 and all(isinstance(x, str) for x in c):
        return tuple(c)
    return None


def settings(a: AnalysisConfig) -> dict:
    """The analysis parameters as a plain dict (the ``parameters`` block of ``summary.json``)."""
    return {
        "alpha": float(a.alpha),
        "delta": float(a.delta),
        "correction": a.correction,
        "family": a.family,
        "bootstrap": int(a.bootstrap),
        "seed": int(a.seed),
        "rank_tolerance": float(a.rank_tolerance),
        "ci_level": stats.CI_LEVEL,
        "metrics": a.metrics if a.metrics == "all" else list(a.metrics),
        "headline_metrics": list(a.headline_metrics),
        "cd_conditions": a.cd_conditions if a.cd_conditions == "auto" else ["/".join(c) for c in a.cd_conditions],
        "runs_file": str(a.runs_file) if a.runs_file else None,
    }


# --------------------------------------------------------------------------- input

def load_runs(cfg: Config) -> pl.DataFrame:
    """The runs table: ``analysis.runs_file`` when set, else ``campaign.load_runs(cfg)``."""
    path = cfg.analysis.runs_file
    if path:
        if not Path(path).is_file():
            raise DataError(path, "analysis.runs_file does not exist")
        return pl.read_parquet(path)
    return campaign.load_runs(cfg)


@dataclass
class Cube:
    """Replicate-averaged per-window values as dense arrays, one per source.

    ``values[source]`` has shape (regions, metrics, schedulers, windows); NaN = missing.
    """

    sources: list[str]
    provenance: dict[str, str]
    regions: list[str]
    rho: dict[str, float]
    metrics: list[str]
    directions: list[str]
    schedulers: list[str]
    windows: dict[str, list[str]]
    values: dict[str, np.ndarray]
    n_replicates: dict[str, np.ndarray]
    notes: list[str] = field(default_factory=list)

    @property
    def sign(self) -> np.ndarray:
        return np.array([stats.ORIENTATION[d] for d in self.directions])

    def oriented(self, source: str) -> np.ndarray:
        return self.values[source] * self.sign[None, :, None, None]

    def label(self, source: str) -> str:
        return label(source, self.provenance[source])


def _scheduler_order(names, want) -> list[str]:
    if isinstance(want, (list, tuple)):
        order = list(want)
    else:
        order = list(scheduler_registry.SCHEDULERS)
    pos = {n: i for i, n in enumerate(order)}
    return sorted(names, key=lambda n: (pos.get(n, len(pos)), n))


def build_cube(runs: pl.DataFrame, *, metric_spec="all", all_metrics: list[str], scheduler_order="all",
               where: str = "runs table") -> Cube:
    """Average replicates within windows and arrange the values as dense arrays.

    ``metric_spec`` (``analysis.metrics``: "all" or names) picks among ``all_metrics`` (the registry's
    names with the run's SLO definitions); ``scheduler_order`` (``simulation.schedulers``) orders the
    schedulers (the registry's order for "all")."""
    required = ["source", "provenance", "window_id", "region", "rho", "scheduler", "replicate"]
    missing = [c for c in required if c not in runs.columns]
    if missing:
        raise DataError(where, f"missing column(s) {missing}", column=missing[0])
    if runs.height == 0:
        raise DataError(where, "the runs table is empty")
    notes: list[str] = []
    want = metric_spec
    requested = check_choices("analysis.metrics", want, all_metrics)
    absent = [m for m in requested if m not in runs.columns]
    if absent and want != "all":
        raise DataError(where, f"metric column(s) {absent} requested by analysis.metrics are absent",
                        column=absent[0])
    if absent:
        notes.append(f"metrics absent from the runs table and left out: {', '.join(absent)}")
    metrics = [m for m in requested if m in runs.columns]
    if not metrics:
        raise DataError(where, "no metric column of the metric registry is present")

    sources_present = runs["source"].unique().to_list()
    sources = [s for s in SOURCES if s in sources_present] + sorted(set(sources_present) - set(SOURCES))
    provenance = {}
    for s in sources:
        provs = runs.filter(pl.col("source") == s)["provenance"].unique().to_list()
        if len(provs) != 1:
            raise DataError(where, f"source {s!r} has mixed provenance {provs}", column="provenance")
        provenance[s] = provs[0]
    reg = runs.group_by("region").agg(pl.col("rho").first()).sort(["rho", "region"])
    regions, rho = reg["region"].to_list(), dict(zip(reg["region"], reg["rho"]))

    # schedulers and regions present for every source
    per_source = runs.group_by("source").agg(pl.col("scheduler").unique(), pl.col("region").unique())
    common_sched = set.intersection(*(set(x) for x in per_source["scheduler"]))
    common_reg = set.intersection(*(set(x) for x in per_source["region"]))
    dropped = (set(runs["scheduler"].unique()) - common_sched)
    if dropped:
        notes.append(f"schedulers not run on every source, left out: {', '.join(sorted(dropped))}")
    if set(regions) - common_reg:
        notes.append(f"regions not run on every source, left out: {', '.join(sorted(set(regions) - common_reg))}")
    regions = [r for r in regions if r in common_reg]
    schedulers = _scheduler_order(common_sched, scheduler_order)
    if len(schedulers) < 2:
        raise DataError(where, f"at least 2 schedulers are needed to rank, found {schedulers}")

    finite = [pl.when(pl.col(m).cast(pl.Float64).is_finite()).then(pl.col(m).cast(pl.Float64))
              .otherwise(None).alias(m) for m in metrics]
    nonfinite = int(sum(runs[m].cast(pl.Float64).is_finite().not_().sum() for m in metrics))
    if nonfinite:
        notes.append(f"{nonfinite} non-finite or missing metric values treated as missing")
    agg = (runs.filter(pl.col("scheduler").is_in(schedulers) & pl.col("region").is_in(regions))
           .with_columns(finite)
           .group_by(["source", "window_id", "region", "scheduler"])
           .agg([pl.col(m).mean() for m in metrics] + [pl.len().alias("_n_rep")]))

    values, n_rep, windows = {}, {}, {}
    r_pos = {r: i for i, r in enumerate(regions)}
    k_pos = {k: i for i, k in enumerate(schedulers)}
    for s in sources:
        sub = agg.filter(pl.col("source") == s)
        wins = sorted(sub["window_id"].unique().to_list())
        w_pos = {w: i for i, w in enumerate(wins)}
        ri = np.array([r_pos[x] for x in sub["region"].to_list()])
        ki = np.array([k_pos[x] for x in sub["scheduler"].to_list()])
        wi = np.array([w_pos[x] for x in sub["window_id"].to_list()])
        arr = np.full((len(regions), len(metrics), len(schedulers), len(wins)), np.nan)
        arr[ri, :, ki, wi] = sub.select(metrics).to_numpy().astype(float)
        cnt = np.zeros((len(regions), len(schedulers), len(wins)), dtype=np.int64)
        cnt[ri, ki, wi] = sub["_n_rep"].to_numpy()
        values[s], n_rep[s], windows[s] = arr, cnt, wins
        n_missing = int((cnt == 0).sum())
        if n_missing:
            notes.append(f"{s}: {n_missing} (region, scheduler, window) cells have no run")
    return Cube(sources=sources, provenance=provenance, regions=regions, rho=rho, metrics=metrics,
                directions=[metric_direction(m) for m in metrics], schedulers=schedulers,
                windows=windows, values=values, n_replicates=n_rep, notes=notes)


# --------------------------------------------------------------------------- small helpers

def _frame(dims: dict[str, list], **arrays) -> pl.DataFrame:
    """A long table from arrays whose axes are ``dims`` (in order, C order flattening)."""
    shape = tuple(len(v) for v in dims.values())
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    cols = {name: np.asarray(vals, dtype=object)[g.ravel()].tolist() if len(vals) else []
            for (name, vals), g in zip(dims.items(), grids)}
    for name, arr in arrays.items():
        a = np.asarray(arr)
        cols[name] = np.broadcast_to(a, shape).ravel() if a.shape != shape else a.ravel()
    return pl.DataFrame(cols)


def _num(x):
    """JSON-safe number (NaN -> None, numpy scalars -> Python)."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else float(f"{x:.6g}")


def _stat(value, definition: str, count=None, ci=None, **extra) -> dict:
    out = {"value": _num(value), "definition": definition}
    if count is not None:
        out["count"] = _num(count)
    if ci is not None:
        out["ci"] = [_num(ci[0]), _num(ci[1])]
    out.update({k: (_num(v) if isinstance(v, (float, int, np.floating, np.integer)) else v)
                for k, v in extra.items()})
    return out


def _mean_with_ci(point, boot, mask=None) -> tuple[float, tuple, int]:
    """Mean of the defined ``point`` values (optionally within ``mask``) and its bootstrap CI.

    ``boot`` has the shape of ``point`` plus a last resample axis (or is None).
    """
    point = np.asarray(point, dtype=float)
    sel = ~np.isnan(point) if mask is None else (~np.isnan(point) & mask)
    n = int(sel.sum())
    if n == 0:
        return float("nan"), (float("nan"), float("nan")), 0
    value = float(point[sel].mean())
    if boot is None:
        return value, (float("nan"), float("nan")), n
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        bm = np.nanmean(np.asarray(boot)[sel], axis=0)
    lo, hi = stats.percentile_ci(bm)
    return value, (float(lo), float(hi)), n


def _rate_with_ci(point, boot) -> tuple[float, tuple, int]:
    """Fraction of True in ``point`` with the bootstrap CI of the fraction (boot: extra last axis)."""
    point = np.asarray(point, dtype=float)
    value = float(point.mean()) if point.size else float("nan")
    if boot is None or point.size == 0:
        return value, (float("nan"), float("nan")), int(point.sum())
    bm = np.asarray(boot, dtype=float).reshape(-1, np.asarray(boot).shape[-1]).mean(axis=0)
    lo, hi = stats.percentile_ci(bm)
    return value, (float(lo), float(hi)), int(point.sum())


def _tau_points(x1, x2, lead_shape) -> np.ndarray:
    """scipy Kendall tau-b for every leading index; ``x1``/``x2`` (..., K)."""
    out = np.full(lead_shape, np.nan)
    for idx in np.ndindex(*lead_shape):
        out[idx] = stats.kendall_tau(x1[idx], x2[idx])
    return out


def _source_rng(seed: int, source: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(source.encode())])


# --------------------------------------------------------------------------- the analysis

@dataclass
class Analysis:
    """Every analysis table (polars) and the summary numbers (JSON-ready dict)."""

    tables: dict[str, pl.DataFrame]
    summary: dict
    meta: dict

    @property
    def provenance(self) -> dict[str, str]:
        return {s: v["provenance"] for s, v in self.summary["provenance"].items()}

    @property
    def skipped(self) -> list[str]:
        return [s for s in SOURCES if s not in self.provenance]

    @property
    def labels(self) -> dict[str, str]:
        return {s: label(s, p) for s, p in self.provenance.items()}

    def __getitem__(self, table: str) -> pl.DataFrame:
        return self.tables[table]


def compute(config: Config, runs: pl.DataFrame | None = None, *, progress: bool = False) -> Analysis:
    """Compute every table and the summary numbers (no files written)."""
    t0 = time.perf_counter()
    cfg = settings(config.analysis)
    where = cfg["runs_file"] or "campaign runs table"
    runs = load_runs(config) if runs is None else runs
    cube = build_cube(runs, metric_spec=config.analysis.metrics, all_metrics=metric_names(config.simulation.slo),
                      scheduler_order=config.simulation.schedulers, where=str(where))
    timings = {}

    def tick(name):
        timings[name] = round(time.perf_counter() - t0 - sum(timings.values()), 3)
        if progress:
            print(f"[analysis] {name}: {timings[name]:.2f} s", flush=True)

    B = cfg["bootstrap"]
    means, boot = {}, {}
    for s in cube.sources:
        xo = cube.oriented(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means[s] = np.nanmean(xo, axis=-1)                      # (R, M, K) oriented
        if B > 0:
            idx = stats.bootstrap_indices(len(cube.windows[s]), B, _source_rng(cfg["seed"], s))
            boot[s] = np.stack([stats.bootstrap_means(xo[r], idx) for r in range(len(cube.regions))])
        else:
            boot[s] = None                                          # (R, M, K, B) oriented
    tick("means_and_bootstrap")

    tables: dict[str, pl.DataFrame] = {}
    tables["window_values"] = _window_values_table(cube)
    tol = cfg["rank_tolerance"]
    tables["rankings"] = _rankings_table(cube, means, boot, tol)
    ties = _rank_ties(cube, means, tol)
    tick("rankings")
    cs = _cross_source(cube, means, boot, tables, tol)
    tick("cross_source")
    cr = _cross_region(cube, means, boot, tables, tol)
    tick("cross_region")
    rv = _reversals(cube, cfg, tables)
    tick("reversals")
    cm = _cross_metric(cube, means, boot, tables, tol)
    tick("cross_metric")
    slo = _slo_sensitivity(cube, means, boot, tables, tol)
    tick("slo_sensitivity")
    fr = _friedman(cube, cfg, tables, rv)
    tick("friedman")

    summary = {
        "schema": SCHEMA,
        "parameters": {**{k: cfg[k] for k in ("alpha", "delta", "correction", "family", "bootstrap",
                                              "seed", "ci_level", "rank_tolerance")},
                       "tied_ranks": tied_ranks_definition(tol),
                       "bootstrap_scheme": "percentile bootstrap; windows resampled with replacement "
                                           "within each source, one index matrix per source shared by "
                                           "every scheduler, region and metric",
                       "relative_effect": "|mean_a - mean_b| / ((|mean_a| + |mean_b|) / 2)",
                       "paired_test": "two-sided Wilcoxon signed-rank over windows (scipy, zeros dropped; "
                                      "all-zero differences: p = 1)",
                       "family_definition": _family_definition(cfg["family"]),
                       "metrics": cube.metrics, "schedulers": cube.schedulers, "regions": cube.regions,
                       "sources": cube.sources},
        "provenance": {s: {"provenance": cube.provenance[s], "label": cube.label(s),
                           "n_windows": len(cube.windows[s])} for s in cube.sources},
        "data": {"n_runs": runs.height, "replicates": int(runs["replicate"].n_unique()),
                 "n_windows": {s: len(cube.windows[s]) for s in cube.sources},
                 "rho": {r: _num(cube.rho[r]) for r in cube.regions},
                 "directions": dict(zip(cube.metrics, cube.directions)), "notes": cube.notes},
        "rank_ties": ties, "cross_source": cs, "cross_region": cr, "reversals": rv, "cross_metric": cm,
        "slo_sensitivity": slo, "friedman": fr, "figures": [],
    }
    timings["total"] = round(time.perf_counter() - t0, 3)
    meta = {"fingerprint": fingerprint(runs, config), "timings_s": timings}
    return Analysis(tables=tables, summary=summary, meta=meta)


def _family_definition(family: str) -> str:
    return {"all": "every side test (scheduler pair x source x region x metric) corrected together",
            "per_metric": "side tests corrected separately within each metric",
            "per_region": "side tests corrected separately within each region"}[family]


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


def tied_ranks_definition(tol: float) -> str:
    """How scheduler means are ranked (for summary.json and the notebooks' method text)."""
    base = ("schedulers are ranked by their mean over windows, 1 = best (direction from the metric registry); "
            "tied schedulers share the average of the ranks they span")
    if tol == 0:
        return base + "; rank_tolerance = 0: only exactly equal means are tied"
    return (base + f"; practically tied ranks with rank_tolerance = {tol:g}: sorted best first, a new tie group "
            f"starts wherever the relative gap |x - y| / ((|x| + |y|) / 2) to the next-better mean is at least "
            f"{tol:g} ({100 * tol:g}%), so means closer than that are tied (single linkage: a chain of small gaps "
            "can tie means that differ by more than the tolerance end to end; see rank_ties)")


def _tie_note(tol: float) -> str:
    return "exact ranks" if tol == 0 else f"means within {100 * tol:g}% tied"


def _rankings_table(cube: Cube, means, boot, tol: float) -> pl.DataFrame:
    frames = []
    for s in cube.sources:
        raw = cube.values[s]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(raw, axis=-1)
            sd = np.nanstd(raw, axis=-1, ddof=1) if raw.shape[-1] > 1 else np.full(mean.shape, np.nan)
        n = (~np.isnan(raw)).sum(axis=-1)
        rank = stats.tolerant_ranks(means[s], tol, axis=-1)
        n_tied = np.sum(rank[..., :, None] == rank[..., None, :], axis=-1)
        if boot[s] is not None:
            lo, hi = stats.percentile_ci(boot[s] * cube.sign[None, :, None, None])
        else:
            lo = hi = np.full(mean.shape, np.nan)
        f = _frame({"region": cube.regions, "metric": cube.metrics, "scheduler": cube.schedulers},
                   mean=mean, sd=sd, n_windows=n, rank=rank, n_tied=n_tied, ci_low=lo, ci_high=hi)
        f = f.with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                           pl.col("region").replace_strict(cube.rho, return_dtype=pl.Float64).alias("rho"),
                           pl.col("metric").replace_strict(dict(zip(cube.metrics, cube.directions)),
                                                           return_dtype=pl.Utf8).alias("direction"))
        frames.append(f)
    return pl.concat(frames).select(list(COLUMNS["rankings"]))


def _boot_ranks(b, tol: float):
    return None if b is None else stats.tolerant_ranks(b, tol, axis=2)     # (R, M, K, B)


def _rank_ties(cube: Cube, means, tol: float) -> dict:
    """How often the rank tolerance ties schedulers, and how wide single linkage makes a tie group."""
    n_cond = changed = all_tied = all_tied_exact = groups = chained = 0
    widest, chains = None, []
    K = np.asarray(cube.schedulers)
    for s in cube.sources:
        rk = stats.tolerant_ranks(means[s], tol, axis=-1)                    # (R, M, K)
        ex = stats.ranks_best_first(means[s], axis=-1)
        spread = stats.tie_group_spread(means[s], tol, axis=-1)
        for r, region in enumerate(cube.regions):
            for m, metric in enumerate(cube.metrics):
                x = rk[r, m]
                if np.isnan(x).any():
                    continue
                n_cond += 1
                changed += bool(np.any(x != ex[r, m]))
                all_tied += bool(np.all(x == x[0]))
                all_tied_exact += bool(np.all(ex[r, m] == ex[r, m][0]))
                for v in np.unique(x):
                    members = x == v
                    if members.sum() < 2:
                        continue
                    groups += 1
                    sp = float(spread[r, m][members][0])
                    entry = {"source": s, "region": region, "metric": metric, "spread": _num(sp),
                             "schedulers": K[members].tolist()}
                    if widest is None or sp > widest[0]:
                        widest = (sp, entry)
                    if tol > 0 and sp >= tol:
                        chained += 1
                        chains.append((sp, entry))
    chains.sort(key=lambda e: -e[0])
    note = _tie_note(tol)
    return {
        "definition": "ties made by the rank tolerance in the rankings of scheduler means (every source x region "
                      f"x metric): {tied_ranks_definition(tol)}",
        "rank_tolerance": tol,
        "conditions_with_new_ties": _stat(changed, f"conditions whose ranking has a tie that exact ranks do not "
                                                   f"have ({note})", n_cond,
                                          rate=(changed / n_cond if n_cond else None)),
        "all_tied": _stat(all_tied, f"conditions where every scheduler is tied ({note}; tau-b undefined there)",
                          n_cond, exact=all_tied_exact),
        "tie_groups": _stat(groups, "tie groups of two or more schedulers, over every condition", n_cond),
        "chained_groups": _stat(chained, "tie groups whose best and worst means differ by at least the tolerance "
                                         "(single linkage chained several smaller gaps)", groups,
                                rate=(chained / groups if groups else None)),
        "max_group_spread": _stat(widest[0] if widest else 0.0, "largest relative difference between the best and "
                                  "the worst mean of one tie group", groups,
                                  where=widest[1] if widest else None),
        "widest_chains": [e for _, e in chains[:5]],
    }


def _cross_source_tau_points(cube: Cube, means, tol: float) -> np.ndarray:
    """scipy tau-b between every source pair's practically tied rankings: (R, M, source pairs)."""
    S, R, M = cube.sources, cube.regions, cube.metrics
    pairs = list(combinations(range(len(S)), 2))
    rk = {s: stats.tolerant_ranks(means[s], tol, axis=-1) for s in S}
    tau = np.full((len(R), len(M), len(pairs)), np.nan)
    for q, (i, j) in enumerate(pairs):
        tau[:, :, q] = _tau_points(rk[S[i]], rk[S[j]], (len(R), len(M)))
    return tau


def sensitivity_tolerances(tol: float) -> list[float]:
    """The rank tolerances of the sensitivity table: 0 (exact ranks), half, the chosen one, double."""
    return sorted({0.0, tol / 2, tol, tol * 2})


def _cross_source(cube: Cube, means, boot, tables, tol: float) -> dict:
    S, R, M = cube.sources, cube.regions, cube.metrics
    pairs = list(combinations(range(len(S)), 2))
    has_boot = all(boot[s] is not None for s in S)
    pair_names = [f"{S[i]}|{S[j]}" for i, j in pairs]
    tau = _cross_source_tau_points(cube, means, tol)
    tau_b = np.full((len(R), len(M), len(pairs), boot[S[0]].shape[-1] if has_boot else 0), np.nan)
    ranks_b = {s: _boot_ranks(boot[s], tol) for s in S} if has_boot else {}           # (R, M, K, B)
    signs_b = {s: stats.pair_signs(ranks_b[s], axis=2) for s in S} if has_boot else {}  # (R, M, B, P)
    for q, (i, j) in enumerate(pairs):
        if has_boot:
            tau_b[:, :, q, :] = stats.tau_b_from_signs(signs_b[S[i]], signs_b[S[j]])
    lo, hi = stats.percentile_ci(tau_b) if has_boot else (np.full(tau.shape, np.nan),) * 2
    nvalid = (~np.isnan(tau_b)).sum(axis=-1)
    rows = []
    for q, (i, j) in enumerate(pairs):
        f = _frame({"region": R, "metric": M}, tau=tau[:, :, q], ci_low=lo[:, :, q], ci_high=hi[:, :, q],
                   n_boot_valid=nvalid[:, :, q])
        rows.append(f.with_columns(pl.lit(S[i]).alias("source_1"), pl.lit(S[j]).alias("source_2"),
                                   pl.lit(cube.provenance[S[i]]).alias("provenance_1"),
                                   pl.lit(cube.provenance[S[j]]).alias("provenance_2"),
                                   pl.lit(len(cube.schedulers)).alias("n_items")))
    cols = list(COLUMNS["cross_source_tau"])
    tables["cross_source_tau"] = pl.concat(rows).select(cols) if rows else _empty("cross_source_tau")

    # Kendall's W across sources
    if len(S) >= 2:
        ranks = np.stack([stats.tolerant_ranks(means[s], tol, axis=-1) for s in S], axis=2)  # (R, M, S, K)
        W = stats.kendall_w(ranks)
        if has_boot:
            rb = np.stack([ranks_b[s] for s in S], axis=2)                                # (R, M, S, K, B)
            Wb = stats.kendall_w(np.moveaxis(rb, -1, 2))                                    # (R, M, B)
            wlo, whi = stats.percentile_ci(Wb)
        else:
            Wb, wlo, whi = None, np.full(W.shape, np.nan), np.full(W.shape, np.nan)
        tables["cross_source_w"] = _frame({"region": R, "metric": M}, W=W, ci_low=wlo, ci_high=whi,
                                          n_rankings=len(S), n_items=len(cube.schedulers)) \
            .with_columns(pl.lit(",".join(f"{s}:{cube.provenance[s]}" for s in S)).alias("provenance")) \
            .select(list(COLUMNS["cross_source_w"]))
    else:
        W, Wb = np.full((len(R), len(M)), np.nan), None
        tables["cross_source_w"] = _empty("cross_source_w")

    defn = (f"Kendall tau-b between two sources' scheduler rankings (same region and metric; {_tie_note(tol)}), "
            "averaged over every region x metric x source pair where defined")
    tb = tau_b if has_boot else None
    out: dict = {"definition": "agreement between the scheduler rankings of different workload sources",
                 "n_conditions": len(R) * len(M), "n_source_pairs": len(pairs)}
    if not pairs:
        out["available"] = False
        out["reason"] = "fewer than two sources in the runs table"
        return out
    v, ci, n = _mean_with_ci(tau, tb)
    out["mean_tau"] = _stat(v, defn, n, ci, undefined=int(np.isnan(tau).sum()))
    # sensitivity to the rank tolerance (point estimates only): the mean over the conditions defined at that
    # tolerance, and over the conditions defined at every tolerance compared (the same set for every row)
    tols = sensitivity_tolerances(tol)
    taus = {t: tau if t == tol else _cross_source_tau_points(cube, means, t) for t in tols}
    common = np.all([~np.isnan(taus[t]) for t in tols], axis=0)

    def _means_by_region(tt, sel):
        return {name: _num(tt[r][sel[r]].mean()) if sel[r].any() else None for r, name in enumerate(R)}

    out["by_rank_tolerance"] = {}
    for t in tols:
        tt = taus[t]
        sel = ~np.isnan(tt)
        out["by_rank_tolerance"][f"{t:g}"] = _stat(
            float(tt[sel].mean()) if sel.any() else None,
            f"mean tau-b as mean_tau but with rank_tolerance = {t:g} ({_tie_note(t)}); point estimate, no bootstrap",
            int(sel.sum()), rank_tolerance=t, undefined=int((~sel).sum()), chosen=bool(t == tol),
            by_region=_means_by_region(tt, sel),
            common_value=float(tt[common].mean()) if common.any() else None, common_count=int(common.sum()),
            common_by_region=_means_by_region(tt, common))
    out["by_source_pair"] = {}
    for q, name in enumerate(pair_names):
        m = np.zeros(tau.shape, bool)
        m[:, :, q] = True
        v, ci, n = _mean_with_ci(tau, tb, m)
        i, j = pairs[q]
        out["by_source_pair"][name] = _stat(v, f"mean tau between {cube.label(S[i])} and {cube.label(S[j])} "
                                               "over regions x metrics", n, ci)
    out["by_region"] = {}
    for r, name in enumerate(R):
        m = np.zeros(tau.shape, bool)
        m[r] = True
        v, ci, n = _mean_with_ci(tau, tb, m)
        out["by_region"][name] = _stat(v, f"mean tau over metrics x source pairs in region {name}", n, ci)
    out["by_metric"] = {}
    for k, name in enumerate(M):
        m = np.zeros(tau.shape, bool)
        m[:, k] = True
        v, ci, n = _mean_with_ci(tau, tb, m)
        out["by_metric"][name] = _stat(v, f"mean tau over regions x source pairs for metric {name}", n, ci)
    bp = {k: d["value"] for k, d in out["by_source_pair"].items() if d["value"] is not None}
    if bp:
        worst = min(bp, key=bp.get)
        out["least_agreeing_pair"] = {"pair": worst.split("|"), "mean_tau": bp[worst]}
    if not np.isnan(tau).all():
        r, k, q = np.unravel_index(np.nanargmin(tau), tau.shape)
        i, j = pairs[q]
        out["lowest"] = {"source_1": S[i], "source_2": S[j], "region": R[r], "metric": M[k],
                         "tau": _num(tau[r, k, q]), "ci": [_num(lo[r, k, q]), _num(hi[r, k, q])]}
    out["fraction_tau_ci_below_0.5"] = _stat(
        float(np.mean(hi[~np.isnan(hi)] < 0.5)) if has_boot and (~np.isnan(hi)).any() else None,
        "fraction of (region, metric, source pair) conditions whose tau CI lies entirely below 0.5",
        int((~np.isnan(hi)).sum()))
    if len(S) >= 2:
        v, ci, n = _mean_with_ci(W, Wb)
        out["kendall_w"] = _stat(v, f"Kendall's W across the {len(S)} sources' rankings (tie-corrected; "
                                    f"{_tie_note(tol)}), averaged over region x metric", n, ci)
    return out


def _empty(table: str) -> pl.DataFrame:
    return pl.DataFrame({c: [] for c in COLUMNS[table]})


def _cross_region(cube: Cube, means, boot, tables, tol: float) -> dict:
    S, R, M = cube.sources, cube.regions, cube.metrics
    rpairs = list(combinations(range(len(R)), 2))
    has_boot = all(boot[s] is not None for s in S)
    rows, wrows = [], []
    tau_all = np.full((len(S), len(M), len(rpairs)), np.nan)
    tau_all_b = np.full((len(S), len(M), len(rpairs), boot[S[0]].shape[-1] if has_boot else 0), np.nan)
    W_all = np.full((len(S), len(M)), np.nan)
    W_all_b = np.full((len(S), len(M), tau_all_b.shape[-1]), np.nan)
    for si, s in enumerate(S):
        mm = stats.tolerant_ranks(np.transpose(means[s], (1, 0, 2)), tol, axis=-1)   # (M, R, K) ranks
        rb = _boot_ranks(boot[s], tol) if has_boot else None                      # (R, M, K, B)
        for q, (i, j) in enumerate(rpairs):
            tau_all[si, :, q] = _tau_points(mm[:, i], mm[:, j], (len(M),))
        if has_boot and rpairs:
            sg = np.transpose(stats.pair_signs(rb, axis=2), (1, 2, 0, 3))        # (M, B, R, P)
            tm = stats.tau_b_matrix(sg)                                          # (M, B, R, R)
            ii, jj = zip(*rpairs)
            tau_all_b[si] = np.moveaxis(tm[:, :, list(ii), list(jj)], 1, -1)     # (M, Q, B)
        if len(R) >= 2:
            W_all[si] = stats.kendall_w(mm)
            if has_boot:
                W_all_b[si] = stats.kendall_w(np.transpose(rb, (1, 3, 0, 2)))    # (M, B, R, K)
        lo, hi = stats.percentile_ci(tau_all_b[si]) if has_boot else (np.full(tau_all[si].shape, np.nan),) * 2
        nvalid = (~np.isnan(tau_all_b[si])).sum(axis=-1)
        if rpairs:
            f = _frame({"metric": M, "region_pair": [f"{R[i]}|{R[j]}" for i, j in rpairs]},
                       tau=tau_all[si], ci_low=lo, ci_high=hi, n_boot_valid=nvalid)
            f = f.with_columns(pl.col("region_pair").str.split("|").list.get(0).alias("region_1"),
                               pl.col("region_pair").str.split("|").list.get(1).alias("region_2"),
                               pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"),
                               pl.lit(len(cube.schedulers)).alias("n_items"))
            rows.append(f.select(list(COLUMNS["cross_region_tau"])))
        wlo, whi = stats.percentile_ci(W_all_b[si]) if has_boot else (np.full(len(M), np.nan),) * 2
        wrows.append(_frame({"metric": M}, W=W_all[si], ci_low=wlo, ci_high=whi, n_rankings=len(R),
                            n_items=len(cube.schedulers))
                     .with_columns(pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"))
                     .select(list(COLUMNS["cross_region_w"])))
    tables["cross_region_tau"] = pl.concat(rows) if rows else _empty("cross_region_tau")
    tables["cross_region_w"] = pl.concat(wrows)
    out: dict = {"definition": "agreement between the scheduler rankings of different operating regions "
                               "(same source and metric)",
                 "n_conditions": len(S) * len(M), "n_region_pairs": len(rpairs)}
    if not rpairs:
        out["available"] = False
        out["reason"] = "fewer than two regions"
        return out
    tb = tau_all_b if has_boot else None
    v, ci, n = _mean_with_ci(tau_all, tb)
    out["mean_tau"] = _stat(v, f"Kendall tau-b between two regions' rankings ({_tie_note(tol)}), averaged over "
                               "every region pair x source x metric where defined", n, ci,
                            undefined=int(np.isnan(tau_all).sum()))
    q_ext = rpairs.index((0, len(R) - 1))
    m = np.zeros(tau_all.shape, bool)
    m[:, :, q_ext] = True
    v, ci, n = _mean_with_ci(tau_all, tb, m)
    out["extreme_regions_tau"] = _stat(v, f"mean tau between the lightest ({R[0]}) and the heaviest "
                                          f"({R[-1]}) region over sources x metrics", n, ci,
                                       regions=[R[0], R[-1]])
    adj = [q for q, (i, j) in enumerate(rpairs) if j == i + 1]
    m = np.zeros(tau_all.shape, bool)
    m[:, :, adj] = True
    v, ci, n = _mean_with_ci(tau_all, tb, m)
    out["adjacent_regions_tau"] = _stat(v, "mean tau between neighbouring regions (next load level) "
                                           "over sources x metrics", n, ci)
    out["by_source"] = {}
    for si, s in enumerate(S):
        m = np.zeros(tau_all.shape, bool)
        m[si] = True
        v, ci, n = _mean_with_ci(tau_all, tb, m)
        out["by_source"][s] = _stat(v, f"mean tau between regions on {cube.label(s)} over region pairs x metrics",
                                    n, ci)
    v, ci, n = _mean_with_ci(W_all, W_all_b if has_boot else None)
    out["kendall_w"] = _stat(v, f"Kendall's W across the {len(R)} regions' rankings, averaged over "
                                "sources x metrics", n, ci)
    if not np.isnan(tau_all).all():
        si, k, q = np.unravel_index(np.nanargmin(tau_all), tau_all.shape)
        out["lowest"] = {"source": S[si], "metric": M[k], "region_1": R[rpairs[q][0]],
                         "region_2": R[rpairs[q][1]], "tau": _num(tau_all[si, k, q])}
    return out


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


# --------------------------------------------------------------------------- files

def analysis_dir(results_dir: Path) -> Path:
    return Path(results_dir) / "analysis"


def summary_path(results_dir: Path) -> Path:
    return Path(results_dir) / "summary.json"


def fingerprint(runs: pl.DataFrame, cfg: Config) -> str:
    """Hash of the runs table and everything in the parameters that changes the analysis."""
    h = hashlib.sha256()
    h.update(json.dumps(settings(cfg.analysis), sort_keys=True, default=str).encode())
    h.update(json.dumps(sorted(runs.columns)).encode())
    h.update(json.dumps(cfg.simulation.slo_dicts, sort_keys=True, default=str).encode())
    h.update(json.dumps(scheduler_registry.names(cfg.simulation.schedulers)).encode())
    buf = io.BytesIO()
    runs.write_ipc(buf)
    h.update(buf.getvalue())
    return h.hexdigest()


def write(results_dir: Path, A: Analysis) -> dict[str, str]:
    """Write every table as parquet under ``{results_dir}/analysis/`` and the summary core."""
    out = analysis_dir(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, df in A.tables.items():
        p = out / f"{name}.parquet"
        fileio.atomic_write(p, lambda tmp, df=df: df.write_parquet(tmp))
        paths[name] = str(p)
    fileio.write_text(out / "summary_core.json", json.dumps(A.summary, indent=1, default=_json_default))
    fileio.write_text(out / "meta.json", json.dumps(A.meta, indent=1))
    return paths


def _json_default(x):
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return _num(x)
    if isinstance(x, np.ndarray):
        return [_num(v) for v in x.tolist()]
    return str(x)


def load(cfg: Config, *, recompute: bool = False, progress: bool = False) -> Analysis:
    """The analysis for ``cfg``: read from ``{results_dir}/analysis`` when it matches the runs table and
    the parameters (fingerprint), else computed and written (tables, summary core and summary.json)."""
    runs = load_runs(cfg)
    fp = fingerprint(runs, cfg)
    d = analysis_dir(cfg.paths.results_dir)
    meta_p = d / "meta.json"
    if not recompute and meta_p.is_file():
        meta = json.loads(meta_p.read_text())
        files = [d / f"{t}.parquet" for t in TABLES]
        if meta.get("fingerprint") == fp and all(f.is_file() for f in files) and (d / "summary_core.json").is_file():
            tables = {t: pl.read_parquet(d / f"{t}.parquet") for t in TABLES}
            summary = json.loads((d / "summary_core.json").read_text())
            return Analysis(tables=tables, summary=summary, meta=meta)
    A = compute(cfg, runs, progress=progress)
    write(cfg.paths.results_dir, A)
    figindex.forget(cfg.paths.figures_dir, FIGURE_NOTEBOOKS)  # figures of an older analysis are not indexed
    write_summary(cfg, A)
    return A


def figure_index(cfg: Config) -> list[dict]:
    """``[{name, file, pdf, notebook, description}]`` of every figure in ``paths.figures_dir`` (notebooks
    01-08, each recorded by ``figures.save``), paths relative to the project root where possible."""
    return figindex.index(cfg.paths.figures_dir, cfg.paths.root)


def write_summary(cfg: Config, A: Analysis | None = None) -> dict:
    """Write ``{results_dir}/summary.json``: the summary numbers plus the index of every figure."""
    A = A or load(cfg)
    summary = dict(A.summary)
    summary["figures"] = figure_index(cfg)
    fileio.write_text(summary_path(cfg.paths.results_dir), json.dumps(summary, indent=1, default=_json_default))
    return summary


# --------------------------------------------------------------------------- notebook helpers

def columns_table(table: str) -> pl.DataFrame:
    """The column dictionary of an analysis table, for display."""
    return pl.DataFrame({"column": list(COLUMNS[table]), "meaning": list(COLUMNS[table].values())})


def fmt(stat: dict | None, digits: int = 2) -> str:
    """``"0.71 [0.65, 0.77] (n = 252)"`` from a summary stat dict."""
    if not stat or stat.get("value") is None:
        return "n/a"
    v = stat["value"]
    s = f"{v:.{digits}f}" if isinstance(v, float) else f"{v}"
    ci = stat.get("ci")
    if ci and ci[0] is not None:
        s += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    if stat.get("count") is not None:
        s += f" (n = {stat['count']})"
    return s


def headline_table(summary: dict) -> pl.DataFrame:
    """Every headline number of the summary with its definition, count and CI."""
    rows = []

    def add(section, name, st):
        if isinstance(st, dict) and "value" in st and "definition" in st:
            ci = st.get("ci") or [None, None]
            rows.append({"section": section, "number": name, "value": st["value"] if st["value"] is not None
                         else float("nan"), "ci_low": ci[0], "ci_high": ci[1], "count": st.get("count"),
                         "definition": st["definition"]})

    for section in ("rank_ties", "cross_source", "cross_region", "reversals", "cross_metric", "slo_sensitivity",
                    "friedman"):
        sec = summary.get(section) or {}
        for name, st in sec.items():
            add(section, name, st)
        for group in ("by_source_pair", "by_source", "by_rank_tolerance"):
            for name, st in (sec.get(group) or {}).items():
                add(section, f"{group}: {name}", st)
    return pl.DataFrame(rows, schema={"section": pl.Utf8, "number": pl.Utf8, "value": pl.Float64,
                                      "ci_low": pl.Float64, "ci_high": pl.Float64, "count": pl.Int64,
                                      "definition": pl.Utf8})


def tied_ranks_markdown(tol: float) -> str:
    """One paragraph for the notebooks' method text: how scheduler means are tied (from the parameter)."""
    if not tol:
        return ("Only exactly equal means are tied (`analysis.rank_tolerance` = 0, exact ranks); tied schedulers share "
                "the average rank.")
    return (f"**Practically tied ranks** (`analysis.rank_tolerance` = {tol:g}): sorted best first, a scheduler whose "
            f"mean is within {100 * tol:g}% of the next-better mean (relative gap |x − y| / ((|x| + |y|) / 2) below "
            f"{tol:g}) is tied with it, and tied schedulers share the average rank; so differences of a few parts per "
            "million (e.g. microseconds of simulator noise at light load) do not count as an order. Ties chain "
            f"(single linkage), so a tie group can span more than {100 * tol:g}% end to end. Every ranking-based "
            "number (τ-b, W, top-1, bump charts, winners) uses these ranks, in the bootstrap too; the reversal "
            "tests and Friedman/Nemenyi work on per-window values instead.")


def tolerance_sensitivity_table(A: Analysis) -> pl.DataFrame:
    """The cross-source mean tau-b at each rank tolerance of the sensitivity (``by_rank_tolerance``)."""
    sens = (A.summary.get("cross_source") or {}).get("by_rank_tolerance") or {}
    R = A.summary["parameters"]["regions"]
    rows = [{"rank_tolerance": v["rank_tolerance"], "chosen": v["chosen"], "mean_tau": v["value"],
             "n_defined": v["count"], "n_undefined": v["undefined"], "mean_tau_common": v["common_value"],
             "n_common": v["common_count"], **{f"{r}": v["by_region"][r] for r in R}} for v in sens.values()]
    schema = {"rank_tolerance": pl.Float64, "chosen": pl.Boolean, "mean_tau": pl.Float64, "n_defined": pl.Int64,
              "n_undefined": pl.Int64, "mean_tau_common": pl.Float64, "n_common": pl.Int64,
              **{r: pl.Float64 for r in R}}
    return pl.DataFrame(rows, schema=schema)


def rank_changes(A: Analysis, metrics=None, top: int = 10) -> pl.DataFrame:
    """Schedulers whose rank moves most between the lightest and the heaviest region."""
    R = A.summary["parameters"]["regions"]
    rk = A["rankings"]
    if metrics:
        rk = rk.filter(pl.col("metric").is_in(list(metrics)))
    light = rk.filter(pl.col("region") == R[0]).select("source", "metric", "scheduler",
                                                      pl.col("rank").alias(f"rank_{R[0]}"))
    heavy = rk.filter(pl.col("region") == R[-1]).select("source", "metric", "scheduler",
                                                       pl.col("rank").alias(f"rank_{R[-1]}"))
    return (light.join(heavy, on=["source", "metric", "scheduler"])
            .with_columns((pl.col(f"rank_{R[-1]}") - pl.col(f"rank_{R[0]}")).alias("rank_change"))
            .sort(pl.col("rank_change").abs(), descending=True).head(top))


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
