"""Ingest benchmark: :func:`portbench.data.traces.read_file` on a synthetic BurstGPT-format file.

The file has as many rows as the official ``BurstGPT_without_fails_2.csv`` (a tenth with
``quick``), BurstGPT's 6 columns, failures (0 response tokens) at BurstGPT_1's published share,
inter-arrival times at without_fails_2's mean rate, and log-normal token counts matching the
published median and p99 of the first 60 k rows of BurstGPT_1. Only the file's size and shape
matter for parsing speed; the values just keep every validation path busy. ``read_file`` (parse,
validate, exclude failures, build the canonical table) is timed against a plain
``polars.read_csv`` of the same file in the same run, alternating the two; medians are reported.

**Memory** (:func:`memory`, issue #27): an Azure-format file (``TIMESTAMP`` with 7 fractional digits,
``ContextTokens``, ``GeneratedTokens``; log-normal tokens at the Azure conversation trace's medians) of 1 GB and
5 GB (1 GB, one run, with ``quick``) is generated under the system's temporary folder and ingested as a user's source in a
fresh process, then its windows are frozen in another; each process's peak resident memory (``VmHWM``) is
measured, medians over :data:`MEMORY_REPEATS` runs for files up to 1 GB (one run above). Reading in parts costs
about 0.6 GiB above the start whatever the file's size (the parts in flight, polars' buffers), so the factor
target says something only from about 1 GB up. Target: every stage's peak
<= :data:`TARGET_PEAK_GIB` GiB, and its growth over the process's memory before reading (the interpreter, polars,
the parameters: ``base_gib``) <= :data:`TARGET_PEAK_FACTOR` x the file's size. The files are deleted after.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from .. import params
from ..data import registry, traces, windows

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
TARGET_PEAK_GIB = 4.0      # issue #27: any file ingests within 4 GiB ...
TARGET_PEAK_FACTOR = 2.0   # ... and within twice its size
MEMORY_GB = (1.0, 5.0)     # generated file sizes (GB); quick: QUICK_MEMORY_GB
QUICK_MEMORY_GB = (1.0,)   # (smaller files say little: reading in parts costs about 0.6 GiB whatever the size)
MEMORY_REPEATS = 3         # runs per size up to 1 GB (median); one run above
# Azure conversation trace 2023 (the mirror's full file): 19,366 requests over 3,502 s; medians 1,020 prompt and
# 129 output tokens (its ingest report); p99s set wide so the value lengths vary as in the file.
MEMORY_TARGET = (f"ingest and freeze of a large trace file: peak memory <= {TARGET_PEAK_GIB:g} GiB, its growth over the "
                 f"process's start <= {TARGET_PEAK_FACTOR:g} x the file's size (issue #27)")
AZURE_RATE_RPS = 19_366 / 3_502
AZURE_PROMPT_P50_P99 = (1_020, 8_000)
AZURE_OUTPUT_P50_P99 = (129, 700)
AZURE_ROWS_PER_PART = 2_000_000


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


def synthetic_azure(path: str | os.PathLike, gigabytes: float, seed: int = SEED) -> Path:
    """Write a seeded Azure-2023-format CSV of about ``gigabytes`` GB (10**9 bytes) to ``path``, in parts."""
    rng = np.random.default_rng(seed)
    path = Path(path)
    start = int(np.datetime64("2023-11-16T18:15:46.680590000", "ns").astype(np.int64))
    with open(path, "wb") as f:
        f.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")
        while f.tell() < gigabytes * 1e9:
            gaps = np.rint(rng.exponential(1e9 / AZURE_RATE_RPS, AZURE_ROWS_PER_PART) / 100).astype(np.int64) * 100
            ns = start + np.cumsum(gaps)
            start = int(ns[-1])
            part = pl.DataFrame({"TIMESTAMP": pl.Series(ns).cast(pl.Datetime("ns")).dt.to_string(
                                     "%Y-%m-%d %H:%M:%S%.9f").str.slice(0, 27),
                                 "ContextTokens": _lognormal(rng, AZURE_PROMPT_P50_P99, AZURE_ROWS_PER_PART),
                                 "GeneratedTokens": _lognormal(rng, AZURE_OUTPUT_P50_P99, AZURE_ROWS_PER_PART)})
            part.write_csv(f, include_header=False)
    return path


def _peak_gib() -> float:
    """This process's peak resident memory (GiB): ``VmHWM`` of /proc/self/status where there is one (``ru_maxrss``
    would also count the parent's memory copied by the fork that started this process), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20          # kB -> GiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _probe(stage: str, trace: str, work: str) -> None:
    """Child-process entry: ingest ``trace`` as the user's source ``big`` (or freeze its windows) with data under
    ``work``; prints the process's peak resident memory as JSON."""
    o = {"paths.data_dir": f"{work}/data", "paths.manifest": f"{work}/manifest.json",
         "paths.results_dir": f"{work}/results", "paths.figures_dir": f"{work}/figures",
         "sources": {**{s: None for s in ("azure", "burstgpt", "bailian", "azure_code", "mooncake")},
                     "big": {"mode": "real", "file": trace}}}
    cfg = params.load("papermill_params/default.yaml", params.undot(o))
    base = _peak_gib()    # the interpreter, the libraries, the parameters
    t0 = time.perf_counter()
    if stage == "ingest":
        _, rep = traces.ingest_source(cfg.paths, cfg.sources, cfg.standins, "big")
        out = {"rows": rep["rows_valid"]}
    else:
        m = windows.freeze(cfg, refreeze=True)
        out = {"windows": len(m["windows"])}
    peak = _peak_gib()
    print("PROBE " + json.dumps({**out, "stage": stage, "wall_s": time.perf_counter() - t0, "peak_gib": peak,
                                 "base_gib": base}))


def _run_probe(stage: str, trace: Path, work: Path) -> dict:
    code = "import sys; from portbench.bench.ingest import _probe; _probe(*sys.argv[1:4])"
    proc = subprocess.run([sys.executable, "-c", code, stage, str(trace), str(work)],
                          capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[3]))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{stage} of {trace.name} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(line[len("PROBE "):])


def memory(quick: bool = False, sizes_gb: tuple[float, ...] | None = None) -> dict:
    """Peak memory of ingesting and freezing generated Azure-format files (module docstring); returns
    ``{"sizes": [{file_gb, rows, ingest_peak_gib (median), freeze_peak_gib (median), runs, limit_gib, met}],
    "target": ...}``."""
    rows = []
    for gb in sizes_gb or (QUICK_MEMORY_GB if quick else MEMORY_GB):
        with tempfile.TemporaryDirectory(prefix="portbench-bench-memory-") as tmp:
            trace = synthetic_azure(Path(tmp) / "azure_big.csv", gb)
            size_gib = trace.stat().st_size / 2**30
            runs = []
            for k in range(MEMORY_REPEATS if gb <= 1 and not quick else 1):
                work = Path(tmp) / f"run{k}"
                runs.append({"ingest": _run_probe("ingest", trace, work), "freeze": _run_probe("freeze", trace, work)})
            ingest = statistics.median(r["ingest"]["peak_gib"] for r in runs)
            freeze = statistics.median(r["freeze"]["peak_gib"] for r in runs)
            base = statistics.median(r[s]["base_gib"] for r in runs for s in ("ingest", "freeze"))
            grown = max(ingest, freeze) - base
            rows.append({"file_gb": round(trace.stat().st_size / 1e9, 2), "rows": runs[0]["ingest"]["rows"],
                         "ingest_peak_gib": ingest, "freeze_peak_gib": freeze, "base_gib": base,
                         "ingest_s": statistics.median(r["ingest"]["wall_s"] for r in runs),
                         "freeze_s": statistics.median(r["freeze"]["wall_s"] for r in runs),
                         "runs": runs, "met": max(ingest, freeze) <= TARGET_PEAK_GIB
                         and grown <= TARGET_PEAK_FACTOR * size_gib})
    return {"target": MEMORY_TARGET, "sizes": rows, "met": all(r["met"] for r in rows)}


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
    return {"memory": memory(quick), "rows": rows, "file_mb": round(size_mb, 1), "repeats": repeats,
            "read_file_s": ours_s, "read_csv_s": plain_s, "rows_per_s": rows / ours_s,
            "ratio_vs_read_csv": ours_s / plain_s, "read_file_runs_s": ours, "read_csv_runs_s": plain,
            "rows_valid": report["rows_valid"], "excluded": report["excluded"]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        _probe(*sys.argv[2:5])
    elif sys.argv[1:2] == ["--memory"]:     # python -m portbench.bench.ingest --memory [GB ...]
        print(json.dumps(memory(sizes_gb=tuple(float(x) for x in sys.argv[2:]) or None), indent=1))
    else:
        print(json.dumps(run(quick="--quick" in sys.argv[1:]), indent=1))
