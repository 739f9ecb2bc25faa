"""Counterfactual attribution: *which property of a workload flips a scheduler ranking?* (notebook 09).

For an ordered pair of sources (A, B) and a window pair (A's i-th, B's i-th attribution window), a
**hybrid** is A's window with some properties taken from B's (:mod:`portbench.data.hybrids`): the
arrival pattern, the prompt-length distribution, the output-length distribution, the prompt/output
coupling (with the order in time and the tenants), and the load. Every hybrid runs at the region's
target load rho on its own sustainable throughput, the campaign's load definition, under which A and B
are at the same load: the ``load`` swap is the identity (:mod:`.runs` says why the achieved utilisation of
a finite window is not used instead). The properties are grouped into **players**
(``attribution.properties``; default: the four window properties, ungrouped); every subset of players is
one hybrid, so a pair has ``2^players`` hybrids: the empty subset is A itself and the full subset is B.
The joint (prompt, output) pairs are the subset prompt & output & coupling (:func:`.results.joint_group`
reports it as one group, from the same runs).

Each hybrid is simulated like a campaign window (:mod:`.runs`: the campaign's engine, capacity,
rescaling, seeds and metrics) and ranked like a source (:mod:`.rankings`: the analysis' cube, tie rule
and agreement statistics). For every region and metric, the **distance** between A's ranking and a
hybrid's (``attribution.distance``) is a game on the players whose **Shapley values** (:mod:`.game`)
split the A -> B disagreement into one part per player; they sum to the distance between A's and B's
rankings. Their **share** is phi / total. A player whose swap never changes a ranking gets 0; the
properties **interact** when the full swap differs from the sum of the single swaps (the interaction's
95% bootstrap CI excludes 0). **Bootstrap:** the window pairs are resampled with replacement
(``attribution.bootstrap``, seeded by ``attribution.seed`` and the pair), one index matrix per pair for
every hybrid, so hybrids stay paired on their windows; each resample recomputes every ranking, distance
and Shapley value. **Reversal tracing:** for each significant-and-practical reversal of the analysis
between A and B, the smallest sets of swapped players whose hybrid *reproduces* it on A's attribution
windows -- a significant-and-practical reversal between A and that hybrid, by the analysis' definition
(:data:`.results.REPRODUCES`); where the windows are too few for the test it says so.

Entry point: :func:`attribute` (``portbench attribute``, notebook 09): run, compute, write the tables under
``{results_dir}/attribution/`` and the ``attribution`` section for ``summary.json``
(:func:`portbench.study.analysis.sections.write_section`), which the summary (notebook 10) writes once, last.
"""

from __future__ import annotations

from ...core.config import Config
from ...core.errors import DataError
from ...data.windows import Manifest
from .. import analysis
from .design import REAL_PANEL, Design, available_sources, compared_metrics, cost_plan, make_design, resolve_pairs, spaced
from .rankings import compare, distance, hybrid_cube, ranks, tie_rule
from .results import (REPRODUCES, SECTION, TABLES, TRACE_STATUS, Attribution, compute, endpoint_check, joint_group, load,
                      min_wilcoxon_p, representativeness, trace_reversals, write)
from .runs import (LOAD_CHECK, LOAD_DEFINITION, STEADY_REQUESTS, UTILISATION_DEFINITION, AttributionRuns,
                   achieved_utilisation, attribution_dir, build_hybrids, freeze_hybrids, hybrids_path, pair_windows,
                   repeated, run, window_parts)
from .game import grouped, interaction, shapley, singles, smallest_sets


def attribute(cfg: Config, manifest: Manifest, *, refreeze: bool = False, progress: bool = True, engine=None,
              reversals: bool = True, verbose: bool = True) -> Attribution:
    """Simulate (or reuse) every hybrid, compute the attribution, write its tables and its section for
    summary.json (``summary.json`` itself is written by :func:`portbench.study.analysis.write_summary`, the
    summary notebook, which runs after this one). ``reversals``: trace the analysis' significant-and-practical
    reversals (needs the campaign and the analysis of ``cfg``; skipped with a note when they are absent).
    ``manifest``: the window manifest, loaded once by the caller (``windows.load_manifest``)."""
    ar = run(cfg, manifest=manifest, engine=engine, refreeze=refreeze, progress=progress, verbose=verbose)
    rev = rk = cruns = note = None
    if reversals:
        try:
            study = analysis.load(cfg, manifest)
            rev, rk, cruns = (study["reversals"], study["rankings"],
                              analysis.load_runs(cfg.analysis, cfg.plan_settings, manifest))
        except DataError as e:
            note = f"reversal tracing skipped: {e}"
    A = compute(cfg.simulation, cfg.analysis, cfg.windows.size, ar, rev, rk, cruns)
    A.summary["tracing"] = note or "every significant-and-practical reversal of the analysis between the pair's sources"
    write(cfg.paths.results_dir, A)
    return A


__all__ = ["LOAD_CHECK", "LOAD_DEFINITION", "REAL_PANEL", "REPRODUCES", "SECTION", "STEADY_REQUESTS", "TABLES",
           "TRACE_STATUS", "UTILISATION_DEFINITION", "Attribution", "AttributionRuns", "Design", "achieved_utilisation",
           "attribute", "attribution_dir", "available_sources", "build_hybrids", "compare", "compared_metrics", "compute",
           "cost_plan", "distance", "endpoint_check", "freeze_hybrids", "grouped", "hybrid_cube", "hybrids_path",
           "interaction", "joint_group", "load", "make_design", "min_wilcoxon_p", "pair_windows", "ranks", "repeated",
           "representativeness", "resolve_pairs", "run", "shapley", "singles", "smallest_sets", "spaced", "tie_rule",
           "trace_reversals", "window_parts", "write"]
