"""Shared test fixtures. Tests use data shipped in the repo or the mirror in ../shared/traces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# Tests never touch the network: absent official files are not downloaded (tests of the download
# path patch pooch and clear this variable themselves).
os.environ.setdefault("PORTBENCH_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = (ROOT.parent / "shared" / "traces").resolve()


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The data mirror with the real trace files (../shared/traces)."""
    mirror = Path(os.environ.get("PORTBENCH_DATA_MIRROR") or SHARED_TRACES)
    if not (mirror / "azure2023" / "AzureLLMInferenceTrace_conv.csv").is_file():
        pytest.skip(f"data mirror with the Azure trace not found at {mirror}")
    return mirror


@pytest.fixture()
def tmp_params(tmp_path):
    """A loader of parameters whose data, results and figures go under tmp_path."""
    from portbench import params

    def make(base: str = "papermill_params/smoke.yaml", **overrides):
        o = {"paths.data_dir": str(tmp_path / "data"), "paths.results_dir": str(tmp_path / "results"),
             "paths.figures_dir": str(tmp_path / "figures")}
        o.update(overrides)
        return params.load(base, params.undot(o))

    return make
