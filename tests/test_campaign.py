"""Campaign orchestration: seeds, sharding, resume, stale-shard protection, executors, parameters.

Most tests inject a deterministic fake engine (``FakeEngine``: every number is a function of the
run's seed and window) so that they check the orchestration alone, fast; the ``real_*`` tests run
the real simulator on a tiny grid.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from portbench.core import io
from portbench.present import text as present_text
from portbench.study import campaign
from portbench import params
from portbench.study.campaign import Engine, RunResult, WindowRef
from portbench.core.errors import DataError, ParameterError

TESTS_DIR = Path(__file__).resolve().parent
SMOKE = "papermill_params/smoke.yaml"


# --------------------------------------------------------------------------- the fake engine


def make_windows(per_source: int = 2, size: int = 12) -> list[tuple[WindowRef, pl.DataFrame]]:
    """Small synthetic window tables (contract columns) with refs; deterministic."""
    out = []
    for s_i, source in enumerate(("azure", "burstgpt", "bailian")):
        for k in range(per_source):
            rng = np.random.default_rng(1000 * s_i + k)
            df = pl.DataFrame({
                "arrival_s": np.cumsum(rng.exponential(1.0, size)) - 0.0,
                "prompt_tokens": rng.integers(1, 500, size),
                "output_tokens": rng.integers(1, 300, size),
                "tenant": [f"t{1 + i % 3}" for i in range(size)],
            }).with_columns(pl.col("arrival_s") - pl.col("arrival_s").min())
            sha = hashlib.sha256(df.write_csv().encode()).hexdigest()
            prov = "real" if source == "azure" else "standin"
            out.append((WindowRef(f"{source}-{k:02d}", source, prov, sha), df))
    return out


class FakeEngine(Engine):
    """Deterministic stand-in for the simulator. Logs each call as a file in ``calls_dir`` (so calls
    are counted across processes); raises on the ``fail_after``-th run call of a process."""

    METRICS = ("completed", "throughput_tok_s", "e2e_p99", "ttft_p50")

    def __init__(self, calls_dir=None, fail_after: int | None = None, sleep_s: float = 0.0, version: int = 1):
        self.calls_dir = str(calls_dir) if calls_dir else None
        self.fail_after, self.sleep_s, self.version = fail_after, sleep_s, version
        self._n = 0

    def fingerprint(self, sim):
        return {"engine": "fake", "version": self.version}

    def metric_names(self, sim):
        return list(self.METRICS) + [f"slo_{k}" for k in sim.slo]

    def profile_name(self, sim):
        return "fake_profile"

    def _log(self, kind):
        if self.calls_dir:
            Path(self.calls_dir, f"{kind}-{os.getpid()}-{uuid.uuid4().hex}").touch()

    def capacity(self, window_df, sim):
        self._log("capacity")
        return float(window_df.height) / (1.0 + float(window_df["arrival_s"].max()))

    def prepare(self, window_df, rho, capacity_rps, sim):
        span = float(window_df["arrival_s"].max()) or 1.0
        target = window_df.height / (rho * capacity_rps)
        scaled = window_df.with_columns(pl.col("arrival_s") * (target / span))
        return scaled, sim.horizon_factor * target

    def run(self, scaled_df, scheduler, seed, horizon_s, sim):
        self._n += 1
        if self.fail_after is not None and self._n >= self.fail_after:
            raise RuntimeError(f"injected failure at run call {self._n}")
        self._log("run")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        rng = np.random.default_rng(seed)
        n = scaled_df.height
        completed = int(rng.integers(0, n + 1))
        rejected = int(rng.integers(0, n - completed + 1))
        counters = {"arrived": n, "completed": completed, "rejected": rejected,
                    "unfinished": n - completed - rejected, "preemptions": int(rng.integers(0, 5))}
        metrics = {m: float(rng.random()) for m in self.metric_names(sim)}
        metrics["completed"] = float(completed)
        metrics["horizon_echo"] = horizon_s  # not a metric name: must be ignored
        records = pl.DataFrame({"req_id": np.arange(n, dtype=np.int64), "arrival_s": scaled_df["arrival_s"],
                                "finish_s": scaled_df["arrival_s"] + rng.random(n),
                                "prompt_tokens": scaled_df["prompt_tokens"], "tenant": scaled_df["tenant"]})
        return RunResult(counters=counters, metrics=metrics, records=records)


def n_calls(calls_dir: Path, kind: str = "run") -> int:
    return len(list(Path(calls_dir).glob(f"{kind}-*")))


@pytest.fixture()
def smoke(tmp_path):
    """Smoke parameters with results under tmp_path/<name> (2 replicates, so replicate seeds matter)."""

    def make(name: str = "a", validate: bool = True, **overrides):
        o = {"paths.data_dir": str(tmp_path / "data"), "paths.results_dir": str(tmp_path / name),
             "paths.figures_dir": str(tmp_path / "figures"), "simulation.replicates": 2}
        o.update(overrides)
        return params.load(SMOKE, params.undot(o), validate=validate)

    return make


WINDOWS = make_windows()


def run_fake(P, calls_dir=None, **kw):
    engine = kw.pop("engine", None) or FakeEngine(calls_dir)
    kw.setdefault("workers", 1)
    return campaign.run(P, engine=engine, windows=WINDOWS, progress=False, verbose=False, **kw)


# --------------------------------------------------------------------------- seeds


def test_seed_is_pinned_distinct_and_process_independent():
    assert campaign.run_seed(0, "azure-00", "fcfs", "light", 0) == 1010745406291831005  # never changes silently
    keys = [(b, w, s, r, k) for b in (0, 1) for w in ("azure-00", "azure-01", "bailian-00")
            for s in ("fcfs", "las", "random") for r in ("light", "overload") for k in (0, 1, 2)]
    seeds = [campaign.run_seed(*k) for k in keys]
    assert len(set(seeds)) == len(keys), "every key gets its own seed"
    assert all(0 <= x < 2 ** 63 for x in seeds)
    code = ("import json,sys; from portbench.study.campaign import run_seed; "
            f"print(json.dumps([run_seed(*k) for k in {keys!r}]))")
    for hashseed in ("1", "12345"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hashseed}).stdout
        assert json.loads(out) == seeds, "seeds must not depend on the process (no hash())"


def test_rows_carry_the_derived_seed_and_every_cell_of_the_grid(smoke, tmp_path):
    P = smoke()
    res = run_fake(P)
    runs = res.runs
    plan = res.plan
    assert runs.height == plan.n_runs == 6 * 3 * 6 * 2
    assert list(runs.columns) == list(campaign.RUN_COLUMNS) + FakeEngine().metric_names(P.simulation)
    assert runs.select(["window_id", "region", "scheduler", "replicate"]).n_unique() == runs.height
    assert runs["seed"].n_unique() == runs.height
    for row in runs.sample(10, seed=1).iter_rows(named=True):
        assert row["seed"] == campaign.run_seed(P.simulation.seed, row["window_id"], row["scheduler"],
                                                row["region"], row["replicate"])
        assert row["arrived"] == row["completed_n"] + row["unfinished"] + row["rejected"]
    assert runs["profile"].unique().to_list() == ["fake_profile"]
    assert runs.sort(campaign.SORT_COLUMNS).equals(runs), "rows are sorted deterministically"
    # the base seed changes every seed (and so the results)
    P2 = smoke("b", **{"simulation.seed": 1})
    runs2 = run_fake(P2).runs
    assert not set(runs["seed"].to_list()) & set(runs2["seed"].to_list())


def test_same_parameters_same_results(smoke):
    a = run_fake(smoke("a")).runs
    b = run_fake(smoke("b")).runs
    assert a.equals(b)


# --------------------------------------------------------------------------- shards, capacity, records


def test_shard_layout_capacity_cache_and_records(smoke, tmp_path):
    P = smoke()
    calls = tmp_path / "calls"
    calls.mkdir()
    res = run_fake(P, calls)
    out = Path(P.paths.results_dir)
    shards = sorted((out / "runs").glob("*.parquet"))
    assert len(shards) == 6 * 3 == len(res.plan.shards)
    for sh in res.plan.shards:
        path = campaign.shard_path(P.paths.results_dir, sh)
        assert path.name.startswith(f"{sh.window.id}__{sh.region}__") and len(sh.key) == 16
        meta = io.read_meta(path)
        assert meta["shard"] == sh.name and meta["fingerprint"]["window"]["sha256"] == sh.window.sha256
        df = pl.read_parquet(path)
        assert df.height == 6 * 2 and set(df["window_id"]) == {sh.window.id} and set(df["region"]) == {sh.region}
    # capacity measured once per window and reused by all its regions
    assert n_calls(calls, "capacity") == 6
    assert len(list((out / "capacity").glob("*.json"))) == 6
    caps = campaign.load_capacities(P.paths, res.plan)
    for row in res.runs.select(["window_id", "capacity_rps"]).unique().iter_rows():
        assert caps[row[0]]["capacity_rps"] == row[1]
    # records: first window per source, region overload, replicate 0 (smoke.yaml)
    req = campaign.load_requests(P.paths, campaign.make_plan(P.plan_settings, engine=FakeEngine(), windows=WINDOWS))
    assert set(req["window_id"]) == {"azure-00", "burstgpt-00", "bailian-00"}
    assert set(req["region"]) == {"overload"} and set(req["replicate"]) == {0}
    assert req.height == 3 * 6 * 12
    assert list(req.columns[:8]) == list(campaign.KEY_COLUMNS)
    assert len(list((out / "requests").glob("*.parquet"))) == 3
    # consolidated file tagged with the plan
    assert io.read_meta(out / "runs.parquet")["plan"] == res.plan.hash
    assert campaign.load_runs(P.paths, campaign.make_plan(P.plan_settings, engine=FakeEngine(), windows=WINDOWS)).equals(res.runs)


def test_rerun_reuses_every_shard(smoke, tmp_path):
    P = smoke()
    calls = tmp_path / "calls"
    calls.mkdir()
    first = run_fake(P, calls)
    before = n_calls(calls)
    again = run_fake(P, calls)
    assert n_calls(calls) == before and n_calls(calls, "capacity") == 6
    assert again.computed_shards == 0 and again.reused_shards == len(first.plan.shards)
    assert again.runs.equals(first.runs)
    # parameters that do not change results do not change shard keys
    P2 = smoke(**{"campaign.workers": 1, "analysis.alpha": 0.01})
    assert run_fake(P2, calls).computed_shards == 0


@pytest.mark.parametrize("override", [
    {"simulation.horizon_factor": 3.0},
    {"simulation.seed": 5},
    {"simulation.predictor_sigma": 0.9},
    {"simulation.slo": {"tight": {"ttft_s": 0.25, "tpot_s": 0.05}}},
    {"simulation.edf_slo": "tight"},
    {"simulation.scheduler_options": {"las": {"quantum_tokens": 7}}},
    {"simulation.region_loads.light": 0.35},
    {"simulation.capacity_policy": "sarathi"},
    {"simulation.profile": "other"},
])
def test_changing_a_result_parameter_never_reuses_old_shards(smoke, tmp_path, override, monkeypatch):
    if "simulation.profile" in override:  # the fake engine's model fingerprint stands in for the profile
        monkeypatch.setattr(FakeEngine, "fingerprint", lambda self, sim: {"engine": "fake",
                                                                          "profile": sim.profile})
    P = smoke()
    run_fake(P)
    calls = tmp_path / "calls"
    calls.mkdir()
    P2 = smoke(validate=False, **override)  # the fake engine accepts any profile / option name
    plan1, plan2 = (campaign.make_plan(x.plan_settings, engine=FakeEngine(), windows=WINDOWS) for x in (P, P2))
    changed = {a.name for a in plan1.shards} ^ {b.name for b in plan2.shards}
    affected = [b for b in plan2.shards if b.name not in {a.name for a in plan1.shards}]
    assert changed and affected
    res = run_fake(P2, calls)
    assert res.computed_shards == len(affected)
    assert n_calls(calls) == len(affected) * 6 * 2
    if "simulation.region_loads.light" in override:  # only the light region is affected
        assert {sh.region for sh in affected} == {"light"}
    else:
        assert len(affected) == len(plan2.shards)


def test_engine_model_change_invalidates_shards_and_capacities(smoke, tmp_path):
    P = smoke()
    run_fake(P)
    calls = tmp_path / "calls"
    calls.mkdir()
    res = run_fake(P, engine=FakeEngine(calls, version=2))
    assert res.computed_shards == len(res.plan.shards) and n_calls(calls, "capacity") == 6


def test_request_record_selection_change_recomputes_only_those_shards(smoke, tmp_path):
    P = smoke()
    first = run_fake(P)
    calls = tmp_path / "calls"
    calls.mkdir()
    P2 = smoke(**{"campaign.request_records": {"windows_per_source": 1, "regions": ["overload", "light"],
                                               "replicates": [0]}})
    res = run_fake(P2, calls)
    assert res.computed_shards == 3 and n_calls(calls) == 3 * 12  # the three light shards gain records
    assert res.runs.equals(first.runs)


def test_load_runs_refuses_other_parameters(smoke):
    P = smoke()
    run_fake(P)
    P2 = smoke(**{"simulation.horizon_factor": 2.5})
    with pytest.raises(DataError, match="shards of this parameter set are missing.*portbench simulate"):
        campaign.load_runs(P2.paths, campaign.make_plan(P2.plan_settings, engine=FakeEngine(), windows=WINDOWS))


# --------------------------------------------------------------------------- resume after a crash


def test_resume_after_an_exception_mid_campaign(smoke, tmp_path):
    reference = run_fake(smoke("ref")).runs
    P = smoke("crash")
    calls = tmp_path / "calls"
    calls.mkdir()
    with pytest.raises(campaign.RunFailed, match="injected failure"):
        run_fake(P, engine=FakeEngine(calls, fail_after=5 * 12 + 3))  # dies inside the 6th shard
    out = Path(P.paths.results_dir)
    done = len(list((out / "runs").glob("*.parquet")))
    assert done == 5 and not (out / "runs.parquet").exists()
    assert not list((out / "runs").glob(".*")), "no temporary file left behind"
    calls2 = tmp_path / "calls2"
    calls2.mkdir()
    res = run_fake(P, calls2)
    assert res.computed_shards == 18 - 5 and res.reused_shards == 5
    assert n_calls(calls2) == (18 - 5) * 12, "finished shards are not recomputed"
    assert n_calls(calls2, "capacity") == 0, "capacities measured before the crash are reused"
    assert res.runs.equals(reference), "exactly the rows of an uninterrupted run, no duplicates"


def test_resume_after_sigkill(smoke, tmp_path):
    reference = run_fake(smoke("ref")).runs
    P = smoke("killed")
    (tmp_path / "P.json").write_text(json.dumps(P.tree))
    calls = tmp_path / "calls"
    calls.mkdir()
    script = (f"import json, sys; sys.path.insert(0, {str(TESTS_DIR)!r}); "
              "from test_campaign import FakeEngine, WINDOWS; from portbench.study import campaign; "
              "from portbench.core import config; "
              f"P = config.build(json.load(open({str(tmp_path / 'P.json')!r}))); "
              f"campaign.run(P, engine=FakeEngine({str(calls)!r}, sleep_s=0.02), windows=WINDOWS, "
              "workers=1, progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runs_dir = Path(P.paths.results_dir) / "runs"
    deadline = time.time() + 120
    try:
        while time.time() < deadline and len(list(runs_dir.glob("*.parquet"))) < 4:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = len(list(runs_dir.glob("*.parquet")))
    assert 4 <= done < 18, "killed mid-way"
    calls2 = tmp_path / "calls2"
    calls2.mkdir()
    res = run_fake(P, calls2)
    assert res.reused_shards == done and n_calls(calls2) == (18 - done) * 12
    assert res.runs.equals(reference)


# --------------------------------------------------------------------------- executors


def test_one_two_workers_and_dask_give_identical_rows(smoke, tmp_path):
    one = run_fake(smoke("one")).runs
    two = run_fake(smoke("two"), workers=2).runs
    assert two.equals(one)
    pytest.importorskip("distributed")
    dask = run_fake(smoke("dask"), executor="dask", workers=2).runs
    assert dask.equals(one)
    for name in ("one", "two", "dask"):
        P = smoke(name)
        req = campaign.load_requests(P.paths, campaign.make_plan(P.plan_settings, engine=FakeEngine(), windows=WINDOWS))
        assert req.height == 3 * 6 * 12


def test_a_worker_failure_is_reported_with_the_run(smoke, tmp_path):
    with pytest.raises(campaign.RunFailed, match=r"source \S+, window \S+, region \S+ .*scheduler \S+, replicate \d"):
        run_fake(smoke(), engine=FakeEngine(fail_after=1), workers=2)


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("override, param, allowed", [
    ({"campaign.executor": "spark"}, "campaign.executor", "process, dask"),
    ({"campaign.workers": 0}, "campaign.workers", "positive integer"),
    ({"campaign.windows_per_source": -1}, "campaign.windows_per_source", "positive integer"),
    ({"campaign.request_records": {"regions": ["nowhere"]}}, "campaign.request_records.regions",
     "light, moderate"),
    ({"simulation.region_loads.light": -0.3}, "simulation.region_loads.light", "rho"),
    ({"simulation.regions": ["light", "hyperdrive"]}, "simulation.regions", "light, moderate, busy"),
    ({"simulation.replicates": 0}, "simulation.replicates", "positive integer"),
])
def test_bad_parameters_name_the_parameter_and_allowed_values(override, param, allowed):
    with pytest.raises(ParameterError) as e:
        params.load(SMOKE, params.undot(override))
    msg = str(e.value)
    assert param in msg and allowed in msg, msg


def test_unknown_scheduler_and_profile_are_rejected():
    with pytest.raises(ParameterError, match=r"simulation\.schedulers.*fcfs"):
        params.load(SMOKE, params.undot({"simulation.schedulers": ["fcfs", "fifo_magic"]}))
    with pytest.raises(ParameterError, match=r"simulation\.profile"):
        params.load(SMOKE, params.undot({"simulation.profile": "tpu_v9_llama9"}))


# --------------------------------------------------------------------------- the real simulator


def _real_windows(P):
    from portbench.data import windows

    manifest = windows.load_manifest(P.paths)
    refs = campaign.window_refs(manifest, P.source_names(), P.campaign)
    tables = windows.load_windows(P.data, per_source=P.campaign.windows_per_source, manifest=manifest)
    return [(r, tables[r.id]) for r in refs]


def test_real_campaign_is_deterministic_across_executors(smoke, shared_traces):
    over = {"campaign.windows_per_source": 1, "simulation.schedulers": ["fcfs", "sjf_oracle", "random"],
            "simulation.regions": ["light", "overload"]}
    P1 = smoke("r1", **over)
    wins = _real_windows(P1)
    kw = dict(windows=wins, progress=False, verbose=False)
    one = campaign.run(P1, workers=1, **kw).runs
    assert one.height == len(wins) * 2 * 3 * 2
    assert (one["arrived"] == one["completed_n"] + one["unfinished"] + one["rejected"]).all()
    again = campaign.run(smoke("r1b", **over), workers=1, **kw).runs
    assert again.equals(one), "same seed, same results"
    two = campaign.run(smoke("r2", **over), workers=2, **kw).runs
    assert two.equals(one)
    pytest.importorskip("distributed")
    dask = campaign.run(smoke("rd", **over), executor="dask", workers=2, **kw).runs
    assert dask.equals(one)


class _EveryReplicateEngine(campaign.SimEngine):
    """The simulator's engine without ``seed_used``: the campaign must simulate every replicate."""

    def run(self, *a, **kw):
        res = super().run(*a, **kw)
        res.counters.pop("seed_used", None)
        return res


def test_replicates_of_a_policy_that_draws_no_random_number_are_simulated_once(smoke, shared_traces):
    """12 of the 13 policies never draw from the run's generator: their replicates are the same run. The
    campaign simulates them once and copies the rows (new replicate and seed); the table is identical to
    simulating every replicate, and ``random`` (which draws) still differs between replicates."""
    over = {"campaign.windows_per_source": 1, "simulation.schedulers": ["fcfs", "las", "vtc", "random"],
            "simulation.regions": ["overload"]}
    P = smoke("dedup", **over)
    wins = _real_windows(P)
    kw = dict(windows=wins, progress=False, verbose=False, workers=1)
    fast = campaign.run(P, **kw).runs
    full = campaign.run(smoke("every", **over), engine=_EveryReplicateEngine(), **kw).runs
    assert fast.equals(full)
    metrics = ["e2e_mean", "ttft_p90", "completed"]
    for sched, same in (("fcfs", True), ("las", True), ("vtc", True), ("random", False)):
        sub = fast.filter(pl.col("scheduler") == sched)
        assert sub["seed"].n_unique() == sub.height                     # each row keeps its own seed
        per_rep = sub.group_by("window_id").agg([pl.col(m).n_unique() for m in metrics])
        assert (per_rep.select(metrics).max_horizontal() == 1).all() == same, sched


def test_cli_simulate_runs_the_campaign_from_the_manifest(tmp_path, shared_traces, capsys):
    from portbench import cli

    sets = [f"paths.data_dir={tmp_path / 'data'}", f"paths.results_dir={tmp_path / 'results'}",
            "campaign.windows_per_source=1", "campaign.workers=1", "simulation.schedulers=[fcfs, las]",
            "simulation.regions=[overload]"]
    argv = ["simulate", "--params", SMOKE] + [a for s in sets for a in ("--set", s)]
    assert cli.main(argv) == 0
    n_src = len(params.load(SMOKE).source_names())   # one window per source
    assert f"{2 * n_src} runs in {n_src} shards ({n_src} computed, 0 reused)" in capsys.readouterr().out
    assert cli.main(argv) == 0
    assert f"(0 computed, {n_src} reused)" in capsys.readouterr().out
    P = params.load(SMOKE, params.undot(dict(s.split("=", 1) for s in sets[:2])) | {
        "campaign": {"windows_per_source": 1, "workers": 1},
        "simulation": {"schedulers": ["fcfs", "las"], "regions": ["overload"]}})
    from portbench.data import windows

    manifest = windows.load_manifest(P.paths)
    runs = campaign.load_runs(P.paths, campaign.make_plan(P.plan_settings, manifest=manifest))
    assert runs.height == 2 * n_src and set(runs["provenance"]) <= {"real", "standin"}
    sha = {w["id"]: w["sha256"] for w in manifest["windows"]}
    for sh in campaign.make_plan(P.plan_settings, manifest=manifest).shards:
        assert io.read_meta(campaign.shard_path(P.paths.results_dir, sh))["fingerprint"]["window"]["sha256"] == sha[sh.window.id]


def test_scheduler_defined_in_main_needs_one_worker(smoke, monkeypatch, shared_traces):
    from portbench.sim import schedulers

    class Mine(schedulers.SCHEDULERS["fcfs"]):
        pass

    Mine.__module__ = "__main__"
    monkeypatch.setitem(schedulers.SCHEDULERS, "mine_main", Mine)
    P = smoke("m", **{"simulation.schedulers": ["fcfs", "mine_main"], "simulation.regions": ["light"]})
    wins = _real_windows(smoke("m2", **{"campaign.windows_per_source": 1}))[:1]
    with pytest.raises(ParameterError, match="campaign.workers.*defined in the notebook"):
        campaign.run(P, windows=wins, workers=2, progress=False, verbose=False)
    runs = campaign.run(P, windows=wins, workers=1, progress=False, verbose=False).runs
    assert set(runs["scheduler"]) == {"fcfs", "mine_main"}


def test_preemption_markdown_quotes_the_heaviest_region_per_run_numbers():
    rows = []
    for source, prov, factor in (("azure", "real", 1.0), ("bailian", "standin", 0.0)):
        for sched, base in (("fcfs", 4), ("las", 40), ("rr", 30), ("random", 5)):
            for region, rho, load in (("light", 0.3, 0), ("severe", 2.0, 1)):
                for k in range(2):  # two runs: 2*base and 0 preemptions -> mean = base
                    rows.append({"source": source, "provenance": prov, "scheduler": sched, "region": region,
                                 "rho": rho, "preemptions": int(2 * base * load * factor) if k == 0 else 0,
                                 "rejected": 0, "arrived": 200})
    runs = pl.DataFrame(rows)
    text = present_text.preemption_markdown(runs, {"azure": "Azure", "bailian": "Bailian (stand-in)"})
    assert "`las`, `rr` preempt more than `fcfs`" in text and "region *severe* (ρ = 2)" in text
    assert "Azure: `las` 40.0, `rr` 30.0 vs `fcfs` 4.0" in text
    assert "On Bailian (stand-in) the cache almost never fills" in text and "mlfq" not in text
    assert present_text.preemption_markdown(runs.filter(pl.col("scheduler") != "fcfs")) is None
    assert present_text.preemption_markdown(runs.with_columns(pl.lit(0).alias("preemptions"))) is None


# --------------------------------------------------------------------------- prefix cache and refusals (summary.json `load`)

def _cache_runs(refused_vtc: int = 1) -> pl.DataFrame:
    """A planted runs table: Mooncake carries block hashes (lookups), Azure none. Per Mooncake run of fcfs:
    100 of 1,000 tokens hit in light, 300 of 1,000 in severe; las hits 500 of 1,000 everywhere. Azure refuses
    one request per run under every scheduler except vtc (``refused_vtc``)."""
    rows = []
    for src, prov in (("azure", "real"), ("mooncake", "real")):
        for sched in ("fcfs", "las", "vtc"):
            for region, rho in (("light", 0.3), ("severe", 2.0)):
                for rep in range(2):
                    hit = 0 if src == "azure" else (500 if sched == "las" else (100 if region == "light" else 300))
                    rows.append({"source": src, "provenance": prov, "window_id": f"{src}-00", "region": region,
                                 "rho": rho, "scheduler": sched, "replicate": rep, "arrived": 200,
                                 "refused": (refused_vtc if sched == "vtc" else 1) if src == "azure" else 0,
                                 "prefix_hit_tokens": hit, "prefix_query_tokens": 0 if src == "azure" else 1000})
    return pl.DataFrame(rows)


def test_prefix_cache_hit_rate_per_source_scheduler_and_region():
    from portbench.study.campaign import tables as T

    runs = _cache_runs()
    t = T.prefix_cache_table(runs, ("source", "scheduler"))
    moon = dict(zip(*t.filter(pl.col("source") == "mooncake").select("scheduler", "hit_rate")))
    assert moon == {"fcfs": pytest.approx(0.2), "las": pytest.approx(0.5), "vtc": pytest.approx(0.2)}
    assert t.filter(pl.col("source") == "azure")["hit_rate"].is_null().all()        # nothing looked up: n/a
    pc = T.prefix_cache_summary(runs, "fcfs", order=["mooncake", "azure"])
    assert list(pc["by_source"]) == ["mooncake", "azure"]
    m = pc["by_source"]["mooncake"]
    assert m["hit_rate"] == pytest.approx(0.2) and m["hit_tokens"] == 800 and m["looked_up_tokens"] == 4000
    assert m["hit_rate_all_policies"] == pytest.approx((800 + 2000 + 800) / 12000)
    assert m["by_region"] == {"light": pytest.approx(0.1), "severe": pytest.approx(0.3)}   # lightest first
    assert pc["by_source"]["azure"] == {"hit_rate": None, "note": T.PREFIX_NA}
    md = present_text.prefix_cache_markdown(pc, {"mooncake": "Mooncake", "azure": "Azure"})
    assert "active on Mooncake" in md and "20.0% of the tokens `fcfs`" in md and "(800 of 4,000)" in md
    assert "from 20.0% (`fcfs`) to 50.0% (`las`)" in md and "10.0% in *light* to 30.0% in *severe*" in md
    assert "Azure: no prompt block hashes" in md
    assert "off in this campaign" in present_text.prefix_cache_markdown(pc, {}, "off")
    assert T.prefix_cache_summary(runs.drop("prefix_hit_tokens")) == {}


def test_refusals_per_scheduler_and_the_check_that_every_scheduler_agrees():
    from portbench.study.campaign import tables as T

    ok = T.refusal_check(_cache_runs())
    assert ok["schedulers_agree"] and ok["disagreements"] == []
    assert ok["by_source_scheduler"]["azure"] == {"fcfs": 4, "las": 4, "vtc": 4}    # 2 regions x 2 replicates
    bad = T.refusal_check(_cache_runs(refused_vtc=0))
    assert not bad["schedulers_agree"] and len(bad["disagreements"]) == 2
    assert bad["disagreements"][0] == {"source": "azure", "region": "light",
                                       "refused_by_scheduler": {"fcfs": 2, "las": 2, "vtc": 0}}
    block = T.load_summary(_cache_runs(), {}, max_model_len=131072)
    assert block["refusals"]["schedulers_agree"] and "131,072 tokens or more" in block["refusals"]["rule"]
    assert block["refusals"]["depends_on"].startswith("the prompt alone: checked")
    assert "schedulers disagree" in T.load_summary(_cache_runs(refused_vtc=0), {})["refusals"]["depends_on"]
    assert block["prefix_cache"]["by_source"]["mooncake"]["hit_rate"] == pytest.approx(0.2)
    w = campaign.refusal_warnings(_cache_runs(), max_model_len=131072)         # azure: 12 of 2,400 = 0.5 %
    assert w == []
    w = campaign.refusal_warnings(_cache_runs().with_columns(pl.col("refused") * 5), max_model_len=131072)
    assert len(w) == 1 and "has 131,072 tokens (the model's context) or more" in w[0] and "longer" not in w[0]


# --------------------------------------------------------------------------- what the campaign does once (issue #26)


def test_run_seed_is_the_sha256_of_the_canonical_json_of_its_key():
    """run_seed serialises its key with one encoder made once; the seed is still the first 8 bytes (>> 1) of the
    SHA-256 of io.canonical_json of the key (the module docstring's definition)."""
    for key in [(0, "azure-00", "fcfs", "light", 0), (123456789, "bailian-17", "srpt_oracle", "overload", 2),
                (7, "w/ünï cödé", "my plug-in", "r\"q\\", 9)]:
        base, wid, sched, region, rep = key
        want = int.from_bytes(hashlib.sha256(io.canonical_json(
            [campaign.SEED_TAG, base, wid, sched, region, rep]).encode()).digest()[:8], "big") >> 1
        assert campaign.run_seed(*key) == want


def test_consolidation_uses_the_shards_just_written_and_equals_reading_them_back(smoke):
    """The runs table a campaign returns (its computed shards kept in memory, not read back) is the table read
    back from the shard files, and runs.parquet holds it; a campaign that reuses half of its shards gives it too."""
    P = smoke("mem")
    res = run_fake(P)
    assert res.computed_shards == len(res.plan.shards)
    from_files = campaign.consolidate_runs(P.paths, res.plan)          # every shard read from its file
    assert res.runs.schema == from_files.schema and res.runs.equals(from_files)
    assert pl.read_parquet(campaign.runs_path(P.paths.results_dir)).equals(from_files)
    for sh in res.plan.shards[::2]:
        campaign.shard_path(P.paths.results_dir, sh).unlink()
    mixed = run_fake(P)
    assert mixed.computed_shards == len(res.plan.shards[::2]) and mixed.reused_shards
    assert mixed.runs.equals(from_files)


def test_sim_engine_computes_marks_and_options_once_per_table_and_section(smoke, shared_traces):
    """SimEngine keeps a shard's utilisation marks and scheduler options between its runs (checked by the
    identity of the scaled table and of the simulation section): runs on another table, or with another
    section, give what a fresh engine gives."""
    import dataclasses

    P = smoke("eng", **{"campaign.windows_per_source": 1})
    sim = P.simulation
    eng = campaign.SimEngine()
    for _, df in _real_windows(P)[:2] * 2:
        scaled, horizon = eng.prepare(df, 0.9, 2.0, sim)
        got = eng.run(scaled, "las", 1, horizon, sim)
        fresh = campaign.SimEngine().run(scaled, "las", 1, horizon, sim)
        assert got.counters == fresh.counters and got.metrics == fresh.metrics
    for sigma in (2.0, 0.25):
        other = dataclasses.replace(sim, predictor_sigma=sigma)
        assert eng._scheduler(other, "sjf_noisy_oracle").sigma == sigma


def test_campaign_files_reads_the_runs_once_and_none_when_given_them(smoke, monkeypatch):
    """The summary's campaign_files reads the campaign's runs through the plan it is given (the same table as
    load_runs), and reads no runs when the caller passes the table it has loaded already."""
    from portbench.study.analysis import results

    P = smoke("files")
    res = run_fake(P)
    calls: list = []
    real = campaign.load_runs
    monkeypatch.setattr(campaign, "load_runs", lambda paths, plan: calls.append(plan) or real(paths, plan))
    runs, caps = results.campaign_files(P.paths, res.plan)
    assert runs.equals(res.runs) and calls == [res.plan]
    assert set(caps) == {w.id for w in res.plan.windows}
    given = res.runs.head(3)
    assert results.campaign_files(P.paths, res.plan, given)[0] is given and len(calls) == 1
    assert results.campaign_files(P.paths, None) is None


def test_the_campaign_imports_no_model_library_and_the_predictor_fingerprint_names_their_versions():
    """Reading frozen predictions (fingerprint, attach) does not import lightgbm, scikit-learn or scipy.stats: they
    load where a predictor is trained or scored. The fingerprint still records their versions, the same strings
    as the packages' ``__version__``."""
    code = ("import sys, portbench.study.campaign, portbench.data.predictors as p; "
            "print([m for m in ('lightgbm', 'sklearn', 'scipy.stats') if m in sys.modules]); "
            "import lightgbm, sklearn; print(p._version('lightgbm') == lightgbm.__version__, "
            "p._version('scikit-learn') == sklearn.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True True"
