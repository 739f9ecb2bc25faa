"""A user's own trace runs through the whole pipeline as one more source, labelled by its own name."""

from __future__ import annotations

import polars as pl
import pytest

from portbench.study import analysis, campaign
from portbench import params
from portbench.core import io
from portbench.data import registry, traces, windows
from portbench.core.errors import ParameterError


@pytest.fixture()
def own_params(tmp_path, shared_traces):
    # the user's trace: the real Azure *code* trace, copied to a path of the user's choosing
    mine = tmp_path / "my_trace.csv"
    mine.write_bytes((shared_traces / "azure2023" / "AzureLLMInferenceTrace_code.csv").read_bytes())
    o = {"paths.data_dir": str(tmp_path / "data"), "paths.results_dir": str(tmp_path / "results"),
         "paths.figures_dir": str(tmp_path / "figures"), "paths.manifest": str(tmp_path / "manifest.json"),
         "paths.mirror": str(shared_traces),
         "sources": {"burstgpt": None, "bailian": None, "mytrace": {"mode": "real", "file": str(mine)}},
         "windows": {"per_source": 4, "size": 60},
         "simulation": {"schedulers": ["fcfs", "sjf_oracle", "sarathi"], "regions": ["busy", "overload"],
                        "replicates": 1},
         "campaign": {"workers": 1, "request_records": {"windows_per_source": 0}},
         "analysis": {"bootstrap": 20, "metrics": ["e2e_mean", "ttft_p99", "slo_medium"],
                      "headline_metrics": ["e2e_mean"]}}
    return params.load("papermill_params/default.yaml", params.undot(o)), mine


def test_own_trace_is_ingested_frozen_simulated_and_analysed(own_params):
    P, mine = own_params
    assert P.source_names() == ["azure", "mytrace"]
    resolved = registry.resolve_sources(P)
    assert resolved["mytrace"]["provenance"] == "real" and "burstgpt" not in resolved
    table = traces.load_canonical(P, "mytrace")
    assert table.height == 8819 and set(table["source"].unique()) == {"mytrace"}

    manifest = windows.freeze(P)
    ids = [w["id"] for w in manifest["windows"] if w["source"] == "mytrace"]
    assert ids == [f"mytrace-{i:02d}" for i in range(4)]
    assert io.sha256_of(mine) in manifest["source_files"].values()
    assert windows.verify(P)[:2] == (8, 8)

    runs = campaign.run(P, progress=False, verbose=False).runs
    assert set(runs["source"]) == {"azure", "mytrace"}
    assert runs.filter(pl.col("source") == "mytrace")["provenance"].unique().to_list() == ["real"]
    A = analysis.compute(P)
    pair = A["cross_source_tau"].select("source_1", "source_2").unique().rows()
    assert pair == [("azure", "mytrace")]
    assert A.summary["provenance"]["mytrace"]["label"] == "mytrace"


def test_own_source_needs_a_file_and_a_sane_name():
    with pytest.raises(ParameterError, match="sources.mine"):
        params.load(overrides={"sources": {"mine": {"mode": "auto"}}})
    with pytest.raises(ParameterError, match="stand-in"):
        params.load(overrides={"sources": {"mine": {"mode": "standin", "file": "x.csv"}}})
    with pytest.raises(ParameterError, match="source name"):
        params.load(overrides={"sources": {"My Trace!": {"mode": "real", "file": "x.csv"}}})
