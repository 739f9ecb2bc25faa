"""Smoke run: every numbered notebook end to end under papermill_params/smoke.yaml."""

from __future__ import annotations

import json

import nbformat
import pytest

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
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    for key in ("cross_source", "cross_region", "reversals", "cross_metric"):
        assert key in summary
    for fig in summary.get("figures", []):
        assert "provenance" in json.dumps(summary) and fig
