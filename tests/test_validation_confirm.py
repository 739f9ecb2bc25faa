"""The validation's verdict statistics without vLLM: TOST, intersection-union, Holm, the two verdicts,
the pre-registration (its draw, power and hash) and the settings match -- on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import scipy.stats as st
from portbench.core.errors import DataError
from portbench.validation import confirm, prereg
from portbench.validation.cases import Case, SideResult


def _runs(effects: dict[str, list[float]], metric: str = "e2e_mean", base: float = 10.0, region: str = "overload"):
    """Per-window rows of schedulers a and b whose relative effect (oriented: a better) is each value given:
    a = base * (1 - e/2) / (1 + e/2)-style values solved so that (b - a) / ((a + b) / 2) = e."""
    rows = []
    for s, es in effects.items():
        for i, e in enumerate(es):
            a = base * (2 - e) / 2
            b = base * (2 + e) / 2       # (b - a) / ((a + b)/2) = e ; lower is better -> a better when e > 0
            for name, v in (("a", a), ("b", b)):
                rows.append({"source": s, "window_id": f"{s}-{i:02d}", "region": region, "scheduler": name, metric: v})
    return pl.DataFrame(rows)


def _case(kind="reversal", signs=(1, -1), sources=("azure", "mooncake"), metric="e2e_mean"):
    sides = tuple(SideResult(source=s, diff=float(g), rel=0.2, p_adj=0.001, significant=True)
                  for s, g in zip(sources, signs))
    return Case(kind, "a", "b", "overload", metric, sides, rho=1.2, direction="lower")


# --------------------------------------------------------------------------- effects and tests


def test_window_effects_are_relative_and_oriented():
    runs = _runs({"azure": [0.1, 0.2, -0.1]})
    wins, e = confirm.window_effects(runs, "azure", "overload", "e2e_mean", "a", "b", "lower")
    assert wins == ["azure-00", "azure-01", "azure-02"]
    assert np.allclose(e, [0.1, 0.2, -0.1])
    _, e2 = confirm.window_effects(runs, "azure", "overload", "e2e_mean", "b", "a", "lower")
    assert np.allclose(e2, [-0.1, -0.2, 0.1])


def test_one_sided_wilcoxon_exact_values():
    # 5 positive differences: one-sided exact p = 1/2^5; two negatives among 6 distinct: by enumeration
    assert confirm.one_sided_wilcoxon([1, 2, 3, 4, 5], +1) == pytest.approx(1 / 32)
    assert confirm.one_sided_wilcoxon([1, 2, 3, 4, 5], -1) == pytest.approx(1.0)
    d = [1.0, 2.0, -3.0, 4.0, 5.0, 6.0]        # R+ = 18 of 21; P(R+ >= 18) over 2^6 sign patterns
    signs = ((np.arange(64)[:, None] >> np.arange(6)) & 1)
    rplus = (signs * np.arange(1, 7)).sum(axis=1)
    assert confirm.one_sided_wilcoxon(d, +1) == pytest.approx((rplus >= 18).mean())
    assert confirm.one_sided_wilcoxon([0.0, 0.0], +1) == 1.0


def test_intersection_union_is_the_largest_side():
    assert confirm.intersection_union([0.01, 0.03]) == 0.03
    assert confirm.intersection_union([0.01, float("nan")]) == 1.0


def test_holm_hand_computed():
    # sorted p: 0.01, 0.02, 0.03, 0.04 -> x4, x3, x2, x1 = 0.04, 0.06, 0.06 (monotone), 0.06
    p = [0.03, 0.01, 0.04, 0.02]
    assert np.allclose(confirm.holm(p), [0.06, 0.04, 0.06, 0.06])
    fam = confirm.confirm_family([{"p_iut": x} for x in p], alpha=0.05)
    assert [r["confirmed"] for r in fam] == [False, True, False, False]


def test_tost_hand_computed():
    x = np.array([0.01, -0.01, 0.02, 0.0, -0.02])       # mean 0, sd sqrt(0.001/4) = 0.0158
    t = confirm.tost(x, 0.05, 0.05)
    se = x.std(ddof=1) / math.sqrt(5)
    assert t.p_equivalent == pytest.approx(st.t.sf(0.05 / se, 4))
    assert t.verdict == "reproduced" and -0.05 < t.lo < t.hi < 0.05
    far = confirm.tost(x + 0.2, 0.05, 0.05)             # mean 0.2, far beyond the margin
    assert far.verdict == "not reproduced" and far.p_beyond == pytest.approx(st.t.sf((0.2 - 0.05) / se, 4))
    edge = confirm.tost(x * 5 + 0.05, 0.05, 0.05)       # straddles the margin: neither
    assert edge.verdict == "inconclusive"
    assert confirm.tost([0.0], 0.05, 0.05).verdict == "inconclusive"


# --------------------------------------------------------------------------- the two verdicts


def test_survives_settings_needs_sign_and_size_on_every_side():
    c = _case()
    resim = _runs({"azure": [0.2, 0.25, 0.15], "mooncake": [-0.3, -0.2, -0.25]})
    assert confirm.survives_settings(c, resim, delta=0.05, level=0.95)["survives"]
    gone = _runs({"azure": [0.2, 0.25, 0.15], "mooncake": [0.01, -0.02, 0.0]})   # mooncake side vanished
    s = confirm.survives_settings(c, gone, delta=0.05, level=0.95)
    assert not s["survives"] and [x["keeps_sign_and_size"] for x in s["sides"]] == [True, False]
    assert confirm.case_verdict(s, {"verdict": "reproduced"}) == "not testable on this engine"
    # the campaign's effect in the same units, over its own windows
    camp = _runs({"azure": [0.3, 0.1], "mooncake": [-0.2, -0.4]})
    s2 = confirm.survives_settings(c, resim, delta=0.05, level=0.95, campaign_runs=camp)
    assert [sd["campaign_effect"]["mean"] for sd in s2["sides"]] == pytest.approx([0.2, -0.3])
    # proportions: absolute effects against delta_absolute
    assert confirm.practical_size("slo_medium", 0.05, 0.1) == 0.1 and confirm.practical_size("e2e_mean", 0.05, 0.1) == 0.05


def test_engine_vs_resim_pairs_windows_and_tests_each_side():
    c = _case()
    resim = _runs({"azure": [0.20, 0.25, 0.15, 0.22], "mooncake": [-0.3, -0.2, -0.25, -0.22]})
    same = _runs({"azure": [0.21, 0.24, 0.16, 0.22], "mooncake": [-0.29, -0.21, -0.25, -0.23]})
    ev = confirm.engine_vs_resim(c, same, resim, margin=0.05, alpha=0.05)
    assert ev["verdict"] == "reproduced" and all(sd["windows"] == 4 and sd["sign_agrees"] for sd in ev["sides"])
    flipped = _runs({"azure": [0.21, 0.24, 0.16, 0.22], "mooncake": [0.2, 0.25, 0.22, 0.21]})
    ev2 = confirm.engine_vs_resim(c, flipped, resim, margin=0.05, alpha=0.05)
    assert ev2["verdict"] == "not reproduced" and not ev2["sides"][1]["sign_agrees"]


def test_confirm_case_intersection_union_over_sides():
    c = _case()
    eng = _runs({"azure": [0.1, 0.2, 0.15, 0.12, 0.3, 0.05, 0.07],
                 "mooncake": [-0.1, -0.2, -0.15, -0.12, -0.3, -0.05, 0.01]})
    r = confirm.confirm_case(c, eng)
    p_az, p_mc = (sd["p_one_sided"] for sd in r["sides"])
    assert p_az == pytest.approx(1 / 128)                 # all 7 in the simulated direction
    assert p_mc > p_az and r["p_iut"] == p_mc             # the smallest rank against it: 2/128
    assert p_mc == pytest.approx(2 / 128)


def _family_all_in_direction(n: int, cases: int = 5) -> list[dict]:
    """The family's tests when the engine shows every case in the simulated direction on each of n windows, every
    side: the best any engine could do."""
    eng = _runs({"azure": [0.1 + 0.01 * i for i in range(n)], "mooncake": [-0.1 - 0.01 * i for i in range(n)]})
    return confirm.confirm_family([confirm.confirm_case(_case(), eng) for _ in range(cases)], 0.05)


@pytest.mark.parametrize("n", [1, 3, 6, 7, 10])
def test_confirmability_from_n_cases_and_alpha_agrees_with_the_tests(n):
    c = confirm.confirmability(n, 5, 0.05, preregistered=n)
    fam = _family_all_in_direction(n)
    assert c["min_p"] == pytest.approx(min(r["p_iut"] for r in fam)) == pytest.approx(0.5 ** n)
    assert c["min_p_holm"] == pytest.approx(min(r["p_holm"] for r in fam))
    assert c["can_confirm"] is any(r["confirmed"] for r in fam)      # the best outcome confirms iff it says so
    assert c["min_windows"] == 7 and c["windows"] == n and c["cases"] == 5


def test_a_reduced_run_of_3_windows_cannot_confirm_and_enough_windows_can():
    c = confirm.confirmability(3, 5, 0.05, preregistered=3)
    assert c["can_confirm"] is False and c["min_p"] == 0.125 and c["min_p_holm"] == 0.625
    assert "no case can be confirmed" in c["reason"] and "1/2^3 = 0.125" in c["reason"] and "7 windows" in c["reason"]
    assert confirm.confirmability(7, 5, 0.05)["can_confirm"] is True
    assert confirm.confirmability(3, 1, 0.05)["can_confirm"] is False        # 0.125 > 0.05 even alone
    assert confirm.confirmability(5, 1, 0.05)["can_confirm"] is True         # 1/32 < 0.05
    assert confirm.confirmability(7, 5, 0.01)["can_confirm"] is False        # alpha counts: 5/128 >= 0.01
    assert confirm.confirmability(9, 5, 0.01)["min_windows"] == 9
    assert confirm.confirmability(3, 0, 0.05)["can_confirm"] is False        # no family, nothing to confirm
    assert "the pre-registration fixed 3" in confirm.confirmability(1, 5, 0.05, preregistered=3)["reason"]


def test_tested_windows_is_the_best_cases_fewest_sides():
    rows = [{"role": "confirmatory", "confirmatory": {"sides": [{"windows": 3}, {"windows": 2}]}},
            {"role": "confirmatory", "confirmatory": {"sides": [{"windows": 3}, {"windows": 3}]}},
            {"role": "exploratory"}]
    assert confirm.tested_windows(rows) == 3
    assert confirm.tested_windows(rows[:1]) == 2 and confirm.tested_windows(rows[2:]) is None


def test_notebook_08_says_a_run_that_cannot_confirm_is_a_smoke_run():
    from portbench.present import validation_report as report

    rows = [{"role": "confirmatory", "confirmatory": {"sides": [{"windows": n}, {"windows": n}]}} for n in (3, 3)]
    pr = {"windows_per_source": 3, "n_cases": 5, "alpha": 0.05}
    s = {"ran": True, "run": "reduced", "preregistration": pr, "verdicts": rows,
         "confirmability": confirm.confirmability(3, 5, 0.05, preregistered=3)}
    md = report.confirmability_markdown(s)
    assert "smoke run" in md and "`make validate` is the confirmatory run" in md and "0.625" in md
    assert report.confirmability(s) == report.confirmability({k: v for k, v in s.items() if k != "confirmability"})
    full = {**s, "run": "full", "confirmability": confirm.confirmability(6, 5, 0.05)}
    assert "smoke" not in report.confirmability_markdown(full) and "at least 7" in report.confirmability_markdown(full)
    assert report.confirmability_markdown({**s, "confirmability": confirm.confirmability(7, 5, 0.05)}) == ""
    assert report.confirmability_markdown({"ran": False}) == ""


# --------------------------------------------------------------------------- pre-registration


def _reversal_table():
    rows = []

    def add(a, b, s1, s2, d1, d2, rel, metric="e2e_mean", region="overload"):
        rows.append({"panel": "real", "a": a, "b": b, "source_1": s1, "source_2": s2, "region": region,
                     "metric": metric, "direction": "lower", "headline": True, "diff_1": d1, "diff_2": d2,
                     "rel_1": rel, "rel_2": rel, "p_1": 1e-4, "p_2": 1e-4, "p_adj_1": 1e-3, "p_adj_2": 1e-3,
                     "reversal": d1 * d2 < 0, "significant": True, "practical": True})
    for s1, s2 in (("azure", "mooncake"), ("azure", "azure_code"), ("azure_code", "mooncake")):
        add("fcfs", "sjf_prompt", s1, s2, 1.0, -1.0, 0.5 if s1 == "azure" and s2 == "mooncake" else 0.1)
        add("fcfs", "las", s1, s2, 1.0, -1.0, 0.2)
        add("random", "sjf_oracle", s1, s2, -1.0, -1.0, 0.3)
        add("fcfs", "srpt_oracle", s1, s2, 1.0, -1.0, 0.15, region="severe")
    return pl.DataFrame(rows)


def test_draw_is_seeded_and_stratified_by_source_pair():
    rev = _reversal_table()
    loads = {"overload": 1.2, "severe": 2.0}
    conf, explore, _ = prereg.choose_cases(rev, loads, extra=3, seed=5)
    assert conf[0].kind == "reversal" and (conf[0].a, conf[0].b) == ("fcfs", "sjf_prompt")
    assert conf[1].kind == "control" and set(conf[1].sources) == set(conf[0].sources)
    drawn = conf[2:]
    assert len(drawn) == 3 and len({"/".join(sorted(c.sources)) for c in drawn}) == 3   # one per source pair
    again, _, _ = prereg.choose_cases(rev, loads, extra=3, seed=5)
    assert [(c.a, c.b, c.region, c.sources) for c in again] == [(c.a, c.b, c.region, c.sources) for c in conf]
    assert len(conf) <= prereg.MAX_CASES
    assert not any(prereg._same(e, c) for e in explore for c in conf)


def test_power_grows_with_windows_and_reaches_the_target():
    c = _case()
    runs = _runs({"azure": list(np.linspace(0.15, 0.35, 20)), "mooncake": list(-np.linspace(0.15, 0.35, 20))})
    ps = prereg.PowerSettings(alpha=0.05, target=0.8, noise_cv=0.05, min_windows=3, max_windows=12,
                              simulations=200, seed=0)
    pw = prereg.power([c], runs, ps)
    # the effects are all far from 0: every side rejects as soon as 1/2^n < alpha, i.e. n = 5
    assert pw["windows_per_source"] == 5 and pw["target_reached"]
    assert pw["power_by_n"]["3"][0] == 0.0 and pw["power_at_n"][0] >= 0.8
    weak = _runs({"azure": list(np.linspace(-0.3, 0.32, 20)), "mooncake": list(-np.linspace(-0.3, 0.32, 20))})
    pw2 = prereg.power([c], weak, ps)
    assert not pw2["target_reached"] and pw2["windows_per_source"] == 12


def test_preregistration_hash_changes_with_a_case(tmp_path):
    pw = {"windows_per_source": 8, "power_at_n": [0.9, 0.95], "target_reached": True}
    a = [_case(), _case("control", (1, 1))]
    doc = prereg.document(a, pw, {"azure": ["azure-01"]}, alpha=0.05, inputs={"x": 1}, draw_seed=1, extra=3,
                          margin=0.05)
    h = prereg.write(tmp_path / "p.json", doc)
    assert h == prereg.sha256(doc) and prereg.check(tmp_path / "p.json", h)["correction"] == "holm"
    b = [_case(), _case("control", (1, 1), metric="ttft_p90")]
    doc_b = prereg.document(b, pw, {"azure": ["azure-01"]}, alpha=0.05, inputs={"x": 1}, draw_seed=1, extra=3,
                            margin=0.05)
    assert prereg.sha256(doc_b) != h
    assert prereg.sha256(dict(doc)) == h                 # same content, same hash (no timestamp inside)
    back = prereg.cases_from(doc)
    assert [(c.kind, c.metric, c.sources) for c in back] == [(c.kind, c.metric, c.sources) for c in a]
    (tmp_path / "p.json").write_text((tmp_path / "p.json").read_text().replace('"holm"', '"fdr_bh"'))
    with pytest.raises(DataError):
        prereg.check(tmp_path / "p.json", h)


# --------------------------------------------------------------------------- settings match


def test_hashed_prompts_share_exactly_the_hashed_prefix():
    from portbench.validation import replay
    w = pl.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [150, 140, 150], "output_tokens": [3, 3, 3],
                      "block_hashes": [[1, 2], [1, 3], [7, 8]]})
    reqs, _ = replay.build_requests(w, vocab_size=1000, seed=0, hash_block_tokens=64)
    p = [np.array(r.prompt_token_ids) for r in reqs]
    assert [len(x) for x in p] == [150, 140, 150]
    assert (p[0][:64] == p[1][:64]).all() and not (p[0][64:128] == p[1][64:128]).all()
    assert not (p[0][:64] == p[2][:64]).all()
    plain, _ = replay.build_requests(w, vocab_size=1000, seed=0)
    assert not (np.array(plain[0].prompt_token_ids)[:64] == np.array(plain[1].prompt_token_ids)[:64]).all()


# --------------------------------------------------------------------------- step grid (no vLLM)


def test_step_grid_shapes_schedule_and_fit():
    from portbench.core.config import StepGridConfig
    from portbench.sim import profiles
    from portbench.validation import steps
    g = StepGridConfig()
    shapes = steps.grid(g)
    assert shapes[0].kind == "decode" and {s.kind for s in shapes} == {"decode", "prefill", "mixed"}
    # the KV cache (the CPU engine's 20,224 tokens) keeps long contexts with small batches only
    held = steps.grid(g, kv_tokens=20_224)
    dec = {(s.decode_batch, s.decode_context) for s in held if s.kind == "decode"}
    assert (1, 8192) in dec and (4, 2048) in dec and (64, 256) in dec
    assert (4, 8192) not in dec and (16, 2048) not in dec and (64, 2048) not in dec
    assert all(b * (c + 1 + g.steps_per_shape) <= 20_224 for b, c in dec) and held[0] == shapes[0]
    assert shapes[-2].model_inputs() == (128, 16, 16 * 65 + 128, 128 * 129 // 2)
    assert shapes[-1].name == "mixed B=2 C=2048 + P=256" and shapes[-1].model_inputs()[2] == 2 * 2049 + 256
    from portbench.core.errors import ParameterError
    with pytest.raises(ParameterError, match="triples"):
        StepGridConfig(mixed=((2, 256, 2048, 1),))
    order = steps.schedule(shapes, 2, seed=3)
    assert order == steps.schedule(shapes, 2, seed=3) and order[0] == (0, 0)
    for r in (0, 1):   # every shape once per round besides the repeated reference
        assert sorted(i for rr, i in order if rr == r and i) == list(range(1, len(shapes)))
    # a known cost model, medians exact: the fit recovers it, attention term included
    true = dict(c0_s=5e-3, c_prefill_s=2e-5, c_decode_s=1e-4, c_kv_s=1e-7, c_attn_s=3e-9)
    rows = []
    for s in shapes:
        p, b, c, a = s.model_inputs()
        t = true["c0_s"] + true["c_prefill_s"] * p + true["c_decode_s"] * b + true["c_kv_s"] * c + true["c_attn_s"] * a
        for k in range(9):
            rows.append({"shape": s.name, "kind": s.kind, "step_wall_s": t * (1 + 0.01 * (k - 4)), "as_planned": True,
                         "prefill_tokens": p, "decode_seqs": b, "context_tokens": c, "attention_pairs": a,
                         "round": 0, "reference": False})
    tab = steps.shape_table(pl.DataFrame(rows))
    assert (tab["lo_s"] < tab["median_s"]).all() and (tab["median_s"] < tab["hi_s"]).all()
    prof, out, summ = steps.fit(tab, profiles.get_profile("a100_40gb_llama3_1_8b"), "t")
    for k, v in true.items():
        assert summ["coefficients"][k] == pytest.approx(v, rel=1e-3)
    assert summ["max_abs_rel_err"] < 1e-6 and summ["r2"] == pytest.approx(1.0)
    assert prof.c_attn_s == pytest.approx(true["c_attn_s"], rel=1e-3) and prof.floor_s == 0


def test_median_ci_order_statistics():
    from portbench.validation import steps
    med, lo, hi = steps.median_ci(np.arange(1.0, 21.0))
    # n = 20: binom(20, .5) 2.5 % quantile = 6 -> the 6th and 15th order statistics
    assert (med, lo, hi) == (10.5, 6.0, 15.0)
    assert math.isnan(steps.median_ci([1.0, 2.0, 3.0])[1])


# --------------------------------------------------------------------------- the deciding engine (issue 24)


def _verdict_rows(engine, resim, cases, n_conf):
    return confirm.verdicts(cases[:n_conf], cases[n_conf:], engine, resim, alpha=0.05, delta=0.05, margin=0.05,
                            delta_absolute=0.02)


def test_combine_planted_cases_virtual_decides_wall_clock_beside():
    """Planted per-window effects: the re-simulation keeps the campaign's reversal (+ on azure, - on mooncake);
    the virtual engine reproduces it exactly, the wall-clock engine shows the opposite on mooncake. The
    pre-registered (virtual) engine decides the confirmatory case; the exploratory case, run on the wall-clock
    engine only, is decided there; a case whose re-simulation loses the sign is not testable on either."""
    eff = {"azure": [0.1, 0.2, 0.15, 0.12, 0.3, 0.11, 0.14], "mooncake": [-0.1, -0.2, -0.15, -0.12, -0.3, -0.11, -0.13]}
    resim = _runs(eff)
    virt = _runs(eff)
    wall = _runs({"azure": eff["azure"], "mooncake": [abs(x) for x in eff["mooncake"]]})
    kept, lost = _case(), _case(signs=(1, 1))          # lost: the campaign says + on mooncake, the re-simulation -
    by = {"virtual": _verdict_rows(virt, resim, [kept, lost], 2), "wall_clock": _verdict_rows(wall, resim,
                                                                                             [kept, lost, kept], 2)}
    rows = confirm.combine(by)
    assert [r["decided_by"] for r in rows] == ["virtual", "virtual", "wall_clock"]
    assert rows[0]["verdict"] == "reproduced" and rows[0]["confirmatory"]["confirmed"]
    assert rows[0]["by_engine"]["wall_clock"]["verdict"] == "not reproduced"
    assert not rows[0]["by_engine"]["wall_clock"]["confirmatory"]["confirmed"]
    assert rows[1]["verdict"] == "not testable on this engine" == rows[1]["by_engine"]["wall_clock"]["verdict"]
    assert rows[2]["role"] == "exploratory" and set(rows[2]["by_engine"]) == {"wall_clock"}
    # without the virtual engine's rows the wall-clock engine decides, and says it was not the pre-registered one
    alone = confirm.combine({"wall_clock": by["wall_clock"]})
    assert alone[0]["decided_by"] == "wall_clock" and not alone[0]["decided_as_preregistered"]
    with pytest.raises(ValueError):
        confirm.combine({"virtual": [{**by["virtual"][0], "case": "another case"}], "wall_clock": by["wall_clock"]})


def test_preregistration_names_the_deciding_engine():
    doc = prereg.document([_case()], {"windows_per_source": 6, "power_at_n": [0.9]}, {"azure": ["azure-00"]},
                          alpha=0.05, inputs={}, draw_seed=1, extra=3, margin=0.05)
    assert doc["decided_by"]["engine"] == confirm.DECIDING_ENGINE == "virtual"
    assert doc["decided_by"]["also_reported"] == ["wall_clock"]


def test_repeat_cv_from_every_shape_per_round():
    from portbench.validation import steps
    speed = {0: 1.0, 1: 1.1, 2: 0.9}          # the machine's speed per round; one outlier step does not move it
    rows = pl.DataFrame([{"shape": sh, "round": r, "step_wall_s": base * f * (5.0 if (sh, r, k) == ("x", 2, 0) else 1.0)}
                         for sh, base in (("x", 1e-3), ("y", 4e-3), ("z", 9e-3)) for r, f in speed.items()
                         for k in range(3)])
    r = steps.repeat_cv(rows)
    assert r["rounds"] == 3 and r["cv"] == pytest.approx(0.1)
    assert math.isnan(steps.repeat_cv(rows.filter(pl.col("round") == 0))["cv"])


def test_a_control_asks_whether_its_order_holds_not_its_size():
    c = _case("control", signs=(1, 1))
    small = _runs({"azure": [0.10, 0.12, 0.08], "mooncake": [0.012, 0.011, 0.013]})   # mooncake: clear but < delta
    s = confirm.survives_settings(c, small, delta=0.05, level=0.9)
    assert s["survives"] and s["order_holds"] and s["question"] == "does the order hold"
    assert [x["keeps_order"] for x in s["sides"]] == [True, True]
    assert confirm.case_verdict(s, {"verdict": "reproduced"}) == "reproduced"
    # the same effects on a reversal-kind case fail the size rule
    r = confirm.survives_settings(_case(signs=(1, 1)), small, delta=0.05, level=0.9)
    assert not r["survives"] and r["question"] == "does the reversal survive"
    # an order whose interval spans 0 does not hold
    blurred = _runs({"azure": [0.10, 0.12, 0.08], "mooncake": [0.02, -0.015, 0.001]})
    s2 = confirm.survives_settings(c, blurred, delta=0.05, level=0.9)
    assert not s2["order_holds"] and confirm.case_verdict(s2, {"verdict": "reproduced"}) == "not testable on this engine"
    row = {"kind": "control", "confirmatory": {"confirmed": True}}
    assert confirm.outcome_words(row) == "order holds on the engine (confirmed)"
    assert confirm.outcome_words({**row, "kind": "reversal"}) == "confirmed"
    assert confirm.outcome_words({"kind": "control", "confirmatory": {"confirmed": False}}).startswith("order not shown")


def test_engine_input_takes_the_clients_send_times_by_request_id():
    from portbench.validation import predict
    win = pl.DataFrame({"arrival_s": [0.0, 0.0, 0.0, 1.0], "prompt_tokens": [10, 20, 30, 40]})
    rec = pl.DataFrame({"req_id": [2, 0, 1], "arrival_s": [0.0004, 0.0011, 0.0007]})    # request 3 never sent
    got = predict.engine_input(win, rec)["arrival_s"].to_list()
    assert got == [0.0011, 0.0007, 0.0004, 1.0]          # the client sent 2 first, then 1, then 0


def test_speed_band_is_the_quantiles_of_the_grids_visit_speeds():
    from portbench.validation import steps
    rows = []
    for shape, base in (("a", 0.004), ("b", 0.010)):
        for rnd, f in enumerate((0.8, 1.0, 1.0, 1.0, 1.25)):      # the same speed states met by both shapes
            rows += [{"shape": shape, "round": rnd, "step_wall_s": base * f}] * 3
    band = steps.speed_band(pl.DataFrame(rows), (0.0, 1.0))
    assert band["lo"] == pytest.approx(0.8) and band["hi"] == pytest.approx(1.25) and band["visits"] == 10
    one_round = pl.DataFrame([r for r in rows if r["round"] == 0])
    assert math.isnan(steps.speed_band(one_round)["lo"])


def test_family_runs_each_case_window_and_policy_once():
    from portbench.validation import family

    a = _case()                                         # a vs b on azure and mooncake at overload
    b = Case("control", "a", "c", "overload", "e2e_mean", a.sides, rho=1.2, direction="lower")
    wins = {"azure": ["azure-01", "azure-02"], "mooncake": ["mooncake-03"]}
    got = family.todo([a, b], wins)
    keys = [(s, w, r, x) for s, w, r, _, x in got]
    assert len(keys) == len(set(keys)) == 2 * 3 + 3      # a, b on 3 windows; c on the same 3 (a runs once)
    assert keys[:2] == [("azure", "azure-01", "overload", "a"), ("azure", "azure-01", "overload", "b")]
    assert all(rho == 1.2 for *_, rho, _ in got)
    assert {x for *_, x in got} == {"a", "b", "c"}


def test_family_agreement_with_the_campaigns_replicate_0():
    from portbench.validation import family

    key = {"source": "azure", "window_id": "azure-01", "region": "overload", "scheduler": "a"}
    resim = pl.DataFrame([{**key, "rho": 1.2, "e2e_mean": 2.0, "ttft_p90": float("nan")},
                          {**key, "scheduler": "b", "rho": 1.2, "e2e_mean": 3.0, "ttft_p90": 1.0}])
    camp = pl.DataFrame([{**key, "e2e_mean": 2.0 * (1 + 1e-12), "ttft_p90": float("nan")},
                         {**key, "scheduler": "b", "e2e_mean": 3.5, "ttft_p90": 1.0}])
    assert family.agreement(resim, camp) == {"compared": 2, "identical": 1}
    assert family.agreement(resim, pl.DataFrame()) == {"compared": 0, "identical": 0}


def test_resolution_words_come_from_the_summary():
    from portbench.present import validation_report as report
    assert report.resolution_markdown({}) == ""
    w = {"available": True,
         "machine_speed": {"within_replay": {"bin_s": 0.5, "pieces": 12, "replays": 2, "q10": 0.81, "median": 0.97,
                                             "q90": 1.19, "relative_sd_median": 0.123}},
         "sensitivity": {"steps_x1.05": {"factor": 1.05, "e2e": 0.111, "by_source": {"azure": {"e2e": 0.078}}},
                         "explanation": "..."},
         "speed_band": {"lo": 0.9, "hi": 1.17, "coverage": {"requests": 600, "e2e": 0.607, "e2e_above": 0.148,
                                                             "ttft": 0.55, "tpot": 0.57, "by_source": {}}}}
    text = report.resolution_markdown({"whole_run_prediction": w})
    assert "0.81x-1.19x" in text and "12.3%" in text and "x1.05: E2E 11.1% (azure 7.8%)" in text
    assert "60.7% of the 600 requests" in text and "14.8% were slower" in text
