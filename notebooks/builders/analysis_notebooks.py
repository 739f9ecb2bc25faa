"""Build the analysis notebooks 04-07 and 09 (committed without outputs):
`.venv/bin/python notebooks/builders/analysis_notebooks.py`.

Every number in their text is computed (``Markdown(f"...")`` over ``analysis`` results); plotting and
computing live in ``portbench.analysis`` / ``portbench.plots_analysis``.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NB_DIR = Path(__file__).resolve().parents[1]


def md(text):
    return new_markdown_cell(text.strip("\n"))


def code(text, **meta):
    cell = new_code_cell(text.strip("\n"))
    cell.metadata.update(meta)
    return cell


PARAMS = code('''
params_file = "papermill_params/default.yaml"
overrides = {}
''', tags=["parameters"])

SETUP = code('''
import polars as pl
from IPython.display import Markdown, display

import portbench.params
from portbench import analysis, sources
from portbench import plots_analysis as plots

P = portbench.params.load(params_file, overrides)
A = analysis.load(P)   # computes the analysis tables, or reads them when they match the runs and parameters
display(Markdown(sources.banner(A.provenance, A.skipped)))
pl.Config.set_fmt_str_lengths(160)
pl.Config.set_tbl_rows(40)
par, data, L = A.summary["parameters"], A.summary["data"], A.labels
''')

RANKING_METHOD = code('''
display(Markdown(f"""**Rankings.** For each source, region and metric, each of the {len(par['schedulers'])} schedulers'
values are averaged over replicates within a window ({data['replicates']} replicate(s) per window: the window is the unit)
and then over the source's windows ({', '.join(f"{L[s]}: {n}" for s, n in data['n_windows'].items())}). The schedulers are
ranked by that mean: rank 1 = best, using each metric's direction from the metric registry (↑ higher is better,
↓ lower is better), tied means share the average rank. **Confidence intervals** are 95% percentile-bootstrap intervals:
{par['bootstrap']} resamples of the windows, drawn with replacement independently within each source (seed {par['seed']});
one resample of a source's windows serves all its schedulers, regions and metrics, so a scheduler pair stays paired on
the same windows. Resampling adds noise to the means, so resampled rankings agree slightly less than the observed ones;
for a τ-b near 1 the interval can therefore sit just below the point estimate. Notes on the data:
{'; '.join(data['notes']) or 'none (every run present, every value finite)'}."""))
''')


def nb04():
    return [
        md('''
# 04 — Cross-workload rank agreement

**Question.** A paper ranks schedulers on one trace. Does that ranking hold on another trace? For every
operating region and metric, this notebook compares the scheduler rankings obtained on each workload source
(Azure, BurstGPT, Bailian) and asks which pair of sources agrees least, and where.
'''), PARAMS, SETUP, RANKING_METHOD,
        code('''
display(Markdown(f"""**Method.** Two sources' rankings (same region, same metric) are compared with **Kendall's τ-b**
(scipy.stats.kendalltau, variant b, which handles ties): 1 = the same order, 0 = unrelated, −1 = exactly reversed. All
{len(par['sources'])} sources together are compared with **Kendall's W** (coefficient of concordance, with the tie
correction): 0 = no agreement, 1 = identical rankings. τ-b is undefined ("n/a") when a ranking is all ties, e.g. when
every scheduler completes every request at light load; such conditions are left out of every average and counted.
Columns of the table behind the figures:"""))
display(analysis.columns_table("cross_source_tau"))
'''),
        code('''
plots.cross_source_heatmaps(P, A);
'''),
        code('''
cs = A.summary["cross_source"]
if cs.get("mean_tau"):
    pairs = sorted(cs["by_source_pair"].items(), key=lambda kv: kv[1]["value"] if kv[1]["value"] is not None else 9)
    regions = sorted(cs["by_region"].items(), key=lambda kv: kv[1]["value"] if kv[1]["value"] is not None else 9)
    low, worst = cs["lowest"], pairs[0][0].split("|")
    display(Markdown(f"""**What the numbers show.** Over the {cs['mean_tau']['count']} (region × metric × source pair)
conditions where τ-b is defined ({cs['mean_tau']['undefined']} undefined), the mean τ-b is
**{analysis.fmt(cs['mean_tau'])}** (95% CI in brackets, n = conditions). By source pair:
{'; '.join(f"{L[p.split('|')[0]]} vs {L[p.split('|')[1]]}: {analysis.fmt(v)}" for p, v in pairs)}.
The pair that agrees least is **{L[worst[0]]} vs {L[worst[1]]}**. By region, agreement is lowest in
**{regions[0][0]}** ({analysis.fmt(regions[0][1])}) and highest in **{regions[-1][0]}** ({analysis.fmt(regions[-1][1])}).
The single least-agreeing condition is **{low['metric']}** in region **{low['region']}** between {L[low['source_1']]}
and {L[low['source_2']]}: τ-b = {low['tau']:.2f} [{low['ci'][0]:.2f}, {low['ci'][1]:.2f}].
Conditions whose whole τ-b interval lies below 0.5 (orders that are, at best, loosely related):
{analysis.fmt(cs['fraction_tau_ci_below_0.5'])} as a fraction of the conditions with an interval."""))
else:
    display(Markdown(f"**Cross-source agreement is not available:** {cs.get('reason')}."))
'''),
        md('''
### Every condition with its interval

The forest plot shows each τ-b with its 95% bootstrap interval, one panel per region; points left of zero
are conditions where the two sources tend to order the schedulers in reverse.
'''),
        code('''
plots.cross_source_forest(P, A);
'''),
        code('''
display(Markdown("**The ten least-agreeing conditions** (lowest τ-b):"))
display(A["cross_source_tau"].filter(pl.col("tau").is_not_nan()).sort("tau").head(10)
        .select("region", "metric", "source_1", "source_2", "tau", "ci_low", "ci_high"))
'''),
        code('''
plots.kendall_w_heatmap(P, A);
'''),
        code('''
if cs.get("kendall_w"):
    w = A["cross_source_w"].filter(pl.col("W").is_not_nan()).sort("W")
    display(Markdown(f"""**All sources together.** Kendall's W across the {len(par['sources'])} sources, averaged over
region × metric: **{analysis.fmt(cs['kendall_w'])}**. The weakest concordance is {w['metric'][0]} in region
{w['region'][0]} (W = {w['W'][0]:.2f} [{w['ci_low'][0]:.2f}, {w['ci_high'][0]:.2f}]); the strongest is
{w['metric'][-1]} in region {w['region'][-1]} (W = {w['W'][-1]:.2f})."""))
'''),
    ]


def nb05():
    return [
        md('''
# 05 — Cross-region rank agreement

**Question.** Schedulers are usually evaluated at one load. Does the ranking measured at one operating region
(offered load ρ relative to the window's capacity) hold at another — from light load to severe overload?
'''), PARAMS, SETUP, RANKING_METHOD,
        code('''
display(Markdown(f"""**Method.** For each source and metric, the rankings of every pair of the {len(par['regions'])}
regions ({', '.join(f"{r} ρ={data['rho'][r]:g}" for r in par['regions'])}) are compared with Kendall's τ-b (scipy),
and all regions together with Kendall's W (tie-corrected), with the same window bootstrap for the CIs. The
**bump charts** follow each scheduler's rank from the lightest to the heaviest region for the headline metrics
({', '.join(analysis.settings(P)['headline_metrics'])}). Columns of the pairwise table:"""))
display(analysis.columns_table("cross_region_tau"))
'''),
        code('''
plots.cross_region_matrices(P, A);
'''),
        code('''
cr = A.summary["cross_region"]
if cr.get("mean_tau"):
    bys = sorted(cr["by_source"].items(), key=lambda kv: kv[1]["value"] if kv[1]["value"] is not None else 9)
    low = cr.get("lowest") or {}
    display(Markdown(f"""**What the numbers show.** The mean τ-b between two regions' rankings, over every region pair ×
source × metric, is **{analysis.fmt(cr['mean_tau'])}**. Neighbouring regions agree at
{analysis.fmt(cr['adjacent_regions_tau'])}; the lightest and the heaviest region
({cr['extreme_regions_tau']['regions'][0]} vs {cr['extreme_regions_tau']['regions'][1]}) at
{analysis.fmt(cr['extreme_regions_tau'])}. By source: {'; '.join(f"{L[s]}: {analysis.fmt(v)}" for s, v in bys)}.
The least-agreeing case is {low.get('metric')} on {L.get(low.get('source'), low.get('source'))} between
{low.get('region_1')} and {low.get('region_2')} (τ-b = {low.get('tau', float('nan')):.2f})."""))
else:
    display(Markdown(f"**Cross-region agreement is not available:** {cr.get('reason')}."))
'''),
        code('''
plots.cross_region_w_heatmap(P, A);
'''),
        code('''
if cr.get("kendall_w"):
    w = A["cross_region_w"].filter(pl.col("W").is_not_nan()).sort("W")
    display(Markdown(f"""Kendall's W across all {len(par['regions'])} regions, averaged over sources × metrics:
**{analysis.fmt(cr['kendall_w'])}**. Lowest: {w['metric'][0]} on {L[w['source'][0]]} (W = {w['W'][0]:.2f}
[{w['ci_low'][0]:.2f}, {w['ci_high'][0]:.2f}]); highest: {w['metric'][-1]} on {L[w['source'][-1]]} (W = {w['W'][-1]:.2f})."""))
'''),
        md('''
### Rank trajectories (bump charts)

One chart per source; each line is one scheduler's rank (1 = best, at the top) in each region.
'''),
        code('''
plots.bump_charts(P, A);
'''),
        code('''
moves = analysis.rank_changes(A, analysis.settings(P)["headline_metrics"] or None, top=10)
R = par["regions"]
if moves.height:
    m0 = moves.row(0, named=True)
    display(Markdown(f"""**Largest moves** between {R[0]} and {R[-1]} (headline metrics): {m0['scheduler']} on
{L[m0['source']]} under {m0['metric']} goes from rank {m0['rank_' + R[0]]:g} to {m0['rank_' + R[-1]]:g}. The ten largest:"""))
    display(moves)
'''),
    ]


def nb06():
    return [
        md('''
# 06 — Pairwise reversals between sources

**Question.** "Scheduler A beats B" — on which traces? A *reversal* is a scheduler pair whose order flips between two
workload sources at the same load and under the same metric. Many sign flips are noise; this notebook counts the
reversals that are statistically significant on both sources *and* large enough to matter.
'''), PARAMS, SETUP,
        code('''
rp = A.summary["reversals"]["parameters"]
display(Markdown(f"""**Method.** For each of the {len(par['schedulers']) * (len(par['schedulers']) - 1) // 2}
scheduler pairs (a, b) and each source, region and metric, the per-window values (replicates averaged) give paired, *oriented* differences
(positive = a better than b, using the metric's direction). On each side:

* the **mean difference** over windows, and a two-sided **Wilcoxon signed-rank test** over windows (scipy; windows
  with a zero difference are dropped; when every difference is zero, p = 1). Each side test is computed once and reused
  by every source pair;
* the **multiple-comparison correction**: {rp['correction']} ({'family-wise error rate' if rp['correction'] == 'holm' else 'false discovery rate, Benjamini–Hochberg'}),
  over the family **{rp['family']}** — {par['family_definition']} ({A.summary['reversals']['side_tests']['value']:,} side tests);
* the **relative effect** {par['relative_effect']}: symmetric in a and b, between 0 and 2, and about the percentage
  difference for small effects.

A comparison of two sources is a **sign reversal** when the two mean differences have opposite signs; it is
**significant** when, in addition, both sides' adjusted p-values are below α = {rp['alpha']} with each test pointing in
the direction of its mean; **significant and practical** when, in addition, both relative effects are at least
δ = {rp['delta']:.0%}. Columns of the full table ({A['reversals'].height:,} rows):"""))
display(analysis.columns_table("reversals"))
'''),
        code('''
plots.reversal_funnel(P, A);
'''),
        code('''
rv = A.summary["reversals"]
n = rv["comparisons"]["value"]
def pc(k):
    return f"**{rv[k]['value']:,}** ({rv[k]['value'] / n:.2%})" if n else "0"
display(Markdown(f"""**What the numbers show.** Of {n:,} comparisons, {pc('sign_reversals')} reverse in sign,
{pc('significant')} are significant reversals, and {pc('significant_and_practical')} are significant *and* at least
{rp['delta']:.0%} apart on both sources. So {1 - rv['significant']['value'] / max(rv['sign_reversals']['value'], 1):.0%}
of the raw sign flips do not survive the paired test and the correction."""))
n_min = min(data["n_windows"].values())
if 2 / 2 ** n_min >= rp["alpha"]:
    display(Markdown(f"""**Caution: too few windows for significance.** With {n_min} windows per source, the smallest
possible two-sided Wilcoxon p-value is 2/2^{n_min} = {2 / 2 ** n_min:.3g} ≥ α = {rp['alpha']}, so no side test can reject
even before the correction; the significant counts are zero by construction, not because rankings are stable."""))
'''),
        md('''
### Where the reversals concentrate
'''),
        code('''
rev = A["reversals"]
by_region = analysis.breakdown(rev, ["region"])
by_metric = analysis.breakdown(rev, ["metric"])
by_sources = analysis.breakdown(rev, ["source_1", "source_2"])
by_pair = analysis.breakdown(rev, ["a", "b"])
display(by_region)
display(by_metric)
display(by_sources)
display(by_pair.head(10))
'''),
        code('''
plots.reversal_concentration(P, A);
plots.reversal_pairs(P, A);
'''),
        code('''
if rv["significant_and_practical"]["value"]:
    r0, m0, s0, p0 = by_region.row(0, named=True), by_metric.row(0, named=True), by_sources.row(0, named=True), by_pair.row(0, named=True)
    display(Markdown(f"""Significant-and-practical reversals are most frequent in region **{r0['region']}**
({r0['significant_and_practical']} of {r0['comparisons']:,}, {r0['significant_and_practical_rate']:.2%}), under metric
**{m0['metric']}** ({m0['significant_and_practical']} of {m0['comparisons']:,}), between **{L[s0['source_1']]}** and
**{L[s0['source_2']]}** ({s0['significant_and_practical']} of {s0['comparisons']:,}), and for the scheduler pair
**{p0['a']} vs {p0['b']}** ({p0['significant_and_practical']} of {p0['comparisons']:,})."""))
else:
    display(Markdown("No comparison is a significant-and-practical reversal under these parameters."))
'''),
        code('''
plots.reversal_forest(P, A);
'''),
        md('''
### The most dramatic reversal

The significant-and-practical reversal whose *smaller* side has the largest relative effect: it is large on both
sources, not just on one.
'''),
        code('''
md_ = rv.get("most_dramatic")
if md_:
    def side(k):
        return (f"mean {md_['mean_a_' + k]:.4g} ({md_['a']}) vs {md_['mean_b_' + k]:.4g} ({md_['b']}), relative effect "
                f"{md_['rel_' + k]:.0%}, raw p = {md_['p_' + k]:.2g}, adjusted p = {md_['p_adj_' + k]:.2g}, {md_['n_' + k]} windows")
    better1 = md_['a'] if md_['diff_1'] > 0 else md_['b']
    better2 = md_['a'] if md_['diff_2'] > 0 else md_['b']
    display(Markdown(f"""**{md_['a']} vs {md_['b']}**, metric **{md_['metric']}** ({md_['direction']} is better), region
**{md_['region']}**. On **{md_['label_1']}**, {better1} is better: {side('1')}. On **{md_['label_2']}**, {better2} is
better: {side('2')}."""))
else:
    display(Markdown("There is no significant-and-practical reversal to show."))
plots.most_dramatic_paired(P, A);
'''),
        md('''
### How much the count depends on the choices

The same side tests, corrected with each method over each family, and with half and double δ:
'''),
        code('''
sens = analysis.reversal_sensitivity(A)
display(sens)
lo, hi = sens["significant_and_practical"].min(), sens["significant_and_practical"].max()
display(Markdown(f"""Across these settings the number of significant-and-practical reversals ranges from **{lo:,}** to
**{hi:,}** (chosen setting: {rv['significant_and_practical']['value']:,})."""))
'''),
    ]


def nb07():
    return [
        md('''
# 07 — Cross-metric agreement and SLO sensitivity

**Question.** "Best scheduler" — by which metric? For each source and region, this notebook compares the rankings under
different metrics, asks how often the best scheduler depends on the metric, how much the SLO definition matters, and
which differences between schedulers are statistically distinguishable.
'''), PARAMS, SETUP, RANKING_METHOD,
        code('''
cm = A.summary["cross_metric"]
display(Markdown(f"""**Method.** Per (source, region) condition ({cm['conditions']} conditions), Kendall's τ-b between the
rankings under every pair of the {cm['n_metrics']} metrics, and their mean. The **top-1** scheduler under a metric is
the one with the best mean; tied best schedulers all count as top-1, and the top-1 **changes** in a condition when no
scheduler is top-1 under every metric. CIs: the window bootstrap. Columns:"""))
display(analysis.columns_table("cross_metric_conditions"))
'''),
        code('''
plots.metric_agreement(P, A);
'''),
        code('''
pairs = (A["cross_metric_tau"].filter(pl.col("tau").is_not_nan()).group_by(["metric_1", "metric_2"])
         .agg(pl.col("tau").mean()).sort("tau"))
lo_, hi_ = pairs.row(0, named=True), pairs.row(-1, named=True)
display(Markdown(f"""**What the numbers show.** The mean τ-b between two metrics' rankings is
**{analysis.fmt(cm['mean_tau'])}** over conditions. The least-agreeing pair of metrics is {lo_['metric_1']} vs
{lo_['metric_2']} (mean τ-b {lo_['tau']:.2f}); the most agreeing is {hi_['metric_1']} vs {hi_['metric_2']}
({hi_['tau']:.2f}). The best scheduler depends on the metric in **{cm['top1_change_rate']['changed']} of
{cm['conditions']}** conditions: top-1 change rate {analysis.fmt(cm['top1_change_rate'])}."""))
display(A["cross_metric_conditions"])
'''),
        code('''
plots.winners(P, A);
'''),
        code('''
best = analysis.top_winners(A)
display(Markdown("**Which scheduler wins under which metric** (most frequent top-1 over the conditions; a tie for best "
                 "counts for each tied scheduler; conditions where all schedulers tie are counted apart): " +
                 "; ".join(f"{m}: {w or '—'} ({c or 0}/{cm['conditions']}{f', all tied in {t}' if t else ''})"
                           for m, w, c, t in best.iter_rows()) + "."))
'''),
        md('''
### SLO-definition sensitivity

SLO attainment depends on where the TTFT/TPOT targets are set. Each named SLO definition gives one `slo_*` metric;
their rankings are compared per condition.
'''),
        code('''
slo = A.summary["slo_sensitivity"]
if slo.get("available"):
    defs = P["simulation"]["slo"]
    display(Markdown(f"""**Method and result.** SLO definitions: {'; '.join(f"{k}: TTFT ≤ {v['ttft_s']} s, TPOT ≤ {v['tpot_s']} s"
    for k, v in defs.items() if 'slo_' + k in slo['slo_metrics'])}. Mean τ-b between the rankings under two SLO
definitions: **{analysis.fmt(slo['mean_tau'])}**; Kendall's W across them: {analysis.fmt(slo['kendall_w'])}; the best
scheduler depends on the SLO definition in **{slo['top1_change_rate']['changed']} of {slo['conditions']}** conditions
({analysis.fmt(slo['top1_change_rate'])})."""))
    plots.slo_sensitivity(P, A)
    display(A["slo_conditions"])
else:
    display(Markdown(f"SLO sensitivity is not available: {slo.get('reason')}."))
'''),
        md('''
### Which differences are distinguishable: Friedman and Nemenyi

Per condition, the Friedman test asks whether the schedulers differ at all (windows are the blocks); the Nemenyi
post-hoc test then tells which pairs of schedulers are distinguishable. Critical-difference diagrams place the schedulers
by their average per-window rank; schedulers joined by a bar are not significantly different.
'''),
        code('''
fr = A.summary["friedman"]
display(Markdown(f"""Friedman test: the schedulers differ (adjusted p < {par['alpha']}) in
**{fr['rejected']['value']} of {fr['rejected']['count']}** conditions ({fr['definition']}). The diagrams below show
{', '.join('/'.join(c) for c in fr['cd_conditions'])} (by default: the region and metric of the most dramatic reversal,
on every source)."""))
plots.cd_diagrams(P, A);
'''),
    ]


def nb09():
    return [
        md('''
# 09 — Summary

**Question.** What are the headline answers of the study, with their definitions, counts and uncertainty, and where
is each figure? This notebook writes `summary.json` (through the library) and shows every number in it.
'''), PARAMS, SETUP,
        code('''
summary = analysis.write_summary(P, A)
cs, cr, rv, cm, slo = (summary[k] for k in ("cross_source", "cross_region", "reversals", "cross_metric", "slo_sensitivity"))
md_ = rv.get("most_dramatic")
display(Markdown(f"""**Headline.** Scheduler rankings agree between workload sources at a mean Kendall τ-b of
{analysis.fmt(cs.get('mean_tau'))}, between operating regions at {analysis.fmt(cr.get('mean_tau'))} (lightest vs heaviest
region: {analysis.fmt(cr.get('extreme_regions_tau'))}), and between metrics at {analysis.fmt(cm.get('mean_tau'))}; the
best scheduler depends on the metric in {cm['top1_change_rate']['changed']} of {cm['conditions']} (source, region)
conditions. Of {rv['comparisons']['value']:,} scheduler-pair comparisons between sources, {rv['sign_reversals']['value']:,}
reverse in sign, {rv['significant']['value']:,} significantly, and {rv['significant_and_practical']['value']:,}
significantly and by at least δ = {rv['parameters']['delta']:.0%} on both sources
({rv['parameters']['correction']} correction, family {rv['parameters']['family']}, α = {rv['parameters']['alpha']}).
""" + (f"""The most dramatic reversal: **{md_['a']} vs {md_['b']}**, {md_['metric']}, region {md_['region']}, between
{md_['label_1']} and {md_['label_2']} (relative effects {md_['rel_1']:.0%} and {md_['rel_2']:.0%}).""" if md_ else
"There is no significant-and-practical reversal.")))
'''),
        md('''
### Every headline number

Value, 95% bootstrap CI where the number has one, count (what it is computed over), and definition.
'''),
        code('''
display(analysis.headline_table(summary))
'''),
        md('''
### Figure index
'''),
        code('''
figs = pl.DataFrame(summary["figures"]) if summary["figures"] else pl.DataFrame({"file": [], "shows": [], "notebook": []})
display(Markdown(f"{figs.height} figures (PNG for reading; a PDF next to each for papers). Figures are indexed when "
                 "notebooks 04–07 (or `portbench analyze`) made them for this analysis."))
display(figs.select("notebook", "file", "shows"))
display(Markdown(f"Written: `{analysis.summary_path(P)}`; the analysis tables are in `{analysis.analysis_dir(P)}`."))
'''),
    ]


NOTEBOOKS = {
    "04_cross_workload.ipynb": nb04,
    "05_cross_region.ipynb": nb05,
    "06_reversals.ipynb": nb06,
    "07_cross_metric.ipynb": nb07,
    "09_summary.ipynb": nb09,
}


def build() -> list[Path]:
    out = []
    for name, make in NOTEBOOKS.items():
        nb = new_notebook(cells=make(), metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"}})
        path = NB_DIR / name
        nbformat.write(nb, path)
        out.append(path)
    return out


if __name__ == "__main__":
    for p in build():
        print(p)
