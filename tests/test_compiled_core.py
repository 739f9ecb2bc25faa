"""The compiled engine core against the SimPy reference: equality as a contract.

Every run the compiled core supports must give *identical* records (every column of every request),
counters and step log on both cores -- not close: the same floats. A golden set over every supported
policy x operating region x source (the study's frozen windows, rebuilt from the data mirror), with
and without prefix caching, and property tests over random small windows (arrival ties, evictions,
refusals at the context limit, prefix hits, finite horizons). The fallback of ``engine.core: auto`` and
the error of ``compiled`` on what it does not support are tested too. numba is an ordinary dependency:
nothing here skips."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portbench import params
from portbench.core.config import EngineConfig
from portbench.core.errors import ParameterError
from portbench.data import windows as W
from portbench.sim import profiles, regions
from portbench.sim.engine import compiled, simulate
from portbench.sim.schedulers import get_scheduler

SLO = {"ttft_s": 2.0, "tpot_s": 0.1}
REGION_LOADS = {"light": 0.3, "moderate": 0.5, "busy": 0.7, "near_saturation": 0.9, "overload": 1.2, "severe": 2.0}
SOURCES = ("azure", "burstgpt", "bailian", "azure_code", "mooncake")


def prof():
    return profiles.get_profile(profiles.DEFAULT_PROFILE)


def both(df, policy, profile, **kw):
    """The run on both cores: (reference, compiled)."""
    engine = kw.pop("engine", {})
    ref = simulate(df, policy, profile, engine={**engine, "core": "reference"}, **kw)
    cc = simulate(df, policy, profile, engine={**engine, "core": "compiled"}, **kw)
    return ref, cc


def assert_identical(ref, cc, what="", cores=("reference", "compiled")):
    assert (ref.core, cc.core) == cores, what
    a, b = ref.requests, cc.requests
    assert a.columns == b.columns and a.dtypes == b.dtypes, what
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":     # bit-identical, NaN where NaN
            same = (x.view(np.int64) == y.view(np.int64))
        else:
            same = x == y
        assert same.all(), f"{what}: column {col} differs at rows {np.nonzero(~same)[0][:5].tolist()}"
    assert ref.counters == cc.counters, (what, {k: (v, cc.counters.get(k)) for k, v in ref.counters.items()
                                               if cc.counters.get(k) != v})
    if ref.iterations is not None:
        assert cc.iterations is not None and ref.iterations.equals(cc.iterations), what


def with_predictions(df: pl.DataFrame) -> pl.DataFrame:
    """Placeholder predictions (the equality of the cores does not depend on the predictor's quality)."""
    p = pl.col("prompt_tokens").cast(pl.Float64)
    return df.with_columns(p.sqrt().alias("predicted_output"), p.log().alias("ltr_score"))


@pytest.fixture(scope="module")
def frozen(tmp_path_factory, shared_traces):
    """The first frozen window of every source (the committed manifest, rebuilt from the mirror), with its
    prompt-hash block size."""
    d = tmp_path_factory.mktemp("compiled")
    cfg = params.load("papermill_params/smoke.yaml", params.undot({
        "paths.data_dir": str(d / "data"), "paths.results_dir": str(d / "results"),
        "paths.figures_dir": str(d / "figures"), "paths.mirror": str(shared_traces)}))
    manifest = W.load_manifest(cfg.paths)
    tables = W.load_windows(cfg.data, SOURCES, 1, manifest=manifest)
    entries = {e["id"]: e for e in manifest["windows"]}
    out = {}
    for wid, df in tables.items():
        e = entries[wid]
        hb = W.hash_block_size(manifest, e)
        if "block_hashes" in df.columns and (hb is None or df["block_hashes"].null_count() == df.height):
            df = df.drop("block_hashes")
            hb = None
        out[e["source"]] = (with_predictions(df), hb)
    return out


@pytest.mark.parametrize("source", SOURCES)
def test_golden_every_supported_policy_and_region(frozen, source):
    """Every supported policy x operating region on the source's frozen window (work marks and the step
    log on), under V0 batching, with swap preemption, without prefix caching too
    where the window has hashes, and on a cache of 1/25 of the
    size at overload and severe (so that every source reaches evictions): identical on both cores."""
    df, hb = frozen[source]
    p = prof()
    small = dataclasses.replace(p, kv_capacity_blocks=p.kv_capacity_blocks // 25)
    cap = float(regions.saturation(df, p, "fcfs", hash_block_tokens=hb)["capacity_rps"])
    modes = [{}, {"batching": "v0"}, {"preemption": "swap"}] + ([{"prefix_caching": "off"}] if hb else [])
    seen = {"preemptions": 0, "prefix_hit_tokens": 0, "unfinished": 0, "swaps": 0}
    for region, rho in REGION_LOADS.items():
        sdf = regions.rescale(df, rho, cap)
        h = regions.horizon_s(sdf, 1.5)
        t1, t2 = regions.utilisation_marks(sdf)
        for policy in compiled.SUPPORTED_POLICIES:
            for mode in modes:
                for pr in (p, small) if region in ("overload", "severe") else (p,):
                    ref, cc = both(sdf, policy, pr, horizon_s=h, seed=3, slo=SLO, hash_block_tokens=hb, engine=mode,
                                   work_marks=(t1, t2), record_iterations=True)
                    assert_identical(ref, cc, f"{source} {region} {policy} {mode} {pr.kv_capacity_blocks}")
                    for k in seen:
                        seen[k] += ref.counters[k]
    assert seen["preemptions"] > 0 and seen["unfinished"] > 0 and seen["swaps"] > 0, seen   # evictions, swaps
    if hb:
        assert seen["prefix_hit_tokens"] > 0, seen


def test_golden_covers_refusals_at_the_context_limit():
    """Prompts at or above max_model_len are refused and outputs clipped: identical on both cores."""
    p = dataclasses.replace(prof(), max_model_len=3000)
    rng = np.random.default_rng(5)
    n = 120
    df = with_predictions(pl.DataFrame({
        "arrival_s": np.sort(rng.uniform(0, 20, n)), "prompt_tokens": rng.integers(10, 4000, n),
        "output_tokens": rng.integers(1, 2000, n), "tenant": ["a"] * n}))
    for policy in compiled.SUPPORTED_POLICIES:
        ref, cc = both(df, policy, p, horizon_s=60.0, seed=0, slo=SLO)
        assert ref.counters["refused"] > 0 and ref.counters["clipped"] > 0
        assert_identical(ref, cc, policy)


# --------------------------------------------------------------------------- random small windows


def small_profile(cap_blocks: int, max_seqs: int, budget: int, host_blocks: int = 0):
    return dataclasses.replace(prof(), kv_capacity_blocks=cap_blocks, max_num_seqs=max_seqs,
                               max_batched_tokens=budget, max_model_len=1500, host_kv_blocks=host_blocks)


@st.composite
def windows(draw):
    n = draw(st.integers(1, 40))
    grid = draw(st.sampled_from([0.0, 0.05, 0.5]))          # 0: continuous; else arrivals on a grid (ties)
    arr = np.sort(np.asarray(draw(st.lists(st.floats(0, 8), min_size=n, max_size=n))))
    if grid:
        arr = np.floor(arr / grid) * grid
    prompts = draw(st.lists(st.integers(1, 1700), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    hashed = draw(st.booleans())
    tenants = draw(st.lists(st.sampled_from(["t0", "t1", "t2"]), min_size=n, max_size=n))   # vtc's counters
    df = pl.DataFrame({"arrival_s": arr, "prompt_tokens": prompts, "output_tokens": outputs, "tenant": tenants})
    if hashed:                # conversations sharing leading 32-token blocks, then diverging
        convs = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        shared = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
        hs = [[c * 1000 + j if j < s else 10**6 + i * 1000 + j for j in range(-(-p // 32))]
              for i, (p, c, s) in enumerate(zip(prompts, convs, shared))]
        df = df.with_columns(pl.Series("block_hashes", hs, dtype=pl.List(pl.Int64)))
    return with_predictions(df), (32 if hashed else None)


# every supported policy, ltr with a short starvation guard (it fires within the small windows) and none, vtc
# with other weights, and the preemptive policies with small quanta (keys change often in small windows)
POLICIES = compiled.SUPPORTED_POLICIES + (("ltr", {"starvation_s": 0.3}), ("ltr", {"starvation_s": None}),
                                          ("vtc", {"w_prompt": 3, "w_output": 1}), ("rr", {"quantum_tokens": 4}),
                                          ("las", {"quantum_tokens": 3}), ("mlfq", {"quantum_tokens": 2, "levels": 4}))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=windows(), policy=st.sampled_from(POLICIES), cap=st.integers(60, 400),
       seqs=st.integers(1, 12), budget=st.sampled_from([64, 256, 2048]), horizon=st.sampled_from([math.inf, 3.0, 12.0]),
       seed=st.integers(0, 3), batching=st.sampled_from(["v1", "v0"]),
       preemption=st.sampled_from(["recompute", "swap"]), host=st.sampled_from([0, 40, 400]))
def test_random_windows_identical(w, policy, cap, seqs, budget, horizon, seed, batching, preemption, host):
    df, hb = w
    p = small_profile(cap, seqs, budget, host)       # swap: host memory none, small (then recompute) or ample
    if isinstance(policy, tuple):
        policy = get_scheduler(policy[0], **policy[1])
    ref, cc = both(df, policy, p, horizon_s=horizon, seed=seed, slo=SLO, hash_block_tokens=hb, engine={"batching": batching, "preemption": preemption},
                   work_marks=(1.0, 4.0), record_iterations=True)
    assert_identical(ref, cc, policy)


# --------------------------------------------------------------------------- the setting and the fallback


def test_setting_and_fingerprint():
    assert EngineConfig().core == "auto"
    assert EngineConfig.of({"core": "reference"}).core == "reference"
    with pytest.raises(ParameterError, match="engine.core"):
        EngineConfig(core="fast")
    # the core is not part of what the fingerprints record (both give the same results)
    assert EngineConfig(core="compiled").as_dict() == EngineConfig().as_dict()
    assert EngineConfig(core="reference").reference.core == "reference"


def test_auto_falls_back_with_the_reason():
    df = with_predictions(pl.DataFrame({"arrival_s": [0.0, 0.1], "prompt_tokens": [10, 20],
                                        "output_tokens": [5, 6], "tenant": ["a", "b"]}))
    p = prof()
    assert simulate(df, "fcfs", p, horizon_s=10.0, seed=0).core == "compiled"
    for policy, engine, why in ((get_scheduler("sjf_prompt", preemptive=True), {}, "preemptive: true"),):
        res = simulate(df, policy, p, horizon_s=10.0, seed=0, engine=engine)
        assert res.core == "reference" and why in res.core_note
        with pytest.raises(ParameterError, match="engine.core"):
            simulate(df, policy, p, horizon_s=10.0, seed=0, engine={**engine, "core": "compiled"})
    res = simulate(df, "fcfs", p, horizon_s=10.0, seed=0, check_invariants=True)
    assert res.core == "reference" and "check_invariants" in res.core_note
    assert compiled.unsupported(type("X", (), {"name": "x"})(), EngineConfig(), p) is not None


def test_plugins_run_on_the_reference():
    from portbench.sim.schedulers import FCFS

    class MyFCFS(FCFS):          # defined outside portbench: a plug-in
        name = "my_fcfs"

    df = pl.DataFrame({"arrival_s": [0.0], "prompt_tokens": [10], "output_tokens": [3], "tenant": ["a"]})
    res = simulate(df, MyFCFS(), prof(), horizon_s=10.0, seed=0)
    assert res.core == "reference" and "plug-in" in res.core_note


def test_hash_ids_vectorised_as_the_requests_give_them():
    """The prompt-hash entry ids from the window's ``block_hashes`` column (vectorised) are the ids the
    requests' own hashes give (numbered in order of first occurrence), with empty and missing lists."""
    df = pl.DataFrame({"arrival_s": [0.0, 0.1, 0.2, 0.3, 0.4], "prompt_tokens": [40, 40, 40, 40, 40],
                       "output_tokens": [2, 2, 2, 2, 2], "tenant": ["a"] * 5,
                       "block_hashes": [[9, 7, 5], [], None, [7, 9, 11, 9], [2**62, 5]]})
    from portbench.sim.request import requests_from_window
    reqs, _ = requests_from_window(df, prof(), np.random.default_rng(0))
    hoff, hid = compiled.hash_ids(df, reqs)
    ref_off, ref_id = compiled.hash_ids({"block_hashes": df["block_hashes"].to_list()}, reqs)   # the requests' path
    assert hoff.tolist() == ref_off.tolist() == [0, 3, 3, 3, 7, 9]
    assert hid.tolist() == ref_id.tolist() == [0, 1, 2, 1, 0, 3, 0, 4, 2]


def test_column_setup_hash_ids_as_the_requests_give_them():
    """The set-up from the window's columns (:mod:`portbench.sim.engine.columns`) reads the prompt hashes from
    the column's Arrow buffers: the same ids as the requests' own hashes, with null and empty lists (the
    flatten path), without them (the offsets path) and on a slice of the table (offsets not starting at 0);
    null elements inside a list are left to the reference set-up."""
    from portbench.sim.engine import columns
    from portbench.sim.request import requests_from_window

    df = pl.DataFrame({"arrival_s": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], "prompt_tokens": [40] * 6,
                       "output_tokens": [2] * 6, "tenant": ["a"] * 6,
                       "block_hashes": [[9, 7, 5], [], None, [7, 9, 11, 9], [2**62, 5], [5, 3]]})
    for d in (df, df.filter(pl.col("block_hashes").is_not_null()), df.slice(3), df.slice(1, 3)):
        reqs, _ = requests_from_window(d, prof(), np.random.default_rng(0))
        lens, flat = columns._hashes(d)
        hoff, hid = columns.hash_ids(lens, flat)
        ref_off, ref_id = compiled.hash_ids({"block_hashes": d["block_hashes"].to_list()}, reqs)
        assert hoff.tolist() == ref_off.tolist() and hid.tolist() == ref_id.tolist()
    assert columns._hashes(df.with_columns(pl.Series("block_hashes", [[1, None]] * 6))) is None


def test_column_setup_is_used_and_the_reference_setup_agrees():
    """A polars window runs on the column set-up; a mapping of columns (which it does not read) takes the
    Request set-up: both give the reference's records, for a static, a ranked, a fair and a preemptive policy."""
    from portbench.sim.engine import columns

    rng = np.random.default_rng(2)
    n = 60
    df = with_predictions(pl.DataFrame({
        "arrival_s": np.sort(rng.uniform(0, 6, n)), "prompt_tokens": rng.integers(10, 1400, n),
        "output_tokens": rng.integers(1, 300, n), "tenant": rng.choice(["a", "b", "c"], n)}))
    p = small_profile(120, 8, 256)
    for policy in ("sjf_predicted", "random", "edf", "ltr", "vtc", "rr"):
        sched = get_scheduler(policy)
        got = columns.prepare(df, sched, p, 20.0, np.random.default_rng(0), SLO, EngineConfig(), hash_block_tokens=None,
                              marks=(), record_iterations=False, check_contract=False)
        assert got is not None and got[1].prompt.shape == (n,)
        ref, cc = both(df, policy, p, horizon_s=20.0, seed=1, slo=SLO)
        assert_identical(ref, cc, policy)
        mapping = {c: df[c].to_list() for c in df.columns}
        ref2 = simulate(mapping, policy, p, horizon_s=20.0, seed=1, slo=SLO, engine={"core": "reference"})
        cc2 = simulate(mapping, policy, p, horizon_s=20.0, seed=1, slo=SLO, engine={"core": "compiled"})
        assert_identical(ref2, cc2, f"{policy} (mapping)")


def test_compiled_queue_statistics_equal_numpys_bit_for_bit():
    """The waiting queue's time-average and 95th percentile (``counters["queue_mean"]``, ``queue_p95``):
    the compiled loops (numba) give numpy's numbers on random intervals (ties, zero length, reaching outside
    [0, t_end])."""
    import importlib

    sim_mod = importlib.import_module("portbench.sim.engine.simulate")
    core = sim_mod.QUEUE_LOOP(may_import=True)
    assert core is not None
    rng = np.random.default_rng(3)
    for k in range(400):
        m = int(rng.integers(0, 50))
        st = np.round(rng.uniform(-2, 12, m), int(rng.integers(0, 3)))
        en = st + np.round(rng.uniform(-1, 6, m), int(rng.integers(0, 3)))
        t_end = float(rng.choice([10.0, 5.5, 0.7]))
        got = sim_mod._queue_stats(st, en, t_end)
        sim_mod.QUEUE_LOOP.off = True
        try:
            ref = sim_mod._queue_stats(st, en, t_end)
            ref2 = sim_mod.queue_stats(np.column_stack([st, en]) if m else [], t_end)
        finally:
            sim_mod.QUEUE_LOOP.off = False
        bits = [np.asarray(x, float).view(np.int64).tolist() for x in (got, ref, ref2)]
        assert bits[0] == bits[1] == bits[2], k


def test_a_shared_window_gives_every_run_the_records_of_its_own_table():
    """``simulate(Window(df), ...)``: the scheduler-independent set-up kept once for the window and shared by the
    runs of every policy (as a campaign's shard shares it), in any order, gives each run the records, counters
    and step log of ``simulate(df, ...)``; a window the column set-up does not read (nulls) runs on the reference
    set-up as before (a mapping of columns)."""
    from portbench.sim.engine.columns import Window

    rng = np.random.default_rng(4)
    n = 80
    df = with_predictions(pl.DataFrame({
        "arrival_s": np.sort(np.round(rng.uniform(0, 6, n), 1)), "prompt_tokens": rng.integers(10, 1400, n),
        "output_tokens": rng.integers(1, 300, n), "tenant": rng.choice(["a", "b", "c"], n)}))
    p = small_profile(120, 8, 256)
    win = Window(df)
    for policy in ("fcfs", "vtc", "las", "sjf_predicted", "ltr", "random", "mlfq", "edf", "vtc", "fcfs", "rr"):
        for seed in (1, 2):
            got = simulate(win, policy, p, horizon_s=8.0, seed=seed, slo=SLO, engine={"core": "compiled"},
                           work_marks=(1.0, 5.0))
            want = simulate(df, policy, p, horizon_s=8.0, seed=seed, slo=SLO, engine={"core": "compiled"},
                            work_marks=(1.0, 5.0))
            assert_identical(want, got, f"{policy} seed {seed}", cores=("compiled", "compiled"))
    mapping = {c: df[c].to_list() for c in df.columns}
    got = simulate(Window(mapping), "las", p, horizon_s=8.0, seed=1, engine={"core": "auto"})
    assert_identical(simulate(mapping, "las", p, horizon_s=8.0, seed=1, engine={"core": "auto"}), got, "mapping",
                     cores=("compiled", "compiled"))


def test_loop_returns_arrays_that_own_their_memory(monkeypatch):
    """The loop's helpers take borrowed views (``compiled._borrowed``: no reference counting per call); what the
    loop returns (S, SF: views of its work buffers; the queue intervals, the step log) keeps its memory alive."""
    real = compiled.kernel()
    got = []

    def recording(*args):
        got.append(real(*args))
        return got[-1]

    monkeypatch.setattr(compiled, "kernel", lambda: recording)
    rng = np.random.default_rng(3)
    n = 40
    df = pl.DataFrame({"arrival_s": np.sort(rng.uniform(0, 3, n)), "prompt_tokens": rng.integers(10, 900, n),
                       "output_tokens": rng.integers(1, 200, n)})
    p = small_profile(60, 8, 256)
    for policy in ("fcfs", "las"):
        ref, cc = both(df, policy, p, horizon_s=30.0, seed=1, slo=SLO, record_iterations=True)
        assert_identical(ref, cc, policy)
    assert len(got) == 2
    for out in got:
        for x in out[2:]:
            assert isinstance(x, np.ndarray) and x.base is not None      # a numba-owned array, not a borrowed one
