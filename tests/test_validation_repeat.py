"""The wall-clock engine's run-to-run floor (validation/repeat.py) on hand-made records. No vLLM, no wall-clock
assertion."""

from __future__ import annotations

import math

import polars as pl
import pytest
from portbench.validation import fidelity, repeat


def _records(source: str, wid: str, n: int = 5, slower: float = 1.0, scheduler: str = "fcfs",
             drop: tuple[int, ...] = ()) -> pl.DataFrame:
    """n requests of one replay; ``slower``: every latency x this factor; ``drop``: requests not completed."""
    ids = list(range(n))
    arr = [0.5 * i for i in ids]
    ttft = [0.02 * (1 + i) * slower for i in ids]
    e2e = [0.2 * (1 + i) * slower for i in ids]
    return pl.DataFrame({
        "source": source, "window_id": wid, "region": "moderate", "scheduler": scheduler, "rho": 0.5,
        "req_id": ids, "arrival_s": arr, "first_token_s": [a + t for a, t in zip(arr, ttft)],
        "finish_s": [a + e if i not in drop else math.nan for i, (a, e) in enumerate(zip(arr, e2e))],
        "output_tokens": [10] * n, "rejected": [False] * n})


def test_identical_replays_disagree_by_nothing():
    first = pl.concat([_records("azure", "azure-1"), _records("mooncake", "mooncake-2")])
    rep, table = repeat.section(first, first.clone())
    assert rep["available"] and rep["replays"] == 2 and rep["requests"] == 10 == table.height
    assert all(rep["mape"][x] == 0 for x in fidelity.LATENCIES) and rep["floor_e2e_approx"] == 0
    floor = repeat.e2e_floor(rep, 0.10)
    assert floor["target_below_floor"] is False and "above" in floor["phrase"]


def test_a_ten_percent_slower_repeat_is_a_ten_percent_mape():
    first = _records("azure", "azure-1")
    rep, _ = repeat.section(first, _records("azure", "azure-1", slower=1.1))
    for x in fidelity.LATENCIES:
        assert rep["mape"][x] == pytest.approx(0.1)
    assert rep["mape"]["e2e_bias"] == pytest.approx(0.1)
    assert rep["floor_e2e_approx"] == pytest.approx(0.1 / math.sqrt(2))
    assert repeat.e2e_floor(rep, 0.05)["target_below_floor"] is True
    assert repeat.e2e_floor(rep, 0.10)["target_below_floor"] is False


def test_a_window_sent_in_another_order_is_reported_and_left_out_of_the_floor():
    first = pl.concat([_records("azure", "azure-1"), _records("mooncake", "mooncake-2")])
    # mooncake's repeat: the client sent requests 0 and 1 in swapped order (a burst), and the engine ran it 30 % slower
    moon = _records("mooncake", "mooncake-2", slower=1.3).with_columns(
        pl.when(pl.col("req_id") == 0).then(0.6).otherwise(pl.col("arrival_s")).alias("arrival_s"))
    repeats = pl.concat([_records("azure", "azure-1", slower=1.1), moon])
    rep, _ = repeat.section(first, repeats)
    row = {r["source"]: r for r in rep["per_replay"]}
    assert row["azure"]["same_input"] and not row["mooncake"]["same_input"]
    assert row["mooncake"]["send_order_changed"] == pytest.approx(2 / 5)
    assert rep["same_input"]["sources"] == ["azure"] and rep["same_input"]["e2e"] == pytest.approx(0.1)
    assert rep["floor_e2e_approx"] == pytest.approx(0.1 / math.sqrt(2))     # azure's alone
    assert rep["mape"]["e2e"] > 0.1                                        # the pooled disagreement counts both
    floor = repeat.e2e_floor(rep, 0.05)
    assert floor["sources"] == ["azure"] and "azure" in floor["phrase"]


def test_requests_missing_on_one_side_are_left_out_and_sources_split():
    # the first replays: every replay of the run (a case replay besides the fidelity ones); the repeats: two
    first = pl.concat([_records("azure", "azure-1"), _records("mooncake", "mooncake-2"),
                       _records("azure", "azure-1", scheduler="sjf_prompt", slower=3.0)])
    repeats = pl.concat([_records("azure", "azure-1", drop=(0, 1)),                 # 2 requests not completed
                         _records("mooncake", "mooncake-2", slower=1.2, drop=(4,))])
    # the prediction completed the first replay's requests 1-4 of azure, each 1.5x the first replay
    pred = _records("azure", "azure-1", slower=1.5, drop=(0,))
    rep, table = repeat.section(first, repeats, prediction=pred)
    assert rep["requests"] == 3 + 4 == table.height
    assert set(table["scheduler"].to_list()) == {"fcfs"}         # the case replay is not a repeat's first replay
    by = rep["mape_by_source"]
    assert by["azure"]["e2e"] == pytest.approx(0.0) and by["azure"]["requests"] == 3
    assert by["mooncake"]["e2e"] == pytest.approx(0.2) and by["mooncake"]["requests"] == 4
    assert rep["mape"]["e2e"] == pytest.approx(0.8 / 7)
    # the prediction on the same requests: azure's 3 (all completed by it), none of mooncake's
    ps = rep["prediction_same_requests"]
    assert ps["mape_by_source"]["azure"]["e2e"] == pytest.approx(0.5) and ps["mape"]["requests"] == 3
    assert math.isnan(ps["mape_by_source"]["mooncake"]["e2e"])
    assert [r["requests"] for r in rep["per_replay"]] == [3, 4]


def test_speeds_from_each_replays_own_steps():
    from portbench.sim import profiles

    prof = profiles.get_profile("a100_80gb_llama3_8b")
    steps = pl.DataFrame({"t_start": [1.0, 2.0, 11.0, 12.0], "prefill_tokens": [0, 64, 0, 64],
                          "decode_seqs": [4, 2, 4, 2], "context_tokens": [400, 300, 400, 300]})
    tab = prof.iteration_time(steps["prefill_tokens"].to_numpy(), steps["decode_seqs"].to_numpy(),
                              steps["context_tokens"].to_numpy(), 0)
    steps = steps.with_columns(pl.Series("step_s", list(tab[:2]) + list(tab[2:] * 1.25)))
    phases = [{"phase": "fidelity", "tag": "azure-1.moderate", "policy": "fcfs", "t0": 0.0, "t1": 5.0},
              {"phase": repeat.PHASE, "tag": repeat.tag("azure-1", "moderate"), "policy": "fcfs", "t0": 10.0,
               "t1": 14.0}]
    first = _records("azure", "azure-1")
    rep, _ = repeat.section(first, first, logged=steps, phases=phases, profile=prof,
                            info=[{"source": "azure", "window_id": "azure-1", "region": "moderate",
                                   "scheduler": "fcfs", "prefix_cache_reset": True}])
    row = rep["per_replay"][0]
    assert row["speed_first"] == pytest.approx(1.0) and row["speed_repeat"] == pytest.approx(1.25)
    assert row["first_s"] == 5.0 and row["repeat_s"] == 4.0 and row["prefix_cache_reset"] is True
