"""Incremental ranking (issue #16, item 2): the structures that replace a sort per decision give exactly
the order the sort gave.

* LTR keeps its waiting queue in two sorted lists (by waiting-since and by score) and VTC one sorted
  queue per tenant, maintained by the arrival / eviction / admission hooks: their admission order must
  be the order of sorting by priority (LTR) or of the paper's tenant-by-tenant rule (VTC) at every step.
* The preemptive plan decides the cohort tail of its walk in bulk (``Batching._bulk_tail``): it must
  select and displace exactly what the one-by-one greedy walk does.
* Lazy keys (LAS, MLFQ, RR re-key only the requests whose key can have changed): ``check_invariants``
  compares every cached key with a fresh ``(priority, id)`` at every preemptive decision, on real windows.
  (The compiled engine core against the reference: ``tests/test_compiled_core.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from portbench.sim import engine as simulator
from portbench.sim import profiles, regions, schedulers
from portbench.sim.engine.batching import Batching
from portbench.sim.request import RUNNING, WAITING, Request, RunContext


def _ctx(n, rng, tenants=None, scores=None):
    return RunContext(n=n, arrival_s=np.zeros(n), prompt_tokens=np.ones(n, dtype=np.int64),
                      output_tokens=np.ones(n, dtype=np.int64), tenant=tenants or ["t0"] * n, profile=None,
                      rng=rng, ltr_score=np.asarray(scores if scores is not None else rng.random(n)))


def _reference_ltr_order(pol, waiting, now):
    return sorted(waiting, key=lambda r: (pol.priority(r, now), r.id))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 40))
def test_ltr_admission_order_is_the_priority_order_at_every_step(seed, n):
    rng = np.random.default_rng(seed)
    pol = schedulers.get_scheduler("ltr", starvation_s=5.0)
    scores = rng.choice([0.1, 0.5, 0.9], n) if seed % 2 else rng.random(n)   # ties too
    pol.reset(_ctx(n, rng, scores=scores))
    reqs = [Request(i, float(t), 10, 10, "t0") for i, t in enumerate(np.sort(rng.uniform(0, 20, n)))]
    waiting, now = [], 0.0
    for step in range(4 * n):
        now += float(rng.exponential(2.0))
        # arrivals up to now, an occasional eviction (waiting since now), then admission of a prefix
        for r in reqs:
            if r.state == -1 and r.arrival_s <= now:
                r.state, r.waiting_since = WAITING, r.arrival_s
                pol.on_arrival(r, now)
                waiting.append(r)
        running = [r for r in reqs if r.state == RUNNING]
        if running and rng.random() < 0.3:
            r = running[int(rng.integers(len(running)))]
            r.state, r.waiting_since = WAITING, now
            pol.on_evict(r, now)
            waiting.append(r)
        expected = _reference_ltr_order(pol, waiting, now)
        got = []
        k = int(rng.integers(0, len(waiting) + 1))
        for r in pol.admission_order(waiting, now):
            got.append(r)
            if len(got) > k:
                break                                   # the engine stops at the first that does not fit
            r.state = RUNNING
            pol.on_admit(r, now)
            waiting.remove(r)
        assert [r.id for r in got] == [r.id for r in expected[:len(got)]], (step, now)
        if not waiting and all(r.state != -1 for r in reqs):
            break
    assert sorted(e[1] for e in pol._by_ws) == sorted(e[1] for e in pol._by_score) == sorted(r.id for r in waiting)


def _reference_vtc_order(pol, waiting):
    """The paper's rule as the earlier implementation computed it from scratch: per tenant by (arrival, id);
    repeatedly the tenant with the smallest (counter, head arrival, head id)."""
    queues = {}
    for r in sorted(waiting, key=lambda r: (r.arrival_s, r.id)):
        queues.setdefault(r.tenant, []).append(r)
    return queues


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 40), st.integers(1, 5))
def test_vtc_admission_order_matches_the_rule_at_every_step(seed, n, n_tenants):
    rng = np.random.default_rng(seed)
    tenants = [f"t{k}" for k in rng.integers(0, n_tenants, n)]
    pol = schedulers.get_scheduler("vtc")
    pol.reset(_ctx(n, rng, tenants=tenants))
    reqs = [Request(i, float(t), int(rng.integers(1, 500)), 10, tenants[i])
            for i, t in enumerate(np.sort(rng.uniform(0, 20, n)))]
    waiting, now = [], 0.0
    for _ in range(4 * n):
        now += float(rng.exponential(2.0))
        for r in reqs:
            if r.state == -1 and r.arrival_s <= now:
                r.state = WAITING
                pol.on_arrival(r, now)
                waiting.append(r)
        running = [r for r in reqs if r.state == RUNNING]
        if running and rng.random() < 0.3:
            r = running[int(rng.integers(len(running)))]
            r.state = WAITING
            pol.on_evict(r, now)
            waiting.append(r)
        if running:
            pol.on_tokens(running, int(rng.integers(1, 5)), lambda i: now)
        k = int(rng.integers(0, len(waiting) + 1))
        got = []
        for r in pol.admission_order(waiting, now):
            # the rule, recomputed from scratch with the counters as they are now
            queues = _reference_vtc_order(pol, waiting)
            t = min(queues, key=lambda u: (pol._counter[u], queues[u][0].arrival_s, queues[u][0].id))
            assert r is queues[t][0]
            got.append(r)
            if len(got) > k:
                break
            r.state = RUNNING
            pol.on_admit(r, now)
            waiting.remove(r)
        # next_decision's view of the heads is the waiting queue's
        heads = {t: q[0][2] for t, q in pol._queues.items()}
        assert heads == {t: q[0] for t, q in _reference_vtc_order(pol, waiting).items()}


@pytest.mark.parametrize("name", ["ltr", "vtc"])
def test_a_full_pass_without_admissions_yields_each_waiting_request_once(name):
    """The contract (admission_order yields only waiting requests, each at most once) also when the caller
    admits none of them, e.g. to inspect the order: the incremental queues must not yield a head again."""
    rng = np.random.default_rng(3)
    n = 25
    tenants = [f"t{k}" for k in rng.integers(0, 3, n)]
    pol = schedulers.get_scheduler(name, **({"starvation_s": 1.0} if name == "ltr" else {}))
    pol.reset(_ctx(n, rng, tenants=tenants))
    waiting = []
    for i, t in enumerate(np.sort(rng.uniform(0, 5, n))):
        r = Request(i, float(t), int(rng.integers(1, 500)), 10, tenants[i])
        r.state = WAITING
        pol.on_arrival(r, 5.0)
        waiting.append(r)
    for now in (5.0, 100.0):                    # none starving / all starving (ltr)
        got = [r.id for r in pol.admission_order(waiting, now)]
        assert sorted(got) == list(range(n))
    if name == "ltr":
        assert got == [r.id for r in _reference_ltr_order(pol, waiting, 100.0)]


class _Tail(Batching):
    """Just what ``_bulk_tail`` reads."""

    def __init__(self, bs, clock):
        self.bs, self.clock = bs, clock


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(-40, 40)), min_size=1, max_size=30),
       st.integers(0, 400), st.integers(0, 35), st.integers(0, 30), st.integers(0, 5))
def test_bulk_tail_selects_exactly_what_the_greedy_walk_selects(members, free, slots, clock, start):
    bs = 16
    eng = _Tail(bs, clock)
    rs = []
    for i, (p, gb) in enumerate(members):
        r = Request(i, 0.0, p, 10_000, "t")
        r.gbase = max(gb, 1 - clock)             # generated = gbase + clock >= 1
        rs.append(r)
    start = min(start, len(rs) - 1)
    needs = [(r.prompt_tokens + r.gbase + clock + bs - 1) // bs for r in rs]
    # the one-by-one walk
    f, s, displaced = free, slots, []
    for r, nd in zip(rs[start:], needs[start:]):
        if s > 0 and nd <= f:
            f, s = f - nd, s - 1
        else:
            displaced.append(r.id)
    got = []
    f2, s2 = eng._bulk_tail(rs, start, sum(needs[start:]), free, slots, got)
    assert (f2, s2, [r.id for r in got]) == (f, s, displaced)


@pytest.fixture(scope="module")
def azure_windows(shared_traces):
    from portbench.bench import simulator as simbench

    return simbench.real_windows((400,), 2, mirror=shared_traces)[400]


@pytest.mark.parametrize("name", ["las", "mlfq", "rr", "srpt_oracle", "ltr", "vtc"])
def test_incremental_structures_hold_their_invariants_on_real_windows(azure_windows, name):
    """Overloaded real windows (deep backlogs, evictions): every decision's incremental state is checked
    from scratch (``check_invariants``: cached keys = fresh keys, rank order = residents, cohort
    aggregates), under recompute and swap preemption."""
    prof = profiles.get_profile(profiles.DEFAULT_PROFILE)
    for df in azure_windows:
        df = df.with_columns(df["prompt_tokens"].cast(float).log().alias("ltr_score"),
                             df["prompt_tokens"].cast(float).alias("predicted_output"))
        cap = regions.capacity(df, prof)
        for rho in (0.9, 2.0):
            s = regions.rescale(df, rho, cap)
            for engine in (None, {"preemption": "swap"}):
                res = simulator.simulate(s, name, prof, horizon_s=regions.horizon_s(s, 1.5), seed=1,
                                         check_invariants=True, engine=engine)
                assert res.counters["conserved"]
