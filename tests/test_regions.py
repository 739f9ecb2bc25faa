"""Operating regions: capacity definition, rescaling, horizon, parameter validation."""

from __future__ import annotations

import copy
import math

import numpy as np
import polars as pl
import pytest

from portbench import params
from portbench.sim import engine as simulator
from portbench.sim import regions
from portbench.core.errors import DataError, ParameterError
from test_simulator import StubProfile, azure_windows, real_profile, window


@pytest.fixture(scope="module")
def windows(shared_traces):
    return azure_windows(shared_traces)


@pytest.fixture(scope="module")
def P():
    return params.load(validate=False)


def test_capacity_is_the_steady_completion_rate_of_a_backlog(windows):
    """Capacity = completions per second in the steady part of a backlog of the window's requests
    (repeated to >= 4,000): from the 10 % completion quantile to the last admission."""
    prof = real_profile()
    for df in windows.values():
        sat = regions.saturation(df, prof)
        assert sat["capacity_rps"] == regions.capacity(df, prof)
        reps = math.ceil(4096 / df.height)
        backlog = pl.concat([df] * reps).with_columns(pl.lit(0.0).alias("arrival_s"))
        assert sat["backlog"] == backlog.height >= 16 * prof.max_num_seqs
        res = simulator.simulate(backlog, "fcfs", prof, horizon_s=math.inf, seed=0)
        fin = np.sort(res.requests["finish_s"].to_numpy())
        t0 = fin[math.ceil(0.1 * len(fin)) - 1]
        t1 = float(res.requests["admitted_s"].max())
        assert (sat["t_start_s"], sat["t_end_s"]) == (t0, t1)
        assert sat["capacity_rps"] == pytest.approx(((fin > t0) & (fin <= t1)).sum() / (t1 - t0), rel=1e-12)
        # the backlog keeps the engine saturated: KV (or the batch) is full
        assert res.counters["kv_max_used_blocks"] >= 0.9 * prof.kv_capacity_blocks
        # without the drain tail the capacity is above the burst's completed / makespan
        assert sat["capacity_rps"] > regions.burst_capacity(df, prof)
        serial = df.height / float(np.sum(prof.isolated_service_s(df["prompt_tokens"].to_numpy(),
                                                                   df["output_tokens"].to_numpy())))
        assert sat["capacity_rps"] > 3 * serial


def test_capacity_on_planted_workloads_with_known_service_rates():
    """Identical requests. One at a time (max_num_seqs = 1): capacity = 1 / service time. Four at a
    time: they run in lock-step batches (four prompts in one iteration, then four decodes per
    iteration), capacity = 4 / batch time."""
    p, o = 100, 5
    df = window(np.arange(50) * 0.01, [p] * 50, [o] * 50)
    serial = StubProfile(max_num_seqs=1)
    assert regions.capacity(df, serial) == pytest.approx(1 / serial.isolated_service_s(p, o), rel=1e-9)
    four = StubProfile(max_num_seqs=4)
    batch = four.iteration_time(4 * p, 0, 4 * p) + sum(four.iteration_time(0, 4, 4 * (p + j)) for j in range(1, o))
    assert regions.capacity(df, four) == pytest.approx(4 / batch, rel=1e-9)
    # the earlier burst definition on a single burst of 6 requests (2 batches of 4 and 2) undershoots
    six = window([0] * 6, [p] * 6, [o] * 6)
    assert regions.burst_capacity(six, four) < regions.capacity(six, four) == pytest.approx(4 / batch, rel=1e-9)
    # utilisation: one request per 2 service times on the serial server -> 0.5 (and 1 when saturated)
    s = serial.isolated_service_s(p, o)
    for rho in (0.5, 2.0):
        arr = np.arange(100) * s / rho
        d = window(arr, [p] * 100, [o] * 100)
        t1, t2 = regions.utilisation_marks(d)
        res = simulator.simulate(d, "fcfs", serial, horizon_s=math.inf, seed=0, work_marks=(t1, t2))
        w = res.counters["work_at"]
        u = regions.utilisation((w[1] - w[0]) / (t2 - t1), 1 / s, p + o)
        assert u == pytest.approx(min(rho, 1.0), rel=0.03)


def test_burst_capacity_of_a_hand_case():
    """The earlier definition: two identical requests that fit together, all at t=0 (V0): prefill
    both (200 tokens), then 4 decodes of both; capacity = 2 / makespan."""
    prof = StubProfile()
    df = window([0.3, 0.9], [100, 100], [5, 5])
    t = prof.iteration_time(200, 0, 200) + sum(prof.iteration_time(0, 2, 2 * (100 + j)) for j in range(1, 5))
    assert regions.burst_capacity(df, prof) == pytest.approx(2 / t, rel=1e-12)
    assert regions.burst_capacity(df, prof, policy="sarathi") > 0


def test_rescale_hits_the_offered_rate_and_keeps_the_pattern(windows):
    prof = real_profile()
    df = windows["azure-1000"]
    cap = regions.capacity(df, prof)
    gaps = np.diff(df["arrival_s"].to_numpy())
    for rho in (0.3, 0.9, 2.0):
        s = regions.rescale(df, rho, cap)
        assert s.columns == df.columns and s.dtypes == df.dtypes
        assert s.select(pl.exclude("arrival_s")).equals(df.select(pl.exclude("arrival_s")))
        n = s.height
        assert (n - 1) / s["arrival_s"].max() == pytest.approx(rho * cap, rel=1e-12)
        assert regions.offered_rate(s) == pytest.approx(rho * cap, rel=1e-12)
        sgaps = np.diff(s["arrival_s"].to_numpy())
        f = regions.scale_factor(df, rho, cap)
        np.testing.assert_allclose(sgaps, gaps * f, rtol=1e-12, atol=1e-12)   # bursts kept
        assert s["arrival_s"][0] == 0.0
        h = regions.horizon_s(s, 1.5)
        assert h == pytest.approx(1.5 * s["arrival_s"].max())


def test_load_orders_the_regions(windows):
    """Higher rho -> more waiting: FCFS mean TTFT grows with the load, and only overload leaves
    requests unfinished at the horizon."""
    prof = real_profile()
    df = windows["azure-8000"]
    cap = regions.capacity(df, prof)
    ttft, unfinished = [], []
    for rho in (0.3, 0.7, 1.2, 2.0):
        s = regions.rescale(df, rho, cap)
        res = simulator.simulate(s, "fcfs", prof, horizon_s=regions.horizon_s(s, 1.5), seed=0)
        r = res.requests
        ttft.append(float((r["first_token_s"] - r["arrival_s"]).drop_nans().mean()))
        unfinished.append(res.counters["unfinished"])
    assert ttft == sorted(ttft)
    assert unfinished[0] == 0 and unfinished[-1] > 0


@pytest.mark.parametrize("rho", [0, -0.5, float("nan"), float("inf"), True, "high"])
def test_bad_rho(rho):
    with pytest.raises(ParameterError) as e:
        regions.rescale(window([0, 1, 2], [5, 5, 5], [2, 2, 2]), rho, 3.0)
    assert e.value.param == "rho" and "> 0" in e.value.expected


def test_bad_capacity_and_windows():
    df = window([0, 1, 2], [5, 5, 5], [2, 2, 2])
    with pytest.raises(ParameterError) as e:
        regions.rescale(df, 0.5, 0.0)
    assert e.value.param == "capacity_rps"
    with pytest.raises(DataError):
        regions.rescale(window([0, 0], [5, 5], [2, 2]), 0.5, 1.0)      # zero span
    with pytest.raises(DataError):
        regions.rescale(window([0], [5], [2]), 0.5, 1.0)               # one request
    with pytest.raises(ParameterError) as e:
        regions.horizon_s(df, 0)
    assert e.value.param == "simulation.horizon_factor"
    with pytest.raises(DataError):
        regions.capacity(window([0], [10_000], [10_000]), StubProfile(kv_capacity_blocks=10))
    with pytest.raises(DataError):
        regions.burst_capacity(window([0], [10_000], [10_000]), StubProfile(kv_capacity_blocks=10))


def test_region_loads_follow_the_parameters(P):
    assert P.simulation.loads == {"light": 0.3, "moderate": 0.5, "busy": 0.7, "near_saturation": 0.9,
                                  "overload": 1.2, "severe": 2.0}
    assert P.with_overrides({"simulation.regions": ["severe", "light"]}).simulation.loads == \
        {"light": 0.3, "severe": 2.0}     # in increasing load, whatever the order given
    with pytest.raises(ParameterError) as e:
        P.with_overrides({"simulation.regions": ["meltdown"]})
    assert e.value.param == "simulation.regions[0]" and "near_saturation" in e.value.expected


def test_validate_simulation_params_accepts_the_defaults(P):
    params.validate_config(P)


@pytest.mark.parametrize("path, value, param", [
    ("schedulers", ["fcfs", "fifo"], "simulation.schedulers[1]"),
    ("regions", ["light", "meltdown"], "simulation.regions[1]"),
    ("region_loads", {"light": 0.3, "bad": -1.0}, "simulation.region_loads.bad"),
    ("region_loads", {"light": 0}, "simulation.region_loads.light"),
    ("capacity_policy", "best", "simulation.capacity_policy"),
    ("horizon_factor", 0, "simulation.horizon_factor"),
    ("replicates", 0, "simulation.replicates"),
    ("seed", -3, "simulation.seed"),
    ("predictor_sigma", -0.1, "simulation.predictor_sigma"),
    ("slo", {"tight": {"ttft_s": 0.5}}, "simulation.slo.tight.tpot_s"),
    ("slo", {"tight": {"ttft_s": -1, "tpot_s": 0.1}}, "simulation.slo.tight.ttft_s"),
    ("edf_slo", "strict", "simulation.edf_slo"),
    ("scheduler_options", {"rr": {"quantum": 4}}, "simulation.scheduler_options.rr"),
    ("scheduler_options", {"rr": {"quantum_tokens": -4}}, "simulation.scheduler_options.rr.quantum_tokens"),
    ("scheduler_options", {"nope": {}}, "simulation.scheduler_options"),
    ("profile", "tpu_v9", "simulation.profile"),
])
def test_validate_simulation_params_rejects(P, path, value, param):
    tree = copy.deepcopy(P.tree)
    tree["simulation"][path] = value                 # replaces the whole value (no merge)
    if path == "regions":
        tree["simulation"]["region_loads"] = {"light": 0.3}
    with pytest.raises(ParameterError) as e:
        params.validate_config(params.build(tree))   # built (types, ranges), then checked against the registries
    assert e.value.param == param
