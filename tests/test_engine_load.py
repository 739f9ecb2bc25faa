"""The engine section of the parameters, load and refusal bookkeeping of the campaign (issue #10)."""

from __future__ import annotations

import polars as pl
import pytest

from portbench import params
from portbench.core.config import EngineConfig
from portbench.core.errors import ParameterError
from portbench.study import campaign
from portbench.study.campaign.plan import WindowRef, make_plan


def test_engine_section_defaults_and_validation():
    cfg = params.load(validate=False)
    assert cfg.engine == EngineConfig("v1", "recompute", "auto") == cfg.simulation.engine
    v0 = params.load(overrides={"engine.batching": "v0", "engine.preemption": "swap"}, validate=False)
    assert (v0.engine.batching, v0.engine.preemption) == ("v0", "swap") and v0.simulation.engine is v0.engine
    with pytest.raises(ParameterError) as e:
        params.load(overrides={"engine.batching": "v2"}, validate=False)
    assert e.value.param == "engine.batching" and "v1" in e.value.expected
    with pytest.raises(ParameterError) as e:
        params.load(overrides={"engine.prefix_caching": "on"}, validate=False)
    assert e.value.param == "engine.prefix_caching"
    with pytest.raises(ParameterError):
        params.load(overrides={"engine.swap_space": 4}, validate=False)      # not in the schema
    assert EngineConfig.of({"batching": "v0"}).batching == "v0" and EngineConfig.of(None) == EngineConfig()
    with pytest.raises(ParameterError):
        EngineConfig.of({"batching": "v1", "typo": 1})


def _refs():
    return [WindowRef(f"{s}-0{i}", s, "real", f"{s}{i}" * 8) for s in ("azure", "bailian") for i in range(2)]


def test_the_engine_is_part_of_every_shard_key_and_capacity_is_measured_on_the_reference_engine():
    a = params.load("papermill_params/smoke.yaml", validate=False)
    b = a.with_overrides({"engine.batching": "v0"})
    c = a.with_overrides({"engine.preemption": "swap"})
    d = a.with_overrides({"engine.prefix_caching": "off"})
    pa, pb, pc, pd = (make_plan(x.plan_settings, windows=_refs()) for x in (a, b, c, d))
    for p in (pb, pc, pd):
        assert not {s.name for s in pa.shards} & {s.name for s in p.shards}
    # capacity: FCFS on vLLM V1 with recompute whatever the engine, so that variants replay the same
    # arrivals (prefix caching, a property of the workload's hashes, stays part of it)
    assert pa.capacity_keys == pb.capacity_keys == pc.capacity_keys != pd.capacity_keys
    assert b.engine.reference == EngineConfig("v1", "recompute", "auto")
    assert pa.common["engine"] == {"batching": "v1", "preemption": "recompute", "prefix_caching": "auto"}


def _runs(refused=(0, 0, 5, 0), arrived=200):
    rows = []
    for i, (src, sched) in enumerate([("azure", "fcfs"), ("azure", "las"), ("bailian", "fcfs"), ("bailian", "las")]):
        for reg, rho, q in (("light", 0.3, 0.0), ("overload", 1.2, 4.0)):
            rows.append({"source": src, "provenance": "real", "window_id": f"{src}-00", "region": reg, "rho": rho,
                         "scheduler": sched, "replicate": 0, "capacity_rps": 5.0, "arrived": arrived,
                         "refused": refused[i], "clipped": 1, "utilisation": rho if rho < 1 else 1.0,
                         "queue_mean": q, "queue_p95": 3 * q,
                         "e2e_mean": 1.0 if reg == "light" else (2.0 if sched == "fcfs" else 3.0)})
    return pl.DataFrame(rows)


def test_refusals_are_counted_and_warned_about_above_one_percent():
    runs = _runs(refused=(0, 0, 2, 3))           # bailian: 2 regions x (2 + 3) = 10 of 800 arrivals = 1.25 %
    w = campaign.refusal_warnings(runs, max_model_len=131072)
    assert len(w) == 1 and "bailian" in w[0] and "1.2%" in w[0] and "131,072" in w[0]
    assert campaign.refusal_warnings(_runs(refused=(0, 0, 1, 1))) == []     # 0.5 %
    t = campaign.refusal_table(runs)
    assert set(t.columns) >= {"source", "region", "scheduler", "refused", "arrived", "refused_frac"}
    b = t.filter(pl.col("source") == "bailian").sort("scheduler", "rho")
    assert b["refused_frac"].to_list() == [0.01, 0.01, 0.015, 0.015]


def test_distinct_means_and_the_load_block():
    assert campaign.distinct_means([1.0, 1.005, 1.02, float("nan")]) == 2
    assert campaign.distinct_means([2.0, 2.0, 2.0]) == 1 and campaign.distinct_means([]) == 0
    runs = _runs()
    t = campaign.load_table(runs)
    light = t.filter(pl.col("region") == "light")
    assert light["distinct_schedulers"].to_list() == [1, 1] and light["utilisation"].to_list() == [0.3, 0.3]
    assert t.filter(pl.col("region") == "overload")["distinct_schedulers"].to_list() == [2, 2]
    caps = {"azure-00": {"capacity_rps": 5.0, "burst_rps": 4.0, "method": "m"},
            "bailian-00": {"capacity_rps": 50.0, "burst_rps": 20.0, "method": "m"}}
    block = campaign.load_summary(runs, caps)
    assert block["capacity"]["bailian"]["capacity_rps"] == 50.0
    assert block["capacity"]["bailian"]["sustainable_over_burst"]["median"] == 2.5
    assert block["by_source_region"]["azure"]["overload"]["queue_mean"] == 4.0
    assert block["all_tied_conditions"]["count"] == 2 and block["all_tied_conditions"]["of"] == 4
    assert block["definition"]["capacity_method"] == "m"


def test_the_campaign_hands_a_source_s_hash_block_size_to_the_engine():
    """Prefix caching reads the window's block_hashes with the source's block size (WindowRef.block_size,
    from the manifest), through Engine.for_window."""
    ref = campaign.WindowRef("mooncake-00", "mooncake", "real", "x" * 64, 512)
    eng = campaign.SimEngine()
    assert eng.hash_block_size is None and eng.for_window(ref).hash_block_size == 512
    assert eng.for_window(campaign.WindowRef("azure-00", "azure", "real", "y" * 64)).hash_block_size is None
