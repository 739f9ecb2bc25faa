"""The one formatter of a value with its confidence intervals (present/numbers.py) and its users."""

from __future__ import annotations

from portbench.present import numbers, report, text

STAT = {"value": 0.2134, "ci": [0.18, 0.262], "ci_conditions": [0.1, 0.3], "count": 252}


def test_with_ci_forms():
    num = numbers.fixed(2)
    assert numbers.with_ci("0.21", [0.18, 0.262], [0.1, 0.3], num=num) == "0.21 [0.18, 0.26] / [0.10, 0.30]"
    assert (numbers.with_ci("0.21", [0.18, 0.262], [0.1, 0.3], num=num, conditions="words")
            == "0.21 [0.18, 0.26] (conditions resampled: [0.10, 0.30])")
    assert (numbers.with_ci("0.21", [0.18, 0.262], [0.1, 0.3], num=num, count=252)
            == "0.21 [0.18, 0.26] (n = 252; conditions resampled: [0.10, 0.30])")
    # an interval with a missing bound is left out, not printed as None
    assert numbers.with_ci("0.21", [None, None], [0.1, None], num=num) == "0.21"
    assert numbers.with_ci("0.21", None, None, num=num, count=3) == "0.21 (n = 3)"
    assert numbers.percent(1)(0.1234) == "12.3%" and numbers.percent(0, sign=False)(0.1234) == "12"


def test_the_report_and_the_notebooks_use_it():
    assert report._num(STAT) == "0.21 [0.18, 0.26] / [0.10, 0.30]"
    assert report._pct(STAT) == "21% [18, 26] / [10, 30]"
    assert text.fmt(STAT) == "0.21 [0.18, 0.26] (n = 252; conditions resampled: [0.10, 0.30])"
    assert text.pct_ci(STAT) == "21.3% [18.0%, 26.2%] (conditions resampled: [10.0%, 30.0%])"
    assert text.fmt({"value": 7, "ci": None}) == "7" and text.fmt(None) == "n/a" and report._num(None) == "n/a"


def test_congestion_sentence_names_the_lightest_loads_queues_and_says_when_the_runs_have_no_queue_column():
    """Notebook 05's congestion paragraph: the reference policy's mean queue per source at the lightest rho; a runs
    table without ``queue_mean`` (a user's runs_file, the bench's planted runs) gets a sentence, not a KeyError."""
    cong = {"reference_policy": "fcfs", "by_source_region": {
        "azure": {"light": {"rho": 0.3, "queue_mean": 0.25, "runs": 3}, "overload": {"rho": 1.2, "queue_mean": 40.0}},
        "mooncake": {"light": {"rho": 0.3, "queue_mean": 3.5, "runs": 3}}}}
    ct, s = text.congestion_markdown(cong, {"azure": "Azure"})
    assert ct is not None and ct.height == 3
    assert "ρ = 0.3" in s and "FCFS queue is Azure 0.25, mooncake 3.50" in s and "overload" not in s
    bare = {"by_source_region": {"azure": {"light": {"rho": 0.3, "runs": 3}}}}
    ct, s = text.congestion_markdown(bare, {})
    assert ct is not None and "no queue column" in s
    assert text.congestion_markdown(None, {}) == (None, "")
    assert text.congestion_markdown({"by_source_region": {}}, {}) == (None, "")


def test_an_interval_that_cannot_vary_is_printed_as_a_point():
    num = numbers.percent(0)
    assert numbers.with_ci("64%", [0.64, 0.64], num=num) == "64% (the same in every resample: no interval)"
    assert numbers.with_ci("64%", [0.63, 0.65], num=num) == "64% [63%, 65%]"
