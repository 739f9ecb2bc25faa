"""Running the analysis: every table and summary number (:func:`compute`), files and ``summary.json``, tables for the notebooks."""

from __future__ import annotations

import hashlib
import io
import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ...core import figindex
from ...core import io as fileio
from ...core.config import TIE_RULES, AnalysisInputs, Config, DataSettings, PathsConfig, SimulationConfig
from ...core.errors import DataError, PortbenchError
from ...core.progress import note as progress_note
from ...core.progress import stage, terminal_progress
from ...data import windows as windows_mod
from ...data.windows import Manifest
from ...sim import profiles
from ...sim import schedulers as scheduler_registry
from .. import campaign, honest, stats
from .agreement import _cross_region, _cross_source, _rankings_table, _window_values_table
from .columns import FIGURE_NOTEBOOKS, SCHEMA, TABLES
from .common import _num, _source_rng, headline_panel_of, panel_sources, unavailable_reason
from .cube import Analysis, build_cube, load_runs, metric_names, runs_file_table, settings
from .metric_agreement import _cross_metric, _friedman, _slo_sensitivity
from .power import mde, resolution, warn
from .reversals import _family_definition, _reversals, tenant_na
from .ties import RULE_TEXT, deltas, rank, restrict, side_tests, tie_pairs_table, ties_summary
from .sections import read_sections
from . import hardware, hygiene, multiverse, paper, ports, sampling
from .plan import plan_block, plan_path

# The per-panel sections: each is a dict panel -> section; summary["panels"][name] gathers them, and the
# headline panel's sections are also the top-level entries of summary.json.
PANEL_SECTIONS = ("cross_source", "cross_region", "reversals", "cross_metric", "slo_sensitivity")


CORE_SKIPPED = ("friedman", "power", "headline", "controls", "congestion", "multiverse", "load_distance", "by_metric",
                "by_percentile", "paper_comparison", "across_hardware", "sampling_error")


def compute(config: AnalysisInputs, runs: pl.DataFrame | None = None, *, progress: bool = False,
            core: bool = False) -> Analysis:
    """Compute every table and the summary numbers (no files written) of ``runs`` (default: the file
    ``analysis.runs_file``); ``config``: what the analysis reads (``cfg.analysis_inputs``). ``core``: only the
    rankings, ties and the per-panel sections (cross-source, cross-region, reversals, cross-metric, SLO
    sensitivity) and their tables -- what a sensitivity campaign compares (:mod:`portbench.study.engine_sensitivity`);
    the blocks of :data:`CORE_SKIPPED` (the headline "what ports" block with its bootstrap, the multiverse, power,
    Friedman, hardware, ...) then say ``{"available": False}``. The core's numbers are those of the whole
    analysis (a test holds them equal)."""
    t0 = time.perf_counter()
    cfg = settings(config.analysis, config.window_size)
    where = cfg["runs_file"] or "campaign runs table"
    runs = runs_file_table(config.analysis) if runs is None else runs
    cube = build_cube(runs, metric_spec=config.analysis.metrics, all_metrics=metric_names(config.simulation.slo),
                      scheduler_order=config.simulation.schedulers, where=str(where),
                      source_order=config.source_names(), names=config.display_names)
    if not core:   # the headline's resampled signed-rank tests compiled (numba; this process never runs vLLM)
        stats.SIGNED_RANK_LOOP(may_import=True)
    timings: dict[str, float] = {}

    def tick(name):
        timings[name] = round(time.perf_counter() - t0 - sum(timings.values()), 3)
        if progress:
            print(f"[analysis] {name}: {timings[name]:.2f} s", flush=True)
        elif terminal_progress():      # make all: each part of the analysis on the terminal as it ends
            progress_note(f"analysis: {name} done in {timings[name]:.1f} s")

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

    head = [cube.metrics.index(m) for m in cfg["headline_metrics"] if m in cube.metrics] or list(range(len(cube.metrics)))
    panels = panel_sources(cfg["panels"], cube.sources, cube.provenance)
    headline_panel = headline_panel_of(panels, cube.provenance)
    if headline_panel in panels:      # the headline panel first: every per-panel table and section leads with it
        panels = {headline_panel: panels[headline_panel], **{k: v for k, v in panels.items() if k != headline_panel}}
    side = side_tests(cube, cfg["window_size"])
    delta = deltas(cube, cfg)
    rk = rank(cfg["ties"], cube, means, boot, side, cfg, delta)
    others = {r: rank(r, cube, means, boot, side, cfg, delta, with_boot=False) for r in TIE_RULES if r != cfg["ties"]}
    # schedulers that are n/a on some sources (vtc without tenants): rankings without them, for every
    # comparison of rankings that involves such a source
    red = restrict(tenant_na(cube), cube, means, boot, cfg, delta, cfg["ties"], TIE_RULES)
    tick("side_tests_and_ties")

    tables: dict[str, pl.DataFrame] = {}
    tables["window_values"] = _window_values_table(cube)
    tables["rankings"] = _rankings_table(cube, boot, rk)
    tables["tie_pairs"] = tie_pairs_table(cube, side, rk, delta)
    ties = ties_summary(cube, side, rk, others, cfg, delta, head)
    tick("rankings")
    sections = {"cross_source": _cross_source(cube, rk, others, panels, head, tables, red)}
    tick("cross_source")
    sections["cross_region"] = _cross_region(cube, rk, panels, head, tables, others, red)
    tick("cross_region")
    sections["reversals"] = _reversals(cube, side, delta, cfg, panels, head, tables)
    tick("reversals")
    sections["cross_metric"] = _cross_metric(cube, rk, panels, head, tables, red)
    tick("cross_metric")
    sections["slo_sensitivity"] = _slo_sensitivity(cube, rk, panels, tables, red)
    tick("slo_sensitivity")
    if core:
        return _core_analysis(config, cube, runs, cfg, head, panels, headline_panel, sections, tables, ties, timings, t0)
    rv_head = sections["reversals"].get(headline_panel, {})
    fr = _friedman(cube, cfg, tables, rv_head)
    tick("friedman")
    family_size = _family_size(cfg["family"], cube, len((panels.get(headline_panel) or {}).get("sources", [])))
    res = resolution(cube, side, cfg, head, family_size)
    warn(res)
    mdes, tables["power_curves"] = mde(cube, cfg, head, family_size,
                                       (panels.get(headline_panel) or {}).get("sources") or cube.sources)
    tick("power")
    congestion = hygiene.congestion_block(runs, config.simulation.capacity_policy)
    hp = panels.get(headline_panel) or {}
    matched, unmatched = hygiene.split_matches(
        hygiene.matched_queue(congestion, hp.get("sources") or cube.sources, cube.regions), hygiene.MATCH_RATIO)
    headline_block, controls, tables["ports"] = ports.compute_block(cube, cfg, delta, tenant_na(cube), panels,
                                                                    headline_panel, head, matched=matched,
                                                                    congestion=congestion)
    load_dist = headline_block.pop("load_distance", None)
    if "matched_congestion" in controls:
        controls["matched_congestion"].update(
            max_ratio=hygiene.MATCH_RATIO, unmatched=unmatched,
            rule=f"a region of one source is compared with the other source's region of closest mean FCFS queue when "
                 f"the two queues (+ 1) are within a factor {hygiene.MATCH_RATIO:g}; a region with no such match is "
                 "left out (unmatched), so every comparison is at the same congestion, not merely the least different")
    tick("headline_what_ports")
    hsrc = headline_block.get("sources") or cube.sources
    mv = multiverse.multiverse(cube, cfg, tenant_na(cube), hsrc, [cube.metrics[m] for m in head])
    robust = {"multiverse": mv, "load_distance": load_dist or {"available": False, "reason": "not computed"},
              "by_metric": {"definition": "the headline (plan's fork) on each headline metric alone, point estimates "
                                          "(intervals: headline.breakdowns)",
                            "metrics": multiverse.by_metrics(mv, [cube.metrics[m] for m in head])},
              "by_percentile": multiverse.percentile_block(cube, cfg, tenant_na(cube), hsrc)}
    tick("multiverse")

    summary = assemble_summary(
        cube=cube, runs=runs, cfg=cfg, head=head, panels=panels, headline_panel=headline_panel, sections=sections,
        names={s: config.display_names.get(s, s) for s in cube.sources},
        skipped=[s for s in config.source_names() if s not in cube.sources],
        blocks={"headline": headline_block, "controls": controls, "congestion": congestion,
                "analysis_plan": plan_block(config.paths.root, cfg),
                **robust, "ties": ties, "friedman": fr, "power": {**mdes, "resolution": res, "warnings": res["warnings"]}})
    summary["paper_comparison"] = paper.paper_comparison(summary, tables, config.paths.results_dir)
    summary["across_hardware"] = across_hardware(config)
    summary["sampling_error"] = sampling.sampling_error(hygiene.load_records(config.paths.results_dir), cfg["delta"],
                                                        seed=cfg["seed"])
    tick("paper_and_hardware")
    timings["total"] = round(time.perf_counter() - t0, 3)
    meta = {"fingerprint": fingerprint(runs, config), "timings_s": timings}
    return Analysis(tables=tables, summary=summary, meta=meta)


def _core_analysis(config: AnalysisInputs, cube, runs: pl.DataFrame, cfg: dict, head: list[int], panels: dict,
                   headline_panel: str | None, sections: dict, tables: dict, ties: dict, timings: dict,
                   t0: float) -> Analysis:
    """:func:`compute` with ``core=True``: the summary of the sections computed so far, every other block
    marked as not computed."""
    skipped = {"available": False, "reason": "not computed: core analysis (rankings and per-panel sections only)"}
    summary = assemble_summary(
        cube=cube, runs=runs, cfg=cfg, head=head, panels=panels, headline_panel=headline_panel, sections=sections,
        names={s: config.display_names.get(s, s) for s in cube.sources},
        skipped=[s for s in config.source_names() if s not in cube.sources],
        blocks={"ties": ties, "analysis_plan": plan_block(config.paths.root, cfg),
                **{k: dict(skipped) for k in CORE_SKIPPED}})
    timings["total"] = round(time.perf_counter() - t0, 3)
    return Analysis(tables=tables, summary=summary, meta={"fingerprint": None, "core": True, "timings_s": timings})


def across_hardware(config: AnalysisInputs) -> dict:
    """``summary.json["across_hardware"]`` from the profiles' runs simulated by notebook 03
    (:func:`portbench.study.analysis.hardware.run_hardware`), or why it is not there."""
    root = config.paths.root
    if not (Path(root) / hardware.PROFILES_FILE).is_file():
        return {"available": False, "reason": f"no {hardware.PROFILES_FILE}"}
    runs = hardware.load_hardware(root, config.paths.results_dir)
    return hardware.hardware_block(config, runs)


def _family_size(family: str, cube, n_sources: int) -> int:
    """Side tests in one reversal family of the headline panel."""
    K, R, M = len(cube.schedulers), len(cube.regions), len(cube.metrics)
    per = K * (K - 1) // 2 * max(n_sources, 1)
    return per * {"per_metric": R, "per_region": M, "all": R * M}[family]




def headline_reason(panels: dict, headline: str | None, provenance: dict) -> str:
    """Why ``headline`` is the headline panel, in words (summary.json ``headline_reason``)."""
    if headline is None or headline not in panels:
        return "no panel of at least two sources is available"
    p = panels[headline]
    real = all(provenance.get(s) == "real" for s in p["sources"])
    if p.get("own"):
        return (f"it holds your own source(s) {', '.join(p['own'])}, which are in no configured panel, together with "
                f"the sources of panel {p['extends']}" + (" (all real)" if real else "")
                + ", so every cross-source number answers whether the rankings port to your workload")
    if p.get("implicit"):
        return "no configured panel is available, so every source present is compared (implicit panel all)"
    if real:
        return "it is the first available panel whose sources are all real (cross-source claims rest on real data first)"
    return "no all-real panel is available; it is the first available panel (it includes stand-ins)"


def assemble_summary(*, cube, runs, cfg: dict, head: list[int], panels: dict, headline_panel: str | None,
                     sections: dict[str, dict], blocks: dict[str, dict], names: dict[str, str],
                     skipped: list[str]) -> dict:
    """summary.json in one place: parameters, data, the headline panel's sections at the top level, every
    panel under ``panels``, then the other blocks (``blocks``: name -> section; add new blocks there)."""
    summary: dict = {
        "schema": SCHEMA,
        "headline_metrics": [cube.metrics[k] for k in head],
        "headline_panel": headline_panel,
        "headline_reason": headline_reason(panels, headline_panel, cube.provenance),
        "parameters": {**{k: cfg[k] for k in ("alpha", "delta", "delta_absolute", "ties", "tie_correction",
                                              "rank_tolerance", "correction", "family", "bootstrap", "seed",
                                              "ci_level", "panels", "study_preset", "power", "window_size")},
                       "headline_metrics": [cube.metrics[k] for k in head],
                       "tie_rule": RULE_TEXT[cfg["ties"]],
                       "bootstrap_scheme": "percentile bootstrap; windows resampled with replacement "
                                           "within each source, one index matrix per source shared by "
                                           "every scheduler, region and metric; tie groups fixed at the full "
                                           "data's and re-ordered by their resampled means",
                       "relative_effect": "|mean_a - mean_b| / ((|mean_a| + |mean_b|) / 2)",
                       "paired_test": "two-sided Wilcoxon signed-rank over windows (scipy, zeros dropped; "
                                      "all-zero differences: p = 1)",
                       "family_definition": _family_definition(cfg["family"]),
                       "metrics": cube.metrics, "scales": dict(zip(cube.metrics, cube.scales)),
                       "schedulers": cube.schedulers, "regions": cube.regions, "sources": cube.sources},
        "provenance": {s: {"provenance": cube.provenance[s], "label": cube.label(s),
                           "name": names.get(s, s),
                           "n_windows": len(cube.windows[s])} for s in cube.sources},
        "data": {"n_runs": runs.height, "replicates": int(runs["replicate"].n_unique()),
                 "n_windows": {s: len(cube.windows[s]) for s in cube.sources},
                 "rho": {r: _num(cube.rho[r]) for r in cube.regions},
                 "directions": dict(zip(cube.metrics, cube.directions)), "notes": cube.notes,
                 "skipped_sources": list(skipped)},
    }
    for key in PANEL_SECTIONS:
        summary[key] = (sections[key].get(headline_panel) if headline_panel else None) or {
            "available": False, "reason": "no panel of at least two sources in the runs table"}
    summary["panels"] = {}
    for name, p in panels.items():
        provs = {s: cube.provenance.get(s) for s in p["sources"]}
        summary["panels"][name] = {
            "sources": p["sources"], "available": p["available"],
            **({} if p["available"] else {"reason": unavailable_reason(p)}),
            "implicit": bool(p.get("implicit", False)), "provenance": provs,
            **({"extends": p["extends"], "own_sources": list(p["own"])} if p.get("own") else {}),
            "all_real": bool(p["available"] and all(v == "real" for v in provs.values())),
            **{key: sections[key].get(name) for key in PANEL_SECTIONS}}
    summary.update(blocks)
    summary["figures"] = []
    return summary


def analysis_dir(results_dir: Path) -> Path:
    return Path(results_dir) / "analysis"


def summary_path(results_dir: Path) -> Path:
    return Path(results_dir) / "summary.json"


ANALYSIS_CODE = ("study.analysis", "study.stats")    # the code whose source is part of the analysis' fingerprint


def fingerprint(runs: pl.DataFrame, cfg: AnalysisInputs) -> str:
    """Hash of the runs table and everything in the parameters that changes the analysis (``cfg``)."""
    h = hashlib.sha256()
    h.update(SCHEMA.encode())                       # a new summary layout never reuses an older analysis
    h.update(json.dumps(settings(cfg.analysis, cfg.window_size), sort_keys=True, default=str).encode())
    h.update(json.dumps(sorted(runs.columns)).encode())
    h.update(json.dumps(cfg.simulation.slo_dicts, sort_keys=True, default=str).encode())
    h.update(json.dumps(scheduler_registry.names(cfg.simulation.schedulers)).encode())
    h.update(json.dumps([cfg.source_names(), cfg.display_names], sort_keys=True).encode())
    h.update("".join(fileio.code_sha256(m) for m in ANALYSIS_CODE).encode())   # changed code recomputes
    plan = plan_path(cfg.paths.root)
    h.update(plan.read_bytes() if plan.is_file() else b"no plan")             # a changed plan recomputes
    buf = io.BytesIO()
    runs.write_ipc(buf)
    h.update(buf.getvalue())
    return h.hexdigest()


def write(results_dir: Path, A: Analysis) -> dict[str, str]:
    """Write every table as parquet under ``{results_dir}/analysis/`` and the summary core."""
    out = analysis_dir(results_dir)
    paths = fileio.write_tables(out, A.tables)
    fileio.write_text(out / "summary_core.json", json.dumps(A.summary, indent=1, default=_json_default))
    fileio.write_text(out / "meta.json", json.dumps(A.meta, indent=1))
    return paths


def _json_default(x):
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return _num(x)
    if isinstance(x, np.ndarray):
        return [_num(v) for v in x.tolist()]
    return str(x)


def stage_manifest(paths: PathsConfig, *, required: bool) -> tuple[Manifest | None, str]:
    """The window manifest, loaded once by a stage of the analysis (:func:`load`'s callers) and passed on; where it
    cannot be loaded, None and why (``required``: raised instead -- the campaign's runs need it)."""
    try:
        return windows_mod.load_manifest(paths), ""
    except (PortbenchError, OSError) as e:
        if required:
            raise
        return None, f"{type(e).__name__}: {e}"      # each block of the summary that needs it records the error


def load(cfg: Config, manifest: Manifest | None, *, manifest_error: str = "", recompute: bool = False,
         progress: bool = False) -> Analysis:
    """The analysis for ``cfg``: read from ``{results_dir}/analysis`` when it matches the runs table and
    the parameters (fingerprint), else computed and written (tables, summary core and summary.json).
    ``manifest``: the window manifest the caller's stage loaded (:func:`stage_manifest`; None, with
    ``manifest_error`` saying why, only with ``analysis.runs_file``); the analysis keeps it for
    :func:`write_summary`."""
    runs = load_runs(cfg.analysis, cfg.plan_settings, manifest)
    fp = fingerprint(runs, cfg.analysis_inputs)
    d = analysis_dir(cfg.paths.results_dir)
    meta_p = d / "meta.json"
    if not recompute and meta_p.is_file():
        meta = json.loads(meta_p.read_text())
        files = [d / f"{t}.parquet" for t in TABLES]
        if meta.get("fingerprint") == fp and all(f.is_file() for f in files) and (d / "summary_core.json").is_file():
            tables = {t: pl.read_parquet(d / f"{t}.parquet") for t in TABLES}
            summary = json.loads((d / "summary_core.json").read_text())
            return Analysis(tables=tables, summary=summary, meta=meta, manifest=manifest,
                            manifest_error=manifest_error)
    with stage(f"analysis of {runs.height:,} runs (the tables of notebooks 04-07 and 10)"):
        A = compute(cfg.analysis_inputs, runs, progress=progress)
    A.manifest, A.manifest_error = manifest, manifest_error
    write(cfg.paths.results_dir, A)
    figindex.forget(cfg.paths.figures_dir, FIGURE_NOTEBOOKS)  # figures of an older analysis are not indexed
    write_summary(cfg, A, runs=runs)
    return A


def figure_index(paths: PathsConfig) -> list[dict]:
    """``[{name, file, pdf, notebook, description}]`` of every figure in ``paths.figures_dir`` (each recorded by
    ``figures.save``), paths relative to the project root where possible."""
    return figindex.index(paths.figures_dir, paths.root)


def campaign_files(paths: PathsConfig, plan: campaign.Plan | None,
                   runs: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """The runs and measured capacities of the campaign of ``plan`` (:func:`portbench.study.campaign.make_plan`)
    under ``paths.results_dir``, or None when they are not there (or there is no plan). ``runs``: the campaign's
    runs table when the caller has loaded it (:func:`portbench.study.analysis.cube.load_runs` without
    ``analysis.runs_file``), else loaded here."""
    if plan is None:
        return None
    try:
        return (campaign.load_runs(paths, plan) if runs is None else runs), campaign.load_capacities(paths, plan)
    except DataError:
        return None


def engine_load_blocks(files: tuple[pl.DataFrame, pl.DataFrame] | None, sim: SimulationConfig,
                       source_names: Sequence[str], results_dir: Path) -> dict:
    """The ``engine`` and ``load`` blocks of summary.json (issue #10) from the campaign's runs and capacities
    (``files``: :func:`campaign_files`): the engine the campaign ran on (``sim``), and per source (in the order
    of ``source_names``) its capacity and per source × region utilisation, queue, refusals and distinguishable
    schedulers, refusals per scheduler and the prefix-cache hit rate per source
    (:func:`portbench.study.campaign.load_summary`); the sensitivity tables under ``results_dir``. Empty without
    the campaign's files."""
    if files is None:
        return {}
    runs, caps = files
    prof = profiles.get_profile(sim.profile)
    engine = campaign.engine_summary(sim, prof)
    d = Path(results_dir)
    for key, name in (("batching_sensitivity", "engine_sensitivity.parquet"), ("swap_sensitivity", "swap_sensitivity.parquet")):
        if (d / name).is_file():      # written by notebook 03 (portbench.study.engine_sensitivity)
            engine[key] = pl.read_parquet(d / name).to_dicts()
    return {"engine": engine, "load": campaign.load_summary(runs, caps, sim.capacity_policy,
                                                            order=list(source_names),
                                                            max_model_len=engine["max_model_len"] or None)}


def write_summary(cfg: Config, A: Analysis, *, runs: pl.DataFrame | None = None) -> dict:
    """Write ``{results_dir}/summary.json``: the summary numbers, the engine and load blocks and the
    index of every figure. The campaign's plan and its runs are loaded once here, for every block that reads
    them, from the window manifest the analysis ``A`` was given (:func:`load`; ``runs``: the runs table of
    :func:`portbench.study.analysis.cube.load_runs` when the caller has it)."""
    manifest, manifest_error = A.manifest, A.manifest_error
    try:
        plan = campaign.make_plan(cfg.plan_settings, manifest=manifest) if manifest is not None else None
    except DataError:
        plan = None
    # the campaign's files; not the analysis' own runs when analysis.runs_file analyses a file of its own
    files = campaign_files(cfg.paths, plan, runs) if cfg.analysis.runs_file is None else None
    main = files[0] if files is not None else honest.main_runs(cfg.paths, plan)
    summary = dict(A.summary)
    summary.update(engine_load_blocks(files, cfg.simulation, cfg.source_names(), cfg.paths.results_dir))
    summary["figures"] = figure_index(cfg.paths)
    summary.update(read_sections(cfg.paths.results_dir, reserved=summary))  # later stages' sections (attribution)
    summary = honest.add_to_summary(cfg.data, cfg.predictors, cfg.simulation, cfg.analysis, summary, manifest=manifest,
                                    main=main, manifest_error=manifest_error, workers=cfg.campaign.workers)
    summary = add_design_controls(cfg.analysis_inputs, cfg.data, cfg.campaign.windows_per_source, summary,
                                  manifest=manifest, runs=files[0] if files is not None else None,
                                  manifest_error=manifest_error)
    fileio.write_text(summary_path(cfg.paths.results_dir), json.dumps(summary, indent=1, default=_json_default))
    return summary


def add_design_controls(cfg: AnalysisInputs, data: DataSettings, windows_per_source: int | None, summary: dict, *,
                        manifest: Manifest | None, runs: pl.DataFrame | None, manifest_error: str = "") -> dict:
    """Issue #25's blocks that need more than the runs table: ``trace_checks`` (quantised timestamps of every
    source, of ``data``'s first ``windows_per_source`` windows), ``congestion`` with the share of time with a
    waiting request (per-request records), and ``controls.arrival_jitter`` (the headline with the quantised
    sources' arrivals spread within their grid, when :func:`portbench.study.analysis.hygiene.run_jitter` has
    run). ``runs``: the campaign's runs (None: not there); ``manifest`` None: it could not be loaded
    (``manifest_error``)."""
    if cfg.analysis.runs_file is not None:
        return summary
    try:
        if manifest is None:
            summary["trace_checks"] = {"error": manifest_error or "no window manifest"}
        else:
            summary["trace_checks"] = hygiene.trace_checks_block(data, windows_per_source, manifest=manifest)
    except (PortbenchError, OSError) as e:
        summary["trace_checks"] = {"error": f"{type(e).__name__}: {e}"}
    if runs is None:
        return summary
    summary["congestion"] = hygiene.congestion_block(runs, cfg.simulation.capacity_policy,
                                                     hygiene.load_records(cfg.paths.results_dir))
    jit = hygiene.load_jitter(cfg.paths.results_dir)
    controls = dict(summary.get("controls") or {})
    if jit is not None:
        controls["arrival_jitter"] = jitter_headline(cfg, hygiene.jittered_runs(runs, jit))
    else:
        controls["arrival_jitter"] = {"available": False, "reason": "the jittered runs have not been simulated "
                                      "(hygiene.run_jitter; notebook 03)"}
    eq = hygiene.load_equal_information(cfg.paths.results_dir)
    if eq is not None:
        controls["equal_information"] = {
            **jitter_headline(cfg, hygiene.equal_information_runs(runs, eq), what="equal_information"),
            "replaced": {k: v for k, v in hygiene.EQUAL_INFORMATION.items() if v in set(eq["scheduler"].to_list())},
            "why": "every source's predictor-informed policies get the same information: the true output length with "
                   f"the same log-normal noise (sigma = {cfg.simulation.predictor_sigma:g}; edf: EDF on the deadline "
                   "of that noisy length), instead of a predictor whose quality differs from trace to trace"}
    else:
        controls["equal_information"] = {"available": False, "reason": "the oracle variants have not been simulated "
                                         "(hygiene.run_equal_information; notebook 03)"}
    summary["controls"] = controls
    return summary


JITTER_BOOT = 200   # resamples of the arrival-jitter control's intervals


def jitter_headline(config: AnalysisInputs, runs: pl.DataFrame, what: str = "arrival_jitter") -> dict:
    """The headline (concordance and four-way table, headline panel) on ``runs``: by default the runs with the
    quantised sources' arrivals spread within their grid (``what``: the control's name)."""
    cfg = settings(config.analysis, config.window_size)
    # the control's headline re-runs every test in each resample (minutes): kept beside the analysis, keyed by the
    # runs' content, the settings and the code that computes it, so a notebook re-run reads it
    key = _control_key(runs, cfg, what)
    cache = analysis_dir(config.paths.results_dir) / f"control_{what}.json"
    if cache.is_file():
        try:
            got = json.loads(cache.read_text())
            if got.get("key") == key:
                return got["block"]
        except ValueError:
            pass
    out = _jitter_headline(config, runs, what, cfg)
    cache.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_json(cache, {"key": key, "block": out}, indent=None)
    return out


def _control_key(runs: pl.DataFrame, cfg: dict, what: str) -> str:
    code = b"".join((Path(__file__).parent / f).read_bytes() for f in ("ports.py", "cube.py", "ties.py")) + \
        (Path(__file__).parents[1] / "stats.py").read_bytes()
    rows = int(runs.sort(sorted(c for c in ("source", "window_id", "region", "scheduler", "replicate")
                                if c in runs.columns)).hash_rows(seed=0).sum())
    return hashlib.sha256(json.dumps([what, rows, runs.height, cfg, JITTER_BOOT, ports.INTERVAL], sort_keys=True,
                                     default=str).encode() + code).hexdigest()


def _jitter_headline(config: AnalysisInputs, runs: pl.DataFrame, what: str, cfg: dict) -> dict:
    cube = build_cube(runs, metric_spec=config.analysis.metrics, all_metrics=metric_names(config.simulation.slo),
                      scheduler_order=config.simulation.schedulers, source_order=config.source_names(),
                      names=config.display_names)
    head = [cube.metrics.index(m) for m in cfg["headline_metrics"] if m in cube.metrics]
    panels = panel_sources(cfg["panels"], cube.sources)
    hp = headline_panel_of(panels, cube.provenance)
    sources = panels[hp]["sources"] if hp in panels and panels[hp]["available"] else cube.sources
    b, _ = ports.headline(cube, cfg, deltas(cube, cfg), tenant_na(cube), sources, head, boot=JITTER_BOOT,
                          details=False, blocks=ports.block_lengths(cube, head) if ports.INTERVAL == "block" else None)
    b.pop("_boot", None)
    out = {"available": True, "concordance": b["concordance"], "four_way": b["four_way"], "sides": b["sides"],
           "bootstrap": JITTER_BOOT}
    if what == "arrival_jitter":
        f = hygiene.jitter_dir(config.paths.results_dir) / "sources.json"
        out["jittered_sources"] = json.loads(f.read_text()) if f.is_file() else []
    return out


def headline_table(summary: dict, panel: str | None = None) -> pl.DataFrame:
    """Every headline number of one panel (default: the headline panel) with its definition, count and CI."""
    rows = []
    panel = panel or summary.get("headline_panel")
    sec_of = (summary.get("panels") or {}).get(panel) or summary

    def add(section, name, st):
        if isinstance(st, dict) and "value" in st and "definition" in st:
            ci = st.get("ci") or [None, None]
            rows.append({"section": section, "number": name, "value": st["value"] if st["value"] is not None
                         else float("nan"), "ci_low": ci[0], "ci_high": ci[1], "count": st.get("count"),
                         "definition": st["definition"]})

    for section in ("cross_source", "cross_region", "reversals", "cross_metric", "slo_sensitivity"):
        sec = sec_of.get(section) or {}
        for name, st in sec.items():
            add(section, name, st)
        for group in ("by_source_pair", "by_source", "extreme_regions", "adjacent_regions", "secondary"):
            for name, st in (sec.get(group) or {}).items():
                if isinstance(st, dict) and "value" in st:
                    add(section, f"{group}: {name}", st)
                elif isinstance(st, dict):
                    for k, v in st.items():
                        add(section, f"{group}: {name}: {k}", v)
    for section in ("ties", "friedman"):
        for name, st in (summary.get(section) or {}).items():
            add(section, name, st)
    return pl.DataFrame(rows, schema={"section": pl.Utf8, "number": pl.Utf8, "value": pl.Float64,
                                      "ci_low": pl.Float64, "ci_high": pl.Float64, "count": pl.Int64,
                                      "definition": pl.Utf8})


def tie_rule_table(A: Analysis, panel: str | None = None, section: str = "cross_source") -> pl.DataFrame:
    """The headline agreement numbers of ``section`` (``cross_source`` or ``cross_region``) under every tie rule
    (``by_tie_rule``): the chosen rule first, the others as sensitivity rows (point estimates). The
    cross-region rows also carry the lightest-vs-heaviest-region mean tau-b (``tau_b_extreme``)."""
    panel = panel or A.summary["headline_panel"]
    cs = ((A.summary.get("panels") or {}).get(panel) or {}).get(section) or {}
    schema = {"tie_rule": pl.Utf8, "chosen": pl.Boolean, "tau_b": pl.Float64, "tau_b_norm": pl.Float64,
              "discordance": pl.Float64, "defined": pl.Int64, "all_tied": pl.Int64, "total": pl.Int64,
              "tau_b_all_metrics": pl.Float64, "defined_all_metrics": pl.Int64, "total_all_metrics": pl.Int64}
    if section == "cross_region":
        schema.update({"tau_b_extreme": pl.Float64, "defined_extreme": pl.Int64, "total_extreme": pl.Int64})
    schema["definition"] = pl.Utf8
    rows = [{"tie_rule": r, **{k: v.get(k) for k in schema if k != "tie_rule"}}
            for r, v in (cs.get("by_tie_rule") or {}).items()]
    return pl.DataFrame(rows, schema=schema)


def panels_table(A: Analysis) -> pl.DataFrame:
    """One row per panel: its sources and provenance, whether it is available and all-real, and its headline
    cross-source and reversal numbers."""
    rows = []
    for name, p in A.summary["panels"].items():
        cs, rv = p.get("cross_source") or {}, p.get("reversals") or {}
        v = lambda d, k: ((d.get(k) or {}).get("value") if p["available"] else None)  # noqa: E731
        rows.append({"panel": name, "sources": ", ".join(p["sources"]), "available": p["available"],
                     "all_real": p["all_real"],
                     "provenance": ", ".join(f"{s}: {pv or 'absent'}" for s, pv in p["provenance"].items()),
                     "tau_b": v(cs, "tau_b"), "tau_b_norm": v(cs, "tau_b_norm"), "discordance": v(cs, "discordance"),
                     "significant_and_practical": v(rv, "significant_and_practical"),
                     "comparisons": v(rv, "comparisons"), "note": p.get("reason", "")})
    schema = {"panel": pl.Utf8, "sources": pl.Utf8, "available": pl.Boolean, "all_real": pl.Boolean,
              "provenance": pl.Utf8, "tau_b": pl.Float64, "tau_b_norm": pl.Float64, "discordance": pl.Float64,
              "significant_and_practical": pl.Int64, "comparisons": pl.Int64, "note": pl.Utf8}
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
