"""``portbench`` command line: the pipeline's stages outside the notebooks (thin over the library)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from . import bench, notebooks, params, validation
from .core.errors import PortbenchError
from .data import traces, windows
from .present import plots_analysis, report, text
from .study import campaign


def _params(args):
    return params.load(args.params, params.undot(dict(_kv(o) for o in args.set or [])))


def _kv(item: str):
    if "=" not in item:
        raise PortbenchError(f"--set {item!r}: expected KEY=VALUE, e.g. simulation.replicates=1")
    k, v = item.split("=", 1)
    return k, yaml.safe_load(v)


def cmd_ingest(args):
    report = traces.ingest_all(_params(args))
    print(text.format_report(report))


def cmd_freeze(args):
    manifest = windows.freeze(_params(args), refreeze=args.refreeze)
    print(f"manifest: {len(manifest['windows'])} windows")


def cmd_verify(args):
    ok, total, problems = windows.verify(_params(args))
    for p in problems:
        print(f"MISMATCH {p}", file=sys.stderr)
    print(f"{ok}/{total} windows verified")
    return 0 if ok == total and not problems else 1


def cmd_schedulers(args):
    print(text.schedulers_markdown())


def cmd_profiles(args):
    print(text.profiles_markdown())


def cmd_simulate(args):
    campaign.run(_params(args))


def cmd_analyze(args):
    plots_analysis.run(_params(args))


def cmd_bench(args):
    return bench.main(_params(args), quick=args.quick)


def cmd_report(args):
    cfg = _params(args)
    summary = Path(cfg.paths.results_dir) / "summary.json"
    if args.readme:
        print(report.update_readme(args.readme, summary))
    else:
        print(report.results_markdown(json.loads(summary.read_text())))


def cmd_validate(args):
    validation.run(_params(args))


def cmd_notebooks(args):
    notebooks.run_notebooks(args.params, args.out, only=args.only, overrides=None)


def cmd_sweep(args):
    notebooks.run_sweep(args.sweep, args.out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="portbench", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    def add(name, func, help_, params=True):
        p = sub.add_parser(name, help=help_, description=help_)
        if params:
            p.add_argument("--params", default=None, help="parameter file (default: papermill_params/default.yaml)")
            p.add_argument("--set", action="append", metavar="KEY=VALUE",
                           help="override one parameter, e.g. --set simulation.replicates=1 (repeatable)")
        p.set_defaults(func=func)
        return p

    add("ingest", cmd_ingest, "read each source's official file into the canonical table, with a report")
    add("freeze", cmd_freeze, "freeze the windows into the manifest (or verify and materialise an existing one)") \
        .add_argument("--refreeze", action="store_true", help="rebuild the manifest even though one exists")
    add("verify", cmd_verify, "check every window in the manifest against its SHA-256")
    add("schedulers", cmd_schedulers, "list the registered schedulers and the information each uses", params=False)
    add("profiles", cmd_profiles, "list the hardware x model cost-model profiles", params=False)
    add("simulate", cmd_simulate, "run the campaign (schedulers x windows x regions x replicates)")
    add("analyze", cmd_analyze, "run the portability analysis on the campaign's results")
    add("bench", cmd_bench, "benchmark the simulator, ingest and analysis") \
        .add_argument("--quick", action="store_true", help="a representative subset (about a minute)")
    add("report", cmd_report, "print the headline results from summary.json (or write them into the README)") \
        .add_argument("--readme", default=None, help="README file whose results block to replace")
    add("validate", cmd_validate, "replay the selected cases through vLLM (needs a GPU and the [gpu] extra)")
    nb = add("notebooks", cmd_notebooks, "execute the numbered notebooks in order with papermill")
    nb.add_argument("--out", default="build/notebooks", help="folder for the executed notebooks")
    nb.add_argument("--only", action="append", help="run only notebooks whose name starts with this (repeatable)")
    sw = sub.add_parser("sweep", help="run notebooks over a grid of parameter sets (one folder per point)")
    sw.add_argument("sweep", help="sweep file, e.g. papermill_params/sweeps/profiles.yaml")
    sw.add_argument("--out", default="build/sweeps")
    sw.set_defaults(func=cmd_sweep)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.func(args)
    except PortbenchError as e:
        print(f"portbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
