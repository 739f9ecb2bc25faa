"""The paired design and the real-engine verdicts on synthetic replays (no engine, no wall-clock margins)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from portbench.validation import design, verdict


def _windows(n: int) -> tuple[str, ...]:
    return tuple(f"w{i:02d}" for i in range(n))


def synthetic(specs: pl.DataFrame, log_effect: dict[str, float], sigma_r: float, *, seed: int = 0,
              order_effect: float = 0.0, metric: str = "e2e_mean", tau: float = 0.0) -> pl.DataFrame:
    """A per-replay table as the engine would write it: per window a level, per policy a log-offset
    (``log_effect[policy]``, higher = slower), per replay log-normal noise ``sigma_r``; the second replay of a
    pair slower by ``order_effect`` (log); ``tau``: the policies' effect varies over windows."""
    rng = np.random.default_rng(seed)
    keys = specs.select("case", "source", "window").unique().sort(["case", "source", "window"]).rows()
    level = {k: float(rng.uniform(1.0, 5.0)) for k in keys}
    wiggle = {k: float(rng.normal(0.0, tau)) for k in keys}
    vals = []
    for row in specs.iter_rows(named=True):
        k = (row["case"], row["source"], row["window"])
        off = log_effect.get(row["policy"], 0.0)
        off = off * (1.0 + wiggle[k]) if off else 0.0
        vals.append(level[k] * math.exp(off + order_effect * row["position"] + sigma_r * rng.standard_normal()))
    return specs.with_columns(pl.Series(metric, vals), pl.col("order").alias("replay_index"),
                              pl.lit(1.0).alias("machine_speed"))


def entry(cid: str, a: str, b: str, signs: dict[str, int], role: str = "primary", metric: str = "e2e_mean") -> dict:
    return {"id": cid, "role": role, "a": a, "b": b, "metric": metric, "region": "moderate",
            "sources": list(signs), "campaign_sign": signs}


# --------------------------------------------------------------------------- the design


def test_specs_abba_aa_share_and_determinism():
    side = design.Side("key", "azure", "sarathi", "rr", _windows(8), 4)
    s = design.replay_specs([side], seed=3)
    assert s.columns == list(design.SPEC_COLUMNS)
    assert s["order"].to_list() == list(range(s.height)) and s.height == 2 * 8 * 4
    pairs = s.group_by("pair").agg(pl.col("slot").sort(), pl.col("position").sort(), pl.col("window").n_unique(),
                                   pl.col("is_aa").first())
    assert all(x == ["a", "b"] for x in pairs["slot"].to_list())
    assert all(x == [0, 1] for x in pairs["position"].to_list())
    assert pairs["window"].max() == 1
    assert pairs["is_aa"].sum() == 8                          # 25 % of 32 pairs
    ab = s.filter(~pl.col("is_aa"))
    assert set(ab.filter(pl.col("slot") == "a")["policy"]) == {"sarathi"}
    assert set(ab.filter(pl.col("slot") == "b")["policy"]) == {"rr"}
    aa = s.filter(pl.col("is_aa")).group_by("pair").agg(pl.col("policy").n_unique())
    assert aa["policy"].max() == 1                            # an A/A pair runs one policy twice
    # every window keeps at least one a/b pair; a window's replays run together
    assert ab["window"].n_unique() == 8
    runs = s["window"].to_list()
    assert sum(1 for i in range(1, len(runs)) if runs[i] != runs[i - 1]) == 7
    # ABBA: within a window the first slots alternate ab, ba, ba, ab (or its mirror)
    for _, g in s.filter(pl.col("position") == 0).group_by("window"):
        first = g.sort("order")["slot"].to_list()
        assert first in (["a", "b", "b", "a"], ["b", "a", "a", "b"])
    assert s.equals(design.replay_specs([side], seed=3))
    assert not s.equals(design.replay_specs([side], seed=4))


def test_aa_counts_spread():
    assert design.aa_counts(8, 4) == [1] * 8
    c = design.aa_counts(8, 2)
    assert sum(c) == 4 and max(c) == 1
    assert design.aa_counts(3, 1) == [0, 0, 0]               # never all pairs of a window


# --------------------------------------------------------------------------- the test


def test_sign_flip_hand_computed():
    assert verdict.sign_flip_p([1, 2, 3], 1) == pytest.approx(1 / 8)
    assert verdict.sign_flip_p([1, -2, 3], 1) == pytest.approx(3 / 8)   # sums 6, 4, 2 of the 8 are >= 2
    assert verdict.sign_flip_p([1, 2, 3], -1) == pytest.approx(1.0)
    assert verdict.sign_flip_p([], 1) == 1.0 and verdict.sign_flip_p([1.0], 0) == 1.0
    x = np.arange(1, 21, dtype=float)                          # 20 windows: the seeded sample's floor
    assert verdict.sign_flip_p(x, 1) == pytest.approx(1 / verdict.MC_DRAWS)


def test_oriented_effects():
    # e2e: lower is better, so a = 1 s vs b = 2 s is a better by log 2
    assert verdict.oriented([1.0], [2.0], "e2e_mean")[0] == pytest.approx(math.log(2))
    # a proportion where higher is better: an absolute difference
    assert verdict.oriented([0.9], [0.7], "slo_medium")[0] == pytest.approx(0.2)


def _run(cases: list[tuple[str, str, str, dict, dict]], k=10, r=4, sigma=0.15, seed=0, **kw):
    sides = [design.Side(cid, src, a, b, _windows(k), r) for cid, a, b, signs, _ in cases for src in signs]
    specs = design.replay_specs(sides, seed=seed)
    tabs = []
    for cid, _a, _b, signs, eff in cases:
        for src in signs:
            tabs.append(synthetic(specs.filter((pl.col("case") == cid) & (pl.col("source") == src)),
                                  eff[src], sigma, seed=seed + len(tabs), **kw))
    return pl.concat(tabs)


def test_planted_reversal_detected_and_planted_null_not():
    # delay_shortest is 30 % slower than fcfs on both sources; a null pair differs by nothing
    cases = [("planted", "fcfs", "delay_shortest", {"azure": 1, "mooncake": 1},
              {"azure": {"delay_shortest": 0.3}, "mooncake": {"delay_shortest": 0.3}}),
             ("null", "fcfs", "sjf", {"azure": 1, "mooncake": 1}, {"azure": {}, "mooncake": {}})]
    tab = _run(cases)
    ents = [entry(c[0], c[1], c[2], c[3]) for c in cases]
    res = verdict.case_verdicts(ents, tab, {}, sigma_r=0.15, r=4)
    by = {x["id"]: x for x in res}
    assert by["planted"]["verdict"] == "holds"
    assert by["planted"]["effect"]["azure"] == pytest.approx(0.3, abs=0.1)
    assert by["null"]["verdict"] == "undetermined" and "resolves" in by["null"]["reason"]
    assert verdict.planted(res)["detected"] is True


def test_reversal_predicted_but_engine_shows_the_opposite():
    # predicted: a better on azure, b better on mooncake; the engine shows the opposite on both
    cases = [("key", "sarathi", "rr", {"azure": 1, "mooncake": -1},
              {"azure": {"sarathi": 0.35}, "mooncake": {"rr": 0.35}})]
    tab = _run(cases)
    res = verdict.case_verdicts([entry("key", "sarathi", "rr", {"azure": 1, "mooncake": -1})], tab, {},
                                sigma_r=0.15, r=4)
    assert res[0]["verdict"] == "reverses"
    assert res[0]["effect"]["azure"] < 0 < res[0]["effect"]["mooncake"]
    # the same engine data, with the engine-scale prediction saying the order flips: the prediction holds
    res = verdict.case_verdicts([entry("key", "sarathi", "rr", {"azure": 1, "mooncake": -1})], tab,
                                {"key": {"azure": -0.3, "mooncake": 0.3}}, sigma_r=0.15, r=4)
    assert res[0]["verdict"] == "holds"
    assert res[0]["sides"][0]["tost"]["verdict"] in ("equivalent", "inconclusive")


def test_not_testable_reason_classes():
    e = entry("d1", "fcfs", "las", {"azure": 1, "burstgpt": -1}, role="draw")
    assert verdict.not_testable_reason(e, {}, 0.05) == verdict.REASONS["no_data"]
    assert verdict.not_testable_reason(e, {"azure": -0.2, "burstgpt": -0.2}, 0.05) == verdict.REASONS["flips"]
    assert verdict.not_testable_reason(e, {"azure": 0.01, "burstgpt": -0.2}, 0.05) == verdict.REASONS["below_delta"]
    assert verdict.not_testable_reason(e, {"azure": 0.2, "burstgpt": -0.2}, 0.05) is None
    primary = entry("key", "fcfs", "las", {"azure": 1, "burstgpt": -1})
    assert verdict.not_testable_reason(primary, {"azure": -0.2, "burstgpt": -0.2}, 0.05) is None
    # a primary case without replays: no data
    res = verdict.case_verdicts([primary], pl.DataFrame(), {}, sigma_r=0.1, r=4)
    assert res[0]["verdict"] == "not testable" and res[0]["reason"] == "no data"


def test_aa_false_reversal_rate_exact_size():
    # under the null every sign pattern of the windows' A/A effects is equally likely: the share of the 2^k
    # patterns on which the two-sided test declares an order is the procedure's false-reversal rate, <= alpha
    x = np.array([0.11, 0.32, 0.05, 0.27, 0.18, 0.09, 0.41, 0.23])
    pats = design.sign_flip_matrix(x.size)
    declared = [min(1.0, 2 * min(verdict.sign_flip_p(s * x, 1), verdict.sign_flip_p(s * x, -1))) < verdict.ALPHA
                for s in pats]
    assert 0 < np.mean(declared) <= verdict.ALPHA


def test_aa_false_reversal_rate_at_most_alpha_on_null_data():
    # 200 null cases x 2 sides, 8 windows x 4 pairs (8 A/A pairs per side), sigma_r 0.15, a real order effect;
    # the empirical rate within two binomial standard errors of alpha (its exact size is above)
    cases = [(f"n{i}", "fcfs", "las", {"azure": 1, "mooncake": 1}, {"azure": {}, "mooncake": {}})
             for i in range(200)]
    tab = _run(cases, k=8, r=4, sigma=0.15, seed=11, order_effect=0.1)
    aa = verdict.aa_check(tab, {c[0]: "e2e_mean" for c in cases})
    n = aa["sides_tested"]
    assert n == 400 and aa["pairs"] == 200 * 2 * 8
    assert aa["false_reversal_rate"] <= verdict.ALPHA + 2 * math.sqrt(verdict.ALPHA * (1 - verdict.ALPHA) / n)
    assert aa["sigma_r"] == pytest.approx(0.15 * math.sqrt(1 + 0.1 ** 2 / (2 * 0.15 ** 2)), rel=0.1)
    # the order effect (the second replay 10 % slower) is seen: the first replay is better by about 0.1
    lo, hi = aa["order_effect"]["ci"]
    assert lo > 0 and aa["order_effect"]["mean"] == pytest.approx(0.1, abs=0.02)


def test_aa_check_finds_a_planted_slot_effect():
    # an instrument that can fail: a harness that always runs slot a faster (by 30 %) is caught by the A/A pairs
    cases = [(f"n{i}", "fcfs", "las", {"azure": 1}, {"azure": {}}) for i in range(20)]
    sides = [design.Side(c[0], "azure", "fcfs", "las", _windows(8), 4) for c in cases]
    specs = design.replay_specs(sides, seed=5)
    tab = synthetic(specs, {}, 0.05, seed=5)
    tab = tab.with_columns(pl.when(pl.col("slot") == "a").then(pl.col("e2e_mean") * 0.7)
                           .otherwise(pl.col("e2e_mean")).alias("e2e_mean"))
    assert verdict.aa_check(tab, {c[0]: "e2e_mean" for c in cases})["false_reversal_rate"] > 0.5


def test_holm_over_cases():
    # two strong cases and two nulls: the strong ones decide after Holm, the nulls do not
    cases = [(f"s{i}", "fcfs", "delay_shortest", {"azure": 1, "mooncake": 1},
              {"azure": {"delay_shortest": 0.4}, "mooncake": {"delay_shortest": 0.4}}) for i in range(2)]
    cases += [(f"n{i}", "fcfs", "las", {"azure": 1, "mooncake": 1}, {"azure": {}, "mooncake": {}}) for i in range(2)]
    tab = _run(cases, seed=2)
    res = verdict.case_verdicts([entry(c[0], c[1], c[2], c[3]) for c in cases], tab, {}, sigma_r=0.15, r=4)
    assert [x["verdict"] for x in res] == ["holds", "holds", "undetermined", "undetermined"]
    assert all(x["p_holm"] >= 2 / 2 ** 10 for x in res)


# --------------------------------------------------------------------------- power


def test_power_grows_with_effect_and_windows():
    assert design.min_windows(4, 0.05) == 8                      # 2^-8 < 0.05 / 8 <= 2^-7
    assert design.power(0.0, 8, 4, 0.1, sims=400) <= 0.05
    lo = design.power(0.1, 8, 4, 0.1, sims=400)
    hi = design.power(0.3, 8, 4, 0.1, sims=400)
    assert lo < hi and hi > 0.9
    assert design.resolvable_effect(7, 4, 0.1, sims=200) == math.inf
    assert design.resolvable_effect(12, 4, 0.1, sims=200) < design.resolvable_effect(8, 4, 0.1, sims=200)
    s = design.size(0.1, sims=300)
    assert s["target_reached"] and s["k"] >= 8 and s["resolvable_effect"] <= design.TARGET_EFFECT + 0.01


# --------------------------------------------------------------------------- the pre-registration


def _rev_table() -> pl.DataFrame:
    """A reversal table with known answers: (sarathi, rr) the strongest reversal on azure/mooncake, (fcfs, rr)
    a weaker one, (sjf, random) the strongest same-order comparison there, (fcfs, las) a same-order one on
    azure/burstgpt, and a stronger reversal on a secondary metric (not headline: not the key)."""
    rows = []

    def add(a, b, s1, s2, d1, d2, e1, e2, metric="ttft_p90", region="overload", headline=True, sig=True):
        rows.append({"panel": "headline", "a": a, "b": b, "source_1": s1, "source_2": s2, "region": region,
                     "metric": metric, "headline": headline, "diff_1": d1, "diff_2": d2, "rel_1": e1, "rel_2": e2,
                     "effect_1": e1, "effect_2": e2, "strength": min(e1, e2) / 0.05,
                     "reversal": bool(np.sign(d1) != np.sign(d2)), "significant": sig,
                     "practical": min(e1, e2) >= 0.05})

    add("sarathi", "rr", "azure", "mooncake", 1.0, -2.0, 0.6, 0.9)
    add("fcfs", "rr", "azure", "mooncake", 1.0, -1.0, 0.2, 0.3)
    add("fcfs", "vtc", "azure", "mooncake", 1.0, -1.0, 0.9, 0.95, metric="max_slowdown", headline=False)
    add("random", "sjf", "azure", "mooncake", -1.0, -1.0, 0.5, 0.7)
    add("fcfs", "las", "azure", "mooncake", -1.0, -1.0, 0.1, 0.2, region="moderate")
    add("fcfs", "las", "azure", "burstgpt", 1.0, 1.0, 0.3, 0.3)
    add("las", "rr", "burstgpt", "mooncake", 1.0, -1.0, 0.2, 0.25)
    add("sjf", "rr", "azure", "burstgpt", 1.0, 1.0, 0.02, 0.3, sig=False)
    return pl.DataFrame(rows)


def test_plan_selects_by_strength():
    from portbench.validation import plan

    rev = _rev_table()
    key = plan.key_case(rev)
    assert (key["a"], key["b"], key["metric"]) == ("sarathi", "rr", "ttft_p90")
    assert key["selection"]["strength"] == pytest.approx(12.0)
    assert key["campaign_sign"] == {"azure": 1, "mooncake": -1}
    ctrl = plan.control_case(rev, key)
    assert (ctrl["a"], ctrl["b"]) == ("random", "sjf") and ctrl["campaign_sign"] == {"azure": -1, "mooncake": -1}
    draws = plan.draw_candidates(rev, None, [key, ctrl], seed=38, n=5)
    same = {(d["a"], d["b"], d["region"]) for d in draws["draw_same"]}
    assert same == {("fcfs", "las", "moderate"), ("fcfs", "las", "overload")}       # not the control, not sig=False
    assert {(d["a"], d["b"]) for d in draws["draw_reversed"]} == {("fcfs", "rr"), ("las", "rr")}
    assert draws == plan.draw_candidates(rev, None, [key, ctrl], seed=38, n=5)
    # the first candidate whose prediction keeps sign and size is registered
    first, passed = plan.pick_draw(draws["draw_reversed"],
                                   lambda c: {s: (0.0 if c["a"] == draws["draw_reversed"][0]["a"] else 0.2 * sg)
                                              for s, sg in c["campaign_sign"].items()}, 0.05)
    assert first is not None and first["a"] != draws["draw_reversed"][0]["a"]
    assert passed[0]["reason"] == verdict.REASONS["flips"]


def test_plan_freeze_and_refusals(tmp_path):
    from portbench.core.errors import DataError
    from portbench.validation import plan

    code = tmp_path / "lib" / "portbench" / "validation"
    code.mkdir(parents=True)
    (code / "x.py").write_text("A = 1\n")
    doc = plan.build(tmp_path, _rev_table(), None, why="first freeze", today="2026-12-06", sims=100)
    assert doc["sigma_r"]["measured"] is False and doc["design"]["k"] >= design.min_windows(doc["design"]["cases"], 0.05)
    assert doc["changes"] == [{"date": "2026-12-06", "what": "frozen", "why": "first freeze"}]
    seal = plan.write(tmp_path, doc)
    info = plan.check(tmp_path)
    assert info["sha256"] == seal and info["doc"]["cases"][0]["id"] == "key"
    assert plan.write(tmp_path, doc) == seal                                   # same inputs, same bytes
    # the code changes: refused
    (code / "x.py").write_text("A = 2\n")
    with pytest.raises(DataError, match="code differs"):
        plan.check(tmp_path)
    (code / "x.py").write_text("A = 1\n")
    # the file is edited by hand: refused
    p = plan.plan_path(tmp_path)
    p.write_text(p.read_text().replace("alpha: 0.05", "alpha: 0.1"))
    with pytest.raises(DataError, match="edited after it was frozen"):
        plan.check(tmp_path)
    # a refreeze keeps the change log
    doc2 = plan.build(tmp_path, _rev_table(), None, why="sigma_r measured", previous=doc, today="2026-12-07", sims=100,
                      sigma_r=plan.measured_sigma(0.08, 40, "2026-12-07", "test"))
    assert [c["what"] for c in doc2["changes"]] == ["frozen", "refrozen"] and doc2["sigma_r"]["measured"]


def test_summary_core_has_the_issue_keys():
    cases = [("key", "sarathi", "rr", {"azure": 1, "mooncake": -1},
              {"azure": {"rr": 0.3}, "mooncake": {"sarathi": 0.3}}),
             ("planted", "fcfs", "delay_shortest", {"azure": 1, "mooncake": 1},
              {"azure": {"delay_shortest": 0.3}, "mooncake": {"delay_shortest": 0.3}})]
    tab = _run(cases)
    ents = [entry("key", "sarathi", "rr", {"azure": 1, "mooncake": -1}),
            {**entry("planted", "fcfs", "delay_shortest", {"azure": 1, "mooncake": 1}), "role": "planted"}]
    res = verdict.case_verdicts(ents, tab, {}, sigma_r=0.15, r=4)
    s = verdict.summary_core(res, verdict.aa_check(tab, {"key": "e2e_mean", "planted": "e2e_mean"}),
                             {"sha256": "x", "code_version": {"source_sha256": "y"}}, None)
    assert verdict.check_summary(s) == []
    assert [c["id"] for c in s["cases"]] == ["key"] and s["planted"]["detected"] is True
    assert s["cases"][0]["verdict"] == "holds"     # rr slower on azure, sarathi slower on mooncake: as predicted
    assert verdict.check_summary({"cases": [{"verdict": "confirmed"}]})[0].startswith("summary: no")
    assert any("not one of" in x for x in verdict.check_summary({"cases": [{"verdict": "confirmed"}]}))


def test_report_leads_with_the_real_engine_and_never_confirms():
    from portbench.present import validation_report as report

    cases = [("key", "sarathi", "rr", {"azure": 1, "mooncake": -1},
              {"azure": {"rr": 0.3}, "mooncake": {"sarathi": 0.3}})]
    tab = _run(cases)
    res = verdict.case_verdicts([entry("key", "sarathi", "rr", {"azure": 1, "mooncake": -1})], tab, {},
                                sigma_r=0.15, r=4)
    core = verdict.summary_core(res, verdict.aa_check(tab, {"key": "e2e_mean"}),
                                {"sha256": "ab" * 32, "code_version": {"source_sha256": "cd" * 32}},
                                {"ran": True, "sides": 2, "agreement_rate": 1.0, "window_agreement_rate": 0.9,
                                 "windows": 20})
    s = {"ran": True, "engine": {"device": "cpu"}, **core,
         "fidelity_report": {"replays_predicted": 4, "whole_run": {"all": {"e2e": {"mape": 0.2, "n": 80},
                                                                           "ttft": {"mape": 0.3, "n": 80}}}}}
    lead = report.lead_markdown(s)
    assert lead.startswith("- On a real engine (vLLM CPU build, tiny model), the order of sarathi vs rr")
    assert "holds" in lead and "CPU engine's cost structure" in lead and "A100 claim stays the simulator's" in lead
    text = report.results_markdown({"summary": s})
    assert "confirmed" not in text and "agreement rate" in text and "20.0 %" in text
    assert report.cases_table(s).height == 2


def test_conformance_is_an_agreement_rate():
    from portbench.validation import family

    def runs(sign_azure: float) -> pl.DataFrame:
        rows = []
        for s, sg in (("azure", sign_azure), ("mooncake", -1.0)):
            for w in range(4):
                for k, v in (("sarathi", 1.0), ("rr", 1.0 + 0.2 * sg)):
                    rows.append({"source": s, "window_id": f"{s}-{w}", "region": "overload", "scheduler": k,
                                 "ttft_p90": v})
        return pl.DataFrame(rows)

    e = entry("key", "sarathi", "rr", {"azure": 1, "mooncake": -1}, metric="ttft_p90")
    e["region"] = "overload"
    same = family.conformance([e], runs(1.0), runs(1.0))
    assert same["agreement_rate"] == 1.0 and same["window_agreement_rate"] == 1.0 and same["sides"] == 2
    assert same["by_side"][0]["virtual_effect"] == pytest.approx(math.log(1.2))
    half = family.conformance([e], runs(-1.0), runs(1.0))      # the virtual engine orders azure the other way
    assert half["agreement_rate"] == 0.5 and half["window_agreement_rate"] == 0.5
    assert "Not a confirmation" in half["what_it_shows"]


def test_plan_sigma_from_the_pilot(tmp_path):
    import json

    from portbench.core.errors import DataError
    from portbench.validation import plan

    f = tmp_path / "pilot.json"
    f.write_text(json.dumps({"date": "2026-12-06", "aa_pairs": 12, "source": "azure", "region": "overload",
                             "sigma_r": {"ttft_p90": 0.3, "e2e_mean": 0.5, "tpot_p90": 0.2},
                             "machine": {"note": "loaded"}}))
    s = plan.pilot_sigma(f, ["ttft_p90", "tpot_p90"])
    assert s["value"] == 0.3 and s["metric"] == "ttft_p90" and s["measured"] and "loaded" in s["source"]
    with pytest.raises(DataError, match="no sigma_r for the cases' metrics"):
        plan.pilot_sigma(f, ["slo_medium"])
    with pytest.raises(DataError, match="cannot read"):
        plan.pilot_sigma(tmp_path / "missing.json", ["ttft_p90"])
    # the file `portbench validate --pilot` itself writes: each metric per source and pooled
    g = tmp_path / "pilot_run.json"
    g.write_text(json.dumps({"date": "2026-12-06", "aa_pairs": 12, "region": "overload", "loadavg_start": [0.2, 0.9, 1.2],
                             "sigma_r": {"ttft_p90": {"azure": 0.016, "pooled": 0.016},
                                         "e2e_mean": {"azure": 0.04, "pooled": 0.04},
                                         "tpot_p90": {"azure": 0.0386, "mooncake": 0.01, "pooled": 0.03}}}))
    s = plan.pilot_sigma(g, ["ttft_p90", "tpot_p90"])
    assert s["value"] == 0.03 and s["metric"] == "tpot_p90" and s["by_metric"]["ttft_p90"] == 0.016
    assert "azure, mooncake" in s["source"] and "load average 0.2" in s["source"]
