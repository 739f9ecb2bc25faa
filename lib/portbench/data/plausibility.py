"""Plausibility of a trace read through a column mapping: checks that every row can pass and the whole can still
be wrong. Each finding is a warning naming the parameter or column and the fix (the run goes on: the data may be
unusual but right); :func:`check` returns them, the ingest prints them and keeps them in its report.

* prompts much shorter than outputs on most rows: the two token columns may be swapped;
* an arrival rate or span implausible for the declared ``time_unit``, at both ends: a trace in milliseconds read as
  seconds spreads thousands of requests over days or years (a request every few minutes); one in seconds read as
  milliseconds puts thousands of requests into a few seconds (thousands per second);
* quantised or repeated timestamps: many rows (:data:`REPEAT_GROUP`) share one arrival time, so windows of
  consecutive requests may span no time (a window whose arrivals all share one time is an error at freeze).
"""

from __future__ import annotations

import numpy as np
import polars as pl

SWAP_RATIO = 4.0          # prompt * SWAP_RATIO < output ...
SWAP_SHARE = 0.5          # ... on more than this share of the rows
MAX_RATE_RPS = 1_000.0    # mean arrivals per second above this: the unit is probably too small (the official traces:
                          # 0.7-6 requests per second; seconds read as ms multiply the rate by 1,000)
MIN_SPAN_S = 10.0         # ... or thousands of requests within a span of seconds
MIN_RATE_RPS = 1 / 120    # below one request per two minutes on average (with many rows): the unit is too large
                          # (ms read as s: an hour's trace spans weeks, a request every few minutes)
MIN_ROWS_RATE = 1_000     # rate checks only on traces with at least this many rows
MAX_SPAN_S = 366 * 86_400  # a trace spanning more than a year
BLOCK = 1 << 22           # rows per block of the checks (memory bounded whatever the trace's size)
REPEAT_GROUP = 50         # this many rows or more at one timestamp (Mooncake's ms timestamps: at most 28)

_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "datetime": "date-times"}


def check(body: pl.DataFrame | pl.LazyFrame, *, source: str, columns: dict, time_unit: str) -> list[str]:
    """Warnings for a trace's canonical body (``arrival_s`` in seconds from the first row, ``prompt_tokens``,
    ``output_tokens``); ``columns`` is the mapping role -> file column, ``source`` names ``sources.<source>``.
    ``body`` may be a lazy scan (a large table): it is then read in blocks."""
    out: list[str] = []
    lazy = body.lazy()
    n = int(lazy.select(pl.len()).collect().item())
    if n == 0:
        return out
    p = f"sources.{source}"
    pc, oc, ac = columns.get("prompt_tokens"), columns.get("output_tokens"), columns.get("arrival")
    swapped = int(lazy.select((pl.col("prompt_tokens") * SWAP_RATIO < pl.col("output_tokens")).sum())
                  .collect(engine="streaming").item())
    share = swapped / n
    if share > SWAP_SHARE:
        out.append(f"{p}.columns: the prompt column {pc!r} is less than a quarter of the output column {oc!r} on "
                   f"{share:.0%} of the rows (LLM requests usually have longer prompts than outputs): are the two "
                   f"columns swapped? If so, exchange columns.prompt_tokens and columns.output_tokens")
    lo, hi = lazy.select(pl.col("arrival_s").min().alias("lo"), pl.col("arrival_s").max().alias("hi")).collect(engine="streaming").row(0)
    span = float(hi - lo) if n > 1 else 0.0
    unit = _UNITS.get(time_unit, time_unit)
    if span > MAX_SPAN_S:
        out.append(f"{p}.time_unit: the arrival column {ac!r} read as {unit} spans {span / 86_400 / 365.25:.1f} years; "
                   "if its values are milliseconds or microseconds, set time_unit: ms or us")
    if n >= MIN_ROWS_RATE and span > 0 and time_unit != "datetime":
        rate = (n - 1) / span
        if rate > MAX_RATE_RPS or span < MIN_SPAN_S:
            out.append(f"{p}.time_unit: the arrival column {ac!r} read as {unit} puts {n:,} requests in "
                       f"{span:,.1f} s ({rate:,.0f} requests per second on average), far above any serving trace; if its "
                       "values are seconds (or milliseconds), set time_unit: s (or ms)")
        elif rate < MIN_RATE_RPS:
            out.append(f"{p}.time_unit: the arrival column {ac!r} read as {unit} spreads {n:,} requests over "
                       f"{span / 86_400:,.1f} days (one request every {1 / rate:,.0f} s on average); if its values are "
                       "milliseconds or microseconds, set time_unit: ms or us")
    if n > 1:
        biggest, at, distinct = _longest_run(part["arrival_s"].to_numpy() for part in
                                             lazy.select("arrival_s").collect_batches(chunk_size=BLOCK))
        if biggest >= REPEAT_GROUP:
            repeat = 1 - distinct / n
            out.append(f"{p}.columns.arrival: {biggest:,} rows share one time in {ac!r} ({at:g} s after the first "
                       f"row; {repeat:.0%} of the rows repeat an earlier time): the timestamps are quantised or "
                       "duplicated, so a window of consecutive requests may span no time (its rate is then undefined) "
                       "or compress a burst into one instant; use a finer-grained time column if the file has one")
    return out


def _longest_run(blocks) -> tuple[int, float, int]:
    """``(length, value, distinct values)`` of the longest run of equal consecutive values of the arrays ``blocks``
    taken one after the other (arrivals are non-decreasing, so equal times are consecutive; memory: one block)."""
    best, best_at, distinct = 0, 0.0, 0
    run, run_at = 0, None
    for x in blocks:
        if not len(x):
            continue
        new = np.empty(len(x), dtype=bool)
        new[0] = run_at is None or x[0] != run_at
        new[1:] = x[1:] != x[:-1]
        starts = np.flatnonzero(new)
        distinct += len(starts)
        if not len(starts):          # the whole block continues the current run
            run += len(x)
        else:
            if starts[0] > 0:
                run += int(starts[0])
            if run > best:
                best, best_at = run, float(run_at)
            lengths = np.diff(np.append(starts, len(x)))
            k = int(lengths[:-1].argmax()) if len(lengths) > 1 else None
            if k is not None and lengths[k] > best:
                best, best_at = int(lengths[k]), float(x[starts[k]])
            run, run_at = int(lengths[-1]), x[starts[-1]]
    if run > best:
        best, best_at = run, float(run_at)
    return best, best_at, distinct
