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
