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
