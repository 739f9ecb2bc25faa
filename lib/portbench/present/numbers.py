"""The one formatter of a number with its confidence intervals: ``value [CI]``, then the interval with the
conditions resampled, either after a slash (``0.21 [0.18, 0.26] / [0.10, 0.30]``, the README's block) or in
words (``(conditions resampled: [0.10, 0.30])``, the notebooks), optionally with a count."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Number = Callable[[float], str]


def fixed(digits: int = 2) -> Number:
    """``0.21`` (``digits`` decimals)."""
    return lambda v: f"{v:.{digits}f}"


def percent(digits: int = 1, sign: bool = True) -> Number:
    """``12.3%`` (a fraction times 100; without ``sign``, ``12.3``)."""
    return lambda v: f"{100 * v:.{digits}f}" + ("%" if sign else "")


def with_ci(value: str, ci: Sequence | None = None, ci_conditions: Sequence | None = None, *, num: Number,
            conditions: str = "slash", count: int | None = None) -> str:
    """``value`` (already formatted) followed by `` [lo, hi]`` (each bound through ``num``) when ``ci`` has both
    bounds (an interval that cannot vary, lower = upper bound, is not printed as one: the value is a point), and
    the conditions-resampled interval: ``conditions="slash"`` -> `` / [lo, hi]``; ``"words"`` ->
    `` (conditions resampled: [lo, hi])``. With ``count``: `` (n = count)``, or ``(n = count; conditions
    resampled: [lo, hi])`` (the conditions' interval is then only shown there)."""
    out = value
    if ci and ci[0] is not None and ci[1] is not None:
        out += (" (the same in every resample: no interval)" if ci[0] == ci[1]
                else f" [{num(ci[0])}, {num(ci[1])}]")
    cc = (f"[{num(ci_conditions[0])}, {num(ci_conditions[1])}]"
          if ci_conditions and ci_conditions[0] is not None and ci_conditions[1] is not None else None)
    if count is not None:
        return out + f" (n = {count}" + (f"; conditions resampled: {cc})" if cc else ")")
    if cc:
        out += f" / {cc}" if conditions == "slash" else f" (conditions resampled: {cc})"
    return out
