"""The forks of the headline (issue #39): the multiverse re-classification equals the headline's at the plan's fork,
moves where it must (a planted small effect is strong at delta 2.5 % only), and the plan freeze refuses a changed plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from portbench.core.errors import DataError
from portbench.study.analysis import multiverse as mv
from portbench.study.analysis import plan as plan_mod
from portbench.study.analysis import ports
from portbench.study.analysis.cube import Cube

ROOT = Path(__file__).resolve().parents[1]
CFG = {"alpha": 0.05, "delta": 0.05, "delta_absolute": 0.05, "tie_correction": "fdr_bh", "window_size": 200}


def _cube(seed=0, W=30):
    """Three sources, two regions, two metrics, four schedulers: scheduler k is (1 + e_k) x the base with planted
    effects; source c reverses scheduler 3's 8 % advantage; scheduler 1 is 3 % better everywhere."""
    rng = np.random.default_rng(seed)
    K, R = 4, 2
    eff = {"a": [0, -0.03, 0.0, -0.08], "b": [0, -0.03, 0.001, -0.08], "c": [0, -0.03, 0.0, 0.08]}
    vals = {}
    for s, e in eff.items():
        base = rng.lognormal(0, 0.3, (R, 1, 1, W)) * np.ones((R, 2, K, W))
        noise = rng.normal(0, 0.01, (R, 2, K, W))
        x = base * (1 + np.asarray(e)[None, None, :, None] + noise)
        vals[s] = x
    return Cube(sources=list(eff), provenance={s: "real" for s in eff}, regions=["lo", "hi"], rho={"lo": .5, "hi": .9},
                metrics=["e2e_mean", "ttft_p90"], directions=["lower", "lower"],
                schedulers=["fcfs", "sjf_oracle", "srpt_oracle", "lifo"], windows={s: [] for s in eff}, values=vals,
                n_replicates={})


def test_the_plan_fork_equals_the_headline_classes():
    cube = _cube()
    inp = mv.side_inputs(cube, [0, 1], CFG, {}, cube.sources)
    for s in cube.sources:
        want = ports.classify(cube.values[s], cube.sign, cube.scales, np.array([0.05, 0.05]), window_size=200,
                              alpha=0.05, correction="fdr_bh")["classes"]
        got = mv.fork_classes(inp[s], cube.scales, 0.05, "fdr_bh", "test_and_delta", alpha=0.05, window_size=200)
        assert (got == want).all()


def test_forks_move_where_they_must():
    cube = _cube()
    out = mv.multiverse(cube, CFG, {}, cube.sources, ["e2e_mean", "ttft_p90"])
    assert sum(r["plan"] for r in out["forks"]) == 1
    inp = mv.side_inputs(cube, [0], CFG, {}, cube.sources)
    ia, ib = np.triu_indices(4, 1)
    p01 = int(np.flatnonzero((ia == 0) & (ib == 1))[0])
    p03 = int(np.flatnonzero((ia == 0) & (ib == 3))[0])
    for d, strong in ((0.025, True), (0.05, False), (0.10, False)):
        c = mv.fork_classes(inp["a"], ["ratio"], d, "fdr_bh", "test_and_delta", alpha=0.05, window_size=200)
        assert (np.abs(c[:, 0, p01]) == 1).all() == strong          # the planted 3 % effect: strong below 3 % only
    c = mv.fork_classes(inp["a"], ["ratio"], 0.05, "fdr_bh", "test_only", alpha=0.05, window_size=200)
    assert (np.abs(c[:, 0, p01]) == 1).all()                          # no delta: any significant effect is strong
    ca = mv.fork_classes(inp["a"], ["ratio"], 0.05, "none", "test_and_delta", alpha=0.05, window_size=200)
    cc = mv.fork_classes(inp["c"], ["ratio"], 0.05, "none", "test_and_delta", alpha=0.05, window_size=200)
    assert (ca[:, 0, p03] == -cc[:, 0, p03]).all() and (np.abs(ca[:, 0, p03]) == 1).all()   # the planted reversal
    r = out["range"]["across_sources"]
    assert r["min"] <= out["plan_value"]["across_sources"]["concordance"] <= r["max"]
    assert {o["changed"] for o in out["one_at_a_time"]} == {"metric_set", "delta", "correction", "tie_rule"}


def test_the_plan_freeze_refuses_a_changed_plan(tmp_path):
    plan_file = tmp_path / plan_mod.PLAN_FILE
    plan_file.parent.mkdir(parents=True)
    plan_file.write_bytes((ROOT / plan_mod.PLAN_FILE).read_bytes())
    with pytest.raises(DataError, match="not frozen"):
        plan_mod.check_frozen(tmp_path, required=True)
    rec = plan_mod.freeze(tmp_path)
    assert plan_mod.check_frozen(tmp_path)["sha256"] == rec["sha256"]
    plan_file.write_text(plan_file.read_text().replace("delta: 0.05 ", "delta: 0.10 "))
    with pytest.raises(DataError, match="changed after it was frozen"):
        plan_mod.check_frozen(tmp_path)


def test_the_repository_plan_is_frozen():
    rec = plan_mod.check_frozen(ROOT, required=True)
    assert rec["sha256"] and rec["code_version"]


# --------------------------------------------------------------------------- uncertainty, one side, load distance

def test_an_interval_that_cannot_vary_is_flagged_and_basic_mirrors_percentile():
    from portbench.study.analysis.uncertainty import interval_entry
    fixed = interval_entry(np.array([8, 0, 3, 1]), np.tile([8, 0, 3, 1], (50, 1)))
    assert fixed["value"] == 1.0 and fixed["ci_degenerate"] is True and fixed["ci"] == [1.0, 1.0]
    rng = np.random.default_rng(0)
    same = rng.integers(60, 80, 400)
    b = np.stack([same, 100 - same, np.zeros(400, int), np.zeros(400, int)], axis=1)
    e = interval_entry(np.array([70, 30, 0, 0]), b)
    assert e["ci_degenerate"] is False
    assert abs((e["ci_basic"][0] + e["ci"][1]) - 1.4) < 1e-6 and abs((e["ci_basic"][1] + e["ci"][0]) - 1.4) < 1e-6


def test_one_side_split_counts_the_other_sides_class():
    from portbench.study import stats
    from portbench.study.analysis.uncertainty import one_side_split
    S, E, U = stats.STRONG_A, stats.EQUIVALENT, stats.UNDETERMINED
    point = {"a": np.array([[[S, S, S, E, U]]]), "b": np.array([[[E, U, S, S, U]]])}
    out = one_side_split(point, ["a", "b"])
    assert out["strong_vs_equivalent"]["count"] == 2 and out["strong_vs_undetermined"]["count"] == 1
    assert out["by_source_pair"]["a vs b"]["strong_on_a"] == {"vs_equivalent": 1, "vs_undetermined": 1}
    assert out["by_source_pair"]["a vs b"]["strong_on_b"] == {"vs_equivalent": 1, "vs_undetermined": 0}


def test_load_distance_bins_and_the_gap_at_equal_distance():
    """Two sources, two regions, one metric, four pairs. Regions of a source are one bin apart in queue; the sources
    at equal rho are at distance 0. Hand count: regions keep every order (concordance 1), sources reverse one of two
    orders strong on both (0.5) -> the gap at equal distance is -0.5 when both fall in the same bin."""
    from portbench.study.analysis.load_distance import load_distance
    S, B = 1, -1
    point = {"a": np.array([[[S, S, 0, 2]], [[S, S, 0, 2]]]), "b": np.array([[[S, B, 0, 2]], [[S, B, 0, 2]]])}
    q = {"light": 0.0, "heavy": 0.1}                     # |log1p(0.1)| = 0.095: every comparison in the first bin
    cong = {"by_source_region": {s: {r: {"queue_mean": v} for r, v in q.items()} for s in "ab"}}
    out = load_distance(point, None, ["a", "b"], ["light", "heavy"], cong)
    first = "[0, 0.25)"
    assert out["by_distance"]["across_regions"][first]["value"] == 1.0
    assert out["by_distance"]["across_sources_equal_rho"][first]["value"] == 0.5
    assert out["like_with_like"]["equal_rho"]["gap"] == -0.5
    assert out["across_regions_by_steps"]["1"]["n"] == 4


# --------------------------------------------------------------------------- hardware profiles, the paper's table

def test_hardware_profiles_file_names_three_cost_structures_and_a_bad_entry_is_named(tmp_path):
    from portbench.sim import profiles
    from portbench.study.analysis import hardware
    rows = hardware.read_profiles(ROOT)
    assert len(rows) >= 3 and all(r["provenance"] for r in rows)
    costs = {(round(profiles.get_profile(r["profile"]).c_prefill_s, 9), round(profiles.get_profile(r["profile"]).c0_s, 6))
             for r in rows}
    assert len(costs) == len(rows)                        # distinct cost structures, not one profile thrice
    f = tmp_path / hardware.PROFILES_FILE
    f.parent.mkdir(parents=True)
    f.write_text("profiles:\n  - name: mine\n    profile: no/such/profile.json\n")
    with pytest.raises(DataError, match=r"profiles\[0\] \(mine\)"):
        hardware.read_profiles(tmp_path)


def test_usual_winner_null_counts_pairs_of_metrics_with_different_usual_winners():
    import polars as pl
    from portbench.study.analysis.paper import usual_winner_null
    rows = []
    for reg in ("r1", "r2", "r3"):
        w = {"m1": "x", "m2": "x" if reg != "r3" else "y", "m3": "z"}
        for a, b in (("m1", "m2"), ("m1", "m3"), ("m2", "m3")):
            rows.append({"source": "s", "region": reg, "metric_1": a, "metric_2": b, "winners_1": w[a],
                         "winners_2": w[b], "defined": True, "top1_changes": w[a] != w[b]})
    out = usual_winner_null(pl.DataFrame(rows), ["s"])
    assert out["usual_winner"] == {"m1": "x", "m2": "x", "m3": "z"}
    assert abs(out["value"] - 2 / 3) < 1e-6 and out["count"] == 9   # (m1,m3) and (m2,m3) differ, (m1,m2) does not


def test_stored_profile_files_are_what_the_measured_rows_give(tmp_path):
    import json
    from portbench.study.analysis import hardware
    for path in hardware.write_profile_files(tmp_path):
        rel = path.relative_to(tmp_path)
        assert json.loads((ROOT / rel).read_text()) == json.loads(path.read_text()), f"{rel}: rebuild it"


def test_sampling_error_of_a_window_quantile_shrinks_with_more_requests():
    import polars as pl
    from portbench.study.analysis.sampling import sampling_error
    rng = np.random.default_rng(3)
    rows = []
    for w, n in (("small", 100), ("large", 3000)):
        arr = np.sort(rng.uniform(0, 100, n))
        ttft = rng.exponential(1.0, n)
        rows.append(pl.DataFrame({"source": w, "window_id": w, "region": "r", "scheduler": "fcfs", "replicate": 0,
                                  "arrival_s": arr, "first_token_s": arr + ttft, "finish_s": arr + ttft + 5.0,
                                  "generated_tokens": 51}))
    out = sampling_error(pl.concat(rows), 0.05)["metrics"]
    small, large = out["ttft_p90"]["by_source"]["small"], out["ttft_p90"]["by_source"]["large"]
    # exponential p90: relative SE ~ sqrt(p (1 - p) / n) / (f(q) q) = sqrt(0.09 / n) / (0.1 x 2.303) ~ 0.13 / sqrt(n/100)
    assert 0.08 < small < 0.2 and large < small / 3
    assert out["tpot_p90"]["by_source"]["large"] < 1e-9         # every request's TPOT is the same: no error


def test_the_robustness_sentence_reads_its_numbers_from_the_summary():
    from portbench.present import robustness_text as rt
    s = {"multiverse": {"plan_value": {"across_sources": {"concordance": 0.8221}},
                        "range_multi_metric": {"across_sources": {"min": 0.6805, "max": 0.9093, "forks": 72}},
                        "range": {"across_sources": {"min": 0.2759, "max": 1.0}}},
         "headline": {"concordance": {"across_sources": {}}, "uncertainty": {"source_pair_range": [0.78, 0.86]}},
         "load_distance": {"available": True, "pooled": {"gap_pooled": -0.137},
                           "like_with_like": {"equal_rho": {"gap": -0.153, "gap_ci": [-0.17, -0.14], "sources": 0.822,
                                                            "regions_same_distance": 0.975}}}}
    text = rt.robustness_markdown(s)
    for want in ("82%", "68% to 91%", "72", "78% to 86%", "-15 points", "98%", "-14 points"):
        assert want in text, want
    assert "hardware" not in text                          # not in the summary: not claimed
    assert "not in this summary" in rt.robustness_markdown({})
