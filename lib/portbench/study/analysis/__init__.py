"""The portability analysis: every table behind notebooks 04-07 and 09, and ``summary.json``.

Input: the campaign's run table (``campaign.load_runs(cfg)``; or ``analysis.runs_file``, a parquet
file with the same columns, e.g. a planted table). Replicates are averaged within each window
first: the window is the unit of pairing and of resampling.

What is computed (see :data:`COLUMNS` for every column of every table):

* **rankings** — per (source, region, metric): each scheduler's mean over windows and its rank
  (1 = best, direction from the metric registry, ties averaged). Ranks are *practically tied*
  (``analysis.rank_tolerance``, :func:`portbench.study.stats.tolerant_ranks`): sorted best first, a new
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
:func:`portbench.study.stats.relative_effect` for the relative effect and ``COLUMNS["reversals"]`` for
the verdicts.

The package: :mod:`.cube` (settings, input, the per-window value cube), :mod:`.agreement` (rankings,
cross-source and cross-region agreement), :mod:`.reversals`, :mod:`.metric_agreement` (cross-metric,
SLO sensitivity, Friedman), :mod:`.results` (compute, files, summary.json), :mod:`.columns` (the
column dictionaries), :mod:`.common` (shared helpers).
"""

from .columns import COLUMNS, FAMILIES, FIGURE_NOTEBOOKS, SCHEMA, STAGES, TABLES, columns_table
from .common import _source_rng, sensitivity_tolerances, tied_ranks_definition  # noqa: F401
from .cube import (Analysis, Cube, build_cube, load_runs, metric_direction, metric_label, metric_names, metric_unit, settings,
                   validate)
from .metric_agreement import cd_conditions, top_winners, winner_counts
from .results import (analysis_dir, compute, figure_index, fingerprint, headline_table, load, rank_changes,
                      summary_path, tolerance_sensitivity_table, write, write_summary)
from .reversals import breakdown, reversal_counts, reversal_sensitivity, reversal_summary

__all__ = ["COLUMNS", "FAMILIES", "FIGURE_NOTEBOOKS", "SCHEMA", "STAGES", "TABLES", "Analysis", "Cube", "analysis_dir",
           "breakdown", "build_cube", "cd_conditions", "columns_table", "compute", "figure_index", "fingerprint",
           "headline_table", "load", "load_runs", "metric_direction", "metric_label", "metric_names", "metric_unit",
           "rank_changes", "reversal_counts", "reversal_sensitivity", "reversal_summary", "sensitivity_tolerances",
           "settings", "summary_path", "tied_ranks_definition", "tolerance_sensitivity_table", "top_winners", "validate",
           "winner_counts", "write", "write_summary"]
