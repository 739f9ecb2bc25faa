"""Trace hygiene (issue #25): quantised timestamps, the arrival jitter, congestion helpers."""

from __future__ import annotations

import numpy as np
import polars as pl
from portbench.data import trace_checks as tc
from portbench.study.analysis import hygiene
from portbench.study.campaign.run import jitter_tables


def _grid_trace(n=2000, step=3.0, seed=0):
    rng = np.random.default_rng(seed)
    ticks = np.sort(rng.integers(0, n // 8, n))                    # ~8 requests per grid point
    return ticks * step                                            # exact grid points


def test_a_three_second_grid_is_found_and_a_poisson_trace_is_not():
    t = _grid_trace()
    c = tc.timestamp_check(t)
    assert c["quantised"] and c["grid_step_s"] == 3.0 and c["zero_gap_share"] > 0.5 and c["distinct_ratio"] < 0.2
    rng = np.random.default_rng(1)
    # grid points a few ms off (Mooncake's): still a 3 s grid
    off = np.unique(t) + rng.integers(-3, 4, np.unique(t).size) * 0.001
    assert abs(tc.timestamp_check(off)["grid_step_s"] - 3.0) < 0.01
    p = np.cumsum(rng.exponential(0.2, 5000))
    c = tc.timestamp_check(p)
    assert not c["quantised"] and c["grid_step_s"] is None and c["zero_gap_share"] == 0 and c["distinct_ratio"] == 1


def test_jitter_spreads_within_the_cell_keeps_the_order_and_is_seeded():
    t = _grid_trace(400)
    j = tc.jitter_arrivals(t, 3.0, np.random.default_rng(7))
    assert np.all(j >= t) and np.all(j < t + 3.0)
    assert np.all(np.diff(j[np.argsort(t, kind="stable")]) >= 0)  # the requests keep their order
    assert np.array_equal(j, tc.jitter_arrivals(t, 3.0, np.random.default_rng(7)))
    assert tc.timestamp_check(j)["zero_gap_share"] == 0


def test_jitter_tables_touch_only_quantised_sources():
    t = _grid_trace(200)
    rng = np.random.default_rng(2)
    tables = {"q-00": pl.DataFrame({"arrival_s": t}), "p-00": pl.DataFrame({"arrival_s": np.cumsum(rng.exponential(1, 200))})}
    out = jitter_tables(tables, {"q-00": "q", "p-00": "p"}, seed=0)
    assert out["p-00"].equals(tables["p-00"])
    assert not out["q-00"].equals(tables["q-00"]) and tc.timestamp_check(out["q-00"]["arrival_s"])["zero_gap_share"] == 0


def test_union_length_and_matched_queue():
    assert hygiene._union_length(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0])) == 4.0
    cong = {"by_source_region": {"a": {"light": {"queue_mean": 0.03}, "heavy": {"queue_mean": 5.0}},
                                 "b": {"light": {"queue_mean": 1.6}, "heavy": {"queue_mean": 40.0}}}}
    m = hygiene.matched_queue(cong, ["a", "b"], ["light", "heavy"])
    assert [(ra, rb) for ra, rb, _, _ in m["a vs b"]] == [("light", "light"), ("heavy", "light")]


def test_equal_information_runs_put_the_oracle_variants_in_the_policies_places():
    runs = pl.DataFrame({"source": ["a", "a", "b", "b"], "scheduler": ["ltr", "fcfs", "ltr", "fcfs"], "x": [1.0, 2.0, 3.0, 4.0]})
    var = pl.DataFrame({"source": ["a"], "scheduler": ["ltr_noisy_oracle"], "x": [9.0]})
    out = hygiene.equal_information_runs(runs, var).sort("source", "scheduler")
    assert out.height == 4
    assert out.filter((pl.col("source") == "a") & (pl.col("scheduler") == "ltr"))["x"].to_list() == [9.0]
    assert out.filter((pl.col("source") == "b") & (pl.col("scheduler") == "ltr"))["x"].to_list() == [3.0]
    # every predictor-informed policy has its noisy oracle (edf too); an older control's exact edf_oracle is left out
    assert hygiene.EQUAL_INFORMATION == {"sjf_predicted": "sjf_noisy_oracle", "ltr": "ltr_noisy_oracle",
                                         "edf": "edf_noisy_oracle"}
    runs2 = pl.DataFrame({"source": ["a"] * 2, "scheduler": ["edf", "fcfs"], "x": [1.0, 2.0]})
    var2 = pl.DataFrame({"source": ["a"] * 2, "scheduler": ["edf_noisy_oracle", "edf_oracle"], "x": [7.0, 8.0]})
    out2 = hygiene.equal_information_runs(runs2, var2).sort("scheduler")
    assert out2["scheduler"].to_list() == ["edf", "fcfs"] and out2["x"].to_list() == [7.0, 2.0]


def test_matched_congestion_leaves_out_regions_without_a_match():
    """Planted queues: a's light region (0.03) has no region of b near it (b's lightest is 1.6, (1.6 + 1) / (0.03 + 1)
    > 2): it is unmatched, not compared with b's light region; a's heavy region (30) matches b's heavy (40)."""
    from portbench.study.analysis import hygiene
    cong = {"by_source_region": {"a": {"light": {"queue_mean": 0.03}, "heavy": {"queue_mean": 30.0}},
                                 "b": {"light": {"queue_mean": 1.6}, "heavy": {"queue_mean": 40.0}}}}
    kept, un = hygiene.split_matches(hygiene.matched_queue(cong, ["a", "b"], ["light", "heavy"]), 2.0)
    assert [(ra, rb) for ra, rb, _, _ in kept["a vs b"]] == [("heavy", "heavy")]
    assert [(u["region_a"], u["closest_b"]) for u in un] == [("light", "light")]
    # a looser factor keeps both
    kept3, un3 = hygiene.split_matches(hygiene.matched_queue(cong, ["a", "b"], ["light", "heavy"]), 3.0)
    assert len(kept3["a vs b"]) == 2 and un3 == []
