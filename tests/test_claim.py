"""``portbench claim`` (issue #40): a claim checked with the headline's own tests, on planted run tables.

* the sides of a pair are the classes the headline's ``ports`` table gives that pair (the same function on the same
  ranking), for every source x region;
* a planted effect on every side is found (verdict ``holds``), a planted reversal on one region of one source is
  found and located (verdict ``reverses``, the comparisons that reverse), and a planted null is not called strong;
* the effect's interval covers the planted effect; the JSON has the issue's keys;
* the command: the verdict, the JSON and a self-contained HTML page under ``<site>/claims/``; a misspelt policy,
  metric or panel is one message listing the valid names (no traceback); ``--help`` lists metrics and panels.
"""

from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
import pytest

from planted import Effect, make_runs
from portbench import cli, params
from portbench.core.errors import ParameterError, PortbenchError
from portbench.present import claim_report
from portbench.study import claim
from portbench.study.analysis import ports
from portbench.study.analysis.cube import build_cube, metric_names, settings
from portbench.study.analysis.reversals import tenant_na
from portbench.study.analysis.ties import deltas

SOURCES = ("azure", "burstgpt", "bailian")
REGIONS = {"light": 0.3, "busy": 0.7, "overload": 1.2}
SCHEDS = ("fcfs", "sjf_prompt", "las", "random")


@pytest.fixture(scope="module")
def cfg():
    c = params.load(None, {"analysis": {"bootstrap": 200, "panels": {"study": list(SOURCES)}}}, validate=False)
    return c


def _runs(effects, seed=0, noise_sd=0.08):
    return make_runs(schedulers=SCHEDS, sources=SOURCES, regions=REGIONS, metrics=("ttft_p90", "e2e_mean"),
                     n_windows=16, replicates=1, skill={k: 0.0 for k in SCHEDS}, effects=effects,
                     provenance={s: "real" for s in SOURCES}, seed=seed, noise_sd=noise_sd)


def _everywhere(shift, scheduler="sjf_prompt", but=()):
    return [Effect(scheduler, s, r, "ttft_p90", shift if (s, r) not in but else -shift)
            for s in SOURCES for r in REGIONS]


def _evaluate(cfg, runs, policy="sjf_prompt", baseline="fcfs", metric="ttft_p90"):
    return claim.evaluate(runs, cfg.analysis_inputs, policy=policy, baseline=baseline, metric=metric, panel="study",
                          scheduler_order=list(SCHEDS))


def test_sides_are_the_headlines_classes(cfg):
    runs = _runs(_everywhere(0.4, but={("bailian", "overload")}) + [Effect("las", "azure", "busy", "ttft_p90", 0.1)])
    res = _evaluate(cfg, runs)
    # the headline's classes of the same ranking, through its own table
    a = cfg.analysis_inputs
    st = settings(a.analysis, a.window_size)
    cube = build_cube(runs, metric_spec=["ttft_p90"], all_metrics=metric_names(a.simulation.slo),
                      scheduler_order=list(SCHEDS))
    point, _ = ports.source_classes(cube, [0], st, deltas(cube, st), tenant_na(cube), sources=list(SOURCES))
    table = ports.ports_table(cube, point, list(SOURCES), [0], "study").filter(
        (pl.col("kind") == "across_regions") & (pl.col("a") == "fcfs") & (pl.col("b") == "sjf_prompt"))
    head = {}
    for r in table.iter_rows(named=True):
        head[(r["source_1"], r["region_1"])] = r["side_1"]
        head[(r["source_1"], r["region_2"])] = r["side_2"]
    mine = {(s["source"], s["region"]): (s["class"] if s["class"] != "strong" else
                                         ("a" if s["better"] == "fcfs" else "b")) for s in res["sides"]}
    assert mine == head and len(mine) == len(SOURCES) * len(REGIONS)


def test_planted_effect_holds_and_its_interval_covers_it(cfg):
    res = _evaluate(cfg, _runs(_everywhere(0.4)))
    assert res["verdict"] == "holds"
    assert {s["class"] for s in res["sides"]} == {"strong"} and {s["better"] for s in res["sides"]} == {"sjf_prompt"}
    # a latent shift of 0.4 on a lower-is-better metric: baseline / policy = e^0.4; symmetric relative effect
    planted = (np.exp(0.4) - 1) / ((np.exp(0.4) + 1) / 2)
    covered = sum(s["ci"][0] <= planted <= s["ci"][1] for s in res["sides"])
    assert covered >= len(res["sides"]) - 2              # 95% intervals: nearly all cover the planted value
    assert all(s["effect"] > 0 and s["ci"][0] > 0 for s in res["sides"])
    assert res["four_way"]["across_sources"]["same_order"]["count"] == 3 * len(REGIONS)
    assert res["concordance"]["across_sources"]["value"] == 1.0
    assert not res["reversals"]
    # the claim the other way round: the baseline is better everywhere
    rev = _evaluate(cfg, _runs(_everywhere(0.4)), policy="fcfs", baseline="sjf_prompt")
    assert rev["verdict"] == "opposite" and all(s["effect"] < 0 for s in rev["sides"])


def test_planted_reversal_is_found_and_located(cfg):
    res = _evaluate(cfg, _runs(_everywhere(0.4, but={("bailian", "overload")})))
    assert res["verdict"] == "reverses"
    bad = [s for s in res["sides"] if s["better"] == "fcfs"]
    assert [(s["source"], s["region"]) for s in bad] == [("bailian", "overload")]
    across = {(r["source_1"], r["source_2"], r["region"]) for r in res["reversals"] if r["kind"] == "across_sources"}
    assert across == {("azure", "bailian", "overload"), ("burstgpt", "bailian", "overload")}
    regions = {(r["source"], r["region_1"], r["region_2"]) for r in res["reversals"] if r["kind"] == "across_regions"}
    assert regions == {("bailian", "light", "overload"), ("bailian", "busy", "overload")}
    assert res["four_way"]["across_sources"]["reversal"]["count"] == 2
    assert res["attribution"]["available"] is False       # no results folder: said, not invented


def test_planted_null_is_not_called_strong(cfg):
    # las = fcfs up to small per-window noise: never strong, mostly shown equivalent (TOST at +-delta = 5%)
    res = _evaluate(cfg, _runs(_everywhere(0.4), noise_sd=0.03), policy="las")
    assert res["counts"]["policy_better"] == 0 and res["counts"]["baseline_better"] == 0
    assert res["counts"]["equivalent"] >= 6
    assert res["verdict"] in ("equivalent", "unresolved")


def test_json_keys_and_classes(cfg):
    res = _evaluate(cfg, _runs(_everywhere(0.4)))
    js = json.loads(json.dumps(res, default=str))
    assert {"verdict", "sides", "four_way"} <= set(js)
    for s in js["sides"]:
        assert s["class"] in {"strong", "equivalent", "undetermined"}
        assert {"better", "effect", "ci", "source", "region"} <= set(s)
        assert (s["better"] is not None) == (s["class"] == "strong")
    assert set(js["four_way"]) == {"across_sources", "across_regions"}
    i = js["inputs"]
    assert {"delta", "alpha", "regions", "windows_per_source", "metric", "policy", "runs_sha256_16"} <= set(i)


@pytest.mark.parametrize("kw, param, listed", [
    ({"policy": "sjf_promt"}, "--policy", "sjf_prompt"),
    ({"baseline": "fcfz"}, "--baseline", "fcfs"),
    ({"metric": "ttft_p9"}, "--metric", "ttft_p90"),
])
def test_misspelt_names_list_the_valid_ones(cfg, kw, param, listed):
    args = {"policy": "sjf_prompt", "baseline": "fcfs", "metric": "ttft_p90", **kw}
    with pytest.raises(ParameterError, match=re.escape(param) + f".*{listed}"):
        claim.evaluate(_runs(()), cfg.analysis_inputs, panel="study", scheduler_order=list(SCHEDS), **args)


def test_the_command_writes_verdict_json_and_page(tmp_path, capsys):
    runs = _runs(_everywhere(0.4, but={("bailian", "overload")}))
    f = tmp_path / "runs.parquet"
    runs.write_parquet(f)
    base = ["--set", f"analysis.runs_file={f}", "--set", "analysis.bootstrap=100",
            "--set", "analysis.panels={study: [azure, burstgpt, bailian]}", "--set", f"paths.results_dir={tmp_path / 'r'}"]
    site = tmp_path / "site"
    rc = cli.main(["claim", "--policy", "sjf_prompt", "--baseline", "fcfs", "--metric", "ttft_p90", "--panel", "study",
                   "--json", str(tmp_path / "c.json"), "--report-dir", str(site), *base])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "verdict: REVERSES" in out and "bailian vs" not in out.split("reverses:")[0]
    res = json.loads((tmp_path / "c.json").read_text())
    assert res["verdict"] == "reverses"
    page = site / "claims" / "sjf_prompt_vs_fcfs_ttft_p90.html"
    text = page.read_text()
    assert "REVERSES" in text and "<svg" in text and "δ" in text and "α" in text
    assert not re.search(r'(src|href)="(https?:|/)', text)           # self-contained: no external file
    # misspelt panel / policy: one message with the valid names, exit status 2, no traceback
    for bad, words in ((["--panel", "reel"], "--panel.*study"), (["--policy", "sjf_promt"], "--policy.*sjf_prompt")):
        argv = ["claim", "--policy", "sjf_prompt", "--panel", "study", *base, "--report-dir", str(site)]
        argv[argv.index(bad[0]) + 1] = bad[1]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert re.search(words, err) and "Traceback" not in err


def test_help_lists_metrics_and_panels(capsys):
    with pytest.raises(SystemExit):
        cli.main(["claim", "--help"])
    out = capsys.readouterr().out
    assert "metrics: " in out and "ttft_p90" in out and "panels: " in out and "real" in out


def test_page_name_is_safe():
    assert claim_report.page_name("vllm_mysched", "fcfs", "ttft_p90") == "vllm_mysched_vs_fcfs_ttft_p90.html"
    assert claim_report.page_name("a/b c", "fcfs", "x") == "a_b_c_vs_fcfs_x.html"


def test_with_extra_compares_every_scheduler_on_the_policys_windows():
    runs = _runs(())
    extra = runs.filter(pl.col("scheduler") == "fcfs").with_columns(pl.lit("mine").alias("scheduler"))
    extra = extra.filter(pl.col("window_id").is_in(sorted(extra["window_id"].unique().to_list())[:5]))
    both, note = claim.with_extra(runs.filter(pl.col("scheduler") != "mine"), extra, "mine")
    assert set(both["window_id"].unique()) == set(extra["window_id"].unique())
    assert note and "ran on 5 windows per source" in note and "has 16 per source" in note
    from portbench.study.campaign import imported

    assert imported.imported_name("pkg.mod:MySched") == "vllm_mysched"


# --------------------------------------------------------------------------- simulation.vllm_schedulers (make all)


def test_vllm_schedulers_parameter_is_checked():
    from portbench.study.campaign import imported

    cfg = params.load(None, {"simulation": {"vllm_schedulers": ["pkg.mod:MySched"]}}, validate=False)
    assert cfg.simulation.vllm_schedulers == ("pkg.mod:MySched",)
    assert params.load(None, validate=False).simulation.vllm_schedulers == ()
    for bad in (["MySched"], "pkg.mod:MySched", [":X"], [3]):
        with pytest.raises(ParameterError, match="simulation.vllm_schedulers.*MODULE:CLASS"):
            params.load(None, {"simulation": {"vllm_schedulers": bad}}, validate=False)
    assert imported.imported_name("pkg/x.py:My-Sched") == "vllm_my_sched"


def test_campaign_hook_runs_the_classes_in_vllm_venv_and_the_analysis_reads_them(tmp_path, monkeypatch):
    from portbench.core.errors import DataError, PortbenchError
    from portbench.study.campaign import imported

    py = tmp_path / "python"
    py.write_text("")
    monkeypatch.setenv("PORTBENCH_VLLM_PYTHON", str(py))
    cfg = params.load(None, {"simulation": {"vllm_schedulers": ["docs/examples/vllm_prompt_sjf.py:PromptSJF"]},
                             "paths": {"results_dir": str(tmp_path / "r")}}, validate=False)
    seen = []

    class Done:
        returncode = 0

    imported.run_classes(cfg, runner=lambda cmd, env: seen.append((cmd, env)) or Done())
    cmd, env = seen[0]
    assert cmd[:4] == [str(py), "-m", "portbench", "simulate"]
    assert cmd[cmd.index("--vllm-scheduler") + 1] == "docs/examples/vllm_prompt_sjf.py:PromptSJF"
    assert cmd[cmd.index("--panel") + 1] == "all" and cmd[cmd.index("--windows") + 1] == "all"
    assert f"paths.results_dir={tmp_path / 'r'}" in cmd and env["PYTHONPATH"].split(":")[0].endswith("lib")

    class Failed:
        returncode = 3

    with pytest.raises(PortbenchError, match="failed \\(exit 3"):
        imported.run_classes(cfg, runner=lambda cmd, env: Failed())
    # the analysis' runs: the campaign's plus the class's; missing runs are one message naming the command
    runs = _runs(())
    with pytest.raises(DataError, match="vllm_promptsjf.*missing.*notebook 03"):
        imported.with_classes(runs, cfg.simulation, tmp_path / "r")
    mine = runs.filter(pl.col("scheduler") == "fcfs").with_columns(pl.lit("vllm_promptsjf").alias("scheduler"))
    folder = imported.runs_dir(tmp_path / "r", "vllm_promptsjf")
    folder.mkdir(parents=True)
    mine.write_parquet(folder / "runs.parquet")
    both = imported.with_classes(runs, cfg.simulation, tmp_path / "r")
    assert both.height == runs.height + mine.height and "vllm_promptsjf" in both["scheduler"].unique().to_list()
    cube = build_cube(both, metric_spec=["ttft_p90"], all_metrics=metric_names(cfg.simulation.slo))
    assert "vllm_promptsjf" in cube.schedulers                # ranked beside the others


# --------------------------------------------------------------------------- a plug-in file: the same faults


RAISING_PLUGIN = """
from portbench.sim.schedulers import BaseScheduler, register_scheduler

@register_scheduler
class Fragile(BaseScheduler):
    name = "fragile_claim"
    information = "prompt"
    seen = 0

    def priority(self, r, now):
        type(self).seen += 1
        if type(self).seen > 50:
            raise ZeroDivisionError("the 51st decision")
        return r.prompt_tokens
"""

NOT_A_SCHEDULER = """
from portbench.sim.schedulers import register_scheduler

@register_scheduler
class NotOne:
    name = "not_one_claim"
    information = "prompt"
"""


def test_a_plugin_file_s_faults_are_one_message_each(tmp_path, shared_traces):
    """The plug-in counterparts of the vLLM class's faults (tests/test_vllm_import.py): a missing file, a class that
    is not a scheduler, one that raises while running (its line, no traceback); non-deterministic and reading what
    it does not declare are tests/test_fault_cases.py's."""
    from pathlib import Path

    from portbench.core import plugins
    from portbench.sim import schedulers
    from portbench.study import campaign
    from portbench.study.campaign.executors import RunFailed

    root = Path(__file__).resolve().parents[1]
    with pytest.raises(ParameterError, match="plugins.*an existing Python file"):
        params.load("papermill_params/smoke.yaml", {"plugins": [str(tmp_path / "nope.py")]})
    bad = tmp_path / "not_one.py"
    bad.write_text(NOT_A_SCHEDULER)
    with pytest.raises(PortbenchError, match="not_one_claim.*Scheduler protocol.*missing"):
        params.load("papermill_params/smoke.yaml", {"plugins": [str(bad)]})
    f = tmp_path / "fragile.py"
    f.write_text(RAISING_PLUGIN)
    o = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "r"),
                   "manifest": str(root / "data" / "windows" / "manifest.json")},
         "plugins": [str(f)], "simulation": {"schedulers": ["fcfs", "fragile_claim"], "regions": ["overload"],
                                             "replicates": 1},
         "campaign": {"windows_per_source": 1, "request_records": {"windows_per_source": 0}},
         "sources": {"bailian": None, "burstgpt": None, "mooncake": None, "azure_code": None}}
    try:
        cfg = params.load("papermill_params/smoke.yaml", o)
        with pytest.raises(RunFailed) as got:
            campaign.run(cfg, workers=1, progress=False, verbose=False)
        msg = str(got.value)
        assert re.search(r"window azure-\d+, region overload .*scheduler fragile_claim.*the plug-in raised "
                         r"ZeroDivisionError: the 51st decision \(at fragile.py:13\)", msg), msg
        assert "Traceback" not in msg and "worker traceback" not in msg
    finally:
        for n in ("fragile_claim", "not_one_claim"):
            schedulers.SCHEDULERS.pop(n, None)
        plugins._LOADED.clear()


def test_a_reversal_gets_the_attributions_leading_property(cfg, tmp_path):
    folder = tmp_path / "attribution"
    folder.mkdir()
    rows = [{"pair": "azure|bailian", "source_a": "azure", "source_b": "bailian", "region": "overload",
             "metric": "ttft_p90", "player": p, "share": v, "share_ci_low": v - 0.1, "share_ci_high": v + 0.1}
            for p, v in (("arrival", 0.2), ("output", 0.7), ("prompt", 0.1))]
    rows.append({**rows[0], "region": "light", "player": "prompt", "share": 0.99})     # not a reversal there
    pl.DataFrame(rows).write_parquet(folder / "shapley.parquet")
    pl.DataFrame([{"pair": "azure|bailian", "a": "fcfs", "b": "sjf_prompt", "region": "overload", "metric": "ttft_p90",
                   "status": "traced", "minimal_sets": "output", "sign_sets": "output"},
                  {"pair": "azure|burstgpt", "a": "fcfs", "b": "sjf_prompt", "region": "overload", "metric": "ttft_p90",
                   "status": "traced", "minimal_sets": "arrival", "sign_sets": None}]).write_parquet(folder / "tracing.parquet")
    res = claim.evaluate(_runs(_everywhere(0.4, but={("bailian", "overload")})), cfg.analysis_inputs,
                         policy="sjf_prompt", baseline="fcfs", metric="ttft_p90", panel="study",
                         scheduler_order=list(SCHEDS), results_dir=tmp_path)
    at = res["attribution"]
    assert at["available"]
    assert [(x["sources"], x["region"], x["property"]) for x in at["leading"]] == [("azure vs bailian", "overload", "output")]
    assert [(x["pair"], x["minimal_sets"]) for x in at["traced"]] == [("azure|bailian", "output")]   # not a reversal: left out
    assert "leading property output" in "\n".join(claim.summary_lines(res))
