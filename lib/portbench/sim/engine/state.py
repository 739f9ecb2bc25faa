"""The engine's shared state, declared once: every attribute the parts of the engine read and the methods
they call on one another (:class:`~portbench.sim.engine.core.Engine` sets the attributes; the mixins
:class:`~.memory.CohortMemory`, :class:`~.memory.PrefixCache`, :class:`~.queues.Queues`,
:class:`~.batching.Batching` and :class:`~.iteration.Iterations` define the methods).

Declarations only: the annotations create no attributes and the method stubs exist for the type checker
alone, so what runs is exactly what the mixins define.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from ...core.config import EngineConfig
from ..request import Request
from .modes import BatchingMode


class EngineState:
    """Declarations of the engine's state (see :class:`~portbench.sim.engine.core.Engine` for the meaning)."""

    # the run's settings and inputs
    settings: EngineConfig            # the engine: section (batching, preemption, prefix caching)
    policy: Any                       # the scheduler (a BaseScheduler or a plug-in's duck-typed class)
    sched: Any                        # the scheduler, or its contract checker (CheckedPolicy)
    check_contract: bool
    prof: Any                         # the cost-model profile (duck-typed: plug-ins may bring their own)
    H: float                          # horizon (s)
    naive: bool
    check: bool
    trace: list[tuple] | None
    trace_batch: list[str] | None
    bs: int                           # KV block size (tokens)
    cap: int                          # KV capacity (blocks)
    mode: BatchingMode                # V1Batching or V0Batching (engine.batching), chosen once
    B: int                            # token budget per iteration
    max_seqs: int
    ckv: float
    attn: bool
    preemptive: bool
    ranked: bool
    static: bool
    frozen: bool
    wants_tokens: bool
    reqs: list[Request]
    arrivals: list[Request]
    arr_t: list[float]
    n_arrivable: int
    # swap preemption
    swap: bool
    host_cap: int
    swap_s_block: float
    host_used: int
    pending_s: float
    n_swap_out: int
    n_swap_in: int
    swap_s: float
    # prefix cache
    pc_on: bool
    cache_adj: int
    pc_ref: int
    pc_shared: int
    pc_entries: dict
    pc_lru: OrderedDict
    pc_hit_tokens: int
    pc_query_tokens: int
    pc_hashed: bool
    Hb: int
    eb: int
    # residents, queues and the decode cohort
    cursor: int
    res: dict[int, Request]
    rorder: list[Request]
    lazy_keys: bool
    kdirty: list[Request]
    kheap: list[tuple[int, int, int, Request]]
    prefilling: list[Request]
    paused: list[Request]
    skipped: list[Request]
    cohort: dict[int, Request]
    clock: int
    SL: int
    cnt: list[int]
    need_now: int
    fheap: list[tuple[int, int, int, Request]]
    other_blocks: int
    use_heap: bool
    wait_heap: list[tuple[int, int, Request]]
    wlist: list[Request]
    n_wait: int
    # counters and the iteration in flight
    used: int
    max_used: int
    n_preempt: int
    n_pause: int
    n_iter: int
    n_decisions: int
    n_finished: int
    wake: Any                         # the SimPy event that wakes the idle server
    announced: float | None
    plan_seq: int
    end_time: float
    suffix_min_rank: list[int] | None
    _pf: list[Request]
    _kind: int
    _k: int
    _n_dec: int
    _a0: float
    _inc: float
    one_step: bool
    wq: list[tuple[float, float]]
    work: int
    marks: list[float]
    work_at: list[float]

    if TYPE_CHECKING:   # the methods the parts call on one another (defined by the mixins)
        # memory.CohortMemory
        def _join(self, r: Request) -> None: ...
        def _leave(self, r: Request) -> None: ...
        def _materialize(self) -> list[Request]: ...
        def _advance(self, k: int) -> None: ...
        def _pop_finished(self) -> list[Request]: ...
        def _k_complete(self) -> int: ...
        def _k_memory(self, F: int, kmax: int) -> int: ...
        # memory.PrefixCache
        def _pc_hit(self, r: Request, tokens: int) -> tuple[int, int]: ...
        def _pc_take(self, r: Request, h: int) -> None: ...
        def _pc_register(self, r: Request, upto: int) -> None: ...
        def _pc_release(self, r: Request) -> None: ...
        def _pc_reconcile(self) -> None: ...
        def _pc_reconcile_walk(self, used: int) -> None: ...
        def _check_prefix_cache(self) -> int: ...
        # queues.Queues
        def _ingest(self, now: float) -> None: ...
        def _push_waiting(self, r: Request, now: float) -> None: ...
        def _evict(self, r: Request, now: float) -> None: ...
        def _requeue_evicted(self, r: Request, now: float) -> None: ...
        def _admit_need(self, r: Request, budget_left: int, pf_tokens: int, admitted: int,
                        free: int) -> int | None: ...
        def _admit(self, r: Request, now: float) -> bool: ...
        # batching.Batching
        def _plan(self, now: float) -> float | None: ...
        def _plan_preemptive(self, now: float) -> float | None: ...
        # iteration.Iterations
        def _iteration(self, now: float, used: int, pf_tokens: int) -> float | None: ...
        def _note_marks(self, t: float, partial: Callable[[float], float] | None = None,
                        inclusive: bool = False) -> None: ...
        def _commit(self, t0: float, t1: float) -> None: ...
        def _finish(self, r: Request, t: float) -> None: ...
