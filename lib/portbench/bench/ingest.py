"""Ingest benchmark: :func:`portbench.data.traces.read_file` on a synthetic BurstGPT-format file.

The file has as many rows as the official ``BurstGPT_without_fails_2.csv`` (a tenth with
``quick``), BurstGPT's 6 columns, failures (0 response tokens) at BurstGPT_1's published share,
inter-arrival times at without_fails_2's mean rate, and log-normal token counts matching the
published median and p99 of the first 60 k rows of BurstGPT_1. Only the file's size and shape
matter for parsing speed; the values just keep every validation path busy. ``read_file`` (parse,
validate, exclude failures, build the canonical table) is timed against a plain
``polars.read_csv`` of the same file in the same run, alternating the two; medians are reported.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from ..data import registry, traces

SEED = 20241129
# BurstGPT_1.csv: 25,443 failures in 1,429,737 rows (PROVENANCE.md).
FAILURE_SHARE = 25_443 / 1_429_737
# without_fails_2: 3,784,213 requests over 60.0 days (third-party full-file audit, PROVENANCE.md).
MEAN_INTERARRIVAL_S = 60.0 * 86_400 / 3_784_213
# Token quantiles of the first 59,999 rows of BurstGPT_1 (PROVENANCE.md): (p50, p99).
PROMPT_P50_P99 = (74, 3_023)
OUTPUT_P50_P99 = (14, 757)
# without_fails_1 composition (PROVENANCE.md): ChatGPT 1,189,167 / GPT-4 215,127; Conversation
# log 145,707 / API log 1,258,587.
CHATGPT_SHARE = 1_189_167 / (1_189_167 + 215_127)
CONVERSATION_SHARE = 145_707 / (145_707 + 1_258_587)
FULL_ROWS = registry.OFFICIAL_FILES["BurstGPT_without_fails_2.csv"].rows


def _lognormal(rng: np.random.Generator, p50_p99: tuple[int, int], n: int) -> np.ndarray:
    """Integers >= 1 from a log-normal with the given median and 99th percentile."""
    p50, p99 = p50_p99
    sigma = math.log(p99 / p50) / statistics.NormalDist().inv_cdf(0.99)
    return np.maximum(1, np.rint(rng.lognormal(math.log(p50), sigma, n))).astype(np.int64)


def synthetic_burstgpt(path: str | os.PathLike, rows: int, seed: int = SEED) -> Path:
    """Write a seeded BurstGPT-format (6-column) CSV of ``rows`` data rows to ``path``."""
    rng = np.random.default_rng(seed)
    ts = np.floor(np.cumsum(rng.exponential(MEAN_INTERARRIVAL_S, rows))).astype(np.int64)
    req = _lognormal(rng, PROMPT_P50_P99, rows)
    resp = _lognormal(rng, OUTPUT_P50_P99, rows)
    failed = rng.random(rows) < FAILURE_SHARE
    req[failed], resp[failed] = 0, 0  # BurstGPT failure rows read 0/0/0
    model = np.where(rng.random(rows) < CHATGPT_SHARE, *traces.BURST_MODELS)  # ("ChatGPT", "GPT-4")
    log_type = np.where(rng.random(rows) < CONVERSATION_SHARE, *traces.BURST_LOG_TYPES)
    df = pl.DataFrame(dict(zip(traces.BURST6, (ts, model, req, resp, req + resp, log_type))))
    df.write_csv(path)
    return Path(path)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(quick: bool = False) -> dict:
    """Time ``traces.read_file`` on a synthetic BurstGPT file; returns the measurements.

    Keys: ``rows``, ``file_mb``, ``repeats``, ``read_file_s`` (median), ``read_csv_s`` (median),
    ``rows_per_s`` (of read_file), ``ratio_vs_read_csv``, all runs' times, and the ingest report's
    ``rows_valid`` / ``excluded``.
    """
    rows = FULL_ROWS // 10 if quick else FULL_ROWS
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="portbench-bench-ingest-") as tmp:
        path = synthetic_burstgpt(Path(tmp) / "BurstGPT_synthetic.csv", rows)
        size_mb = path.stat().st_size / 1e6
        _, report = traces.read_file(path, "burstgpt")  # warm-up (page cache, polars thread pool)
        ours, plain = [], []
        for _ in range(repeats):
            ours.append(_timed(lambda: traces.read_file(path, "burstgpt")))
            plain.append(_timed(lambda: pl.read_csv(path)))
    ours_s, plain_s = statistics.median(ours), statistics.median(plain)
    return {"rows": rows, "file_mb": round(size_mb, 1), "repeats": repeats,
            "read_file_s": ours_s, "read_csv_s": plain_s, "rows_per_s": rows / ours_s,
            "ratio_vs_read_csv": ours_s / plain_s, "read_file_runs_s": ours, "read_csv_runs_s": plain,
            "rows_valid": report["rows_valid"], "excluded": report["excluded"]}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv[1:]), indent=1))
