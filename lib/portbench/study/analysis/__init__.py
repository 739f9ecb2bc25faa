"""The portability analysis: every table behind notebooks 04-07 and 10, and ``summary.json``.

Input: the campaign's run table (``load_runs(cfg.analysis, cfg.plan_settings, manifest)``:
``campaign.load_runs(cfg.paths, plan)``; or ``analysis.runs_file``, a parquet file with the same columns, e.g. a
planted table). Replicates are averaged
within each window first: the window is the unit of pairing and of resampling.

Definitions (parameters in ``papermill_params/default.yaml``, section ``analysis``):

* **Headline metrics** (``analysis.headline_metrics``): every headline number is computed over these;
  the other metrics are secondary and reported in their own entries (``secondary``, ``by_metric``).
* **Side tests** (:mod:`.ties`): one paired two-sided Wilcoxon signed-rank test over windows per
  (scheduler pair, source, region, metric); shared by the tie rule and the reversals.
* **Statistical ties** (``analysis.ties``): two schedulers are tied in a ranking unless their side
  test rejects (``analysis.tie_correction`` within the ranking). Tie groups are a proper partition
  (:func:`portbench.study.stats.tie_partition`, complete linkage over the mean order); tied schedulers
  share their group's mean. The old relative-tolerance rule and exact ranks are sensitivity rows.
* **Agreement** of two rankings (:func:`.common.compare_all`): Kendall tau-b (scipy), tau-b / tau-b,max
  (the maximum the two tie structures allow) and the discordance among pairs resolved in both, with
  95% percentile-bootstrap CIs; conditions where a ranking is all tied are counted, not averaged.
* **n/a schedulers**: a scheduler that uses information a source lacks (``vtc`` on a trace without
  tenants, :func:`.reversals.tenant_na`) is left out of every comparison that involves that source: its
  side tests are in no correction family, its reversals and study-preset comparisons are not counted, and
  every comparison of rankings (cross-source, cross-region, cross-metric, SLO) ranks the other schedulers on
  both sides (:class:`.ties.Restricted`; ``na_schedulers`` in each section). The per-source rankings
  tables still list it.
* **Panels** (``analysis.panels``): sets of sources compared with each other; every cross-source table
  has a ``panel`` column and ``summary["panels"][name]`` has every section; a panel whose sources are
  not all in the runs table is reported as not available. The first available panel is the headline.
* **Reversals** (:mod:`.reversals`): per panel, families per metric (default) corrected with
  Benjamini-Hochberg; practical size relative for ratio metrics and absolute for proportions; the
  original study's design as ``study_preset``.
* **Cross-metric**: per (source, region), the pairwise top-1 change over pairs of headline metrics,
  the all-metrics rule (secondary), metric x metric tau-b and tau-b / tau-b,max.
* **Power** (:mod:`.power`): whether a test can reach alpha with the windows given (a
  :class:`ResolutionWarning` otherwise) and the minimal detectable effect by planted-effect simulation.

**Bootstrap.** Windows are resampled with replacement independently within each source
(``analysis.bootstrap`` resamples, seeded by ``analysis.seed`` and the source name); one index
matrix per source is shared by every scheduler, region and metric of that source, so the pairing of
schedulers on a window and the dependence between conditions are kept. The tie groups are those of the
full data; each resample re-orders them by their resampled means, and every tau / W / top-1 statistic
is recomputed. Aggregates are bootstrapped the same way, so their CIs account for the shared windows.

The package: :mod:`.cube` (settings, input, the per-window value cube), :mod:`.ties` (side tests, tie
rules), :mod:`.agreement` (rankings, cross-source and cross-region agreement), :mod:`.reversals`,
:mod:`.metric_agreement` (cross-metric, SLO sensitivity, Friedman), :mod:`.power`, :mod:`.results`
(compute, files, the one place summary.json is assembled), :mod:`.columns` (the column dictionaries),
:mod:`.common` (shared helpers).
"""

from .columns import COLUMNS, FAMILIES, FIGURE_NOTEBOOKS, SCHEMA, STAGES, TABLES, columns_table
from .common import _source_rng, compare_all, panel_sources  # noqa: F401
from .cube import (Analysis, Cube, build_cube, load_runs, metric_direction, metric_label, metric_names, metric_scale,
                   metric_unit, settings, validate)
from .metric_agreement import cd_conditions, top_winners, winner_counts
from .power import ResolutionWarning
from .results import (PANEL_SECTIONS, analysis_dir, campaign_files, compute, engine_load_blocks, figure_index, fingerprint, headline_panel_of,
                      headline_table, load,
                      panels_table, rank_changes, stage_manifest, summary_path, tie_rule_table, write, write_summary)
from .reversals import breakdown, legacy_reversal_counts, reversal_counts, reversal_sensitivity, reversal_summary, tail_check, tail_table
from .ties import RULE_TEXT, Ranking

__all__ = ["panel_sources", "COLUMNS", "FAMILIES", "FIGURE_NOTEBOOKS", "PANEL_SECTIONS", "RULE_TEXT", "SCHEMA", "STAGES", "TABLES",
           "Analysis", "Cube", "Ranking", "ResolutionWarning", "analysis_dir", "breakdown", "build_cube", "cd_conditions",
           "campaign_files", "columns_table", "compute", "engine_load_blocks", "figure_index", "fingerprint", "headline_panel_of", "headline_table", "legacy_reversal_counts", "load", "load_runs",
           "stage_manifest",
           "metric_direction", "metric_label", "metric_names", "metric_scale", "metric_unit", "panels_table",
           "rank_changes", "reversal_counts", "reversal_sensitivity", "reversal_summary", "settings", "summary_path",
           "tail_check", "tail_table", "tie_rule_table", "top_winners", "validate", "winner_counts", "write",
           "write_summary"]
