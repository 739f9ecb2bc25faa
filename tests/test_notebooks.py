"""Smoke run: every numbered notebook end to end under papermill_params/smoke.yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import polars as pl
import pytest

from portbench import params
from portbench.data import registry, windows
from portbench.core import provenance as sources
from portbench.notebooks import notebook_paths, run_notebooks

pytestmark = pytest.mark.slow


def test_notebooks_are_committed_without_outputs():
    for nb_path in notebook_paths():
        nb = nbformat.read(nb_path, as_version=4)
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), nb_path.name
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{nb_path.name}: exactly one cell tagged 'parameters'"
        assert "params_file" in tagged[0].source and "overrides" in tagged[0].source


def test_all_notebooks_run_under_smoke_params(tmp_path, shared_traces):
    overrides = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results"),
                           "figures_dir": str(tmp_path / "figures")}}
    done = run_notebooks("papermill_params/smoke.yaml", tmp_path / "notebooks", overrides=overrides)
    assert [p.name for p in done] == [p.name for p in notebook_paths()]
    for p in done:  # every executed notebook ran every code cell without an error output
        nb = nbformat.read(p, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{p.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    pngs = sorted((tmp_path / "figures").rglob("*.png"))
    assert len(pngs) >= 10 and all(p.with_suffix(".pdf").is_file() for p in pngs)
    # every executed notebook that saves a figure also shows it (embedded PNG outputs; an Agg backend in the
    # kernels would leave the text's "the figure shows ..." without a figure)
    index = json.loads((tmp_path / "figures" / "index.json").read_text())
    makers = {e["notebook"][:2] for e in index.values()}
    for p in done:
        if p.name[:2] in makers:
            nb = nbformat.read(p, as_version=4)
            images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                         for o in c.get("outputs", []))
            assert images >= 1, f"{p.name} saves figures but shows none"
    # figure bytes do not depend on the interpreter's hash seed (set iteration order): notebook 07's
    # critical-difference diagrams and notebook 05's bump charts drawn under two seeds are identical
    code = ("import sys, hashlib, pathlib; from portbench import params; from portbench.study import analysis; "
            "from portbench.present import plots_analysis as pa; "
            f"cfg = params.load('papermill_params/smoke.yaml', {overrides!r} | "
            "{'paths': {**" + repr(overrides['paths']) + ", 'figures_dir': sys.argv[1]}}); "
            "A = analysis.load(cfg); pa.cd_diagrams(cfg, A, close=True); pa.bump_charts(cfg, A, close=True); "
            "print(sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in pathlib.Path(sys.argv[1]).rglob('*.p*')))")
    outs = []
    for seed in ("1", "2"):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"fig-seed{seed}")], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed, "MPLBACKEND": "Agg"}, cwd=params.project_root())
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout)
    assert outs[0] == outs[1] and "cd_diagrams.png" in outs[0]
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    for key in ("cross_source", "cross_region", "reversals", "cross_metric", "attribution"):
        assert key in summary
    for pr in summary["attribution"]["pairs"].values():      # notebook 10: shares with CIs per source pair
        assert all("ci" in v for v in pr["shares"].values())
    _no_stand_in_shown_as_real(tmp_path / "results", summary)


def _no_stand_in_shown_as_real(results, summary):
    """Every result table with a source column carries the manifest's provenance; labels say '(stand-in)'."""
    prov = sources.provenance_from_manifest(json.loads(windows.manifest_path(params.load()).read_text()))
    tables = sorted(results.rglob("*.parquet"))
    assert tables
    for path in tables:
        df = pl.read_parquet(path)
        for src_col in [c for c in df.columns if c == "source" or c.startswith("source_")]:
            prov_col = src_col.replace("source", "provenance")
            assert prov_col in df.columns, f"{path.name}: {src_col} without {prov_col}"
            pairs = df.select(src_col, prov_col).unique().iter_rows()
            for s, p in pairs:
                assert p == prov[s], f"{path.name}: {s} labelled {p}, manifest says {prov[s]}"
    for s, entry in summary["provenance"].items():
        assert entry["provenance"] == prov[s]
        assert entry["label"] == sources.label(s, prov[s], params.load().display_names)
        assert ("(stand-in)" in entry["label"]) == (prov[s] == "standin")


def test_committed_manifest_labels_match_the_data_available(shared_traces):
    """A source is real in the manifest only if its official file is present; stand-ins are synthetic."""
    P = params.load()
    manifest = windows.load_manifest(P)
    resolved = registry.resolve_sources(params.load(overrides={"paths.mirror": str(shared_traces)}))
    for w in manifest["windows"]:
        assert w["provenance"] == resolved[w["source"]]["provenance"], w["id"]
        assert w["synthetic"] == (w["provenance"] == "standin"), w["id"]
        if w["synthetic"]:
            assert w["row_start"] is None and w["generator"]["seed"] is not None, w["id"]
        else:
            assert w["row_end"] - w["row_start"] + 1 == w["n_requests"], w["id"]
