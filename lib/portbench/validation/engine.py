"""The wall-clock engine: a list of replay specs run, in their order, on vLLM's real engine (its CPU build here, CUDA
vLLM on a GPU), one table row per replay.

**Instances.** Every policy runs inside vLLM's scheduler as the project's scheduler class (:func:`placement`,
``portbench.vllm``: fcfs and the static-priority policies on vLLM's ``priority`` queue with the priority the class
gives each request at arrival, the policies vLLM lacks through the simulator's own policy object), never through
per-request keys. One policy per engine instance: an instance is started for each (policy, token budget) of the
specs -- an engine-wide setting such as sarathi's budget is just the budget of its instance --, and a *twin* for
the second replay of an A/A pair (a policy against itself), so that an A/A pair crosses two instances exactly as an
A/B pair does and measures the same noise. The A/A replay in slot ``b`` runs on the twin. All instances are started before the first replay and stay alive
together; each gets one warm-up replay (discarded) before the first measured one.

**A replay** (:meth:`Engine.replay`): vLLM's prefix cache emptied first (a replay never finds the blocks of the
one before it), Python's garbage collector frozen and disabled in the client for the replay (``gc.freeze``: a
collection of the client's heap cannot land inside one replay and not the other), the window's requests sent on
one release clock at their (rescaled) arrival times, aborted at the horizon. Each replay's **machine speed** is
logged: the median, over the replay's engine steps, of the measured step time over the engine's step table (the
cost model fitted to the engine's fixed-shape steps, :mod:`.steps`) -- 1.0 = as fast as when the table was
measured. With the load average, it tells a slow replay from a policy effect.

**The results table** (:func:`run`; the contract is :mod:`.design`'s): one row per replay that ran, in run order --
the spec's columns (``case, source, window, policy, pair, position, is_aa, slot``), ``replay_index`` (its place in
the execution order, warm-ups not counted), ``machine_speed``, ``instance``, ``wall_s``, ``steps``, ``loadavg``,
``prefix_cache_reset``, ``gc_frozen``, the request counts and every window-level metric of
:func:`portbench.sim.metrics.compute` (``ttft_p90``, ``e2e_mean``, ``tpot_p90`` ...) at the replay's horizon. A
replay that did not run (the deadline passed) has no row: no data.

**delay_shortest** (:data:`PLANTED`): a planted reversal -- a policy that deliberately serves the longest requests
(prompt + output tokens) first, so the shortest wait. Against fcfs under load its order on any engine is known
(queueing alone: it is SJF reversed), so the paired procedure must find fcfs better; it runs on the engine like any
static-priority policy.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import polars as pl

from ..core.config import VllmEngineConfig
from ..core.errors import ParameterError, PortbenchError
from ..sim import metrics, schedulers
from ..sim.profiles import Profile
from .. import vllm as pbv
from . import policies, replay, resim

PLANTED = policies.PLANTED
SPEC_COLUMNS = ("case", "source", "window", "policy", "pair", "position", "is_aa", "slot")
STATIC = (*schedulers.VLLM_STATIC_PRIORITY, PLANTED)
RECORDING_SCHEDULER = replay.ENGINE_SCHEDULER
REPLAY_OVERHEAD_S = 3.0    # a replay beyond its horizon: its requests built, the cache emptied, its records


@dataclass(frozen=True)
class Settings:
    """The engine's own settings: what its instances are started with and what the engine-scale prediction
    (:mod:`.predict`) copies. Token counts are the campaign's x ``token_scale``; ``num_blocks`` counts vLLM's null
    block (usable: ``num_blocks - 1``)."""

    model: str
    token_scale: float
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    max_model_len: int
    prefix_caching: bool = False
    dtype: str = "auto"
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.9
    device: str = "cpu"
    seed: int = 0

    def spec(self, *, budget: int | None = None, scheduler_cls: str = RECORDING_SCHEDULER,
             options: Mapping | None = None) -> replay.EngineSpec:
        """The :class:`.replay.EngineSpec` of one instance (``budget``: its own token budget, e.g. sarathi's;
        ``options``: vLLM's ``additional_config``, where the scheduler class reads its policy's options)."""
        B = int(budget or self.max_num_batched_tokens)
        return replay.EngineSpec(
            model=self.model, max_num_seqs=min(int(self.max_num_seqs), B), max_batched_tokens=B,
            num_gpu_blocks=int(self.num_blocks), block_size=int(self.block_size), max_model_len=int(self.max_model_len),
            dtype=self.dtype, enforce_eager=self.enforce_eager, gpu_memory_utilization=self.gpu_memory_utilization,
            seed=int(self.seed), enable_prefix_caching=bool(self.prefix_caching),
            env=dict(replay.CPU_ENGINE_ENV) if self.device == "cpu" else {},
            extra={"scheduler_cls": scheduler_cls, **({"additional_config": dict(options)} if options else {})})

    @property
    def kv_tokens(self) -> int:
        return (int(self.num_blocks) - 1) * int(self.block_size)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "kv_tokens": self.kv_tokens}

    def resim(self, *, version: str = "", distribution: str = "") -> "resim.EngineSettings":
        """The same settings as the prediction's mapping reads them (:class:`.resim.EngineSettings`)."""
        return resim.EngineSettings(device=self.device, distribution=distribution, version=version, model=self.model,
                                    num_blocks=int(self.num_blocks), block_size=int(self.block_size),
                                    max_num_batched_tokens=int(self.max_num_batched_tokens),
                                    max_num_seqs=int(self.max_num_seqs), max_model_len=int(self.max_model_len),
                                    token_scale=float(self.token_scale), prefix_caching=bool(self.prefix_caching))


def settings_for(e: VllmEngineConfig, profile: Profile, *, device: str, seed: int = 0,
                 token_scale: float | None = None) -> Settings:
    """The engine's settings, every one explicit: the campaign's profile (KV cache, block size, token budget,
    ``max_num_seqs``, context) x the token scale where the section ``e`` (``validation.cpu`` / ``validation.gpu``)
    leaves a value null, its own where it sets one. ``token_scale`` overrides the section's (a budget-sensitive case
    runs at 1). The KV cache holds the campaign's tokens x scale in blocks of the engine's size (+ vLLM's null
    block). ParameterError when the model's context is shorter than the engine's."""
    scale = float(e.token_scale if token_scale is None else token_scale)
    bs = int(e.block_size or profile.block_size)
    kv_tokens = int(profile.kv_capacity_blocks) * int(profile.block_size) * scale
    kb = e.kv_blocks
    blocks = int(kb) if not isinstance(kb, str) and token_scale is None else int(math.ceil(kv_tokens / bs)) + 1
    mml = int(e.max_model_len or math.ceil((int(profile.max_model_len) or 131072) * scale)) \
        if token_scale is None else int(math.ceil((int(profile.max_model_len) or 131072) * scale))
    cfg_len = int(replay.model_config(e.model_config).get("max_position_embeddings") or 0)
    if cfg_len < mml:
        raise ParameterError(f"{e.section}.model_config", e.model_config,
                             f"a model config whose context (max_position_embeddings {cfg_len:,}) holds the engine's "
                             f"{mml:,} tokens (tiny_llama_131k / llama3_1_8b: 131,072)")
    budget = int(e.max_num_batched_tokens or 0) if token_scale is None and e.max_num_batched_tokens else \
        int(math.ceil(int(profile.max_batched_tokens) * scale))
    return Settings(model=e.model_config, token_scale=scale, max_num_batched_tokens=budget,
                    max_num_seqs=int(e.max_num_seqs or profile.max_num_seqs), block_size=bs, num_blocks=blocks,
                    max_model_len=mml, prefix_caching=e.prefix_caching != "off", dtype=e.dtype,
                    enforce_eager=bool(e.enforce_eager), gpu_memory_utilization=float(e.gpu_memory_utilization),
                    device=device, seed=int(seed))


@dataclass(frozen=True)
class Placement:
    """How one policy runs on the engine: its instance's scheduler class and options (vLLM's ``additional_config``),
    its token budget (None: the engine's)."""

    policy: str
    scheduler_cls: str
    options: dict
    budget: int | None


PLANTED_SCHEDULER = "portbench.validation.planted.DelayShortest"


def placement(policy: str, options: Mapping | None, settings: Settings) -> Placement:
    """Where ``policy`` runs (module docstring): ``delay_shortest`` as :class:`.planted.DelayShortest`; every study
    policy as its ``portbench.vllm`` scheduler class (:func:`portbench.vllm.engine_args`: the class, its options in
    ``additional_config``, sarathi's budget -- ``options`` carry the simulator's options with token-valued ones
    already scaled). The classes decide every priority themselves: nothing is sent with the requests."""
    if policy == PLANTED:
        return Placement(policy, PLANTED_SCHEDULER, {}, None)
    opts = dict(options or {})
    base = pbv.options.policy_of(policy) if policy in pbv.options.SETTINGS else policy
    allowed = (set(schedulers.SCHEDULERS[base].option_defaults()) - {"prefill_token_budget", "chunked_prefill"}) \
        | set(pbv.options.SETTINGS.get(policy, ("", {}))[1].values())     # what the class reads; sarathi's budget
    args = pbv.engine_args(policy, {k: v for k, v in opts.items() if k in allowed or k == "slo"})
    budget = args.pop("max_num_batched_tokens", None)
    return Placement(policy, str(args["scheduler_cls"]), dict(args.get("additional_config") or {}),
                     int(budget) if budget else None)


def speed(steps: pl.DataFrame, table: Profile | None) -> float:
    """The machine's speed during one replay: median over its engine steps of measured step time / the step
    table's (NaN without steps or table)."""
    if table is None or steps.height == 0:
        return math.nan
    P = steps["prefill_tokens"].to_numpy()
    B = steps["decode_seqs"].to_numpy()
    C = steps["context_tokens"].to_numpy()
    A = steps["attention_pairs"].to_numpy()
    pred = np.array([table.iteration_time(int(p), int(b), int(c), int(a)) if p else table.iteration_time(0, int(b), int(c))
                     for p, b, c, a in zip(P, B, C, A)], dtype=float)
    meas = steps["iteration_s"].to_numpy().astype(float)
    ok = np.isfinite(meas) & (pred > 0)
    return float(np.median(meas[ok] / pred[ok])) if ok.any() else math.nan


def window_metrics(records: pl.DataFrame, horizon_s: float, slo: Mapping | None = None) -> dict[str, float]:
    """Every window-level metric of one replay (:func:`portbench.sim.metrics.compute`)."""
    return metrics.compute(records, float(horizon_s), dict(slo or {}))


@dataclass
class Instance:
    """One started engine instance: its key, placement, replayer and step log."""

    key: str
    place: Placement
    replayer: replay.Replayer
    log: Path
    warmed: bool = False


def instance_key(place: Placement, twin: bool) -> str:
    return f"{place.policy}@{place.budget or 'engine'}" + ("#twin" if twin else "")


class Engine:
    """The instances of one run, started together (a ``with`` block), and the replays on them."""

    def __init__(self, settings: Settings, placements: Mapping[str, Placement], *, twins: Iterable[str] = (),
                 out: Path, vocab: int, step_table: Profile | None = None, log: Callable[[str], None] = print):
        self.settings, self.placements, self.out, self.vocab = settings, dict(placements), Path(out), int(vocab)
        self.twins, self.table, self.log = set(twins), step_table, log
        self.instances: dict[str, Instance] = {}

    def __enter__(self) -> "Engine":
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            for pol, place in sorted(self.placements.items()):
                for twin in ([False, True] if pol in self.twins else [False]):
                    key = instance_key(place, twin)
                    path = self.out / f"iterations_{key.replace('@', '_').replace('#', '_')}.jsonl"
                    path.unlink(missing_ok=True)
                    spec = self.settings.spec(budget=place.budget, scheduler_cls=place.scheduler_cls,
                                              options=place.options)
                    t = time.perf_counter()
                    r = replay.Replayer(spec, path).__enter__()
                    self.instances[key] = Instance(key, place, r, path)
                    self.log(f"instance {key} up in {time.perf_counter() - t:.0f} s")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for inst in self.instances.values():
            try:
                inst.replayer.__exit__(None, None, None)
            except Exception as e:  # noqa: BLE001 - shut the others down all the same
                self.log(f"instance {inst.key}: shutdown failed ({e})")
        self.instances.clear()

    def of(self, policy: str, twin: bool = False) -> Instance:
        return self.instances[instance_key(self.placements[policy], twin and policy in self.twins)]

    def init_record(self, inst: Instance) -> dict:
        inits, _ = replay.read_iteration_log(inst.log)
        return inits[-1] if inits else {}

    def replay(self, inst: Instance, df: pl.DataFrame, horizon_s: float, *, tag: str, prompt_seed: int,
               hash_block_tokens: int | None = None) -> dict[str, Any]:
        """One replay on ``inst`` (module docstring); returns its records and what was logged of it."""
        r = inst.replayer
        reqs, rej = replay.build_requests(df, vocab_size=self.vocab, seed=prompt_seed,
                                          max_model_len=self.settings.max_model_len,
                                          hash_block_tokens=hash_block_tokens)
        reset = bool(self.settings.prefix_caching) and r.reset_prefix_cache()
        load = os.getloadavg()[0]
        gc.collect()
        gc.freeze()
        gc.disable()
        t0 = time.monotonic()
        try:
            rec = r.replay(reqs, horizon_s=horizon_s, policy=inst.place.policy, rejected=rej, window_df=df, tag=tag)
        finally:
            t1 = time.monotonic()
            gc.enable()
            gc.unfreeze()
        st = replay.iteration_rows(inst.log)
        st = st.filter((pl.col("t_start") >= t0) & (pl.col("t_start") <= t1)) if st.height else st
        return {"records": rec, "wall_s": t1 - t0, "t0": t0, "speed": speed(st, self.table), "steps": st.height,
                "loadavg": load, "prefix_cache_reset": reset, "gc_frozen": True}

    def warm_up(self, inst: Instance, df: pl.DataFrame, *, seed: int) -> float:
        """The instance's warm-up: ``df`` queued at t = 0 under the instance's policy, discarded; its seconds."""
        backlog = df.with_columns(pl.lit(0.0).alias("arrival_s"))
        t = time.perf_counter()
        self.replay(inst, backlog, 3600.0, tag=f"warmup-{inst.key.replace('@', '_').replace('#', '_')}",
                    prompt_seed=seed)
        inst.warmed = True
        return time.perf_counter() - t


def spec_dict(s: Any) -> dict:
    """A replay spec (a mapping -- a row of :func:`.design.replay_specs` --, a dataclass or any object with the
    :data:`SPEC_COLUMNS` attributes) as a dict (``slot`` defaults to the position's)."""
    if isinstance(s, Mapping):
        d = dict(s)
    elif dataclasses.is_dataclass(s) and not isinstance(s, type):
        d = dataclasses.asdict(s)
    else:
        d = {k: getattr(s, k) for k in SPEC_COLUMNS if hasattr(s, k)}
    d.setdefault("slot", "b" if int(d.get("position", 0)) else "a")
    missing = [k for k in SPEC_COLUMNS if k not in d]
    if missing:
        raise PortbenchError(f"replay spec {d}: missing {', '.join(missing)}")
    return d


@dataclass(frozen=True)
class Window:
    """A window as the engine replays it for one case: rescaled to the case's load, its horizon, the seeds of its
    prompts and priorities, the engine tokens per block hash (prefix caching; None: off) and the trace's."""

    df: pl.DataFrame
    horizon_s: float
    prompt_seed: int
    priority_seed: int
    hash_block_tokens: int | None = None
    trace_hash_block: int | None = None


def run(specs: Sequence[Any], windows: Callable[[dict], Window], settings: Settings, *,
        options: Callable[[str], Mapping] = lambda p: {}, out: Path, vocab: int, step_table: Profile | None = None,
        slo: Mapping | None = None, warmup: Callable[[str], pl.DataFrame] | None = None, keep_records: bool = True,
        log: Callable[[str], None] = print, deadline: float | None = None,
        twins: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Run ``specs`` (a sequence of specs or :func:`.design.replay_specs`' frame) in their order (module docstring). ``windows(spec)``: the :class:`Window` of a spec;
    ``options(policy)``: the policy's options (the simulator's, token-valued ones already scaled);
    ``step_table``: the engine's step table (each replay's speed); ``slo``: the SLO metrics' definitions;
    ``warmup(policy)``: each instance's warm-up window (default: its first spec's);
    ``deadline`` (``time.monotonic()``): a spec whose horizon (+ :data:`REPLAY_OVERHEAD_S`) would end after it is
    not run (no row: no data); ``twins``
    False: an A/A pair's two replays on one instance (a GPU that cannot hold a twin).

    Returns (one row per replay that ran: :data:`SPEC_COLUMNS`, ``order``, the run's columns, every metric), (the
    replays' per-request records with the spec's columns and ``replay_index``, empty unless ``keep_records``)."""
    sp = [spec_dict(s) for s in (specs.iter_rows(named=True) if isinstance(specs, pl.DataFrame) else specs)]
    pols = sorted({d["policy"] for d in sp})
    places = {p: placement(p, options(p), settings) for p in pols}
    twin_of = {d["policy"] for d in sp if d["is_aa"] and d["slot"] == "b"} if twins else set()
    rows: list[dict] = []
    recs: list[pl.DataFrame] = []
    cut = 0
    with Engine(settings, places, twins=twin_of, out=out, vocab=vocab, step_table=step_table, log=log) as E:
        for inst in E.instances.values():     # every instance warmed up before the first measured replay
            first = next(d for d in sp if d["policy"] == inst.place.policy)
            wdf = warmup(inst.place.policy) if warmup is not None else windows(first).df
            took = E.warm_up(inst, wdf, seed=windows(first).prompt_seed)
            log(f"warm-up of {inst.key}: {wdf.height} requests in {took:.0f} s (discarded)")
        for i, d in enumerate(sp):
            base = {**{k: d[k] for k in SPEC_COLUMNS}, "order": int(d.get("order", i)), "replay_index": len(rows)}
            w = windows(d)
            if deadline is not None and time.monotonic() + w.horizon_s + REPLAY_OVERHEAD_S > deadline:
                cut += 1
                continue
            pol = d["policy"]
            twin = bool(d["is_aa"]) and d["slot"] == "b" and pol in twin_of
            inst = E.of(pol, twin)
            got = E.replay(inst, w.df, w.horizon_s, tag=f"r{i}", prompt_seed=w.prompt_seed,
                           hash_block_tokens=w.hash_block_tokens)
            rec = got.pop("records")
            m = window_metrics(rec, w.horizon_s, slo)
            speed_ = got.pop("speed")
            rows.append({**base, "machine_speed": speed_, "instance": inst.key, "horizon_s": w.horizon_s,
                         "requests": rec.height, "completed_requests": int(rec["finish_s"].is_not_nan().sum()),
                         "rejected_requests": int(rec["rejected"].sum()), **got, **m})
            log(f"replay {i + 1}/{len(sp)}: {d['case']} {d['source']} {d['window']} {pol}"
                f"{' (A/A twin)' if twin else ''}: {got['wall_s']:.1f} s, speed {speed_:.2f}, "
                f"load {got['loadavg']:.1f}")
            if keep_records:
                recs.append(rec.with_columns(*[pl.lit(base[k]).alias(k) for k in (*SPEC_COLUMNS, "replay_index")]))
    if cut:
        log(f"{cut} of {len(sp)} replays not run: the deadline passed")
    table = pl.DataFrame(rows, infer_schema_length=None)
    return table, (pl.concat(recs, how="diagonal_relaxed") if recs else pl.DataFrame())
