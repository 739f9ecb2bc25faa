"""Bad or unusual input from a new user (issue 27): every case ends in one short message or a correct answer, never a
crash or a silent wrong result. One test per case of the issue (the lost-files cases are in test_safety.py)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import planted
import polars as pl
import pytest
from portbench import cli, notebooks, params
from portbench.core import errors, plugins
from portbench.core.errors import DataError, ParameterError, PortbenchError
from portbench.data import generic, preflight, registry, traces
from portbench.data import windows as W
from portbench.sim import schedulers
from portbench.study import analysis, campaign
from portbench.study.attribution import resolve_pairs
from portbench.study.campaign.executors import RunFailed
from test_campaign import FakeEngine, run_fake, smoke  # noqa: F401 - smoke: the fixture

ROOT = Path(__file__).resolve().parents[1]
SMOKE = "papermill_params/smoke.yaml"


# --------------------------------------------------------------------------- crashes -> messages


def _error_classes():
    mods = [errors, plugins, registry, sys.modules["portbench.study.campaign.executors"]]
    found = {c for m in mods for _, c in inspect.getmembers(m, inspect.isclass) if issubclass(c, PortbenchError)}
    return sorted(found, key=lambda c: c.__qualname__)


EXAMPLES = {  # the arguments each class is raised with in the code
    "ParameterError": ("simulation.schedulers", [], "a non-empty list"),
    "DataError": ("trace.csv", "bad value", ),
    "SchedulerError": ("mine", "priority", 3, "returned NaN", "a number"),
    "UnknownSchedulerError": ("simulation.schedulers", "x", ["fcfs", "sjf"]),
    "MissingFileError": ("f.csv", "not found"),
}


def test_every_project_error_pickles_with_its_message_and_fields():
    """Case: DataError / ParameterError raised in a worker could not be unpickled (BrokenProcessPool, message lost)."""
    classes = _error_classes()
    assert {"ParameterError", "DataError", "SchedulerError", "UnknownSchedulerError", "RunFailed",
            "IntegrityError", "ConservationError", "PluginError"} <= {c.__name__ for c in classes}
    for cls in classes:
        args = EXAMPLES.get(cls.__name__, ("something went wrong",))
        try:
            e = cls(*args)
        except TypeError:
            e = cls(*args[:1])
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e) and back.__dict__ == e.__dict__, cls
    e = DataError("t.csv", "zero tokens", row=7, column="out")
    back = pickle.loads(pickle.dumps(e))
    assert (back.row, back.column, str(back)) == (7, "out", "t.csv, row 7, column 'out': zero tokens")


class DataErrorEngine(FakeEngine):
    """Raises the project's DataError on its second run call (a window whose rate is undefined, say)."""

    def run(self, scaled_df, scheduler, seed, horizon_s, sim):
        self._n += 1
        if self._n >= 2:
            raise DataError("window", "all requests arrive at the same time: offered rate undefined")
        return super().run(scaled_df, scheduler, seed, horizon_s, sim)


def test_a_workers_error_is_the_same_short_message_as_with_one_worker(smoke):  # noqa: F811
    """Case: a worker's DataError reached the terminal as 2.3 k characters of BrokenProcessPool."""
    msgs = []
    for workers in (1, 2):
        with pytest.raises(RunFailed) as ei:
            run_fake(smoke(f"w{workers}"), engine=DataErrorEngine(), workers=workers)
        msgs.append(str(ei.value))
    for m in msgs:
        assert "offered rate undefined" in m and "Traceback" not in m and len(m) < 400
        assert all(k in m for k in ("source ", "window ", "region ", "scheduler "))
    assert msgs[0].split(":")[-1] == msgs[1].split(":")[-1]


def test_a_window_whose_arrivals_share_one_time_is_an_error_naming_source_and_window():
    """Case: 300 requests sharing a timestamp passed ingest and freeze, then killed the campaign."""
    n = 600
    t = np.concatenate([np.zeros(300), np.arange(1, n - 299, dtype=float)])
    canon = pl.DataFrame({"source": "mine", "file": "mine.csv", "row": np.arange(1, n + 1), "arrival_s": t,
                          "prompt_tokens": np.full(n, 100), "output_tokens": np.full(n, 20)})
    with pytest.raises(DataError, match=r"mine.csv, column 'arrival': source 'mine', window mine-\d+: its 200 "
                                        r"requests \(rows \d+-\d+\) all share one arrival time.*time_unit"):
        W.cut_windows(canon, 2, 200, 0, "mine", 4)
    body = canon.select("arrival_s", "prompt_tokens", "output_tokens")
    from portbench.data import plausibility
    warns = plausibility.check(body, source="mine", columns={"arrival": "ts", "prompt_tokens": "p",
                                                             "output_tokens": "o"}, time_unit="s")
    assert any("300 rows share one time in 'ts'" in w for w in warns), "the ingest warns first"


@pytest.mark.parametrize("item, match", [
    ("simulation.replicates=[1", "parameter 'simulation.replicates' = '\\[1': expected a YAML value"),
    ("=3", "expected KEY=VALUE with a parameter name"),
    ("simulation.replicates", "expected KEY=VALUE"),
])
def test_a_malformed_set_value_is_a_message(item, match, capsys):
    """Case: a malformed --set value gave a traceback."""
    assert cli.main(["params", "--set", item, "--show", "simulation.replicates"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("portbench params: error:")
    assert __import__("re").search(match, err), err


def test_report_before_any_results_is_a_message(tmp_path, capsys):
    """Case: `portbench report` before any results gave a FileNotFoundError traceback."""
    assert cli.main(["report", "--set", f"paths.results_dir={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert "no results yet" in err and "summary.json does not exist" in err and "Traceback" not in err


@pytest.mark.parametrize("over, param", [
    ({"simulation.schedulers": []}, "simulation.schedulers"),
    ({"simulation.schedulers": ["fcfs", "sjf_prompt", "fcfs"]}, "simulation.schedulers"),
    ({"simulation.regions": []}, "simulation.regions"),
    ({"simulation.regions": ["busy", "busy"]}, "simulation.regions"),
    ({"analysis.metrics": ["e2e_mean", "e2e_mean"]}, "analysis.metrics"),
    ({"attribution.regions": ["overload", "overload"]}, "attribution.regions"),
    ({"attribution.pairs": [["azure", "mooncake"], ["mooncake", "azure"]]}, "attribution.pairs"),
    ({"predictors.transfer.schedulers": ["ltr", "ltr"]}, "predictors.transfer.schedulers"),
    ({"campaign.request_records.regions": []}, "campaign.request_records.regions"),
    ({"sources": {s: None for s in ("azure", "burstgpt", "bailian", "azure_code", "mooncake")}}, "sources"),
])
def test_empty_or_duplicate_lists_are_rejected_at_once(over, param):
    """Case: empty or duplicate scheduler lists passed validation and failed late and unclearly."""
    with pytest.raises(ParameterError, match=rf"parameter '{param}'.*(non-empty|distinct|at least one)"):
        params.load(SMOKE, params.undot(over))


def test_a_sweep_recomputes_a_point_whose_base_file_changed(tmp_path):
    """Case: a sweep kept stale points after its base file was edited."""
    base = tmp_path / "base.yaml"
    base.write_text("extends: smoke.yaml\nsimulation: {replicates: 1}\n")
    over = params.undot({"simulation.horizon_factor": 2.0, "paths.results_dir": str(tmp_path / "p" / "results")})
    before = notebooks.point_fingerprint(str(base), over, ["03"])
    assert notebooks.point_fingerprint(str(base), over, ["03"]) == before
    base.write_text("extends: smoke.yaml\nsimulation: {replicates: 2}\n")
    assert notebooks.point_fingerprint(str(base), over, ["03"]) != before
    assert notebooks.point_fingerprint(str(base), over, ["03", "04"]) != notebooks.point_fingerprint(str(base), over, ["03"])


# --------------------------------------------------------------------------- the user's trace is in the answer


def test_a_users_source_joins_the_real_panel_and_is_the_headline(tmp_params):
    """Case: with the README's example, the user's trace was in no cross-source table, reversal or attribution pair
    (the built-in `real` panel was complete and became the headline, silently)."""
    sources = ("azure", "azure_code", "mooncake", "mytrace")
    runs = planted.make_runs(schedulers=("fcfs", "sjf_prompt", "las"), sources=sources, regions={"overload": 1.2},
                             metrics=("e2e_mean", "ttft_p99"), n_windows=8, replicates=1,
                             provenance={s: "real" for s in sources})
    cfg = tmp_params("papermill_params/default.yaml", **{
        "sources.mytrace": {"file": "x.csv", "columns": {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}},
        "analysis.metrics": ["e2e_mean", "ttft_p99"], "analysis.headline_metrics": ["e2e_mean"],
        "analysis.bootstrap": 0, "simulation.schedulers": ["fcfs", "sjf_prompt", "las"],
        "simulation.regions": ["overload"]})
    A = analysis.compute(cfg.analysis_inputs, runs)
    s = A.summary
    assert s["headline_panel"] == "user" and s["panels"]["user"]["sources"] == list(sources)
    assert s["panels"]["user"]["own_sources"] == ["mytrace"] and s["panels"]["user"]["extends"] == "real"
    assert "mytrace" in s["headline_reason"] and "panel real" in s["headline_reason"]
    tau = A["cross_source_tau"].filter(pl.col("panel") == "user")
    assert {"mytrace"} <= set(tau["source_1"]) | set(tau["source_2"])
    rev = A["reversals"].filter(pl.col("panel") == "user")
    assert "mytrace" in set(rev["source_1"]) | set(rev["source_2"])
    assert s["panels"]["real"]["available"], "the built-in panel is still reported beside it"
    pairs = resolve_pairs("auto", list(sources), ["azure", "burstgpt", "bailian", "azure_code", "mooncake"])
    assert {("azure", "mytrace"), ("azure_code", "mytrace"), ("mooncake", "mytrace")} <= set(pairs)
    assert ("azure", "azure_code") in pairs, "the built-in pairs stay"


def test_a_relative_trace_path_resolves_against_the_parameter_file(tmp_path):
    """Case: a trace path relative to the parameter file (as the README says) was not found."""
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "mine.csv").write_text("ts,p,o\n0,100,20\n1,120,30\n")
    f = tmp_path / "study" / "mine.yaml"
    f.parent.mkdir()
    f.write_text("extends: default.yaml\nsources:\n  mine: {file: ../traces/mine.csv, columns: {arrival: ts, "
                 "prompt_tokens: p, output_tokens: o}}\n")
    cfg = params.load(f, validate=False)
    info = registry.resolve_source(registry.store(cfg.paths), cfg.sources["mine"], False)
    assert info["provenance"] == "real" and Path(info["path"]) == (tmp_path / "traces" / "mine.csv").resolve()


def test_ingest_of_a_missing_user_file_is_an_error_about_the_file(tmp_path):
    """Case: `portbench ingest` printed SKIPPED and exited 0; `make all` gave advice about DATA_MIRROR."""
    f = tmp_path / "mine.yaml"
    f.write_text("extends: default.yaml\nsources:\n  azure: null\n  burstgpt: null\n  bailian: null\n  azure_code: null\n"
                 "  mooncake: null\n  mine: {file: nowhere/mine.csv, columns: {arrival: ts, prompt_tokens: p, "
                 "output_tokens: o}}\n")
    r = subprocess.run([sys.executable, "-m", "portbench.cli", "ingest", "--params", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "your trace file 'nowhere/mine.csv' was not found" in r.stderr and "relative to the parameter" in r.stderr
    assert "SKIPPED" not in r.stderr + r.stdout
    with pytest.raises(DataError, match="sources.mine.file: your trace file") as ei:
        preflight.check(params.load(f))
    assert "DATA_MIRROR" not in str(ei.value)


# --------------------------------------------------------------------------- plausibility at ingest


def _csv(tmp_path, name, rows, header="ts,p,o"):
    p = tmp_path / name
    p.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return p


def _read(path, **kw):
    spec = generic.GenericSpec(columns=kw.pop("columns", {"arrival": "ts", "prompt_tokens": "p", "output_tokens": "o"}),
                               **kw)
    return traces.read_file(path, source="mine", mapping=spec)[1]


def test_swapped_prompt_and_output_columns_are_a_warning(tmp_path):
    """Case: swapped prompt/output columns were accepted silently."""
    rng = np.random.default_rng(0)
    rows = [(i * 0.5, int(rng.integers(20, 60)), int(rng.integers(300, 900))) for i in range(50)]
    rep = _read(_csv(tmp_path, "swapped.csv", rows))
    assert any("are the two columns swapped" in w and "'p'" in w and "'o'" in w for w in rep["warnings"])
    fine = _read(_csv(tmp_path, "fine.csv", [(t, o, p) for t, p, o in rows]))
    assert fine["warnings"] == []


def test_one_column_mapped_to_two_roles_is_an_error():
    """Case: one column mapped to both prompt and output tokens was accepted."""
    with pytest.raises(ParameterError, match=r"sources.mine.columns.output_tokens.*cannot hold both prompt_tokens"):
        params.load(SMOKE, {"sources": {"mine": {"file": "x.csv", "columns": {
            "arrival": "ts", "prompt_tokens": "n", "output_tokens": "n"}}}}, validate=False)


@pytest.mark.parametrize("unit, step, match", [
    ("s", 2000.0, "time_unit: ms or us"),          # milliseconds read as seconds: a request every 2,000 s
    ("ms", 0.01, "set time_unit: s"),              # 10 ms apart in seconds, read as milliseconds: 100,000 req/s
    ("s", 40_000.0, "spans"),                       # over a year
    # the two cases: an Azure-like trace (a request every 0.4 s) in seconds declared as ms (1,200 requests
    # in 0.5 s), and one in ms declared as s (a request every 390 s: 5.4 days)
    ("ms", 0.4, "set time_unit: s"),
    ("s", 390.0, "over 5.4 days (one request every 390 s"),
])
def test_an_implausible_rate_or_span_for_the_time_unit_is_a_warning(tmp_path, unit, step, match):
    """Case: a wrong time_unit was accepted (and gave the predictors a fake time-of-day feature)."""
    rows = [(round(i * step, 6), 200, 50) for i in range(1200)]
    rep = _read(_csv(tmp_path, "t.csv", rows), time_unit=unit)
    assert any(match in w and "'ts'" in w for w in rep["warnings"]), rep["warnings"]
    ok = _read(_csv(tmp_path, "ok.csv", [(i * 0.5, 200, 50) for i in range(1200)]), time_unit="s")
    assert ok["warnings"] == []


def test_a_format_contradicting_the_content_is_an_error(tmp_path):
    """Case: format: csv over a JSON Lines file was read as CSV."""
    p = tmp_path / "t.csv"
    p.write_text('{"ts": 0, "p": 10, "o": 5}\n')
    with pytest.raises(DataError, match="format csv was named, but the content is jsonl"):
        _read(p, format="csv")


# --------------------------------------------------------------------------- plug-ins held to the contract


def _unload(*names):
    for n in names:
        schedulers.SCHEDULERS.pop(n, None)
    plugins._LOADED.clear()


def test_replacing_a_built_in_scheduler_is_refused(tmp_path):
    """Case: register_scheduler(..., replace=True) silently replaced a built-in; the tables kept its name."""
    code = tmp_path / "evil.py"
    code.write_text("from portbench.sim.schedulers import BaseScheduler, register_scheduler\n\n"
                    "@register_scheduler(name='fcfs', replace=True)\nclass Mine(BaseScheduler):\n"
                    "    name = 'fcfs'\n    information = 'prompt'\n\n    def priority(self, r, now):\n"
                    "        return -r.prompt_tokens\n")
    original = schedulers.SCHEDULERS["fcfs"]
    try:
        with pytest.raises(ParameterError, match="new name: it replaced the built-in scheduler 'fcfs'"):
            params.load(SMOKE, {"plugins": [str(code)]})
    finally:
        schedulers.SCHEDULERS["fcfs"] = original
        plugins._LOADED.clear()


RANDOM_PLUGIN = """
import random
from portbench.sim.schedulers import BaseScheduler, register_scheduler

@register_scheduler
class Lottery(BaseScheduler):
    name = "lottery_global"
    information = "none"

    def priority(self, r, now):
        return random.random()
"""

PEEKING_PLUGIN = """
from portbench.sim.schedulers import BaseScheduler, register_scheduler

@register_scheduler
class Peek(BaseScheduler):
    name = "peek_prompt"
    information = "prompt"
    static_priority = True

    def priority(self, r, now):
        return r.output_tokens
"""


@pytest.mark.parametrize("code, name, match", [
    (RANDOM_PLUGIN, "lottery_global", "two runs of window .* with the same seed gave different results.*ctx.rng"),
    (PEEKING_PLUGIN, "peek_prompt", ("declares information prompt, but its decisions .* change when only the "
                                     "requests' true output lengths are permuted")),
])
def test_a_plugin_breaking_the_contract_is_refused_before_the_campaign(tmp_path, shared_traces, code, name, match):
    """Cases: a plug-in using a global random generator was accepted (28 of 30 runs differed, replicates were
    copies); one declaring prompt-only information read the true output length undetected."""
    f = tmp_path / f"{name}.py"
    f.write_text(code)
    o = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "r"),
                   "manifest": str(ROOT / "data" / "windows" / "manifest.json")},
         "plugins": [str(f)], "simulation": {"schedulers": ["fcfs", name], "regions": ["overload"], "replicates": 1},
         "campaign": {"windows_per_source": 1, "request_records": {"windows_per_source": 0}},
         "sources": {"bailian": None, "burstgpt": None, "mooncake": None, "azure_code": None}}
    try:
        cfg = params.load(SMOKE, o)
        with pytest.raises(RunFailed, match=match):
            campaign.run(cfg, workers=1, progress=False, verbose=False)
        assert not list((tmp_path / "r" / "runs").glob("*.parquet")), "refused before any shard is written"
    finally:
        _unload(name)


NUMPY_ORACLE_PLUGIN = """
import numpy as np
from portbench.sim.schedulers import BaseScheduler, register_scheduler

@register_scheduler
class NumpyLottery(BaseScheduler):
    name = "np_lottery_oracle"
    information = "oracle"

    def priority(self, r, now):
        return float(np.random.random()) * r.output_tokens
"""

RANDOM_PROMPT_PLUGIN = """
import random
from portbench.sim.schedulers import BaseScheduler, register_scheduler

@register_scheduler
class Noisy(BaseScheduler):
    name = "noisy_prompt"
    information = "prompt"

    def priority(self, r, now):
        return r.prompt_tokens * random.random()
"""

HANGING_PLUGIN = """
from portbench.sim.schedulers import BaseScheduler, register_scheduler

@register_scheduler
class Stuck(BaseScheduler):
    name = "stuck"
    information = "prompt"

    def priority(self, r, now):
        while True:
            pass
"""


def _plugin_cfg(tmp_path, code: str, name: str, **over):
    f = tmp_path / f"{name}.py"
    f.write_text(code)
    o = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "r"),
                   "manifest": str(ROOT / "data" / "windows" / "manifest.json")},
         "plugins": [str(f)], "simulation": {"schedulers": ["fcfs", name], "regions": ["light", "overload"],
                                             "replicates": 1},
         "campaign": {"windows_per_source": 2, "request_records": {"windows_per_source": 0}},
         "sources": {"bailian": None, "burstgpt": None, "mooncake": None}}
    return params.load(SMOKE, params.undot({**o, **over}))


@pytest.mark.parametrize("code, name", [(NUMPY_ORACLE_PLUGIN, "np_lottery_oracle"),
                                        (RANDOM_PROMPT_PLUGIN, "noisy_prompt")])
def test_randomness_outside_the_runs_generator_is_named_as_such_whatever_the_information(tmp_path, shared_traces,
                                                                                        code, name):
    """Cases: a plug-in drawing from numpy's global generator while declaring information = "oracle" passed the
    determinism check in 2 of 12 runs (only the first shard was run twice); a random one declaring "prompt" was
    refused as reading the true output length (the wrong cause). Checked on the lightest and heaviest region of
    3 windows of 2 sources, randomness before information: the message names randomness, never the output."""
    try:
        cfg = _plugin_cfg(tmp_path, code, name)
        for _ in range(3):      # not a matter of luck: refused every time, for the right reason
            with pytest.raises(RunFailed, match="same seed gave different results.*ctx.rng") as e:
                campaign.run(cfg, workers=1, progress=False, verbose=False)
            assert "output lengths are permuted" not in str(e.value)
        assert not list((tmp_path / "r" / "runs").glob("*.parquet")), "refused before any shard is written"
    finally:
        _unload(name)


def test_the_checked_shards_span_light_and_heavy_regions_three_windows_and_two_sources():
    """The determinism check's shards: the lightest and heaviest region of >= 3 windows over >= 2 sources."""
    from types import SimpleNamespace as N

    from portbench.study.campaign.run import check_shards

    shards = [N(window=N(id=f"{s}-{k}", source=s), rho=r) for s in ("a", "b") for k in range(5)
              for r in (0.3, 0.6, 1.2)]
    got = check_shards(shards)
    assert {x.rho for x in got} == {0.3, 1.2}
    assert len({x.window.id for x in got}) == 3 and {x.window.source for x in got} == {"a", "b"}
    one = [N(window=N(id=f"a-{k}", source="a"), rho=r) for k in range(4) for r in (0.5, 0.9)]
    assert len({x.window.id for x in check_shards(one)}) == 3


def test_a_random_free_plugins_replicates_are_compared_across_the_campaign(tmp_path, shared_traces, monkeypatch):
    """Case: replicates of a policy that never drew from the run's generator were copies, so randomness drawn
    elsewhere could not show in them. With the pre-campaign check switched off, the campaign itself catches it."""
    run_mod = importlib.import_module("portbench.study.campaign.run")

    monkeypatch.setattr(run_mod, "check_plugins", lambda *a, **k: None)
    try:
        cfg = _plugin_cfg(tmp_path, NUMPY_ORACLE_PLUGIN, "np_lottery_oracle",
                          simulation={"schedulers": ["fcfs", "np_lottery_oracle"], "regions": ["overload"],
                                      "replicates": 2})
        with pytest.raises(RunFailed, match="drew no random number from the run's generator, yet two of its runs"):
            campaign.run(cfg, workers=1, progress=False, verbose=False)
    finally:
        _unload("np_lottery_oracle")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_hanging_plugin_is_stopped_at_its_time_limit_with_a_message(tmp_path, shared_traces, workers):
    """Case: a plug-in in an infinite loop hung `portbench simulate` for ever with no output. Its run ends at the
    time limit (here the floor, 2 s: the built-ins of a shard take milliseconds) in this process and in a pool
    worker, with a message naming the scheduler, the window and the limit."""
    from portbench.core.errors import PluginTimeoutError
    run_mod = importlib.import_module("portbench.study.campaign.run")

    try:
        cfg = _plugin_cfg(tmp_path, HANGING_PLUGIN, "stuck", campaign={
            "windows_per_source": 1, "request_records": {"windows_per_source": 0},
            "time_limit": {"factor": 1, "floor_s": 2}})
        if workers == 2:        # past the pre-campaign check: the limit in a pool worker
            orig = run_mod.check_plugins
            run_mod.check_plugins = lambda *a, **k: None
        try:
            with pytest.raises((PluginTimeoutError, RunFailed),
                               match=r"scheduler 'stuck' \(a plug-in\) did not finish within its time limit of 2 s on "
                                     r"window \S+ \(source \w+, region \w+\)"):
                campaign.run(cfg, workers=workers, progress=False, verbose=False)
        finally:
            if workers == 2:
                run_mod.check_plugins = orig
    finally:
        _unload("stuck")


# --------------------------------------------------------------------------- large files: read in parts


GOOD = "ts,p,o,extra\n" + "".join(f"{i * 0.5},{100 + i},{20 + i},x{i}\n" for i in range(10)) + "\n\n"


@pytest.mark.parametrize("text, row, match", [
    (GOOD, None, None),
    ("ts,p,o\n0,5,1\n1,5,1\n2,5,1\n1.5,5,1\n4,5,1\n", 4, "non-decreasing order.*previous row has '2'"),
    ("ts,p,o\n0,5,1\n1,5,1\n2,5,1\n3,5,1\n\n5,5,1\n", 5, "blank line"),
    ("ts,p,o\n0,5,1\n1,5,1\n2,5,1\n3,5,1\n4,zero,1\n", 5, "'zero': expected an integer number of tokens"),
    ("ts,p,o\n0,5,1\n1,5,1\n2,5,1\n3,5\n", 4, "has 2 fields, expected 3"),
])
def test_a_large_file_read_in_parts_gives_the_same_table_and_errors(tmp_path, monkeypatch, text, row, match):
    """Case: a 5 GB file grew past 7 GB of memory with no output (a 1 GB one peaked at 5.5 GB). A CSV file above
    generic.CHUNKED_BYTES is typed and validated in parts (memory: the typed columns and one part; measured: a
    0.87 GB file peaks at 1.7 GB); parts of 3 rows here must give what reading in one piece gives."""
    p = tmp_path / "t.csv"
    p.write_text(text)
    spec = generic.GenericSpec(columns={"arrival": "ts", "prompt_tokens": "p", "output_tokens": "o"})

    def read():
        try:
            return generic.read(p, spec)
        except DataError as e:
            return e

    whole = read()
    monkeypatch.setattr(generic, "CHUNKED_BYTES", 0)
    monkeypatch.setattr(generic, "CHUNK_ROWS", 3)
    parts = read()
    if row is None:
        assert parts[0].equals(whole[0]) and parts[1] == whole[1] and parts[0].height == 10
    else:
        assert isinstance(whole, DataError) and isinstance(parts, DataError), (whole, parts)
        assert whole.row == parts.row == row and __import__("re").search(match, str(parts)), str(parts)


# --------------------------------------------------------------------------- bring your own, as written


def _user_trace(tmp_path, rows: int) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    f = tmp_path / "t.csv"
    f.write_text("ts,p,o\n" + "".join(f"{i * 0.4:.3f},{200 + i % 50},{20 + i % 7}\n" for i in range(rows)))
    return f


def _user_study(tmp_path, rows: int, **windows):
    trace = _user_trace(tmp_path, rows)
    o = {"sources": {"burstgpt": None, "bailian": None, "azure_code": None, "mooncake": None,
                     "mine": {"file": str(trace), "columns": {"arrival": "ts", "prompt_tokens": "p", "output_tokens": "o"}}}}
    if windows:
        o["windows"] = windows
    return params.load(SMOKE, o)


def test_a_small_trace_gets_fewer_windows_and_a_too_small_one_a_one_line_error(tmp_path, capsys):
    """Case: a 3,993-request trace stopped after 55 s with a papermill traceback (40 x 200 windows need 8,000
    requests), and the suggested windows.per_source refroze every built-in source. Now: before any notebook, one
    line naming the source, its requests and the windows it allows; the built-ins keep windows.per_source."""
    cfg = _user_study(tmp_path, 3993)
    preflight.check(cfg)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == ("[portbench] mine: t.csv has 3,993 records (at most): 19 windows of 200 (windows.per_source 40, "
                    "at least 10)")
    assert W.window_count("azure", cfg.sources["azure"], cfg.windows, 19366, own=False) == 40
    small = _user_study(tmp_path / "s", 1500)
    with pytest.raises(DataError, match=r"source 'mine' has 1,500 valid requests, which hold 7 window\(s\) of 200; "
                                        r"a source needs at least 10 windows \(2,000 requests\)") as e:
        preflight.check(small)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(DataError, match=r"hold 19 windows of 200, not the 30 of sources.mine.windows = 30"):
        W.window_count("mine", dataclasses.replace(cfg.sources["mine"], windows=30), cfg.windows, 3993, own=True)


def test_a_users_manifest_beside_the_committed_files_is_refused(tmp_path):
    """Case: the README's example put the user's manifest in data/windows/, so the attribution verified (and a
    refreeze overwrote) the committed data/windows/hybrids.json."""
    trace = _user_trace(tmp_path, 3000)
    o = {"paths": {"manifest": "data/windows/manifest-mine.json"},
         "sources": {"mine": {"file": str(trace), "columns": {"arrival": "ts", "prompt_tokens": "p", "output_tokens": "o"}}}}
    with pytest.raises(ParameterError, match="paths.manifest.*not one holding the default study's committed files"):
        params.load(SMOKE, o)


def test_a_users_study_never_writes_a_tracked_file(tmp_path):
    """Case: `portbench attribute --refreeze` in a user's run overwrote the tracked data/windows/hybrids.json. Every
    write of a tracked file in a process that loaded a study of its own is refused, with one message (run in a
    subprocess: the protection lasts for the process)."""
    code = f"""
import sys
from portbench import params
from portbench.core import io
from portbench.core.errors import ProtectedFileError
from portbench.data import hybrids
params.load({SMOKE!r}, validate=False)        # smoke.yaml: a study other than the default one
for write in (lambda: hybrids.write_frozen({str(ROOT / 'data/windows/hybrids.json')!r}, {{}}),
              lambda: io.write_text({str(ROOT / 'README.md')!r}, 'x')):
    try:
        write()
    except ProtectedFileError as e:
        print("REFUSED", e)
io.write_text({str(tmp_path / 'ok.txt')!r}, 'fine')
"""
    before = {p: (ROOT / p).read_bytes() for p in ("data/windows/hybrids.json", "README.md")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("REFUSED")]
    assert len(lines) == 2 and "data/windows/hybrids.json is a file of the default study" in lines[0]
    assert "never refrozen by another study" in lines[0] and "README.md is a file of the default study" in lines[1]
    assert {p: (ROOT / p).read_bytes() for p in before} == before and (tmp_path / "ok.txt").read_text() == "fine"


class _FakeExecutionError(Exception):
    def __init__(self, ename, evalue):
        super().__init__(evalue)
        self.ename, self.evalue = ename, evalue
        self.traceback = ["\x1b[0;31mTraceback (most recent call last)\x1b[0m", "  File x, line 1", f"{ename}: {evalue}"]


def test_a_notebooks_error_is_its_one_line_message_and_the_log(tmp_path):
    """Case: on the main path (`make all PARAMS=...`) a project error arrived as 40-70 lines of Python and papermill
    traceback with the right sentence last. A project error is its own message plus where the log is; an unexpected
    one is named as such; the traceback (without colour codes) is in the log file."""
    nb = ROOT / "notebooks" / "02_freeze_windows.ipynb"
    e = notebooks.notebook_failure(_FakeExecutionError("DataError", "t.csv, row 7: zero tokens"), nb, tmp_path, ROOT)
    assert isinstance(e, PortbenchError)
    first, second = str(e).splitlines()
    assert first == "02_freeze_windows.ipynb stopped: t.csv, row 7: zero tokens"
    log = tmp_path / "logs" / "02_freeze_windows.log"
    assert f"full log: {log}" in second and "Traceback (most recent call last)" in log.read_text()
    assert "\x1b[" not in log.read_text()
    e = notebooks.notebook_failure(_FakeExecutionError("KeyError", "'x'"), nb, tmp_path, ROOT)
    assert "stopped on an unexpected error: KeyError: 'x'" in str(e) and "traceback is in the log" in str(e)
    for name in ("PluginTimeoutError", "ProtectedFileError", "RunFailed", "IntegrityError", "SchedulerError",
                 "UnknownSchedulerError", "ParameterError"):
        assert name in notebooks._project_error_names()


def test_power_and_texts_use_the_runs_own_window_count(tmp_params, tmp_path):
    """Case: the user's report said "the 40 windows are worth ..." and gave a power figure at 40 windows the user
    never set. With 12 windows per source, the MDE is at 12 windows (analysis.power.windows: auto) and the text
    counts the run's windows."""
    from portbench.present import ports_text

    df = planted.make_runs(schedulers=("fcfs", "sjf_oracle", "las"), regions={"busy": 0.7}, metrics=("e2e_mean",),
                           n_windows=12, replicates=1, noise_sd=0.05, replicate_sd=0.0, window_sd=0.3, seed=4)
    path = planted.write_runs(tmp_path / "results", df)
    P = tmp_params("papermill_params/default.yaml", **{"analysis.runs_file": str(path), "analysis.metrics": ["e2e_mean"],
                                                      "analysis.headline_metrics": ["e2e_mean"], "analysis.bootstrap": 0})
    assert P.analysis.power.windows == "auto"
    A = analysis.compute(P.analysis_inputs)
    assert A.summary["power"]["by_metric"]["e2e_mean"]["windows"] == 12
    ew = {"a": {"windows": 12, "effective_windows": 5.2}, "b": {"windows": 12, "effective_windows": 7.9}}
    assert ports_text._windows_worth(ew) == "the 12 windows are worth about 5, 8"
    ew["b"]["windows"] = 40
    assert ports_text._windows_worth(ew) == "the windows (12, 40) are worth about 5, 8"
