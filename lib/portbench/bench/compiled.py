"""Prototype: the engine's non-preemptive static-priority path compiled with numba (issue #16).

**What it is.** :func:`simulate_static` re-implements, as one numba-compiled loop over flat arrays, exactly
what :func:`portbench.sim.engine.simulate` does for a static-priority, non-preemptive policy under the
default engine (vLLM V1 batching, recompute preemption, no prefix caching, no work marks): the same
V1 iteration composition (running decodes first, then chunks in rank order under the token budget,
admission gated on the whole sequence's blocks, no admission in an iteration with a preemption), the
same paged-KV accounting of the decode cohort in closed form, the same decode runs (completion,
memory boundary, the next arrival that can change the batch, the horizon) and the same floating-point
operations in the same order. The policy's ranks come from the policy itself (Python), so it covers
fcfs, sarathi, sjf_prompt, sjf_oracle, sjf_predicted, edf and random -- 7 of the 13 policies.

**What it is for.** A measured answer to "what would a compiled core buy?": :func:`run` simulates the
benchmark's windows with both engines, checks that every request's first-token time, finish time,
generated tokens, preemptions and admission time, and the run's counters, are *identical*, and
reports simulated seconds per wall second of both. It is a benchmark part (``portbench bench``, when
numba is installed: ``pip install numba``), not used by the study: the Python engine stays the
reference (its SimPy model, its other policies and engine modes).
"""

from __future__ import annotations

import math
import statistics
import time
from importlib.util import find_spec
from typing import Any

import numpy as np

from ..sim import engine as simulator
from ..sim import profiles, schedulers
from ..sim.engine.core import Engine
from ..sim.request import requests_from_window
from . import simulator as simbench

STATIC_POLICIES = ("fcfs", "sarathi", "sjf_prompt", "sjf_oracle", "sjf_predicted", "edf", "random")

_KERNEL = None


def _kernel():
    """Compile (once per process; numba caches nothing here) and return the loop."""
    global _KERNEL
    if _KERNEL is None:
        import numba  # optional dependency of this benchmark part only

        _KERNEL = numba.njit(cache=False)(_loop)
    return _KERNEL


def _loop(arr, P, O, rank, never_fits, order, suffix_min, H, n_arrivable, bs, cap, B, max_seqs,
          c0, cp, cd, ckv, cattn, floor_s, floor_tokens, first_tok, finish, gen, preempt, admitted_s, counters):
    n = P.shape[0]
    INF = math.inf
    # per request
    state = np.full(n, -1, np.int64)          # -1 not arrived, 0 waiting, 1 running, 3 finished, 4 rejected
    prefilled = np.zeros(n, np.int64)
    target = P.copy()
    blocks = np.zeros(n, np.int64)
    chunk = np.zeros(n, np.int64)
    gbase = np.zeros(n, np.int64)
    cver = np.zeros(n, np.int64)
    in_cohort = np.zeros(n, np.bool_)
    # waiting heap of ranks; rank -> request
    by_rank = np.empty(n, np.int64)
    for i in range(n):
        by_rank[rank[i]] = i
    wheap = np.empty(n + 1, np.int64)
    nw = 0
    # completion heap of (remaining at clock 0, id, cver)
    fk = np.empty(4 * n + 16, np.int64)
    fid = np.empty(4 * n + 16, np.int64)
    fcv = np.empty(4 * n + 16, np.int64)
    nf = 0
    # prefilling residents (small)
    pre = np.empty(n, np.int64)
    npre = 0
    n_res = 0
    n_coh = 0
    clock = 0
    SL = 0
    cnt = np.zeros(bs, np.int64)
    need_now = 0
    other = 0
    cursor = 0
    one_step = False
    n_iter = 0
    n_dec = 0
    n_pre = 0
    max_used = 0
    end_time = 0.0
    now = 0.0

    while True:
        # ---- ingest arrivals up to now
        while cursor < n_arrivable and arr[order[cursor]] <= now:
            r = order[cursor]
            cursor += 1
            if never_fits[r]:
                state[r] = 4
                continue
            state[r] = 0
            # heap push rank
            k = rank[r]
            j = nw
            nw += 1
            while j > 0:
                p = (j - 1) >> 1
                if wheap[p] <= k:
                    break
                wheap[j] = wheap[p]
                j = p
            wheap[j] = k
        if n_res == 0 and nw == 0:
            if cursor >= n_arrivable:
                end_time = now
                break
            now = arr[order[cursor]]
            continue
        n_dec += 1
        # ---- plan (V1, non-preemptive)
        preempted = False
        while True:
            # chunks of the ongoing prefills, rank order (insertion sort: few)
            for a in range(1, npre):
                x = pre[a]
                b2 = a - 1
                while b2 >= 0 and rank[pre[b2]] > rank[x]:
                    pre[b2 + 1] = pre[b2]
                    b2 -= 1
                pre[b2 + 1] = x
            budget = B - n_coh
            if budget < 0:
                budget = 0
            for a in range(npre):
                r = pre[a]
                left = target[r] - prefilled[r]
                c = left if left < budget else budget
                chunk[r] = c
                budget -= c
            extra = 0
            for a in range(npre):
                r = pre[a]
                extra += (prefilled[r] + chunk[r] + bs - 1) // bs - blocks[r]
            total = need_now + other + extra
            if total <= cap:
                break
            # evict the worst-ranked resident (materialised)
            v = -1
            for r in range(n):
                if state[r] == 1 and (v < 0 or rank[r] > rank[v]):
                    v = r
            if in_cohort[v]:
                g = gbase[v] + clock
                gen[v] = g
                L = P[v] + gbase[v]
                SL -= L
                cnt[L % bs] -= 1
                b = (P[v] + g + bs - 1) // bs
                need_now -= b
                blocks[v] = b
                cver[v] += 1
                in_cohort[v] = False
                n_coh -= 1
            else:
                other -= blocks[v]
                if prefilled[v] != target[v]:
                    for a in range(npre):
                        if pre[a] == v:
                            for a2 in range(a, npre - 1):
                                pre[a2] = pre[a2 + 1]
                            npre -= 1
                            break
            n_res -= 1
            state[v] = 0
            blocks[v] = 0
            chunk[v] = 0
            preempt[v] += 1
            n_pre += 1
            prefilled[v] = 0
            target[v] = P[v] + gen[v]
            k = rank[v]
            j = nw
            nw += 1
            while j > 0:
                p = (j - 1) >> 1
                if wheap[p] <= k:
                    break
                wheap[j] = wheap[p]
                j = p
            wheap[j] = k
            preempted = True
        for a in range(npre):
            r = pre[a]
            if chunk[r] != 0:
                blocks[r] = (prefilled[r] + chunk[r] + bs - 1) // bs
        other += extra
        free = cap - total
        slots = max_seqs - n_res
        pf_tokens = 0
        for a in range(npre):
            pf_tokens += chunk[pre[a]]
        if preempted and nw > 0:
            one_step = True
        if nw > 0 and slots > 0 and not preempted:
            admitted = 0
            while nw > 0:
                if slots <= 0:
                    break
                r = by_rank[wheap[0]]
                tg = P[r] + gen[r]
                if (tg + bs - 1) // bs > free:
                    break
                c = tg if tg < budget else budget
                if c <= 0:
                    break
                chunk[r] = c
                need = (c + bs - 1) // bs
                # heap pop
                nw -= 1
                last = wheap[nw]
                j = 0
                while True:
                    l = 2 * j + 1
                    if l >= nw:
                        break
                    rr = l + 1
                    m = rr if (rr < nw and wheap[rr] < wheap[l]) else l
                    if wheap[m] >= last:
                        break
                    wheap[j] = wheap[m]
                    j = m
                if nw > 0:
                    wheap[j] = last
                free -= need
                slots -= 1
                admitted += 1
                pf_tokens += c
                budget -= c
                state[r] = 1
                n_res += 1
                if admitted_s[r] != admitted_s[r]:
                    admitted_s[r] = now
                target[r] = tg
                prefilled[r] = 0
                blocks[r] = (c + bs - 1) // bs
                other += blocks[r]
                pre[npre] = r
                npre += 1
        used = cap - free
        if used > max_used:
            max_used = used
        # ---- the iteration
        kind = 0
        kk = 1
        a0 = 0.0
        inc = 0.0
        if pf_tokens:
            ctx = 0
            pairs = 0
            for a in range(npre):
                r = pre[a]
                c = chunk[r]
                if c:
                    p0 = prefilled[r]
                    ctx += p0 + c
                    pairs += c * p0 + c * (c + 1) // 2
            ctx += SL + n_coh * clock
            tok = pf_tokens + n_coh
            fl = floor_s * (1.0 - tok / floor_tokens) if (floor_s > 0 and tok < floor_tokens) else 0.0
            dt = c0 + cp * pf_tokens + cd * n_coh + ckv * ctx + cattn * pairs + fl
            if now + dt > H:
                end_time = H
                break
            kind = 1
        else:
            nn = n_coh
            C = SL + nn * clock
            fl = floor_s * (1.0 - nn / floor_tokens) if (floor_s > 0 and nn < floor_tokens) else 0.0
            a0 = c0 + cp * 0 + cd * nn + ckv * C + cattn * 0 + fl
            if one_step:
                one_step = False
                dt = a0
                if now + dt > H:
                    end_time = H
                    break
                kk = 1
            else:
                # iterations until the first completion (valid heap top)
                while nf > 0 and fcv[0] != cver[fid[0]]:
                    nf -= 1
                    lk, li, lc = fk[nf], fid[nf], fcv[nf]
                    j = 0
                    while True:
                        l = 2 * j + 1
                        if l >= nf:
                            break
                        rr = l + 1
                        m = l
                        if rr < nf and (fk[rr] < fk[l] or (fk[rr] == fk[l] and (fid[rr] < fid[l] or (fid[rr] == fid[l] and fcv[rr] < fcv[l])))):
                            m = rr
                        if not (fk[m] < lk or (fk[m] == lk and (fid[m] < li or (fid[m] == li and fcv[m] < lc)))):
                            break
                        fk[j], fid[j], fcv[j] = fk[m], fid[m], fcv[m]
                        j = m
                    if nf > 0:
                        fk[j], fid[j], fcv[j] = lk, li, lc
                kk = fk[0] - clock
                # memory boundary
                F = cap - used
                if kk > 1 and not (F >= nn * ((kk - 2) // bs + 1)):
                    q = F // nn
                    rem = F - q * nn
                    # offsets sorted: iterate o = 1..bs (offset of residue m is bs - (m + clock - 1) % bs)
                    acc = 0
                    for o in range(1, bs + 1):
                        m = (bs - o - clock + 1) % bs
                        w = cnt[m]
                        if w:
                            acc += w
                            if acc > rem:
                                k2 = bs * q + o
                                if k2 < kk:
                                    kk = k2
                                break
                inc = ckv * nn
                t_bound = INF
                if cursor < n_arrivable:
                    if nw > 0:
                        head = wheap[0]
                        c2 = cursor
                        if suffix_min[c2] < head:
                            while never_fits[order[c2]] or rank[order[c2]] > head:
                                c2 += 1
                            t_bound = arr[order[c2]]
                    else:
                        t_bound = arr[order[cursor]]
                if t_bound < INF and kk > 1:
                    x = t_bound - now
                    if x > a0:
                        if inc > 0:
                            bq = a0 - inc / 2
                            kt = math.ceil((-bq + math.sqrt(bq * bq + 2 * inc * x)) / inc)
                        else:
                            kt = math.ceil(x / a0)
                        if kt < 1:
                            kt = 1
                        while kt > 1 and (kt - 1) * a0 + inc * (kt - 1) * (kt - 2) / 2 >= x:
                            kt -= 1
                        while kt * a0 + inc * kt * (kt - 1) / 2 < x:
                            kt += 1
                        while kt < kk and now + (kt * a0 + inc * kt * (kt - 1) / 2) < t_bound:
                            kt += 1
                        if kt < kk:
                            kk = kt
                    else:
                        kk = 1
                dt = kk * a0 + inc * kk * (kk - 1) / 2
                if now + dt > H:
                    x = H - now
                    if x < a0:
                        kk = 0
                    else:
                        if inc > 0:
                            bq = a0 - inc / 2
                            kk = math.floor((-bq + math.sqrt(bq * bq + 2 * inc * x)) / inc)
                        else:
                            kk = math.floor(x / a0)
                        while kk > 0 and kk * a0 + inc * kk * (kk - 1) / 2 > x:
                            kk -= 1
                        while (kk + 1) * a0 + inc * (kk + 1) * kk / 2 <= x:
                            kk += 1
                    if kk <= 0:
                        end_time = H
                        break
                    dt = kk * a0 + inc * kk * (kk - 1) / 2
        t1 = now + dt
        # ---- commit
        n_iter += kk
        # the cohort decodes kk iterations (one when mixed)
        if kk > 1:
            d = 0
            k1 = kk - 1
            for m in range(bs):
                w = cnt[m]
                if w:
                    d += w * (((m + clock - 1) % bs + k1) // bs)
            need_now += d
            clock += k1
            u2 = need_now + other
            if u2 > max_used:
                max_used = u2
        need_now += cnt[(-clock) % bs]
        clock += 1
        # completions
        while nf > 0:
            if fcv[0] != cver[fid[0]] or fk[0] == clock:
                rid = fid[0]
                valid = fcv[0] == cver[rid]
                nf -= 1
                lk, li, lc = fk[nf], fid[nf], fcv[nf]
                j = 0
                while True:
                    l = 2 * j + 1
                    if l >= nf:
                        break
                    rr = l + 1
                    m = l
                    if rr < nf and (fk[rr] < fk[l] or (fk[rr] == fk[l] and (fid[rr] < fid[l] or (fid[rr] == fid[l] and fcv[rr] < fcv[l])))):
                        m = rr
                    if not (fk[m] < lk or (fk[m] == lk and (fid[m] < li or (fid[m] == li and fcv[m] < lc)))):
                        break
                    fk[j], fid[j], fcv[j] = fk[m], fid[m], fcv[m]
                    j = m
                if nf > 0:
                    fk[j], fid[j], fcv[j] = lk, li, lc
                if valid:
                    g = gbase[rid] + clock
                    gen[rid] = g
                    L = P[rid] + gbase[rid]
                    SL -= L
                    cnt[L % bs] -= 1
                    need_now -= (P[rid] + g + bs - 1) // bs
                    cver[rid] += 1
                    in_cohort[rid] = False
                    n_coh -= 1
                    state[rid] = 3
                    finish[rid] = t1
                    blocks[rid] = 0
                    n_res -= 1
            else:
                break
        if kind == 1:
            a = 0
            while a < npre:
                r = pre[a]
                p1 = prefilled[r] + chunk[r]
                prefilled[r] = p1
                chunk[r] = 0
                if p1 == target[r]:
                    gen[r] += 1
                    if first_tok[r] != first_tok[r]:
                        first_tok[r] = t1
                    other -= blocks[r]
                    for a2 in range(a, npre - 1):
                        pre[a2] = pre[a2 + 1]
                    npre -= 1
                    if gen[r] == O[r]:
                        state[r] = 3
                        finish[r] = t1
                        blocks[r] = 0
                        n_res -= 1
                    else:
                        g = gen[r]
                        gb = g - clock
                        gbase[r] = gb
                        L = P[r] + gb
                        SL += L
                        cnt[L % bs] += 1
                        b = (P[r] + g + bs - 1) // bs
                        blocks[r] = b
                        need_now += b
                        cver[r] += 1
                        in_cohort[r] = True
                        n_coh += 1
                        # push (O - gb, r, cver)
                        k0, i0, v0 = O[r] - gb, r, cver[r]
                        if nf == fk.shape[0]:
                            fk = np.concatenate((fk, np.empty(nf, np.int64)))
                            fid = np.concatenate((fid, np.empty(nf, np.int64)))
                            fcv = np.concatenate((fcv, np.empty(nf, np.int64)))
                        j = nf
                        nf += 1
                        while j > 0:
                            p = (j - 1) >> 1
                            if fk[p] < k0 or (fk[p] == k0 and (fid[p] < i0 or (fid[p] == i0 and fcv[p] < v0))):
                                break
                            fk[j], fid[j], fcv[j] = fk[p], fid[p], fcv[p]
                            j = p
                        fk[j], fid[j], fcv[j] = k0, i0, v0
                    continue
                a += 1
        end_time = t1
        now = t1
    # the cohort's generated tokens, requests never ingested
    for r in range(n):
        if in_cohort[r]:
            gen[r] = gbase[r] + clock
    counters[0] = n_iter
    counters[1] = n_dec
    counters[2] = n_pre
    counters[3] = max_used
    return end_time


def simulate_static(window_df, scheduler: str, profile, *, horizon_s: float, seed: int, slo=None) -> dict:
    """One run of a static non-preemptive policy with the compiled loop; returns the per-request arrays
    and counters that :func:`run` compares with :func:`portbench.sim.engine.simulate`."""
    sched = schedulers.get_scheduler(scheduler)
    if not (sched.static_priority and not sched.preemptive):
        raise ValueError(f"{scheduler}: the compiled prototype covers static non-preemptive policies only")
    rng = np.random.default_rng(int(seed))
    reqs, ctx = requests_from_window(window_df, profile, rng, slo,
                                     max_model_len=int(getattr(profile, "max_model_len", 0) or 0))
    sched.reset(ctx)
    eng = Engine(reqs, sched, profile, float(horizon_s), False, False)   # only for its ranks and budget
    eng.prepare_static_ranks()
    n = len(reqs)
    order = np.array([r.id for r in eng.arrivals], dtype=np.int64)
    suffix = np.array(eng.suffix_min_rank, dtype=np.int64)
    arr = np.array([r.arrival_s for r in reqs])
    P = np.array([r.prompt_tokens for r in reqs], dtype=np.int64)
    O = np.array([r.output_tokens for r in reqs], dtype=np.int64)
    rank = np.array([r.rank for r in reqs], dtype=np.int64)
    nf = np.array([r.never_fits for r in reqs], dtype=np.bool_)
    out: dict[str, Any] = {k: np.full(n, np.nan) for k in ("first_token_s", "finish_s", "admitted_s")}
    gen = np.zeros(n, dtype=np.int64)
    pre = np.zeros(n, dtype=np.int64)
    counters = np.zeros(4, dtype=np.int64)
    p = profile
    end = _kernel()(arr, P, O, rank, nf, order, suffix, float(horizon_s), eng.n_arrivable, eng.bs, eng.cap, eng.B,
                    eng.max_seqs, p.c0_s, p.c_prefill_s, p.c_decode_s, p.c_kv_s, p.c_attn_s, p.floor_s,
                    float(p.floor_tokens) if p.floor_s > 0 else 1.0, out["first_token_s"], out["finish_s"], gen, pre,
                    out["admitted_s"], counters)
    out.update(generated_tokens=gen, preemptions=pre, iterations=int(counters[0]), decision_points=int(counters[1]),
               n_preemptions=int(counters[2]), kv_max_used_blocks=int(counters[3]), sim_end_s=float(end))
    return out


def _same(py, cc) -> bool:
    r, c = py.requests, py.counters
    eq = all(np.array_equal(r[col].to_numpy(), cc[col], equal_nan=True)
             for col in ("first_token_s", "finish_s", "admitted_s"))
    eq = eq and all(np.array_equal(r[col].to_numpy(), cc[col]) for col in ("generated_tokens", "preemptions"))
    return eq and (c["iterations"], c["decision_points"], c["preemptions"], c["kv_max_used_blocks"], c["sim_end_s"]) == \
        (cc["iterations"], cc["decision_points"], cc["n_preemptions"], cc["kv_max_used_blocks"], cc["sim_end_s"])


def run(quick: bool = False) -> dict:
    """Both engines on the simulator benchmark's windows (every static non-preemptive policy x region):
    identical results?, and simulated seconds per wall second of each (medians over policy x region)."""
    if find_spec("numba") is None:
        return {"status": "skipped", "reason": "numba is not installed (pip install numba) -- optional prototype"}
    profile = profiles.get_profile(profiles.DEFAULT_PROFILE)
    slo = {"ttft_s": 2.0, "tpot_s": 0.1}
    t0 = time.perf_counter()
    _kernel()
    cases = simbench._prepare(simbench.real_windows((200,), 2 if quick else 3)[200], profile, simbench.REGION_LOADS)
    simulate_static(simbench._with_predictions(cases[0][2]), "fcfs", profile, horizon_s=cases[0][3], seed=0, slo=slo)
    compile_s = time.perf_counter() - t0
    repeats = 1 if quick else 3
    per: dict = {}
    mismatches = []
    for name in STATIC_POLICIES:
        for i, reg, sdf, h in cases:
            sdf = simbench._with_predictions(sdf)
            walls_py, walls_cc = [], []
            for rep in range(repeats):
                t = time.perf_counter()
                py = simulator.simulate(sdf, name, profile, horizon_s=h, seed=rep, slo=slo)
                walls_py.append(time.perf_counter() - t)
                t = time.perf_counter()
                cc = simulate_static(sdf, name, profile, horizon_s=h, seed=rep, slo=slo)
                walls_cc.append(time.perf_counter() - t)
                if not _same(py, cc):
                    mismatches.append(f"{name} window {i} {reg} seed {rep}")
            sim_s = py.counters["sim_end_s"]
            per.setdefault((name, reg), []).append((sim_s / statistics.median(walls_py),
                                                    sim_s / statistics.median(walls_cc)))
    med_py = statistics.median(statistics.median(x[0] for x in v) for v in per.values())
    med_cc = statistics.median(statistics.median(x[1] for x in v) for v in per.values())
    return {"policies": list(STATIC_POLICIES), "runs_compared": len(STATIC_POLICIES) * len(cases) * repeats,
            "identical": not mismatches, "mismatches": mismatches[:20], "compile_s": compile_s,
            "speedup_per_core_python": med_py, "speedup_per_core_compiled": med_cc,
            "compiled_over_python": med_cc / med_py,
            "note": "whole run each (set-up, ranks and records in Python; the loop compiled)"}
