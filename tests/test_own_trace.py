"""A user's own trace runs through the whole pipeline as one more source, labelled by its own name,
recorded as the user's file (never as an official one); and the whole compendium (`make all`, every
notebook) runs under a parameter file that adds a source in a format no official adapter reads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import nbformat
import polars as pl
import pytest
import yaml

from portbench import params
from portbench.core import io
from portbench.core.errors import ParameterError
from portbench.data import registry, traces, windows
from portbench.study import analysis, campaign

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = Path(__file__).with_name("plugins") / "myschedulers.py"


@pytest.fixture()
def own_params(tmp_path, shared_traces):
    # the user's trace: the real Azure *code* trace, copied to a path of the user's choosing
    mine = tmp_path / "my_trace.csv"
    mine.write_bytes((shared_traces / "azure2023" / "AzureLLMInferenceTrace_code.csv").read_bytes())
    o = {"paths.data_dir": str(tmp_path / "data"), "paths.results_dir": str(tmp_path / "results"),
         "paths.figures_dir": str(tmp_path / "figures"), "paths.manifest": str(tmp_path / "manifest.json"),
         "paths.mirror": str(shared_traces),
         "sources": {"burstgpt": None, "bailian": None, "azure_code": None, "mooncake": None,
                     "mytrace": {"mode": "real", "file": str(mine)}},
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
    resolved = registry.resolve_sources(P.paths, P.sources, P.standins)
    assert resolved["mytrace"]["provenance"] == "real" and "burstgpt" not in resolved
    assert resolved["mytrace"]["origin"] == "user" and resolved["azure"]["origin"] == "official"
    table = traces.load_canonical(P.data, "mytrace")
    assert table.height == 8819 and set(table["source"].unique()) == {"mytrace"}

    manifest = windows.freeze(P)
    ids = [w["id"] for w in manifest["windows"] if w["source"] == "mytrace"]
    assert ids == [f"mytrace-{i:02d}" for i in range(4)]
    assert io.sha256_of(mine) in manifest["source_files"].values()
    rec = manifest["sources"]["mytrace"]
    assert rec["origin"] == "user" and rec["provenance"] == "real"
    assert "user file" in rec["reason"] and "official file" not in rec["reason"].replace("not an official file", "")
    assert "verified" not in rec["reason"]
    assert windows.verify(P)[:2] == (8, 8)

    runs = campaign.run(P, progress=False, verbose=False).runs
    assert set(runs["source"]) == {"azure", "mytrace"}
    assert runs.filter(pl.col("source") == "mytrace")["provenance"].unique().to_list() == ["real"]
    A = analysis.compute(P.analysis_inputs, runs)
    pair = A["cross_source_tau"].select("source_1", "source_2").unique().rows()
    assert pair == [("azure", "mytrace")]
    assert A.summary["provenance"]["mytrace"]["label"] == "mytrace"   # default display name: the source's name
    assert A.summary["provenance"]["azure"]["label"] == "Azure"


def test_own_source_needs_a_file_and_a_sane_name():
    with pytest.raises(ParameterError, match="sources.mine"):
        params.load(overrides={"sources": {"mine": {"mode": "auto"}}})
    with pytest.raises(ParameterError, match="stand-in"):
        params.load(overrides={"sources": {"mine": {"mode": "standin", "file": "x.csv"}}})
    with pytest.raises(ParameterError, match="source name"):
        params.load(overrides={"sources": {"My Trace!": {"mode": "real", "file": "x.csv"}}})
    with pytest.raises(ParameterError, match="sources.mine.colour"):
        params.load(overrides={"sources": {"mine": {"file": "x.csv", "colour": "red"}}})
    with pytest.raises(ParameterError, match="sources.mine.columns.prompt_tokens"):
        params.load(overrides={"sources": {"mine": {"file": "x.csv", "columns": {"arrival": "t", "output_tokens": "o"}}}})
    with pytest.raises(ParameterError, match="sources.mine.block_size"):
        params.load(overrides={"sources": {"mine": {"file": "x.csv", "columns": {
            "arrival": "t", "prompt_tokens": "p", "output_tokens": "o", "block_hashes": "h"}}}})
    with pytest.raises(ParameterError, match="sources.mine.time_unit"):
        params.load(overrides={"sources": {"mine": {"file": "x.csv", "time_unit": "minutes"}}})


def test_extends_finds_the_projects_own_files_by_name(tmp_path):
    own = tmp_path / "elsewhere" / "mine.yaml"
    own.parent.mkdir()
    own.write_text("extends: smoke.yaml\nwindows: {per_source: 2}\n")
    P = params.load(own)
    assert P.windows.per_source == 2 and P.simulation.replicates == 1   # smoke's value, found by name
    own.write_text("extends: default.yaml\n")
    assert params.load(own).simulation.replicates == params.load().simulation.replicates
    own.write_text("extends: no_such_file.yaml\n")
    with pytest.raises(ParameterError, match="extends.*looked at"):
        params.load(own)


def _user_parquet(path: Path, shared_traces: Path, rows: int = 1500) -> Path:
    """A trace in a format no official adapter reads: parquet, ISO date-times, other column names, tenants."""
    raw = pl.read_csv(shared_traces / "azure2023" / "AzureLLMInferenceTrace_code.csv").head(rows)
    df = raw.select(pl.col("TIMESTAMP").str.to_datetime("%Y-%m-%d %H:%M:%S%.f").dt.strftime("%Y-%m-%dT%H:%M:%S%.6f")
                    .alias("when"),
                    pl.col("ContextTokens").alias("n_in"), pl.col("GeneratedTokens").alias("n_out"),
                    (pl.int_range(pl.len()) % 3).cast(pl.String).map_elements(lambda k: f"team-{k}",
                                                                               return_dtype=pl.String).alias("team"))
    df.write_parquet(path)
    return path


@pytest.mark.slow
def test_make_all_with_a_user_source_in_a_format_without_official_adapter(tmp_path, shared_traces):
    """`make all PARAMS=<file>` runs every notebook end to end with a parquet source of the user's own
    (generic adapter), the built-in sources it keeps, and a scheduler plug-in named in the parameters."""
    trace = _user_parquet(tmp_path / "service_log.parquet", shared_traces)
    build = tmp_path / "build"
    pfile = tmp_path / "study" / "mine.yaml"
    pfile.parent.mkdir()
    pfile.write_text(f"""# a user's own study, outside papermill_params/
extends: smoke.yaml
plugins: [{PLUGIN}]
paths:
  data_dir: {tmp_path / 'data'}
  results_dir: {tmp_path / 'results'}
  figures_dir: {tmp_path / 'figures'}
  manifest: {tmp_path / 'data' / 'manifest.json'}
  mirror: {shared_traces}
sources:
  burstgpt: null
  bailian: null
  azure_code: null
  myservice:
    file: {trace}
    columns: {{arrival: when, prompt_tokens: n_in, output_tokens: n_out, tenant: team}}
    time_unit: datetime
    label: My service
windows: {{per_source: 3, size: 50}}
simulation:
  schedulers: [fcfs, sjf_prompt, aging_sjf, lpf]
  regions: [light, overload]
analysis: {{bootstrap: 20}}
""")
    env = {**os.environ, "PORTBENCH_OFFLINE": "1"}
    proc = subprocess.run(["make", "all", f"PARAMS={pfile}", f"BUILD={build}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = build / params.load(pfile, validate=False).paths.run_name   # a non-default run: BUILD/<run name>/ (mine-<hash>)
    nbs = sorted((run / "notebooks").glob("0*.ipynb"))
    assert [p.name for p in nbs] == sorted(p.name for p in (ROOT / "notebooks").glob("0*.ipynb"))
    for p in nbs:
        nb = nbformat.read(p, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{p.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    text = json.dumps(nbformat.read(run / "notebooks" / "01_ingest.ipynb", as_version=4).dict())
    assert "My service" in text and "user file" in text
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["sources"]["myservice"]["origin"] == "user"
    assert [e["id"] for e in manifest["windows"] if e["source"] == "myservice"] == [f"myservice-0{k}" for k in range(3)]
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["provenance"]["myservice"]["label"] == "My service"
    assert {"aging_sjf", "lpf"} <= set(summary["parameters"]["schedulers"])
    runs = pl.read_parquet(tmp_path / "results" / "runs.parquet")
    assert set(runs["source"]) == {"azure", "mooncake", "myservice"}
    tenants = pl.read_parquet(tmp_path / "data" / "windows" / "windows.parquet")
    assert tenants.filter(pl.col("window_id").str.starts_with("myservice"))["tenant"].unique().sort().to_list() == \
        ["team-0", "team-1", "team-2"]


def _readme_example() -> str:
    """The parameter file of the README's "Does it port to my workload?" section, as written there."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Does it port to my workload?"):]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def _tracked_state() -> tuple[str, str]:
    """``git status`` of the tracked files and the diff of their content (what a run must not change)."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return git("status", "--porcelain", "--untracked-files=no"), git("diff", "HEAD", "--binary")


@pytest.mark.slow
def test_the_readme_example_runs_through_make_all_and_writes_no_tracked_file(tmp_path, shared_traces):
    """The README's bring-your-own example, unchanged, on a 3,993-request trace (the issue's size: too small for 40
    windows of 200), sized like smoke.yaml by a second file outside the repository that extends it: `make all`
    runs every notebook; the trace gets 19 windows (the built-ins keep 40) with the one-line note before any
    notebook; the study's manifest and hybrids live in its own build folder; `portbench freeze --refreeze` and
    `portbench attribute --refreeze` on it rewrite only those; and no file git tracks changed (``git status``)."""
    before = _tracked_state()
    committed = {p: (ROOT / p).read_bytes() for p in ("data/windows/manifest.json", "data/windows/hybrids.json")}
    # the user's trace: 3,993 real requests (the Azure code trace's first), in the example's columns and unit (ms)
    raw = pl.read_csv(shared_traces / "azure2023" / "AzureLLMInferenceTrace_code.csv").head(3993)
    t = raw["TIMESTAMP"].str.to_datetime("%Y-%m-%d %H:%M:%S%.f")
    pl.DataFrame({"ts": ((t - t[0]).dt.total_microseconds() / 1000).round(3), "in_tok": raw["ContextTokens"],
                  "out_tok": raw["GeneratedTokens"]}).write_csv(tmp_path / "my_trace.csv")
    (tmp_path / "myschedulers.py").write_bytes(PLUGIN.read_bytes())
    (tmp_path / "my_study.yaml").write_text(_readme_example())
    smoke = yaml.safe_load((ROOT / "papermill_params" / "smoke.yaml").read_text())
    smoke.pop("extends"), smoke.pop("paths")            # smoke's sizes, not its folders
    smoke["simulation"]["schedulers"] += ["aging_sjf", "lpf"]
    sized = tmp_path / "sized.yaml"
    sized.write_text(yaml.safe_dump({"extends": "my_study.yaml", **smoke}, sort_keys=False))
    build = tmp_path / "build"
    env = {**os.environ, "PORTBENCH_OFFLINE": "1", "PORTBENCH_DATA_MIRROR": str(shared_traces)}
    proc = subprocess.run(["make", "-o", ".venv/.installed", "all", f"PARAMS={sized}", f"BUILD={build}",
                           f"VLLM_VENV={tmp_path / 'no-vllm'}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=3600)     # one stream: the order is kept
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out and "KeyboardInterrupt caught in kernel" not in out, out[-4000:]
    assert "mytrace: my_trace.csv has 3,993 records (at most): 19 windows of 200" in out
    assert out.index("19 windows of 200") < out.index("01_ingest.ipynb ...")      # before any notebook
    run = build / params.build(params.read(sized)).paths.run_name
    manifest = json.loads((run / "windows" / "manifest.json").read_text())
    counts = {s: sum(e["source"] == s for e in manifest["windows"]) for s in manifest["sources"]}
    assert counts["mytrace"] == 19 and {n for s, n in counts.items() if s != "mytrace"} == {40}
    assert (run / "windows" / "hybrids.json").is_file()
    summary = json.loads((run / "results" / "summary.json").read_text())
    assert summary["headline_panel"] == "user" and "mytrace" in summary["panels"]["user"]["sources"]
    assert {"aging_sjf", "lpf"} <= set(summary["parameters"]["schedulers"])
    for cmd in (["freeze", "--refreeze"], ["attribute", "--refreeze"]):
        r = subprocess.run([str(ROOT / ".venv" / "bin" / "portbench"), *cmd, "--params", str(sized)], cwd=ROOT,
                           env={**env, "PORTBENCH_BUILD": str(build)}, capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert _tracked_state() == before, "a tracked file changed"
    assert all((ROOT / p).read_bytes() == b for p, b in committed.items())
