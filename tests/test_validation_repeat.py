"""The wall-clock engine's run-to-run floor (validation/repeat.py) on hand-made records, and the repeat replay's
place in the wall-clock run (wallclock._repeat) on a stand-in engine. No vLLM, no wall-clock assertion."""

from __future__ import annotations

import math
from types import SimpleNamespace

import polars as pl
import pytest
from portbench.validation import repeat, verdict


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
    assert all(rep["mape"][x] == 0 for x in verdict.LATENCIES) and rep["floor_e2e_approx"] == 0
    floor = repeat.e2e_floor(rep, 0.10)
    assert floor["target_below_floor"] is False and "above" in floor["phrase"]


def test_a_ten_percent_slower_repeat_is_a_ten_percent_mape():
    first = _records("azure", "azure-1")
    rep, _ = repeat.section(first, _records("azure", "azure-1", slower=1.1))
    for x in verdict.LATENCIES:
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
    from portbench.present import validation_report as report
    text = report.repeatability_markdown({"whole_run_prediction": {"repeatability": rep}, "targets": {"e2e_floor": floor}})
    assert "same order twice on azure" in text and "mooncake (40.0% of its requests" in text


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


def test_no_repeat_says_why():
    first = _records("azure", "azure-1")
    rep, table = repeat.section(first, None, cut=[{"replay": "repeat: fcfs on azure-1 at moderate", "why": "time"}])
    assert not rep["available"] and "cut" in rep["why"] and table.height == 0
    assert repeat.e2e_floor(rep, 0.1)["available"] is False
    assert "ran" in repeat.section(first, None)[0]["why"]


def _stand_in(sim, left_s: float, prefix_caching: bool = True):
    """A _Run and a stand-in engine whose first fidelity replay of azure-1 took 2 s (``sim``: the simulation
    section)."""
    from portbench.validation import wallclock

    R = wallclock._Run(None, None, False, 0.0, 1e9)
    R.left = lambda: left_s     # type: ignore[method-assign]
    sc = _records("azure", "azure-1").select("arrival_s")
    R.scaled[("azure-1", "moderate")] = (sc, 30.0, 0.5)
    R.records[("azure", "azure-1", "moderate", "fcfs")] = _records("azure", "azure-1")
    R.phases.append({"phase": "fidelity", "tag": "azure-1.moderate", "policy": "fcfs", "t0": 0.0, "t1": 2.0})
    calls = []

    def replay_one(df, policy, horizon, tag, phase, prio=None, *, source, seed_tag=None):
        calls.append({"policy": policy, "horizon": horizon, "tag": tag, "phase": phase, "seed_tag": seed_tag,
                      "same_window": df.equals(sc), "prio": prio})
        R.phases.append({"phase": phase, "tag": tag, "policy": policy, "t0": 3.0, "t1": 5.5,
                         "prefix_cache_reset": prefix_caching})     # as _Engine.replay_one records it
        return _records("azure", "azure-1").drop("rho")

    E = SimpleNamespace(R=R, sim=sim, es=SimpleNamespace(prefix_caching=prefix_caching), replay_one=replay_one)
    return wallclock, R, E, calls


def test_the_repeat_replays_the_same_input_apart_from_the_records(tmp_params):
    sim = tmp_params().simulation
    wallclock, R, E, calls = _stand_in(sim, left_s=1e6)
    wallclock._repeat(E, None, "azure", "azure-1", "moderate")
    c = calls[0]
    assert c["tag"] == repeat.tag("azure-1", "moderate") and c["phase"] == repeat.PHASE
    assert c["seed_tag"] == "azure-1.moderate" and c["same_window"] and c["horizon"] == 30.0 and c["policy"] == "fcfs"
    assert list(R.repeats) == [("azure", "azure-1", "moderate", "fcfs")] and len(R.records) == 1
    assert R.repeat_info[0]["prefix_cache_reset"] and R.repeat_info[0]["first_s"] == 2.0 and not R.cut
    # without prefix caching nothing to empty
    wallclock, R, E, calls = _stand_in(sim, left_s=1e6, prefix_caching=False)
    wallclock._repeat(E, None, "azure", "azure-1", "moderate")
    assert R.repeat_info[0]["prefix_cache_reset"] is False


def test_every_replay_starts_with_an_empty_prefix_cache(tmp_params):
    """_Engine.replay_one empties vLLM's prefix cache before each replay when prefix caching is on (the simulator's
    and the prediction's runs of a window start empty; Mooncake's prompts share blocks across windows, and a repeat
    has its first replay's prompts), and records it in the replay's phase."""
    from portbench.validation import wallclock
    sim = tmp_params().simulation
    calls: list = []

    class Eng:
        last_t0 = 0.0

        def reset_prefix_cache(self):
            calls.append("reset")
            return True

        def replay(self, reqs, **kw):
            calls.append(("replay", kw["tag"]))
            return _records("azure", "azure-1")

    R = wallclock._Run(None, None, False, 0.0, 1e9)
    sc = _records("azure", "azure-1").select("arrival_s", "output_tokens").with_columns(pl.lit(64).alias("prompt_tokens"))
    for caching, want in ((True, ["reset", ("replay", "a"), "reset", ("replay", "b")]),
                          (False, [("replay", "a"), ("replay", "b")])):
        calls.clear()
        E = wallclock._Engine(eng=Eng(), es=SimpleNamespace(prefix_caching=caching, max_model_len=4096),
                              log_path=None, sim=sim, inputs=None, vocab=1000, hash_tokens={}, R=R)
        for tag in ("a", "b"):
            E.replay_one(sc, "fcfs", 30.0, tag, "fidelity", source="azure")
        assert calls == want and R.phases[-1]["prefix_cache_reset"] is caching


def test_the_repeat_is_cut_when_the_time_left_cannot_hold_it(tmp_params):
    wallclock, R, E, calls = _stand_in(tmp_params().simulation, left_s=wallclock_reserve() + 1.0)
    wallclock._repeat(E, None, "azure", "azure-1", "moderate")
    assert not calls and not R.repeats
    assert R.cut and R.cut[0]["replay"].startswith(f"{repeat.PHASE}:") and R.cut[0]["estimated_s"] == 2.0


def wallclock_reserve() -> float:
    from portbench.validation import wallclock

    return wallclock._reserve(2)
