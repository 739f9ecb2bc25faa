"""Smoke run: every numbered notebook end to end under papermill_params/smoke.yaml."""

from __future__ import annotations

import hashlib
import json

import nbformat
import polars as pl
import pytest

from portbench import params
from portbench.data import registry, windows
from portbench.core import figindex, outputs
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


def _figure_hashes(figures_dir) -> dict[str, str]:
    """SHA-256 of every file under ``figures_dir`` (relative path -> hash) except the measured figures (engine
    timings: their bytes differ on every run) and their indexes."""
    measured = {e[k] for e in figindex.read_all(figures_dir).values() if e.get("measured") for k in ("file", "pdf")}
    out = {}
    for p in sorted(figures_dir.rglob("*")):
        rel = p.relative_to(figures_dir).as_posix()
        if p.is_file() and rel not in measured and not (p.name == figindex.INDEX_FILE and p.parent != figures_dir) \
                and p.name != outputs.MARKER:     # the output-folder marker records what was written, not a figure
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_all_notebooks_run_under_smoke_params(tmp_path, shared_traces, monkeypatch):
    """Every notebook runs end to end (kernels under PYTHONHASHSEED=1); then every notebook that saved a figure
    runs again under PYTHONHASHSEED=2 on the same data and results (the campaign, predictors, analysis and
    attribution are reused, so the second pass mostly draws: ~60% of the first pass's time) into another figures
    folder: every figure file and the figure index must be byte-identical (no set iteration order reaches a
    figure; measured figures, engine timings, excepted)."""
    paths = {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results")}
    figs = {seed: tmp_path / f"figures-seed{seed}" for seed in ("1", "2")}
    monkeypatch.setenv("PYTHONHASHSEED", "1")            # the kernels inherit the environment
    overrides = {"paths": {**paths, "figures_dir": str(figs["1"])}}
    done = run_notebooks("papermill_params/smoke.yaml", tmp_path / "notebooks", overrides=overrides)
    assert [p.name for p in done] == [p.name for p in notebook_paths()]
    for p in done:  # every executed notebook ran every code cell without an error output
        nb = nbformat.read(p, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{p.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    pngs = sorted(figs["1"].rglob("*.png"))
    assert len(pngs) >= 10 and all(p.with_suffix(".pdf").is_file() for p in pngs)
    # every executed notebook that saves a figure also shows it (embedded PNG outputs; an Agg backend in the
    # kernels would leave the text's "the figure shows ..." without a figure)
    index = figindex.read_all(figs["1"])
    makers = {e["notebook"][:2] for e in index.values()}
    for p in done:
        if p.name[:2] in makers:
            nb = nbformat.read(p, as_version=4)
            images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                         for o in c.get("outputs", []))
            assert images >= 1, f"{p.name} saves figures but shows none"
    # every cross-source figure exists per available panel (the headline panel's without a suffix)
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    others = [n for n, p in summary["panels"].items() if p["available"] and n != summary["headline_panel"]]
    assert others, "the smoke run has both panels (study and real): a second available panel is expected"
    for panel in others:
        for name in ("04_cross_workload/tau_forest", "04_cross_workload/kendall_w_sources", "06_reversals/reversal_funnel",
                     "06_reversals/reversal_forest", "07_cross_metric/top1_pairs", "07_cross_metric/winners"):
            assert f"{name}_{panel}" in index, f"{name} missing for panel {panel}"
    # figure bytes do not depend on the interpreter's hash seed: every notebook that saved a figure, again under
    # another seed (the others, e.g. 10, draw nothing)
    monkeypatch.setenv("PYTHONHASHSEED", "2")
    again = run_notebooks("papermill_params/smoke.yaml", tmp_path / "notebooks-seed2", only=sorted(makers),
                          overrides={"paths": {**paths, "figures_dir": str(figs["2"])}})
    assert sorted(p.name[:2] for p in again) == sorted(makers)
    h1, h2 = _figure_hashes(figs["1"]), _figure_hashes(figs["2"])
    assert len(h1) >= 20 and "07_cross_metric/cd_diagrams.png" in h1
    differ = sorted(k for k in h1.keys() | h2.keys() if h1.get(k) != h2.get(k))
    assert not differ, f"figure files that differ between PYTHONHASHSEED=1 and 2: {differ}"
    for key in ("cross_source", "cross_region", "reversals", "cross_metric", "attribution"):
        assert key in summary
    for pr in summary["attribution"]["pairs"].values():      # notebook 09: shares with CIs per source pair
        assert all("ci" in v for v in pr["shares"].values())
    _no_stand_in_shown_as_real(tmp_path / "results", summary)


def _no_stand_in_shown_as_real(results, summary):
    """Every result table with a source column carries the manifest's provenance; labels say '(stand-in)'."""
    prov = sources.provenance_from_manifest(json.loads(windows.manifest_path(params.load().paths).read_text()))
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
    manifest = windows.load_manifest(P.paths)
    here = params.load(overrides={"paths.mirror": str(shared_traces)})
    resolved = registry.resolve_sources(here.paths, here.sources, here.standins)
    for w in manifest["windows"]:
        assert w["provenance"] == resolved[w["source"]]["provenance"], w["id"]
        assert w["synthetic"] == (w["provenance"] == "standin"), w["id"]
        if w["synthetic"]:
            assert w["row_start"] is None and w["generator"]["seed"] is not None, w["id"]
        else:
            assert w["row_end"] - w["row_start"] + 1 == w["n_requests"], w["id"]
