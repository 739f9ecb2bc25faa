"""portbench command line: the pipeline's stages outside the notebooks (thin over the library).

Every command but sweep takes --params FILE (default papermill_params/default.yaml), --set KEY=VALUE overrides
(see `portbench params` for every key, its value and its documentation) and --plugin FILE; sweep takes a sweep
file (which names its base parameter file and grid) and --plugin. A parameter set other than the default study
writes its results and figures under build/<run name>/, and, when its windows differ from the default study's,
its manifest, window cache and frozen predictions under build/<run name>/windows/."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import yaml

from . import __version__, bench, notebooks, params
from .core import plugins
from .core.config import key_doc, parameter_docs
from .core.errors import DataError, ParameterError, PortbenchError
from .data import registry, traces, windows
from .core.io import read_meta
from .present import attribution_text, claim_report, plots_analysis, plots_attribution, report, site, text
from .sim import metrics as metric_registry
from .sim import schedulers as scheduler_registry
from .sim import settings as sim_settings
from .study import analysis, attribution, campaign, honest
from .study import claim as claim_mod


def _plugin_paths(args) -> list[str]:
    """``--plugin`` values: files made absolute against the current folder, module names as given."""
    out = []
    for p in getattr(args, "plugin", None) or []:
        out.append(str(Path(p).resolve()) if plugins.looks_like_file(p) else p)
    return out


def _overrides(args) -> dict:
    """``--set`` overrides, and ``--plugin`` values appended to the parameter file's ``plugins``."""
    over = params.undot(dict(_kv(o) for o in getattr(args, "set", None) or []))
    extra = _plugin_paths(args)
    if extra:
        base = over.get("plugins")
        if base is None:
            base = params.read(getattr(args, "params", None)).get("plugins") or []
        over["plugins"] = list(base) + [p for p in extra if p not in base]
    return over


def _params(args, validate: bool = True):
    cfg = params.load(args.params, _overrides(args), validate=validate, claim=args.command not in READING_COMMANDS)
    if cfg.paths.run_name and args.command in WRITING_COMMANDS:
        print(f"[portbench] run {cfg.paths.run_name!r} (not the default study): {cfg.paths.where()}",
              file=sys.stderr, flush=True)
    return cfg


WRITING_COMMANDS = ("ingest", "freeze", "predict", "simulate", "analyze", "attribute", "validate", "conform",
                    "vllm-virtual")
READING_COMMANDS = ("params", "report", "files", "schedulers", "profiles")   # claim no output folder


def _kv(item: str):
    if "=" not in item:
        raise PortbenchError(f"--set {item!r}: expected KEY=VALUE, e.g. simulation.replicates=1")
    k, v = item.split("=", 1)
    if not k.strip():
        raise PortbenchError(f"--set {item!r}: expected KEY=VALUE with a parameter name, e.g. simulation.replicates=1")
    try:
        return k.strip(), yaml.safe_load(v)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem", None) or "not a YAML value"
        raise ParameterError(k.strip(), v, f"a YAML value ({mark}); quote lists and text, e.g. "
                             f"--set '{k.strip()}=[a, b]' or --set '{k.strip()}=\"text\"'") from None


def cmd_ingest(args):
    report = traces.ingest_all(_params(args))
    print(text.format_report(report))


def cmd_freeze(args):
    cfg = _params(args)
    manifest = windows.freeze(cfg, refreeze=args.refreeze)
    print(f"manifest: {len(manifest['windows'])} windows -> {windows.manifest_path(cfg.paths)} "
          f"(window cache: {windows.cache_path(cfg.paths)})")


def cmd_verify(args):
    ok, total, problems = windows.verify(_params(args))
    for p in problems:
        print(f"MISMATCH {p}", file=sys.stderr)
    print(f"{ok}/{total} windows verified")
    return 0 if ok == total and not problems else 1


def cmd_schedulers(args):
    _params(args, validate=False)      # loads the parameters' plug-ins (and --plugin); a listing checks no names
    print(text.schedulers_markdown())


def cmd_profiles(args):
    _params(args, validate=False)
    print(text.profiles_markdown())


def cmd_predict(args):
    cfg = _params(args)
    manifest = windows.load_manifest(cfg.paths)     # once for the stage
    _, summ = honest.accuracy(cfg.data, cfg.predictors, cfg.simulation, manifest=manifest, workers=cfg.campaign.workers)
    print(text.predictor_markdown(summ, honest.predictors_block(cfg.data, cfg.predictors, cfg.simulation, cfg.analysis,
                                                                manifest=manifest, workers=cfg.campaign.workers)))
    if args.transfer:
        runs = honest.run_transfer(cfg)
        print(f"transfer campaign: {runs.height} runs under {honest.transfer_dir(cfg.paths.results_dir)}")


def _delegate_vllm(cfg, args, specs: list[str], panel: str, windows_per_source) -> None:
    """Run the vLLM scheduler classes ``specs`` here when this interpreter has vLLM, else ``portbench simulate
    --vllm-scheduler`` in .venv-vllm (a subprocess, :mod:`portbench.study.campaign.imported`) with the same parameters."""
    if importlib.util.find_spec("vllm") is not None:
        from .validation import imported

        imported.simulate(cfg, specs, panel=panel, windows_per_source=windows_per_source)
        return
    cmd = campaign.imported.command(cfg.paths, specs, panel=panel, windows_per_source=windows_per_source)
    for o in getattr(args, "set", None) or []:
        cmd += ["--set", o]
    for p in _plugin_paths(args):
        cmd += ["--plugin", p]
    print(f"[portbench] running the vLLM scheduler class(es) in .venv-vllm: {' '.join(cmd[3:])}", file=sys.stderr,
          flush=True)
    rc = subprocess.run(cmd, env=campaign.imported.subprocess_env(cfg.paths)).returncode
    if rc:
        raise PortbenchError(f"the vLLM scheduler run in .venv-vllm failed (exit {rc}; its message is above)")


def _windows_arg(v: str) -> int | None:
    if v == "all":
        return None
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r}: a number of windows per source or 'all'") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v!r}: at least 1 window per source (or 'all')")
    return n


def cmd_simulate(args):
    cfg = _params(args)
    if args.vllm_scheduler:
        _delegate_vllm(cfg, args, args.vllm_scheduler, args.panel, args.windows)
        return
    if args.backend == "vllm-virtual":
        from .validation.virtual_campaign import VirtualEngine   # imports vLLM (.venv-vllm)

        campaign.run(cfg, engine=VirtualEngine())
    else:
        campaign.run(cfg)


def cmd_claim(args):
    """Does "policy beats baseline on metric" port? (study.claim; issue #40)"""

    t0 = time.perf_counter()
    cfg = _params(args)
    manifest = None if cfg.analysis.runs_file else windows.load_manifest(cfg.paths)
    try:
        runs = analysis.load_runs(cfg.analysis, cfg.plan_settings, manifest)
    except DataError as e:
        raise PortbenchError(f"no campaign runs to check the claim on ({e}); run `make all` (or `portbench simulate`) "
                             "with the same --params / --set first") from None
    present = sorted(runs["scheduler"].unique().to_list())
    policy, prov, note, note_engine = args.policy, None, None, None
    panel = args.panel or analysis.headline_panel_of(
        analysis.panel_sources({k: list(v) for k, v in cfg.analysis.panels.items()}, sorted(runs["source"].unique()),
                               dict(runs.select("source", "provenance").unique().iter_rows())),
        dict(runs.select("source", "provenance").unique().iter_rows()))
    if panel not in cfg.analysis.panels:
        raise ParameterError("--panel", panel, f"one of the analysis' panels: {', '.join(cfg.analysis.panels)}")
    sources = list(cfg.analysis.panels[panel])
    if ":" in policy:                                   # an imported vLLM Scheduler subclass
        spec, policy = policy, campaign.imported.imported_name(policy)
        folder = campaign.imported.runs_dir(cfg.paths.results_dir, policy)
        if not (folder / "runs.parquet").is_file() or args.resimulate:
            _delegate_vllm(cfg, args, [spec], panel, args.windows)
        extra = pl_read(folder / "runs.parquet")
        note_engine = (f"{policy} ran on the virtual vLLM engine, the campaign's schedulers on the simulator: the two are "
                       "bit-identical on runs without prefix caching (portbench conform / vllm-virtual); on sources "
                       "with prefix caching (the trace's hash blocks: mooncake) their cache rules differ, so such sides "
                       "mix two engines")
        prov = {"name": policy, "kind": "vLLM Scheduler subclass on the virtual vLLM engine (vLLM's scheduler, KV "
                "manager and preemption; the campaign's cost model in a virtual clock)", "class": spec,
                **_imported_provenance(folder, policy)}
    elif policy not in present:
        if policy not in scheduler_registry.SCHEDULERS:
            raise ParameterError("--policy", policy, "a scheduler of the campaign ("
                                 + ", ".join(present) + "), a registered plug-in (--plugin FILE), or a vLLM scheduler "
                                 "class MODULE:CLASS / FILE.py:CLASS")
        sub = claim_mod.sub_config(cfg, [policy], sources, cfg.campaign.windows_per_source)
        campaign.reuse_capacities(cfg, sub)
        print(f"[portbench] {policy} is not in the frozen campaign: simulating it on panel {panel} first",
              file=sys.stderr, flush=True)
        extra = campaign.run(sub).runs
        prov = {"name": policy, "kind": "plug-in scheduler (simulator)", **_plugin_provenance(cfg.plugins, policy)}
    else:
        extra = None
        prov = {"name": policy, "kind": "plug-in scheduler (simulator)" if _is_plugin(policy) else "built-in",
                **(_plugin_provenance(cfg.plugins, policy) if _is_plugin(policy) else {})}
    if extra is not None:
        runs, note = claim_mod.with_extra(runs, extra, policy)
    res = claim_mod.evaluate(runs, cfg.analysis_inputs, policy=policy, baseline=args.baseline, metric=args.metric,
                             panel=panel, results_dir=cfg.paths.results_dir, provenance_of_policy=prov)
    res["inputs"]["notes"] += [n for n in (note, note_engine) if n]
    res["inputs"]["portbench"] = __version__
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    for line in claim_mod.summary_lines(res):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
        print(f"json: {args.json}")
    page = claim_report.write(res, Path(args.report_dir) if args.report_dir else Path(cfg.paths.build_dir) / "report")
    print(f"report: {page} ({res['wall_s']:.1f} s)")


def pl_read(path: Path):
    if not Path(path).is_file():
        raise DataError(path, "the vLLM scheduler class's runs are missing (its campaign did not finish)")
    return pl.read_parquet(path)


def _is_plugin(name: str) -> bool:
    return sim_settings.is_plugin(name)


def _plugin_provenance(loaded, name: str) -> dict:
    """The plug-in file (or module) that registered ``name`` and its SHA-256."""

    mod = scheduler_registry.SCHEDULERS[name].__module__
    for p in plugins.specs(loaded):
        if p.module == mod:
            return {"plugin": p.path or p.spec, "sha256": p.sha256}
    return {"module": mod}


def _imported_provenance(folder: Path, name: str) -> dict:
    """The class's source SHA-256 and vLLM's version, from the fingerprint its campaign's shards carry."""
    for f in sorted((folder / "runs").glob("*.parquet"))[:1]:
        fp = ((read_meta(f) or {}).get("fingerprint") or {})
        eng = fp.get("engine") if isinstance(fp.get("engine"), dict) else fp
        found = _find_key(eng, "imported") or {}
        rec = found.get(name) or {}
        return {"source_sha256": rec.get("sha256"), "vllm": _find_key(eng, "vllm")}
    return {}


def _find_key(tree, key):
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for v in tree.values():
            got = _find_key(v, key)
            if got is not None:
                return got
    return None


def cmd_vllm_virtual(args):
    """The headline panel's runs on the simulator and on vLLM's scheduler (needs .venv-vllm)."""
    cfg = _params(args)
    from .validation import virtual_campaign

    s = virtual_campaign.check(cfg, budget_s=args.budget)
    print(json.dumps(s, indent=1, default=str))
    return 0 if virtual_campaign.passed(s) else 1      # a run without prefix caching that differs fails it


def cmd_analyze(args):
    plots_analysis.run(_params(args))


def cmd_attribute(args):
    cfg = _params(args)
    manifest = windows.load_manifest(cfg.paths)      # once for the command
    A = attribution.attribute(cfg, manifest, refreeze=args.refreeze)
    if analysis.summary_path(cfg.paths.results_dir).is_file():   # an existing summary.json gains the section
        try:
            analysis.write_summary(cfg, analysis.load(cfg, manifest))
        except DataError as e:
            print(f"[portbench] summary.json not rewritten: {e}", file=sys.stderr)
    if not args.no_figures:
        plots_attribution.make_all(cfg.paths, A, close=True, names=cfg.display_names)
        tables = windows.load_windows(cfg.data, plots_attribution.example_sources(A), manifest=manifest)
        plots_attribution.hybrid_definitions(cfg.paths, **plots_attribution.example_pair(A, tables), close=True)
    sec = A.summary
    print(attribution_text.design_markdown(sec))
    for pr in sec["pairs"].values():
        print()
        print(attribution_text.pair_markdown(pr, sec["design"]["players"]))
    print()
    print(attribution_text.joint_markdown(sec))
    print(attribution_text.load_markdown(sec))
    print(attribution_text.checks_markdown(sec))
    print(attribution_text.cost_markdown(sec))
    print(f"\ntables: {attribution.attribution_dir(cfg.paths.results_dir)}/*.parquet; section 'attribution' of summary.json")


def cmd_bench(args):
    return bench.main(_params(args), quick=args.quick)


def cmd_report(args):
    cfg = _params(args)
    summary = Path(cfg.paths.results_dir) / "summary.json"
    if not summary.is_file():
        raise PortbenchError(f"no results yet: {summary} does not exist; run the analysis first (`make all`, or "
                             "`portbench simulate` then `portbench analyze` with the same --params / --set)")
    if args.readme:
        before = Path(args.readme).read_bytes() if Path(args.readme).is_file() else None
        print(report.update_readme(args.readme, summary))
        changed = Path(args.readme).read_bytes() != before
        print(f"[portbench] {args.readme}: results block {'updated' if changed else 'unchanged'}", file=sys.stderr,
              flush=True)
    else:
        print(report.results_markdown(json.loads(summary.read_text())))


def cmd_site(args):
    cfg = _params(args)
    build = Path(cfg.paths.build_dir)
    index = site.build(args.out or build / "report", notebooks_dir=args.notebooks or build / "notebooks",
                       figures_dir=cfg.paths.figures_dir, summary_path=Path(cfg.paths.results_dir) / "summary.json",
                       docs_dir=cfg.paths.root / "docs", mkdocs_file=cfg.paths.root / "mkdocs.yml")
    print(f"results site: {index} (every figure: {index.parent / 'figures.html'})")


def cmd_validate(args):
    cfg = _params(args)
    from .validation import pipeline

    if args.analyze_only:
        s = pipeline.analyze(cfg)
    elif args.pilot:
        s = pipeline.pilot(cfg)
        print(json.dumps({k: s[k] for k in ("date", "region", "sigma_r", "planted", "wall_s")}, indent=1, default=str))
        return 0
    elif args.device == "cuda":
        from .validation import gpu
        s = gpu.run(cfg, dry_run=args.dry_run, device_budget_s=args.device_budget)
    else:
        s = pipeline.run(cfg, mode="reduced" if args.reduced else "long" if args.long else "full")
    if not s.get("ran", True):
        print(f"validation skipped: {s.get('skipped_because')}")
        return 0 if args.reduced else 1
    print(s["label"])
    for c in [*s["cases"], s["planted"]]:
        print(f"  {c.get('id', 'planted')}: {' vs '.join(c.get('pair') or [])} ({c.get('metric')}): {c.get('verdict')}"
              + (f" -- {c['reason']}" if c.get("reason") else ""))
    aa = s["aa"]
    print(f"  A/A: {aa['pairs']} pairs, sigma_r {aa['sigma_r']}, false-reversal rate {aa['false_reversal_rate']}; "
          f"planted reversal detected: {s['planted'].get('detected')}")
    return 0


def cmd_conform(args):
    """Simulator vs vLLM's own scheduler, step for step (needs .venv-vllm)."""
    cfg = _params(args)
    from .validation import conformance   # imports vLLM

    s = conformance.run(cfg, windows_per_source=args.windows, regions=tuple(args.regions),
                        schedulers=args.schedulers or None, requests_per_window=args.requests,
                        sources=args.sources or None, window_ids=args.window or None, native=args.native)
    for pol, r in s["policies"].items():
        state = "bit-identical" if r["bit_identical"] else (
            f"first divergence {r['first_divergence']['window_id']} {r['first_divergence']['region']} step "
            f"{r['first_divergence']['step']} ({r['first_divergence']['column']})" if r["first_divergence"] else "records differ")
        print(f"{pol:13s} {r['cases']:3d} cases {r['requests']:6d} requests  steps identical "
              f"{100 * r['steps_identical_share']:6.2f}%  E2E rel. diff mean {r['e2e_rel_mean']:.2e} max "
              f"{r['e2e_rel_max']:.2e}  {state}")
    for pol, r in (s.get("native") or {}).get("policies", {}).items():
        print(f"native {pol:13s} {r['cases']:3d} cases  mean E2E native vs ranked {100 * r['e2e_rel_diff_mean']:+.1f}% "
              f"(min {100 * r['e2e_rel_diff_min']:+.1f}%, max {100 * r['e2e_rel_diff_max']:+.1f}%)  preemptions "
              f"{r['preemptions_native']} vs {r['preemptions_ranked']}")
    if s.get("native"):
        print(f"native: the preemptive policies' order by mean E2E differs in {s['native']['orders_differ']} of "
              f"{len(s['native']['orders'])} (window, region)")
    print(f"wall {s['wall_s']:.0f} s (simulator {s['simulator_s']:.0f} s, vLLM {s['vllm_s']:.0f} s, "
          f"{s['vllm_steps_per_s']:.0f} vLLM steps/s)")
    cached = sum(r.get("cases_prefix_cached", 0) for r in s["policies"].values())
    if cached:
        same = sum(r.get("cases_prefix_cached_bit_identical", 0) for r in s["policies"].values())
        print(f"prefix caching on (a source with block hashes): {same} of {cached} cases bit-identical; the others differ by "
              "the named cache rule (vLLM caches 16-token blocks, the simulator whole hash blocks: docs/conformance.md). "
              "The check fails only on a case without prefix caching (--set engine.prefix_caching=off: every case).")
    return 0 if all(r.get("bit_identical_without_prefix_caching", r["bit_identical"])
                    for r in s["policies"].values()) else 1


def cmd_params(args):
    """The effective parameters (file + overrides), one leaf per line with its documentation."""
    cfg = _params(args)
    docs = parameter_docs()
    leaves = list(_leaves({k: v for k, v in cfg.tree.items() if not k.startswith("_")}))
    if args.show:
        leaves = [(k, v) for k, v in leaves if k == args.show or k.startswith(args.show + ".")]
        if not leaves:
            raise ParameterError("--show", args.show, "a parameter or section, e.g. simulation or "
                                        "analysis.alpha (`portbench params` lists them all)")
    print(f"# parameters of {cfg.paths.params_file}" + (" with --set overrides" if args.set else "")
          + (f" (run {cfg.paths.run_name!r}, not the default study: {cfg.paths.where()})"
             if cfg.paths.run_name else ""))
    for key, value in leaves:
        doc = key_doc(docs, key)
        print(f"{key} = {json.dumps(value, default=str)}" + (f"\n    {doc}" if doc and args.docs else ""))


def _leaves(tree, prefix=""):
    """``(dotted key, value)`` of every leaf of a parameter tree (an open map: one per name in it)."""
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key not in params.OPEN_MAPS:
            yield from _leaves(v, key + ".")
        elif isinstance(v, dict) and v:             # an open map: one line per name the user chose
            for name, spec in v.items():
                yield f"{key}.{name}", spec
        else:
            yield key, v


def cmd_files(args):
    """The official trace files: source, size, SHA-256, where they are looked for and downloaded from."""
    cfg = _params(args)
    st = registry.store(cfg.paths)
    print(f"data mirror: {st.mirror or 'none'} (set with DATA_MIRROR=, $PORTBENCH_DATA_MIRROR or paths.mirror)")
    for f in registry.OFFICIAL_FILES.values():
        try:
            where = str(registry.locate(f.name, st, download=False))
        except PortbenchError:
            where = "not here"
        size = f"{f.size:,} bytes" if f.size else "size not recorded"
        print(f"{f.source:10s} {f.name}  ({size}; sha256 {f.sha256 or 'not recorded'})\n"
              f"           mirror path: {f.mirror_path}; here: {where}\n"
              f"           from: {', '.join(f.urls) or 'no public URL'}")


def cmd_notebooks(args):
    notebooks.run_notebooks(args.params, args.out, only=args.only, overrides=_overrides(args) or None)


def cmd_sweep(args):
    notebooks.run_sweep(args.sweep, args.out, plugins=_plugin_paths(args))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="portbench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"portbench {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    def add(name, func, help_):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--plugin", action="append", metavar="FILE",
                       help="load a plug-in first (a .py file or a module name), e.g. one registering a "
                            "scheduler; added to the parameters' `plugins` (repeatable)")
        p.add_argument("--params", default=None, help="parameter file (default: papermill_params/default.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override one parameter, e.g. --set simulation.replicates=1 (repeatable; "
                            "`portbench params` lists every key with its value and documentation)")
        p.set_defaults(func=func)
        return p

    add("ingest", cmd_ingest, "read each source's official file into the canonical table, with a report")
    add("freeze", cmd_freeze, "freeze the windows into the manifest (or verify and materialise an existing one)") \
        .add_argument("--refreeze", action="store_true", help="rebuild the manifest even though one exists")
    add("verify", cmd_verify, "check every window in the manifest against its SHA-256")
    pa = add("params", cmd_params, "print the effective parameters (file + --set overrides), with their documentation")
    pa.add_argument("--show", metavar="KEY", help="only this parameter or section, e.g. --show analysis")
    pa.add_argument("--no-docs", dest="docs", action="store_false", help="values only")
    add("files", cmd_files, "list the official trace files: size, SHA-256, whether they are here, where from")
    add("schedulers", cmd_schedulers, "list the registered schedulers and the information each uses (with the "
        "plug-ins of --params / --set plugins=… / --plugin)")
    add("profiles", cmd_profiles, "list the hardware x model cost-model profiles (with the plug-ins of --params / "
        "--set plugins=… / --plugin)")
    add("predict", cmd_predict, "train the length predictors outside the frozen windows, freeze their predictions "
        "per window and print their accuracy") \
        .add_argument("--transfer", action="store_true",
                      help="also run the transfer campaign (prediction-based policies with every other source's predictor)")
    si = add("simulate", cmd_simulate, "run the campaign (schedulers x windows x regions x replicates)")
    si.add_argument("--backend", choices=("simulator", "vllm-virtual"), default="simulator", metavar="NAME",
                    help="simulator (default) or vllm-virtual: every run on vLLM's own scheduler (virtual clock; "
                         ".venv-vllm; shards keyed by the engine)")
    si.add_argument("--vllm-scheduler", action="append", metavar="MODULE:CLASS",
                    help="run a vLLM Scheduler subclass (mypkg.mod:MySched or path/file.py:MySched) on the virtual vLLM "
                         "engine on the panel's windows and regions, as scheduler vllm_<class> (runs in .venv-vllm, a "
                         "subprocess when needed; runs under <results>/claims/runs/vllm_<class>/; repeatable)")
    si.add_argument("--panel", default="real", help="with --vllm-scheduler: the panel whose sources it runs on "
                    "(default real)")
    si.add_argument("--windows", type=_windows_arg, default=10, metavar="N|all",
                    help="with --vllm-scheduler: the first N windows per source (default 10, the reduced panel; all: "
                         "every window)")
    vv = add("vllm-virtual", cmd_vllm_virtual, "the headline panel's runs on the simulator and on vLLM's scheduler, "
             "compared run by run and ranking by ranking (needs .venv-vllm; part of make validate)")
    vv.add_argument("--budget", type=float, default=300.0, help="seconds of runs (default 300)")
    add("analyze", cmd_analyze, "run the portability analysis on the campaign's results")
    cl = add("claim", cmd_claim, "check a claim: does 'POLICY beats BASELINE on METRIC' port across sources and regions? "
             "From the frozen campaign's runs (a plug-in or a vLLM class is simulated first); prints the verdict and "
             "writes a one-page HTML report into the results site (<report>/claims/)")
    plain_help = cl.format_help
    cl.format_help = lambda: plain_help() + "\n" + _claim_epilog()      # the names only on --help
    cl.add_argument("--policy", required=True, metavar="NAME|MODULE:CLASS",
                    help="a scheduler of the campaign, a plug-in's (with --plugin FILE) or a vLLM Scheduler subclass")
    cl.add_argument("--baseline", default="fcfs", help="the scheduler it is claimed to beat (default fcfs)")
    cl.add_argument("--metric", default="ttft_p90", help="the metric of the claim (default ttft_p90; list below)")
    cl.add_argument("--panel", default=None, help="the sources compared (default: the headline panel; list below)")
    cl.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON")
    cl.add_argument("--report-dir", default=None, help="the results site's folder (default <build>/report)")
    cl.add_argument("--windows", type=_windows_arg, default=10, metavar="N|all",
                    help="a vLLM class: the first N windows per source it runs on (default 10; all: every window)")
    cl.add_argument("--resimulate", action="store_true", help="a vLLM class: run it again even when its runs exist")
    at = add("attribute", cmd_attribute, "counterfactual attribution: which workload property (arrival pattern, prompt "
             "or output lengths, coupling, load) moves the ranking between two sources (notebook 09)")
    at.add_argument("--refreeze", action="store_true", help="rewrite the committed hybrid SHA-256s (hybrids.json beside "
                    "the window manifest) instead of verifying the rebuilt hybrids against them")
    at.add_argument("--no-figures", action="store_true", help="tables and summary only")
    add("bench", cmd_bench, "benchmark the simulator, ingest and analysis") \
        .add_argument("--quick", action="store_true", help="a representative subset (about a minute)")
    add("report", cmd_report, "print the headline results from summary.json (or write them into the README)") \
        .add_argument("--readme", default=None, help="README file whose results block to replace")
    co = add("conform", cmd_conform, "simulator vs vLLM's own V1 scheduler (virtual clock, stub model), step for "
             "step, on real windows (needs .venv-vllm: make conform)")
    co.add_argument("--windows", type=int, default=2, help="windows per real source (default 2)")
    co.add_argument("--regions", nargs="+", default=["light", "near_saturation", "severe"],
                    help="operating regions (default: light near_saturation severe)")
    co.add_argument("--schedulers", nargs="*", default=None, help="policies (default: the study's)")
    co.add_argument("--requests", type=int, default=None, help="only each window's first N requests (a quick check)")
    co.add_argument("--sources", nargs="*", default=None, help="real sources (default: every real source)")
    co.add_argument("--window", nargs="+", default=None, metavar="ID",
                    help="named windows instead of the first --windows per source (e.g. --window mooncake-25 azure-17)")
    co.add_argument("--native", action="store_true",
                    help="also run las/mlfq/rr/srpt_oracle as their vLLM-native variants (priority recomputed each "
                         "step, vLLM's own preemption) and report the E2E and order differences")
    st = add("site", cmd_site, "the results site: executed notebooks as HTML, an index page with the headline "
             "findings and every figure, and a contact sheet of all figures (make report)")
    st.add_argument("--out", default=None, help="folder of the site (default: <build>/report, build/report for the "
                    "default study)")
    st.add_argument("--notebooks", default=None, help="folder of the executed notebooks (default: <build>/notebooks)")
    va = add("validate", cmd_validate, "replay the selected cases through vLLM (CPU build in .venv-vllm, or a CUDA GPU)")
    va.add_argument("--reduced", action="store_true", help="the reduced run of `make all`: the planted case alone (2 windows x 2 pairs) and the primary cases' predictions")
    va.add_argument("--long", action="store_true", help="whole windows (make validate-long; hours on a 2-core machine)")
    va.add_argument("--pilot", action="store_true", help="the A/A pilot that measures sigma_r for the plan")
    va.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the GPU run (make gpu-validate), sized to --device-budget seconds of device time")
    va.add_argument("--device-budget", type=float, default=600.0, help="seconds the GPU run may take (default 600)")
    va.add_argument("--dry-run", action="store_true",
                    help="with --device cuda: everything but the device, on vLLM's CPU build (tiny model)")
    va.add_argument("--analyze-only", action="store_true",
                    help="the verdicts again from the last run's raw files (no engine; a GPU run's files too)")
    nb = add("notebooks", cmd_notebooks, "execute the numbered notebooks in order with papermill")
    nb.add_argument("--out", default=None, help="folder for the executed notebooks (default: build/notebooks for "
                    "the default study, build/<run name>/notebooks for any other parameter set)")
    nb.add_argument("--only", action="append", help="run only notebooks whose name starts with this (repeatable)")
    sw_help = "run notebooks over a grid of parameter sets (one folder per point)"
    sw = sub.add_parser("sweep", help=sw_help, description=sw_help + ". The sweep file names its base parameter "
                        "file (`base:`) and the grid of dotted parameters, so sweep takes no --params / --set: "
                        "change them in the sweep file or its base.")
    sw.add_argument("sweep", help="sweep file, e.g. papermill_params/sweeps/profile_x_horizon.yaml")
    sw.add_argument("--out", default="build/sweeps", help="folder of the sweeps (default: build/sweeps); each "
                    "point under <out>/<sweep name>/<point>/")
    sw.add_argument("--plugin", action="append", metavar="FILE",
                    help="load a plug-in in every point (a .py file or a module name; repeatable)")
    sw.set_defaults(func=cmd_sweep)
    return ap


def _claim_epilog() -> str:
    """The metric and panel names for ``portbench claim --help`` (the default parameters')."""
    try:
        tree = params.read(None)
        panels = ", ".join((tree.get("analysis") or {}).get("panels") or {})
        metrics = ", ".join(metric_registry.metric_names((tree.get("simulation") or {}).get("slo")))
    except PortbenchError:
        panels, metrics = "(the parameter file's analysis.panels)", "(`portbench params --show analysis.metrics`)"
    return (f"metrics: {metrics}\npanels: {panels} (default: the headline panel)\n"
            "example: portbench claim --policy sjf_prompt --baseline fcfs --metric ttft_p90 --panel real --json c.json\n")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.func(args)
        sys.stdout.flush()
    except PortbenchError as e:
        print(f"portbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`portbench schedulers | head`): not an error; stop writing quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
