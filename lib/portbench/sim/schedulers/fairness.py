"""Virtual token counter fairness across tenants (Sheng et al. OSDI'24)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from operator import attrgetter

from .base import BaseScheduler, register_scheduler

_arrival = attrgetter("arrival_s")

@register_scheduler
class VTC(BaseScheduler):
    """Virtual token counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24).

    One counter per tenant. Admission: repeatedly take the tenant with the smallest counter among
    tenants with waiting requests and admit its earliest request (stop at the first that does not
    fit); admitting charges ``w_prompt`` × prompt tokens (first admission only), every generated
    token charges ``w_output``. Counter lift: a tenant whose queue was empty is lifted to the
    smallest counter of the backlogged tenants (or of the last tenant that left the queue) when
    its request arrives, so idle time earns no credit. Non-preemptive (memory evictions only: the
    latest arrival). Information: tenant, prompt length (charged at admission) and tokens generated
    (the counters). Weights default to the paper's (1, 2). On a source without a tenant field run
    with ``simulation.tenant_model: trace`` every request has the same tenant: one counter, i.e.
    FCFS order -- VTC has nothing to equalise there.
    """

    name = "vtc"
    information = "tenant"
    uses = ("tenant", "prompt", "attained")
    models = "Virtual Token Counter fair scheduling (Sheng et al. OSDI'24)"
    static_priority = False
    OPTIONS = {"w_prompt": 1, "w_output": 2}

    def reset(self, ctx):
        self._counter: dict = {t: 0 for t in sorted(set(ctx.tenant))}
        self._waiting: dict = {t: 0 for t in self._counter}
        self._queues: dict = {}         # tenant -> its waiting requests as sorted (arrival, id, r); non-empty only
        self._charged = [False] * ctx.n
        self._last_left = None

    def priority(self, r, now):
        return (self._counter[r.tenant], r.arrival_s)

    def victim(self, candidates, now):
        """The latest arrival; among equal arrival times the first in running order (vLLM's rule, as for FCFS)."""
        return max(candidates, key=_arrival)

    def on_arrival(self, r, now):
        t = r.tenant
        if self._waiting[t] == 0:
            backlogged = [self._counter[u] for u, w in self._waiting.items() if w > 0]
            if backlogged:
                self._counter[t] = max(self._counter[t], min(backlogged))
            elif self._last_left is not None:
                self._counter[t] = max(self._counter[t], self._counter[self._last_left])
        self._waiting[t] += 1
        self._enqueue(r)

    def on_evict(self, r, now):
        self._waiting[r.tenant] += 1
        self._enqueue(r)

    def _enqueue(self, r) -> None:
        q = self._queues.get(r.tenant)
        if q is None:
            self._queues[r.tenant] = [(r.arrival_s, r.id, r)]
        else:
            bisect.insort(q, (r.arrival_s, r.id, r))

    def on_admit(self, r, now):
        t = r.tenant
        q = self._queues[t]
        i = bisect.bisect_left(q, (r.arrival_s, r.id))
        if i == len(q) or q[i][2] is not r:            # pragma: no cover - the hooks keep the queues exact
            raise RuntimeError(f"vtc: request {r.id} admitted but not in its tenant's queue")
        del q[i]
        if not q:
            del self._queues[t]
        self._waiting[t] -= 1
        if self._waiting[t] == 0:
            self._last_left = t
        if not self._charged[r.id]:
            self._charged[r.id] = True
            self._counter[t] += self.w_prompt * r.prompt_tokens

    def on_tokens(self, batch, k, time_after):
        c, w = self._counter, self.w_output * k
        for r in batch:
            c[r.tenant] += w

    def admission_order(self, waiting, now) -> Iterator:
        """Repeatedly the earliest request of the tenant with the smallest (counter, earliest arrival, id);
        the engine admits each one (``on_admit`` charges its tenant and takes it out of the queue) before
        it asks for the next, and stops at the first that does not fit. O(tenants) per request."""
        queues, c = self._queues, self._counter
        pos = dict.fromkeys(queues, 0)          # per tenant: its next candidate (past the ones not admitted)
        while True:
            best = None
            for u, i in pos.items():
                q = queues.get(u)
                if q is not None and i < len(q):
                    k = (c[u], q[i][0], q[i][1])
                    if best is None or k < best[0]:
                        best = (k, u, i)
            if best is None:
                return
            _, t, i = best
            r = queues[t][i][2]
            yield r
            q = queues.get(t)
            if q is not None and i < len(q) and q[i][2] is r:      # not admitted: the caller went on past it
                pos[t] = i + 1

    def next_decision(self, batch, outside, now):
        """Iterations until the admission head (tenant with the smallest counter) changes."""
        heads = {t: q[0][2] for t, q in self._queues.items()}     # each tenant's earliest waiting request
        if len(heads) < 2:
            return (None, None)
        n_in: dict = {}
        for r in batch:
            n_in[r.tenant] = n_in.get(r.tenant, 0) + 1
        c = self._counter
        h = min(heads, key=lambda u: (c[u], heads[u].arrival_s, heads[u].id))
        best = None
        for u in heads:
            if u == h:
                continue
            s = self.w_output * (n_in.get(h, 0) - n_in.get(u, 0))
            if s <= 0:
                continue
            du = c[u] - c[h]
            earlier = (heads[u].arrival_s, heads[u].id) < (heads[h].arrival_s, heads[h].id)
            k = max(1, -(-du // s)) if earlier else du // s + 1
            if best is None or k < best:
                best = k
        return (best, None)
