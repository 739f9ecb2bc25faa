"""A virtual vLLM engine: vLLM's own V1 ``Scheduler`` stepped in a virtual clock (no model, no GPU).

The scheduler is vLLM's real one -- its KV-cache manager (paged blocks, automatic prefix caching),
its preemption and its priority queue -- through the policy's exported class (:mod:`portbench.vllm`: the
same classes ``vllm serve --scheduler-cls portbench.vllm.<Class>`` runs), bound to the window
(:meth:`portbench.vllm.schedulers._PolicyCore.pb_bind_window`: the policy's run context is the simulator's). Nothing else of the engine runs: a *stub
executor* answers each step with a fabricated ``ModelRunnerOutput`` (one dummy token for every
request whose known tokens are all computed after the step, none for an unfinished prompt chunk),
and a *virtual clock* advances by the step time of a cost-model profile
(``iteration_time(P, B, C, A)``: prompt tokens, decodes, context tokens after the step, causal
attention pairs of the prompt chunks) -- the simulator's own cost model, so the two sides can be
compared step for step, deterministically, on any machine (:mod:`.conformance`).

The loop is the simulator's: at a step boundary every request that has arrived (arrival <= now)
is added; an idle engine jumps to the next arrival; a step that would end past the observation
horizon is not run. Requests the simulator refuses or rejects at arrival (prompt >= the context
limit; a sequence larger than the whole KV cache) are refused/rejected here by the same rule,
outputs are clipped to the context limit the same way.

Returns per-request records with the simulator's schema (:data:`portbench.sim.engine.RECORD_COLUMNS`)
and a step log with the simulator's iteration-trace columns (``start_s, end_s, n_iterations,
prefill_tokens, decode_seqs, context_tokens, kv_blocks_used``) plus ``running``, ``waiting``,
``preempted``, ``scheduled`` (request ids).

vLLM's defaults are kept where the engine has them (``long_prefill_token_threshold`` 0,
``max_num_partial_prefills`` 1, priority ties by arrival time then request id); the request ids are
zero-padded so that vLLM's string tie-break is the simulator's arrival order. Import needs vLLM
(``.venv-vllm``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..core.errors import PortbenchError
from ..sim.engine.simulate import RECORD_COLUMNS
from ..sim.request import requests_from_window
from ..vllm import options as pv_options
from ..vllm.options import UnsupportedVllm
from . import policies
from .replay import model_dir

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402  (vLLM's CPU build needs torch first)
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request as VRequest  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from ..vllm import schedulers as pv_schedulers  # noqa: E402

STEP_COLUMNS = ("start_s", "end_s", "n_iterations", "prefill_tokens", "decode_seqs", "context_tokens",
                "kv_blocks_used")
MODEL = "tiny_llama"        # any architecture: the scheduler never runs the model (no weights are made)
VOCAB = 32000               # token ids for fabricated prompts: below the model's vocabulary


__all__ = ["UnsupportedVllm", "check_version", "run"]


def check_version(expected: str = pv_options.SUPPORTED_VLLM) -> str:
    """The installed vLLM version; :class:`UnsupportedVllm` when it is not ``expected`` (:mod:`portbench.vllm`)."""
    return pv_options.check_version(expected)


@dataclass(frozen=True)
class VirtualSettings:
    """The engine limits (the simulator's profile fields of the same meaning)."""

    num_blocks: int                   # usable KV blocks (vLLM gets one more: its null block)
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 131072
    prefix_caching: bool = False
    hash_block_tokens: int | None = None    # tokens per prompt hash of the window (prefix caching)

    @classmethod
    def of(cls, profile, *, budget: int | None = None, prefix_caching: bool = False,
           hash_block_tokens: int | None = None) -> "VirtualSettings":
        """The settings of a simulator profile (``budget``: the policy's own token budget, e.g. sarathi's)."""
        B = int(budget or profile.max_batched_tokens)
        mml = int(getattr(profile, "max_model_len", 0) or 0) or 131072
        return cls(num_blocks=int(profile.kv_capacity_blocks), block_size=int(getattr(profile, "block_size", 16)),
                   max_num_batched_tokens=B, max_num_seqs=min(int(profile.max_num_seqs), B), max_model_len=mml,
                   prefix_caching=bool(prefix_caching), hash_block_tokens=hash_block_tokens)


@functools.lru_cache(maxsize=1)
def _base_config():
    """vLLM's engine config for a tiny architecture (built once per process: it resolves the model)."""
    check_version()
    args = EngineArgs(model=str(model_dir(MODEL)), load_format="dummy", skip_tokenizer_init=True,
                      max_model_len=8192, enable_prefix_caching=False, scheduling_policy="priority",
                      enable_chunked_prefill=True, max_num_batched_tokens=2048, max_num_seqs=256, block_size=16,
                      num_gpu_blocks_override=1024, async_scheduling=False, seed=0)
    return args.create_engine_config()


def vllm_config(s: VirtualSettings, portbench_options: dict | None = None):
    """A copy of the base config with the settings' limits (and the policy's options where the classes read
    them: ``additional_config["portbench"]``)."""
    cfg = copy.deepcopy(_base_config())
    cfg.additional_config = {pv_options.OPTIONS_KEY: dict(portbench_options or {})}
    cfg.cache_config.block_size = s.block_size
    cfg.cache_config.num_gpu_blocks = s.num_blocks + 1
    cfg.cache_config.enable_prefix_caching = s.prefix_caching
    sc = cfg.scheduler_config
    sc.max_num_batched_tokens = s.max_num_batched_tokens
    sc.max_num_seqs = s.max_num_seqs
    sc.max_model_len = s.max_model_len
    if getattr(sc, "max_num_scheduled_tokens", None) is not None:
        sc.max_num_scheduled_tokens = s.max_num_batched_tokens
    cfg.model_config.max_model_len = s.max_model_len
    return cfg


def _kv_cache_config(s: VirtualSettings) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=s.block_size, num_kv_heads=1, head_size=64, dtype=torch.float32)
    return KVCacheConfig(num_blocks=s.num_blocks + 1, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)])


def prompt_tokens(n: int, row: int, hashes=None, hash_block_tokens: int | None = None) -> list[int]:
    """Token ids of a prompt of ``n`` tokens: each full hash block of the trace's ``hashes`` becomes the
    same tokens wherever that hash occurs (equal hashes = equal prefixes, so vLLM's own block hashes
    reproduce the trace's sharing); every other token is unique to the request."""
    out: list[int] = []
    if hashes is not None and hash_block_tokens:
        full = min(len(hashes), n // hash_block_tokens)
        for h in list(hashes)[:full]:
            rng = np.random.default_rng([int(h) & 0xFFFFFFFF, 1])
            out.extend(rng.integers(1, VOCAB, hash_block_tokens).tolist())
    rest = n - len(out)
    if rest > 0:
        rng = np.random.default_rng([int(row), 2, len(out)])
        out.extend(rng.integers(1, VOCAB, rest).tolist())
    return out


def request_id(policy: str, row: int) -> str:
    """Zero-padded (vLLM breaks priority ties by request id as a string)."""
    return policies.request_id(policy, "v", 0).rsplit(policies.ID_SEP, 1)[0] + f"{policies.ID_SEP}{row:07d}"


def row_of(req_id: str) -> int:
    return int(req_id.rsplit(policies.ID_SEP, 1)[1])


@dataclass
class VirtualResult:
    """Per-request ``requests`` (simulator record schema), ``steps`` (one row per step) and ``counters``."""

    requests: pl.DataFrame
    steps: pl.DataFrame
    counters: dict = field(default_factory=dict)


def class_options(policy: str, options: dict, slo) -> dict:
    """The simulator's options of ``policy`` as the exported class takes them (``additional_config``): the
    engine-wide ones (token budget, prefill mode) are the engine's settings, edf's SLO the run's."""
    out = {k: v for k, v in options.items() if k not in ("prefill_token_budget", "chunked_prefill")}
    if policy == "edf" and out.get("slo") is None and slo is not None:
        out["slo"] = dict(slo)
    return out


def run(window_df: pl.DataFrame, policy: str, profile, *, horizon_s: float, seed: int, slo=None,
        options: dict | None = None, prefix_caching: bool = False, hash_block_tokens: int | None = None,
        budget: int | None = None, log_steps: bool = True, online: bool = False,
        scheduler_cls: type | None = None) -> VirtualResult:
    """Replay ``window_df`` (already rescaled to its region) through vLLM's scheduler under ``policy``.

    ``profile``: the simulator profile whose cost model gives the step time and whose limits are the
    engine's (:meth:`VirtualSettings.of`); ``options``: the policy's options (the simulator's);
    ``budget``: the policy's token budget when it has its own (sarathi); ``log_steps``: keep the step log
    (False: an empty ``steps`` table, the step count in ``counters`` -- a campaign run needs only the records);
    ``online``: the class learns each request when vLLM adds it, as in a server (tenant and predictions in the
    request's ``extra_args``) instead of being bound to the window (the export tests hold the two equal);
    ``scheduler_cls``: a user's vLLM Scheduler subclass with :class:`.imported.VirtualHooks` mixed in
    (:func:`.imported.virtual_class`) instead of the project's class; its exceptions are named with the class and
    the step (:class:`.imported.ImportedSchedulerError`).
    """
    options = dict(options or {})
    if scheduler_cls is None and policies.virtual_mode(policy) == "excluded":
        raise PortbenchError(f"policy {policy!r} cannot run on the virtual vLLM engine: it is not one of the study's "
                             "built-in policies (plug-ins run on the simulator only)")
    s = VirtualSettings.of(profile, budget=budget, prefix_caching=prefix_caching, hash_block_tokens=hash_block_tokens)
    H = float(horizon_s)
    now = 0.0
    n_steps = 0

    def call(what: str, fn, *a):
        """``fn(*a)``; a user's class that raises gets one message naming it, the call, the step and the time."""
        if scheduler_cls is None:
            return fn(*a)
        try:
            return fn(*a)
        except PortbenchError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: whatever it raises is named
            err = getattr(scheduler_cls, "pb_error", PortbenchError)
            raise err(f"vLLM scheduler {getattr(scheduler_cls, 'pb_spec', scheduler_cls.__name__)} raised "
                      f"{type(e).__name__}: {e} in {what} at step {n_steps + 1} (virtual time {now:.6g} s)") from None

    if scheduler_cls is None:
        base = pv_options.policy_of(policy)
        copts = class_options(base, options, slo)
        if online and base == "random":
            copts["seed"] = int(seed)      # the run's seed: the online draws are the bound run's
        cfg = vllm_config(s, copts)
        cls = pv_schedulers.scheduler_class(base)
        sched = cls(cfg, _kv_cache_config(s), StructuredOutputManager(cfg), block_size=s.block_size, log_stats=False)
        if not online:
            sched.pb_bind_window(window_df, seed, profile, slo, row_of)
    else:
        cfg = vllm_config(s)
        sched = call("__init__", lambda: scheduler_cls(cfg, _kv_cache_config(s), StructuredOutputManager(cfg),
                                                       block_size=s.block_size, log_stats=False))
    output_cls = getattr(scheduler_cls, "pb_output_cls", ModelRunnerOutput)
    reqs, ctx = requests_from_window(window_df, profile, np.random.default_rng(seed), slo, max_model_len=s.max_model_len)
    n = len(reqs)
    cap_tokens = s.num_blocks * s.block_size
    hashes = window_df["block_hashes"].to_list() if (s.prefix_caching and "block_hashes" in window_df.columns) else None
    hasher = None
    if s.prefix_caching:
        fn = get_hash_fn_by_name(cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(s.block_size, fn)
    arr = np.array([r.arrival_s for r in reqs], dtype=float)
    order = np.argsort(arr, kind="stable")
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    admitted = np.full(n, np.nan)
    generated = np.zeros(n, dtype=np.int64)
    preempt = np.zeros(n, dtype=np.int64)
    rejected = np.zeros(n, dtype=bool)
    cursor = 0
    live: dict[str, int] = {}
    decoding: set[str] = set()
    steps: list[tuple] = []
    n_preempt = 0
    while True:
        while cursor < n and arr[order[cursor]] <= now:
            r = reqs[order[cursor]]
            cursor += 1
            if r.refused or r.prompt_tokens + r.output_tokens > cap_tokens:
                rejected[r.id] = True
                continue
            rid = request_id(policy, r.id)
            xargs: dict | None = None
            if online:
                xargs = {"tenant": str(r.tenant)}
                for col in ("predicted_output", "ltr_score"):
                    if getattr(ctx, col) is not None:
                        xargs[col] = float(getattr(ctx, col)[r.id])
            sp = SamplingParams(max_tokens=int(r.output_tokens), ignore_eos=True, temperature=0.0, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY, extra_args=xargs)
            toks = prompt_tokens(r.prompt_tokens, r.id, hashes[r.id] if hashes is not None else None,
                                 s.hash_block_tokens)
            vr = VRequest(rid, toks, sp, None, arrival_time=float(r.arrival_s),
                          priority=0, block_hasher=hasher)     # the class sets the policy's priority
            sched.pb_now = now
            call("add_request", sched.add_request, vr)
            live[rid] = r.id
        if not live:
            if cursor >= n:
                break
            now = float(arr[order[cursor]])
            continue
        sched.pb_now = now
        out = call("schedule", sched.schedule)
        preempted_now = sched.pb_take_preempted()
        for rid in preempted_now:
            decoding.discard(rid)
            preempt[live[rid]] += 1
            n_preempt += 1
        sched_tok = out.num_scheduled_tokens
        if not sched_tok:
            if preempted_now:          # vLLM preempted the first running request itself: an empty step,
                continue               # the next schedule() follows at once (the simulator's _plan does the same)
            if cursor >= n:
                if scheduler_cls is not None:
                    raise getattr(scheduler_cls, "pb_error", PortbenchError)(
                        f"vLLM scheduler {getattr(scheduler_cls, 'pb_spec', scheduler_cls.__name__)} scheduled nothing at "
                        f"step {n_steps + 1} (virtual time {now:.6g} s) with {len(live)} requests waiting or running "
                        "and no arrival left: a scheduler must make progress")
                raise RuntimeError(f"vLLM's scheduler made no progress at t={now} with {len(live)} live requests "
                                   f"(policy {policy})")
            now = float(arr[order[cursor]])
            continue
        P = B = C = A = 0
        produced = []
        for rid, k in sched_tok.items():
            req = sched.requests[rid]
            after = int(req.num_computed_tokens)
            before = after - int(k)
            C += after
            row = live[rid]
            if admitted[row] != admitted[row]:
                admitted[row] = now
            if rid in decoding:
                B += 1
            else:
                P += int(k)
                A += int(k) * before + int(k) * (int(k) + 1) // 2
            if after >= req.num_tokens:
                produced.append(rid)
        dt = profile.iteration_time(P, B, C, A) if P else profile.iteration_time(0, B, C)
        if now + dt > H:
            break
        t1 = now + dt
        n_steps += 1
        if log_steps:
            used = s.num_blocks - int(sched.kv_cache_manager.block_pool.get_num_free_blocks())
            steps.append((now, t1, 1, P, B, C, used, len(sched.running), len(sched.waiting),
                          len(out.preempted_req_ids or ()),
                          ",".join(f"{i}:{k}" for i, k in sorted((live[r], int(k)) for r, k in sched_tok.items()))))
        ids = list(sched_tok)
        mro = output_cls(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[1] if r in produced else [] for r in ids])
        now = t1
        for rid in produced:
            row = live[rid]
            generated[row] += 1
            if first[row] != first[row]:
                first[row] = now
            decoding.add(rid)
        sched.pb_now = now                 # the policy's clock for the step's tokens (the class's on_tokens)
        call("update_from_output", sched.update_from_output, out, mro)
        for rid in produced:
            row = live[rid]
            if generated[row] >= reqs[row].output_tokens:
                finish[row] = now
                decoding.discard(rid)
                del live[rid]
    records = pl.DataFrame({
        "req_id": np.arange(n, dtype=np.int64),
        "arrival_s": arr,
        "first_token_s": first,
        "finish_s": finish,
        "prompt_tokens": np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
        "output_tokens": np.array([r.output_tokens for r in reqs], dtype=np.int64),
        "generated_tokens": generated,
        "preemptions": preempt,
        "rejected": rejected,
        "tenant": pl.Series("tenant", [str(r.tenant) for r in reqs], dtype=pl.Utf8),
        "service_s": np.asarray(profile.isolated_service_s(
            np.array([r.prompt_tokens for r in reqs]), np.array([r.output_tokens for r in reqs]),
            s.max_num_batched_tokens), dtype=float).reshape(n) if n else np.zeros(0),
        "refused": np.array([r.refused for r in reqs], dtype=bool),
        "trace_output_tokens": np.array([r.trace_output_tokens for r in reqs], dtype=np.int64),
        "admitted_s": admitted,
    })
    assert tuple(records.columns) == RECORD_COLUMNS
    step_df = pl.DataFrame(steps, schema=[(c, pl.Float64 if c.endswith("_s") else pl.Int64) for c in STEP_COLUMNS]
                           + [("running", pl.Int64), ("waiting", pl.Int64), ("preempted", pl.Int64),
                              ("scheduled", pl.Utf8)], orient="row")
    counters = {"steps": n_steps, "preemptions": n_preempt, "vllm": check_version(),
                "settings": dataclasses.asdict(s), "end_s": now,
                "completed": int(np.isfinite(finish).sum()), "rejected": int(rejected.sum())}
    if math.isfinite(H):
        counters["horizon_s"] = H
    return VirtualResult(records, step_df, counters)
