"""The compiled engine core (``engine.core: compiled | auto``): the engine's decision loop as one numba
function over flat arrays, bit-identical to the SimPy reference engine (:mod:`portbench.sim.engine.core`)
for the runs it supports.

What it runs: every built-in policy of the study -- the static ones (``fcfs``, ``sarathi``, ``sjf_prompt``,
``sjf_oracle``, ``sjf_predicted``, ``edf``, ``random`` and the comparison variants ``edf_oracle``,
``sjf_noisy_oracle``), ``ltr`` (``ltr_noisy_oracle``) with its starvation guard, ``vtc`` with its tenant counters
(lift, prompt and token charges, its tenant-by-tenant admission), and the preemptive ones (``srpt_oracle``,
``mlfq``, ``las``, ``rr``: the ranked plan of :meth:`Batching._plan_ranked` under V1 and the V0 walk of
:meth:`Batching._plan_preemptive`, pauses, evictions among the displaced, their ``next_decision`` and RR's
quantum clock) -- under vLLM V1 batching and V0's prefill-first batching (whole prompts in prefill-only
iterations, the whole prefill's blocks at admission; ``sarathi`` chunked), with recompute or swap preemption
(swap: KV copied to the profile's host memory while it has room, the copies charged to the next iteration),
the context limit, prefix caching, the self-preemption stop of vLLM's running loop
(:meth:`Batching._first_misfit`), work marks, queue intervals and the step log (``record_iterations``).
Everything else -- a static policy with option ``preemptive: true``, plug-ins,
``naive``/``check_invariants``/``check_contract`` runs, a profile that is not the cost-model ``Profile`` --
runs on the reference (:func:`unsupported` says why).

Ordered structures instead of walks over every live request (the decisions are the same; ``tests/test_compiled_core.py``):
the preemptive policies re-key only the decode cohort at a decision (a request's key changes only as it generates),
keep the waiting requests in one sorted list (a waiting request's key is frozen; inserted by bisection,
admitted from its head: :func:`_w_insert`) and the residents in the last plan's rank order, insertion-sorted on the
new keys (:func:`_resort`); the displaced are in rank order, so the victim is the last; the next decision's
bound bisects the waiting and paused lists. ltr keeps its waiting requests in a queue by (waiting since, id)
and a heap by (score, id) (:func:`_enqueue`, :func:`_ltr_next`), vtc a heap per tenant by (arrival, id)
(:func:`_vtc_push`). The per-decision scans that remain visit only the ids that can be live (from the first not
yet finished or rejected to the last ingested), in id order as before.

The set-up (requests, the context limit, static ranks, prefix-cache validation) is the
reference engine's own (:class:`~portbench.sim.engine.core.Engine` is built and its state read), the
loop is compiled, and :func:`run` returns its arrays (:class:`Outcome`), from which ``simulate`` builds the
records, counters and step log in one go (the :class:`Request` objects are not written back).

The helpers take borrowed views of the loop's arrays (:func:`_borrowed_intrinsic`: without numba's reference
counting, which made every helper call pay two atomic operations per array argument), views of the caller's
arguments and of one integer and one float work buffer that the returned ``S`` and ``SF`` keep alive.

Every operation of the reference is reproduced in the same order with the same floating-point
arithmetic (iteration times, the closed-form decode runs, first/last k), so the records and counters
are identical, not close (``tests/test_compiled_core.py``). Compiled once per process and cached on
disk (numba's ``cache=True``, in ``__pycache__`` next to this file or ``$NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.util import find_spec

import numpy as np
import polars as pl

from ...core.errors import ConservationError, ParameterError
from ..profiles.costmodel import Profile
from .contract import is_plugin

# the built-in policies the compiled core runs (registry names) and their victim rule
VICTIM_ARRIVAL = ("fcfs", "sarathi", "vtc")     # the latest arrival, first in running order among ties
VICTIM_RANK = ("sjf_prompt", "sjf_oracle", "sjf_predicted", "edf", "edf_oracle", "random", "sjf_noisy_oracle")
RANK_POLICIES = ("ltr", "ltr_noisy_oracle")  # dynamic: starving requests first (oldest), then by score
PREEMPTIVE_POLICIES = ("las", "mlfq", "srpt_oracle", "rr")   # the ranked plan (Batching._plan_ranked)
SUPPORTED_POLICIES = VICTIM_ARRIVAL + VICTIM_RANK + RANK_POLICIES + PREEMPTIVE_POLICIES

# request states (as portbench.sim.request)
_NOT_ARRIVED, _WAITING, _RUNNING, _PAUSED, _FINISHED, _REJECTED = -1, 0, 1, 2, 3, 4
# per-request int fields (rows of R)
(GEN, PREF, TGT, BLK, CHK, GB, CV, INC, HIGH, HIT, NSH, ST, RANK, PREEMPT, PP, OO, SKF, NFITS, TEN, CHG, JOIN,
 TURN, SWP, SWB, WV) = range(25)
N_RFIELDS = 25
# per-request float fields (rows of F); KEY: what residents are ordered by (the static rank, or ltr's score)
FT, FIN, ADM, WS, ARR, KEY, TAU = range(7)
# scalar state (S)
(NEED, OTHER, CLOCK, SL, NCOH, NRES, NWAIT, ADJ, PCREF, PCSH, LRUN, LRUH, LRUT, NPRE, NRUN, NSKIP, NF,
 NPREEMPT, PCHIT, PCQ, WORK, NFIN, NWA, ONESTEP, NITER, NDEC, MAXUSED, CURSOR, USED, NPAUSED, NPAUSE, NWQ, HOSTU,
 NSWO, NSWI, LVLO, LVHI, WH, WE, NRO, QH, QE, QS, NHK) = range(44)
N_S = 44
PENDING, SWAPS = 0, 1         # float state (SF): swap copies charged to the next iteration, their total
# configuration (C)
C_BS, C_CAP, C_B, C_MAXSEQS, C_PC, C_HB, C_EB, C_NARR, C_VARR, C_NMARKS, C_TRACE, C_POL, C_STARVE, C_NTEN, \
    C_WP, C_WO, C_Q, C_V1, C_CHUNKED, C_SWAP, C_HOSTCAP = range(21)
# waiting queue: a heap of static ranks | ltr's order (starving, then score) | vtc's tenant-by-tenant order
POL_STATIC, POL_LTR, POL_VTC = 0, 1, 2
POL_LAS, POL_MLFQ, POL_SRPT, POL_RR = 3, 4, 5, 6     # preemptive: the ranked plans (_plan_ranked, _plan_v0_preemptive)
# status codes
OK, ERR_KV, ERR_RUN_KV, ERR_PROGRESS = 0, 1, 2, 3


def unsupported(sched, engine, profile, *, naive: bool = False, check_invariants: bool = False,
                check_contract: bool | None = None) -> str | None:
    """Why the compiled core cannot run this run (a short phrase), or None when it can."""
    name = getattr(sched, "name", type(sched).__name__)
    if is_plugin(sched):
        return f"policy {name!r} is a plug-in (plug-ins run on the reference engine)"
    if name not in SUPPORTED_POLICIES or type(sched).__module__.split(".")[:3] != ["portbench", "sim", "schedulers"]:
        return f"policy {name!r} is not implemented in the compiled core (it runs {', '.join(SUPPORTED_POLICIES)})"
    if getattr(sched, "preemptive", False) and name not in PREEMPTIVE_POLICIES:
        return f"policy {name!r} with option preemptive: true"
    if naive:
        return "naive=True"
    if check_invariants:
        return "check_invariants=True"
    if check_contract:
        return "check_contract=True"
    if not isinstance(profile, Profile) or type(profile).iteration_time is not Profile.iteration_time \
            or type(profile).floor_time is not Profile.floor_time:
        return "a profile that is not a portbench cost-model Profile"
    return unsupported_here()


def unsupported_here() -> str | None:
    """Why no run can use the compiled core in this environment, or None."""
    if find_spec("numba") is None:
        return "numba is not installed"
    return None


def require_supported(reason: str | None) -> None:
    """``engine.core: compiled`` on a run the compiled core does not run: one ParameterError."""
    if reason is not None:
        raise ParameterError("engine.core", "compiled", f"a run the compiled core supports, not one with {reason} "
                             "(engine.core: auto runs it on the reference engine)")


_KERNEL = None


def kernel():
    """The compiled loop (compiled once per process; numba caches the machine code on disk)."""
    global _KERNEL
    if _KERNEL is None:
        import numba
        jit = numba.njit(cache=True, nogil=True)
        g = globals()
        g["_borrowed"] = _borrowed_intrinsic()
        for f in _HELPERS:
            g[f.__name__] = jit(f)
        _KERNEL = jit(_loop)
    return _KERNEL


def _borrowed_intrinsic():
    """The compiled :func:`_borrowed`: the same array without its reference-counted owner (a null meminfo).
    numba counts references on every array a compiled function takes (an atomic increment on entry and a
    decrement on return for each one it cannot prove unneeded): with some 20 arrays per helper call that was
    about a third of the loop's time. A borrowed view's counting is a no-op; whoever owns the memory keeps
    it alive (the caller of the loop its arguments, the loop's returned S and SF its work buffers)."""
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def _borrowed_view(typingctx, a):
        if not isinstance(a, types.Array):
            return None

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
            ary.parent = cgutils.get_null_value(ary.parent.type)
            return ary._getvalue()

        return a(a), codegen

    return _borrowed_view


# ---------------------------------------------------------------------------------------------------
# helpers (compiled by kernel(); plain Python otherwise)

def _borrowed(a):
    """``a`` without reference counting (compiled: :func:`_borrowed_intrinsic`; plain Python: ``a``)."""
    return a


def _part(buf, o, m):
    """The borrowed view ``buf[o:o + m]`` and the next offset."""
    return _borrowed(buf[o:o + m]), o + m


def decode_run_s(k, a, g):
    return k * a + g * k * (k - 1) / 2


def last_k_within(a, g, x):
    if x < a:
        return 0
    if g > 0:
        b = a - g / 2
        k = math.floor((-b + math.sqrt(b * b + 2 * g * x)) / g)
    else:
        k = math.floor(x / a)
    while k > 0 and decode_run_s(k, a, g) > x:
        k -= 1
    while decode_run_s(k + 1, a, g) <= x:
        k += 1
    return k


def first_k_reaching(a, g, x):
    if g > 0:
        b = a - g / 2
        k = math.ceil((-b + math.sqrt(b * b + 2 * g * x)) / g)
    else:
        k = math.ceil(x / a)
    if k < 1:
        k = 1
    while k > 1 and decode_run_s(k - 1, a, g) >= x:
        k -= 1
    while decode_run_s(k, a, g) < x:
        k += 1
    return k


def iteration_time(Fc, p, b, c, a):
    """The profile's iteration_time(p, b, c, a) (Fc: c0, c_prefill, c_decode, c_kv, c_attn, floor_s,
    floor_tokens), the same operations in the same order."""
    tok = p + b
    fl = 0.0
    if Fc[5] > 0 and tok < Fc[6]:
        fl = Fc[5] * (1.0 - tok / Fc[6])
    return Fc[0] + Fc[1] * p + Fc[2] * b + Fc[3] * c + Fc[4] * a + fl


def _heap_less(fk, fid, fcv, i, j):
    if fk[i] != fk[j]:
        return fk[i] < fk[j]
    if fid[i] != fid[j]:
        return fid[i] < fid[j]
    return fcv[i] < fcv[j]


def _fsift_down(fk, fid, fcv, j, n):
    while True:
        left = 2 * j + 1
        if left >= n:
            return
        m = left
        if left + 1 < n and _heap_less(fk, fid, fcv, left + 1, left):
            m = left + 1
        if not _heap_less(fk, fid, fcv, m, j):
            return
        fk[j], fk[m] = fk[m], fk[j]
        fid[j], fid[m] = fid[m], fid[j]
        fcv[j], fcv[m] = fcv[m], fcv[j]
        j = m


def _fsift_up(fk, fid, fcv, j):
    while j > 0:
        p = (j - 1) >> 1
        if not _heap_less(fk, fid, fcv, j, p):
            break
        fk[j], fk[p] = fk[p], fk[j]
        fid[j], fid[p] = fid[p], fid[j]
        fcv[j], fcv[p] = fcv[p], fcv[j]
        j = p


def _fpush(fk, fid, fcv, S, R, k, i, v):
    """Push (k, id, cver) on the completion heap; when full, drop the stale entries first."""
    n = S[NF]
    if n == fk.shape[0]:
        m = 0
        for a in range(n):
            if fcv[a] == R[CV, fid[a]]:
                fk[m], fid[m], fcv[m] = fk[a], fid[a], fcv[a]
                m += 1
        for a in range(m // 2 - 1, -1, -1):
            _fsift_down(fk, fid, fcv, a, m)
        n = m
    fk[n], fid[n], fcv[n] = k, i, v
    _fsift_up(fk, fid, fcv, n)
    S[NF] = n + 1


def _fpop(fk, fid, fcv, S):
    n = S[NF] - 1
    fk[0], fid[0], fcv[0] = fk[n], fid[n], fcv[n]
    S[NF] = n
    _fsift_down(fk, fid, fcv, 0, n)


def _iless(F, a, b):
    """Index heaps' order: (arrival, id) of requests ``a`` < ``b`` (vtc; ``F``: the float fields), or the
    number ``a`` < ``b`` (``F`` None: the static ranks; compiled without the other branch)."""
    if F is None:
        return a < b
    return F[ARR, a] < F[ARR, b] or (F[ARR, a] == F[ARR, b] and a < b)


def _isift_up(h, base, j, x, F):
    """Put ``x`` in the heap ``h[base:base + j + 1]`` whose last slot ``j`` is free."""
    while j > 0:
        p = (j - 1) >> 1
        y = h[base + p]
        if not _iless(F, x, y):
            break
        h[base + j] = y
        j = p
    h[base + j] = x


def _isift_down(h, base, n, F):
    """The heap ``h[base:base + n + 1]`` less its top, in ``h[base:base + n]``."""
    last = h[base + n]
    j = 0
    while True:
        left = 2 * j + 1
        if left >= n:
            break
        m = left
        if left + 1 < n and _iless(F, h[base + left + 1], h[base + left]):
            m = left + 1
        if not _iless(F, h[base + m], last):
            break
        h[base + j] = h[base + m]
        j = m
    if n > 0:
        h[base + j] = last


def _wpush(wheap, S, k):
    j = S[NWAIT]
    S[NWAIT] = j + 1
    _isift_up(wheap, 0, j, k, None)


def _wpop(wheap, S):
    n = S[NWAIT] - 1
    S[NWAIT] = n
    _isift_down(wheap, 0, n, None)


def _list_remove(lst, S, idx, x):
    n = S[idx]
    for a in range(n):
        if lst[a] == x:
            for b in range(a, n - 1):
                lst[b] = lst[b + 1]
            S[idx] = n - 1
            return


def _join(r, R, S, cnt, fk, fid, fcv, bs):
    P = R[PP, r]
    g = R[GEN, r]
    gb = g - S[CLOCK]
    R[GB, r] = gb
    L = P + gb
    S[SL] += L
    cnt[L % bs] += 1
    b = (P + g + bs - 1) // bs
    R[BLK, r] = b
    S[NEED] += b
    R[CV, r] += 1
    R[INC, r] = 1
    S[NCOH] += 1
    _fpush(fk, fid, fcv, S, R, R[OO, r] - gb, r, R[CV, r])


def _leave(r, R, S, cnt, bs):
    P = R[PP, r]
    g = R[GB, r] + S[CLOCK]
    R[GEN, r] = g
    L = P + R[GB, r]
    S[SL] -= L
    cnt[L % bs] -= 1
    b = (P + g + bs - 1) // bs
    S[NEED] -= b
    R[BLK, r] = b
    R[CV, r] += 1
    R[INC, r] = 0
    S[NCOH] -= 1


def _advance(k, S, cnt, bs):
    c = S[CLOCK]
    if k == 1:
        S[NEED] += cnt[-c % bs]
        S[CLOCK] = c + 1
        return
    d = 0
    for m in range(bs):
        w = cnt[m]
        if w:
            d += w * (((m + c - 1) % bs + k) // bs)
    S[NEED] += d
    S[CLOCK] = c + k


# prefix cache: entries are dense hash ids; ref[h] = -1 (not cached) or the residents referencing it;
# unreferenced cached entries form an LRU list (lprev/lnext, S[LRUH] oldest .. S[LRUT] newest)

def _lru_remove(h, lprev, lnext, S):
    p, q = lprev[h], lnext[h]
    if p >= 0:
        lnext[p] = q
    else:
        S[LRUH] = q
    if q >= 0:
        lprev[q] = p
    else:
        S[LRUT] = p
    S[LRUN] -= 1


def _lru_append(h, lprev, lnext, S):
    t = S[LRUT]
    lprev[h] = t
    lnext[h] = -1
    if t >= 0:
        lnext[t] = h
    else:
        S[LRUH] = h
    S[LRUT] = h
    S[LRUN] += 1


def _pc_ref(h, ref, lprev, lnext, S, eb):
    x = ref[h]
    if x < 0:
        ref[h] = 1
        S[PCREF] += eb
    else:
        if x == 0:
            _lru_remove(h, lprev, lnext, S)
            S[PCREF] += eb
        ref[h] = x + 1


def _pc_hit(r, tokens, hoff, hid, ref, Hb):
    """(entries hit, of which unreferenced) for a waiting request of ``tokens`` tokens."""
    n = hoff[r + 1] - hoff[r]
    if n == 0:
        return 0, 0
    lim = (tokens - 1) // Hb
    if n < lim:
        lim = n
    h = 0
    nfree = 0
    while h < lim:
        x = ref[hid[hoff[r] + h]]
        if x < 0:
            break
        if x == 0:
            nfree += 1
        h += 1
    return h, nfree


def _pc_take(r, h, R, S, hoff, hid, ref, lprev, lnext, eb):
    for j in range(h):
        _pc_ref(hid[hoff[r] + j], ref, lprev, lnext, S, eb)
    R[NSH, r] = h
    S[PCSH] += h * eb
    S[ADJ] = S[PCREF] - S[PCSH]


def _pc_register(r, upto, R, S, hoff, hid, ref, lprev, lnext, Hb, eb):
    nh = hoff[r + 1] - hoff[r]
    if nh == 0:
        return
    j = R[NSH, r]
    n = upto // Hb
    if nh < n:
        n = nh
    if j >= n:
        return
    while j < n:
        _pc_ref(hid[hoff[r] + j], ref, lprev, lnext, S, eb)
        j += 1
    S[PCSH] += (j - R[NSH, r]) * eb
    R[NSH, r] = j
    S[ADJ] = S[PCREF] - S[PCSH]


def _pc_release(r, R, S, hoff, hid, ref, lprev, lnext, eb):
    k = R[NSH, r]
    if k == 0:
        return
    for j in range(k - 1, -1, -1):
        h = hid[hoff[r] + j]
        x = ref[h] - 1
        ref[h] = x
        if x == 0:
            _lru_append(h, lprev, lnext, S)
            S[PCREF] -= eb
    S[PCSH] -= k * eb
    R[NSH, r] = 0
    S[ADJ] = S[PCREF] - S[PCSH]


def _pc_reconcile(S, ref, lprev, lnext, cap, eb):
    if S[LRUN] == 0:
        return
    over = (S[NEED] + S[OTHER] + S[ADJ]) + eb * S[LRUN] - cap
    while over > 0 and S[LRUN] > 0:
        h = S[LRUH]
        _lru_remove(h, lprev, lnext, S)
        ref[h] = -1
        over -= eb


def _note_marks(t, inclusive, partial, n, a0, inc, t0, marks, work_at, S):
    i = S[NWA]
    while i < marks.shape[0] and (marks[i] < t or (inclusive and marks[i] == t)):
        w = S[WORK]
        if partial:
            w += n * last_k_within(a0, inc, marks[i] - t0)
        work_at[i] = w
        i += 1
    S[NWA] = i


def _release_finish(r, t, R, F, S, run, hoff, hid, ref, lprev, lnext, eb):
    R[ST, r] = _FINISHED
    F[FIN, r] = t
    _pc_release(r, R, S, hoff, hid, ref, lprev, lnext, eb)
    R[BLK, r] = 0
    _list_remove(run, S, NRUN, r)
    S[NRES] -= 1
    S[NFIN] += 1


def _requeue(v, now, R, F, S, SF, C, Fc):
    """The state part of :meth:`Queues._requeue_evicted` (after the resident lists and the prefix cache):
    swapped to host memory while it has room (``engine.preemption: swap``), else recompute."""
    bs = C[C_BS]
    computed = R[BLK, v] if R[PREF, v] == R[TGT, v] else (R[PREF, v] + bs - 1) // bs
    R[ST, v] = _WAITING
    R[BLK, v] = 0
    R[CHK, v] = 0
    R[PREEMPT, v] += 1
    F[WS, v] = now
    S[NPREEMPT] += 1
    if C[C_SWAP] and computed and S[HOSTU] + computed <= C[C_HOSTCAP]:
        R[SWP, v] = 1
        R[SWB, v] = computed
        S[HOSTU] += computed
        S[NSWO] += 1
        SF[PENDING] += computed * Fc[8]
    else:
        R[PREF, v] = 0
        R[TGT, v] = R[PP, v] + R[GEN, v]


def _evict(v, now, R, F, S, cnt, run, pre, hoff, hid, ref, lprev, lnext, bs, eb, SF, C, Fc):
    """:meth:`Queues._evict` + ``_requeue_evicted`` (the caller puts ``v`` in the waiting queue: :func:`_enqueue`)."""
    if R[INC, v]:
        _leave(v, R, S, cnt, bs)
    else:
        S[OTHER] -= R[BLK, v]
        if R[PREF, v] != R[TGT, v]:
            _list_remove(pre, S, NPRE, v)
    _list_remove(run, S, NRUN, v)
    S[NRES] -= 1
    _pc_release(v, R, S, hoff, hid, ref, lprev, lnext, eb)
    _requeue(v, now, R, F, S, SF, C, Fc)


def _enqueue(r, pol, starve, R, F, S, wheap, W, tw, th, toff, Qi, Qf, Hs, Hi):
    """Waiting request ``r`` (arrived, or evicted) into its policy's waiting structure: the static ranks' heap,
    its tenant's heap (vtc), ltr's queue by (waiting since, id) and heap by (score, id), or the sorted waiting
    list of the preemptive policies."""
    if pol == POL_STATIC:
        _wpush(wheap, S, R[RANK, r])
        return
    S[NWAIT] += 1
    if pol == POL_VTC:
        _vtc_push(th, toff, tw, R, F, r)
    elif pol == POL_LTR:
        R[WV, r] += 1                       # its older entries (an earlier wait) are stale from now on
        if starve:
            _q_push(Qi, Qf, S, R, F, r)
        _h_push(Hs, Hi, S, R, F, r)
    else:
        _w_insert(W, S, R, F, r)


def _vtc_push(th, toff, tw, R, F, r):
    """vtc: ``r`` into its tenant's heap of waiting requests by (arrival, id) (``th[toff[u]:toff[u] + tw[u]]``; a
    request waits at most once at a time, so each tenant's part holds its requests)."""
    u = R[TEN, r]
    j = tw[u]
    tw[u] = j + 1
    _isift_up(th, toff[u], j, r, F)


def _vtc_pop(th, toff, tw, F, u):
    """vtc: tenant ``u``'s earliest waiting request leaves its heap (admitted)."""
    n = tw[u] - 1
    tw[u] = n
    _isift_down(th, toff[u], n, F)


def _ltr_valid(Qi, a, R):
    """ltr: entry ``a`` of the queue is its request's current wait."""
    x = Qi[0, a]
    return R[ST, x] == _WAITING and Qi[1, a] == R[WV, x]


def _q_push(Qi, Qf, S, R, F, r):
    """ltr (starvation guard): ``r`` into the queue by (waiting since, id) ``Qi[:, S[QH]:S[QE]]`` (ids, versions;
    ``Qf``: waiting since). Waiting since is the arrival or the eviction time, so an entry goes to the tail but
    for ties; entries that are no longer current (admitted, or an older wait) stay until the head passes them
    (compacted when the array is full). Before ``S[QS]`` every entry is stale or starving."""
    e = S[QE]
    if e == Qf.shape[0]:
        m = 0
        for a in range(S[QH], e):
            if _ltr_valid(Qi, a, R):
                Qi[0, m], Qi[1, m], Qf[m] = Qi[0, a], Qi[1, a], Qf[a]
                m += 1
        e = m
        S[QH] = 0
        S[QS] = 0
    w = F[WS, r]
    p = e
    while p > S[QH] and (Qf[p - 1] > w or (Qf[p - 1] == w and Qi[0, p - 1] > r)):
        Qi[0, p], Qi[1, p], Qf[p] = Qi[0, p - 1], Qi[1, p - 1], Qf[p - 1]
        p -= 1
    Qi[0, p], Qi[1, p], Qf[p] = r, R[WV, r], w
    S[QE] = e + 1
    if p < S[QS]:
        S[QS] = p


def _h_push(Hs, Hi, S, R, F, r):
    """ltr: ``r`` into the heap by (score, id) (``Hs``: scores, ``Hi``: ids, versions); stale entries are dropped
    when they reach the top, or all at once when the heap is full."""
    n = S[NHK]
    if n == Hs.shape[0]:
        m = 0
        for a in range(n):
            x = Hi[0, a]
            if R[ST, x] == _WAITING and Hi[1, a] == R[WV, x]:
                Hs[m], Hi[0, m], Hi[1, m] = Hs[a], x, Hi[1, a]
                m += 1
        for a in range(m // 2 - 1, -1, -1):
            _fsift_down(Hs, Hi[0], Hi[1], a, m)
        n = m
    Hs[n], Hi[0, n], Hi[1, n] = F[KEY, r], r, R[WV, r]
    _fsift_up(Hs, Hi[0], Hi[1], n)
    S[NHK] = n + 1


def _h_pop(Hs, Hi, S):
    n = S[NHK] - 1
    Hs[0], Hi[0, 0], Hi[1, 0] = Hs[n], Hi[0, n], Hi[1, n]
    S[NHK] = n
    _fsift_down(Hs, Hi[0], Hi[1], 0, n)


def _key_after(R, F, tc, pol, a, b):
    """(priority, id) of resident ``a`` > that of ``b`` (vtc: (tenant counter, arrival); else the key)."""
    if pol == POL_VTC:
        ca, cb = tc[R[TEN, a]], tc[R[TEN, b]]
        if ca != cb:
            return ca > cb
        if F[ARR, a] != F[ARR, b]:
            return F[ARR, a] > F[ARR, b]
        return a > b
    if pol >= POL_LAS:                 # ((key, arrival), id), keys refreshed at each decision
        if F[KEY, a] != F[KEY, b]:
            return F[KEY, a] > F[KEY, b]
        if F[ARR, a] != F[ARR, b]:
            return F[ARR, a] > F[ARR, b]
        return a > b
    return F[KEY, a] > F[KEY, b] or (F[KEY, a] == F[KEY, b] and a > b)


def _generated(r, R, S):
    return R[GB, r] + S[CLOCK] if R[INC, r] else R[GEN, r]


def _mlfq_level(r, g, R, mb, mbl):
    j = R[JOIN, r]
    lo = 0
    hi = mbl[j]
    while lo < hi:                     # bisect_right(bounds[j], g)
        mid = (lo + hi) // 2
        if g < mb[j, mid]:
            hi = mid
        else:
            lo = mid + 1
    return j + lo


def _key_of(r, R, F, S, pol, q, mb, mbl):
    """The preemptive policy's priority(r)[0] (its second part is the arrival)."""
    g = _generated(r, R, S)
    if pol == POL_LAS:
        return float(g // q)
    if pol == POL_SRPT:
        return float(R[OO, r] - g)
    if pol == POL_RR:
        return F[TAU, r]
    return float(_mlfq_level(r, g, R, mb, mbl))


def _refresh_keys(run, nrun, R, F, clock, pol, q, mb, mbl):
    """The decode cohort's keys (:func:`_key_of` of each member in ``run[:nrun]``; the others' keys are frozen)."""
    for a in range(nrun):
        r = run[a]
        if R[INC, r]:
            g = R[GB, r] + clock
            if pol == POL_LAS:
                F[KEY, r] = float(g // q)
            elif pol == POL_SRPT:
                F[KEY, r] = float(R[OO, r] - g)
            elif pol == POL_RR:
                F[KEY, r] = F[TAU, r]
            else:
                F[KEY, r] = float(_mlfq_level(r, g, R, mb, mbl))


def _tokens_to_level(r, g, level, R, pol, q, mb, mbl):
    """LAS / MLFQ ``tokens_to_level`` (-1: never)."""
    if pol == POL_LAS:
        if level > g // q:
            t = level * q - g
            return t if t > 1 else 1
        return 0
    j = R[JOIN, r]
    if level <= j:
        return 0
    idx = level - j - 1
    if idx >= mbl[j]:
        return -1
    t = mb[j, idx] - g
    return t if t > 1 else 1


def _kless(R, F, a, b):
    """((key, arrival), id) of ``a`` < that of ``b``."""
    if F[KEY, a] != F[KEY, b]:
        return F[KEY, a] < F[KEY, b]
    if F[ARR, a] != F[ARR, b]:
        return F[ARR, a] < F[ARR, b]
    return a < b


def _bisect(W, lo, hi, R, F, x):
    """The first index of sorted ``W[lo:hi]`` whose request ranks after ``x`` (bisect_right on :func:`_kless`)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if _kless(R, F, x, W[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _w_insert(W, S, R, F, x):
    """Insert waiting request ``x`` into the sorted waiting list ``W[S[WH]:S[WE]]`` (its key is frozen while it
    waits), shifting the shorter side; compacted to the front when the end reaches the array's end."""
    h = S[WH]
    e = S[WE]
    if e == W.shape[0]:
        for a in range(e - h):
            W[a] = W[h + a]
        e -= h
        h = 0
        S[WH] = 0
    pos = _bisect(W, h, e, R, F, x)
    if h > 0 and pos - h < e - pos:
        for a in range(h - 1, pos - 1):
            W[a] = W[a + 1]
        W[pos - 1] = x
        S[WH] = h - 1
        S[WE] = e
        return
    for a in range(e, pos, -1):
        W[a] = W[a - 1]
    W[pos] = x
    S[WE] = e + 1


def _resort(ro, S, R, F):
    """The residents in rank order, in place in ``ro``: the last plan's order (``ro[:S[NRO]]``) less the requests
    that left (finished, evicted), insertion-sorted on the current keys (only the cohort's keys moved since, so
    the list is nearly sorted). Returns their number."""
    m = 0
    for a in range(S[NRO]):
        r = ro[a]
        st = R[ST, r]
        if st == _RUNNING or st == _PAUSED:
            b = m - 1
            while b >= 0 and _kless(R, F, r, ro[b]):
                ro[b + 1] = ro[b]
                b -= 1
            ro[b + 1] = r
            m += 1
    S[NRO] = m
    if m != S[NRUN]:                       # pragma: no cover - every resident is admitted by a ranked plan
        raise AssertionError("the rank order lost a resident")
    return m


def _keep_order(ro, wk, nwk, R, S):
    """The next plan's resident order: the walk's order (``wk[:nwk]``, residents and candidates in rank order)
    less those that are not resident now (candidates left waiting, evicted victims)."""
    m = 0
    for a in range(nwk):
        r = wk[a]
        st = R[ST, r]
        if st == _RUNNING or st == _PAUSED:
            ro[m] = r
            m += 1
    S[NRO] = m


def _admit_need(r, budget, free, R, S, hoff, hid, ref, Hb, eb, pc_on, bs):
    """:meth:`Queues._admit_need` (V1): blocks admitting ``r`` adds, or -1."""
    if R[SWP, r]:
        if R[PREF, r] == R[TGT, r]:                 # resumes decoding
            if budget < 1:
                return -1
            R[CHK, r] = 0
            need = (R[PP, r] + R[GEN, r] + bs - 1) // bs
        else:
            left = R[TGT, r] - R[PREF, r]
            c = left if left < budget else budget
            if c <= 0:
                return -1
            R[CHK, r] = c
            need = (R[PREF, r] + c + bs - 1) // bs
        R[HIT, r] = 0
        return need if need <= free else -1
    target = R[PP, r] + R[GEN, r]
    h = 0
    nfree = 0
    if pc_on:
        h, nfree = _pc_hit(r, target, hoff, hid, ref, Hb)
    e = eb if pc_on else 0
    cached = h * e * bs
    if (target + bs - 1) // bs - h * e + nfree * e > free:
        return -1
    c = target - cached
    if c > budget:
        c = budget
    if c <= 0:
        return -1
    R[CHK, r] = c
    R[HIT, r] = h
    return (c + bs - 1) // bs + nfree * e


def _admit(r, now, R, F, S, run, pre, hoff, hid, ref, lprev, lnext, Hb, eb, pc_on, bs, wq_s, wq_e, SF, Fc, cnt,
           fk, fid, fcv):
    """:meth:`Queues._admit` (V1) and the caller's step: a swapped-out decoder rejoins the cohort, anything
    else goes to the prefill list."""
    R[ST, r] = _RUNNING
    run[S[NRUN]] = r
    S[NRUN] += 1
    S[NRES] += 1
    if F[ADM, r] != F[ADM, r]:
        F[ADM, r] = now
    wq_s[S[NWQ]] = F[WS, r]
    wq_e[S[NWQ]] = now
    S[NWQ] += 1
    if R[SWP, r]:                                   # swapped back in
        S[HOSTU] -= R[SWB, r]
        SF[PENDING] += R[SWB, r] * Fc[8]
        S[NSWI] += 1
        R[SWP, r] = 0
        R[SWB, r] = 0
        if R[PREF, r] == R[TGT, r]:
            _join(r, R, S, cnt, fk, fid, fcv, bs)
            return
        R[BLK, r] = (R[PREF, r] + R[CHK, r] + bs - 1) // bs
        S[OTHER] += R[BLK, r]
        pre[S[NPRE]] = r
        S[NPRE] += 1
        return
    target = R[PP, r] + R[GEN, r]
    R[TGT, r] = target
    c = R[CHK, r]
    cached = 0
    if pc_on:
        cached = R[HIT, r] * Hb
        S[PCQ] += target
        S[PCHIT] += cached
        if R[HIT, r]:
            _pc_take(r, R[HIT, r], R, S, hoff, hid, ref, lprev, lnext, eb)
        _pc_register(r, cached + c, R, S, hoff, hid, ref, lprev, lnext, Hb, eb)
    R[PREF, r] = cached
    if cached > R[HIGH, r]:
        R[HIGH, r] = cached
    R[BLK, r] = (cached + c + bs - 1) // bs
    S[OTHER] += R[BLK, r]
    pre[S[NPRE]] = r
    S[NPRE] += 1


def _plan_ranked(now, C, Fc, SF, R, F, S, cnt, fk, fid, fcv, run, pre, paused, hoff, hid, ref, lprev, lnext,
                 wq_s, wq_e, ro, W, cands, placed, disp, resumed, tw, wk, pend):
    """:meth:`Batching._plan_ranked` (V1; the one-by-one walk over the residents in rank order, :func:`_resort`,
    merged with the sorted waiting list ``W``). Returns the iteration's prompt tokens."""
    bs, cap, B, max_seqs = C[C_BS], C[C_CAP], C[C_B], C[C_MAXSEQS]
    pc_on, Hb, eb = C[C_PC], C[C_HB], C[C_EB]
    if pc_on:
        _pc_reconcile(S, ref, lprev, lnext, cap, eb)
    nr = _resort(ro, S, R, F)
    wh = S[WH]
    nw = S[WE] - wh
    free = cap
    slots = max_seqs
    nc = npl = nd = nres = nwk = 0
    n_dec = 0
    clock = S[CLOCK]
    i = j = 0
    wopen = nw > 0
    while i < nr or (wopen and j < nw):
        if wopen and j < nw and (i >= nr or _kless(R, F, W[wh + j], ro[i])):
            r = W[wh + j]
            need = -1
            if slots > 0:
                if R[SWP, r] and R[PREF, r] != R[TGT, r]:                # _gate_blocks
                    need = (R[TGT, r] + bs - 1) // bs
                else:
                    need = (R[PP, r] + R[GEN, r] + bs - 1) // bs
                if need > free:
                    need = -1
            if need < 0:
                wopen = False
                continue
            j += 1
            free -= need
            slots -= 1
            cands[nc] = r
            nc += 1
            wk[nwk] = r
            nwk += 1
            continue
        r = ro[i]
        i += 1
        wk[nwk] = r
        nwk += 1
        if R[INC, r]:
            need = (R[PP, r] + R[GB, r] + clock + bs - 1) // bs
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
                n_dec += 1
            else:
                disp[nd] = r
                nd += 1
            continue
        if R[PREF, r] == R[TGT, r]:           # a paused decoder
            need = (R[PP, r] + R[GEN, r] + bs - 1) // bs
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
                n_dec += 1
                resumed[nres] = r
                nres += 1
            else:
                disp[nd] = r
                nd += 1
            continue
        need = (R[TGT, r] + bs - 1) // bs
        if slots > 0 and need <= free:
            free -= need
            slots -= 1
            placed[npl] = r
            npl += 1
        else:
            disp[nd] = r
            nd += 1
    reserved = cap - free
    for a in range(nd):
        r = disp[a]
        R[CHK, r] = 0
        if R[INC, r]:
            _leave(r, R, S, cnt, bs)
            R[BLK, r] = (R[PP, r] + R[GEN, r] - 1 + bs - 1) // bs
    held = 0
    for a in range(nd):
        held += R[BLK, disp[a]]
    npend = 0
    while nd > 0 and reserved + held > cap:
        nd -= 1                                # the displaced are in rank order: the victim is the last
        v = disp[nd]
        held -= R[BLK, v]
        # _requeue_evicted (out of the cohort and the prefill list already)
        if R[PREF, v] != R[TGT, v]:
            _list_remove(pre, S, NPRE, v)
        _list_remove(paused, S, NPAUSED, v)
        _list_remove(run, S, NRUN, v)
        S[NRES] -= 1
        _pc_release(v, R, S, hoff, hid, ref, lprev, lnext, eb)
        _requeue(v, now, R, F, S, SF, C, Fc)
        S[NWAIT] += 1
        pend[npend] = v                        # into the waiting list after the admissions (a prefix of W)
        npend += 1
    for a in range(nres):
        r = resumed[a]
        R[ST, r] = _RUNNING
        _join(r, R, S, cnt, fk, fid, fcv, bs)
    b = B - n_dec
    if b < 0:
        b = 0
    pf_tokens = 0
    other = held
    for a in range(npl):
        r = placed[a]
        left = R[TGT, r] - R[PREF, r]
        c = left if left < b else b
        R[CHK, r] = c
        R[ST, r] = _RUNNING
        b -= c
        pf_tokens += c
        R[BLK, r] = (R[PREF, r] + c + bs - 1) // bs
        other += R[BLK, r]
        if c and pc_on:
            _pc_register(r, R[PREF, r] + c, R, S, hoff, hid, ref, lprev, lnext, Hb, eb)
    S[OTHER] = other
    S[NPRE] = 0
    for a in range(npl):
        pre[a] = placed[a]
    S[NPRE] = npl
    if pc_on:
        _pc_reconcile(S, ref, lprev, lnext, cap, eb)
    free = cap - (S[NEED] + S[OTHER] + S[ADJ])
    for a in range(nc):                        # vLLM's admission: its gate on the blocks free now
        r = cands[a]
        need = _admit_need(r, b, free, R, S, hoff, hid, ref, Hb, eb, pc_on, bs) if b > 0 else -1
        if need < 0:
            break
        pf_tokens += R[CHK, r]
        b -= R[CHK, r] if R[CHK, r] else 1
        S[NWAIT] -= 1
        _admit(r, now, R, F, S, run, pre, hoff, hid, ref, lprev, lnext, Hb, eb, pc_on, bs, wq_s, wq_e, SF, Fc, cnt,
               fk, fid, fcv)
        free = cap - (S[NEED] + S[OTHER] + S[ADJ])
        if pc_on:
            _pc_reconcile(S, ref, lprev, lnext, cap, eb)
        S[WH] += 1                             # cands[a] is the waiting list's head
    for a in range(npend):
        _w_insert(W, S, R, F, pend[a])
    _keep_order(ro, wk, nwk, R, S)
    S[NPAUSED] = 0
    for a in range(nd):
        r = disp[a]
        if R[ST, r] == _RUNNING:
            R[ST, r] = _PAUSED
            S[NPAUSE] += 1
        if R[PREF, r] != R[TGT, r]:
            pre[S[NPRE]] = r
            S[NPRE] += 1
        paused[a] = r
    S[NPAUSED] = nd
    if pc_on:
        _pc_reconcile(S, ref, lprev, lnext, cap, eb)
    return pf_tokens


def _admit_need_v0(r, budget, pf_tokens, admitted, free, R, B, bs, chunked):
    """:meth:`Queues._admit_need` under V0 (no prefix caching): blocks admitting ``r`` adds, or -1."""
    if R[SWP, r]:
        if R[PREF, r] == R[TGT, r]:
            if chunked and budget < 1:
                return -1
            R[CHK, r] = 0
            need = (R[PP, r] + R[GEN, r] + bs - 1) // bs
        else:
            left = R[TGT, r] - R[PREF, r]
            if chunked:
                c = left if left < budget else budget
                if c <= 0:
                    return -1
            else:
                c = left
                if admitted and pf_tokens + c > B:
                    return -1
            R[CHK, r] = c
            need = (R[TGT, r] + bs - 1) // bs
        R[HIT, r] = 0
        return need if need <= free else -1
    target = R[PP, r] + R[GEN, r]
    if chunked:
        c = target if target < budget else budget
        if c <= 0:
            return -1
    else:
        c = target
        if admitted and pf_tokens + c > B:
            return -1
    R[CHK, r] = c
    R[HIT, r] = 0
    need = (target + bs - 1) // bs
    return need if need <= free else -1


def _plan_v0_preemptive(now, C, Fc, SF, R, F, S, cnt, fk, fid, fcv, run, pre, paused, wq_s, wq_e, ro, W,
                        placed, disp, resumed, wk):
    """The V0 branch of :meth:`Batching._plan_preemptive` (no prefix caching under V0): one walk in rank
    order admitting, resuming and placing as it goes. Returns the iteration's prompt tokens."""
    bs, cap, B, max_seqs = C[C_BS], C[C_CAP], C[C_B], C[C_MAXSEQS]
    chunked = C[C_CHUNKED]
    nr = _resort(ro, S, R, F)
    wh = S[WH]
    nw = S[WE] - wh
    if chunked:
        n_dec = S[NCOH]
        for a in range(S[NPAUSED]):
            r = paused[a]
            if R[PREF, r] == R[TGT, r]:
                n_dec += 1
        b = B - n_dec
        if b < 0:
            b = 0
    else:
        b = B
    free = cap - S[ADJ]
    slots = max_seqs
    pf_tokens = 0
    admitted = 0
    npl = nd = nres = nwk = 0
    clock = S[CLOCK]
    i = j = 0
    wopen = nw > 0
    while i < nr or (wopen and j < nw):
        if wopen and j < nw and (i >= nr or _kless(R, F, W[wh + j], ro[i])):
            r = W[wh + j]
            need = _admit_need_v0(r, b, pf_tokens, admitted, free, R, B, bs, chunked) if slots > 0 else -1
            if need < 0:
                wopen = False
                continue
            j += 1
            wk[nwk] = r
            nwk += 1
            free -= need
            slots -= 1
            admitted += 1
            pf_tokens += R[CHK, r]
            b -= R[CHK, r] if R[CHK, r] else (1 if chunked else 0)
            S[NWAIT] -= 1
            # _admit (V0)
            R[ST, r] = _RUNNING
            run[S[NRUN]] = r
            S[NRUN] += 1
            S[NRES] += 1
            if F[ADM, r] != F[ADM, r]:
                F[ADM, r] = now
            wq_s[S[NWQ]] = F[WS, r]
            wq_e[S[NWQ]] = now
            S[NWQ] += 1
            if R[SWP, r]:
                S[HOSTU] -= R[SWB, r]
                SF[PENDING] += R[SWB, r] * Fc[8]
                S[NSWI] += 1
                R[SWP, r] = 0
                R[SWB, r] = 0
                if R[PREF, r] == R[TGT, r]:
                    resumed[nres] = r
                    nres += 1
                    continue
                R[BLK, r] = (R[TGT, r] + bs - 1) // bs
                placed[npl] = r
                npl += 1
                continue
            target = R[PP, r] + R[GEN, r]
            R[TGT, r] = target
            R[PREF, r] = 0
            R[BLK, r] = (target + bs - 1) // bs
            placed[npl] = r
            npl += 1
            continue
        r = ro[i]
        i += 1
        wk[nwk] = r
        nwk += 1
        if R[INC, r]:
            need = (R[PP, r] + R[GB, r] + clock + bs - 1) // bs
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
            else:
                disp[nd] = r
                nd += 1
            continue
        left = R[TGT, r] - R[PREF, r]
        if left == 0:                      # a paused decoder
            need = (R[PP, r] + R[GEN, r] + bs - 1) // bs
            if slots > 0 and need <= free:
                free -= need
                slots -= 1
                R[ST, r] = _RUNNING
                resumed[nres] = r
                nres += 1
            else:
                disp[nd] = r
                nd += 1
            continue
        c = left if left < b else b
        need = R[BLK, r]
        if slots > 0 and need <= free:
            free -= need
            slots -= 1
            R[ST, r] = _RUNNING
            R[CHK, r] = c
            b -= c
            pf_tokens += c
            placed[npl] = r
            npl += 1
        else:
            disp[nd] = r
            nd += 1
    S[WH] = wh + j                         # the admitted: a prefix of the waiting list
    for a in range(nd):
        r = disp[a]
        if R[INC, r]:
            _leave(r, R, S, cnt, bs)
    for a in range(nres):
        _join(resumed[a], R, S, cnt, fk, fid, fcv, bs)
    for a in range(npl):
        pre[a] = placed[a]
    S[NPRE] = npl
    S[NPAUSED] = 0
    other = 0
    for a in range(npl):
        other += R[BLK, placed[a]]
    for a in range(nd):
        R[CHK, disp[a]] = 0
        other += R[BLK, disp[a]]
    S[OTHER] = other
    while S[NEED] + S[OTHER] + S[ADJ] > cap and nd > 0:
        nd -= 1                            # the displaced are in rank order: the victim is the last
        v = disp[nd]
        S[OTHER] -= R[BLK, v]
        _list_remove(run, S, NRUN, v)
        S[NRES] -= 1
        _requeue(v, now, R, F, S, SF, C, Fc)
        S[NWAIT] += 1
        _w_insert(W, S, R, F, v)
    _keep_order(ro, wk, nwk, R, S)
    for a in range(nd):
        r = disp[a]
        if R[ST, r] == _RUNNING:
            R[ST, r] = _PAUSED
            S[NPAUSE] += 1
        if R[PREF, r] != R[TGT, r]:
            pre[S[NPRE]] = r
            S[NPRE] += 1
        paused[a] = r
    S[NPAUSED] = nd
    return pf_tokens


def _chunks(budget, R, F, S, pre, tc, pol, frz):
    """:meth:`Batching._chunks` (prefills in (priority, id) order; skipped ones get no chunk; ``frz`` keeps its
    chunk: vLLM fixed it before its allocation failed)."""
    n = S[NPRE]
    if n > 1:
        for a in range(1, n):
            x = pre[a]
            b = a - 1
            while b >= 0 and _key_after(R, F, tc, pol, pre[b], x):
                pre[b + 1] = pre[b]
                b -= 1
            pre[b + 1] = x
    for a in range(n):
        r = pre[a]
        if S[NSKIP] and R[SKF, r]:
            R[CHK, r] = 0
            continue
        left = R[TGT, r] - R[PREF, r]
        if r == frz:
            c = R[CHK, r]
        else:
            c = left if left < budget else budget
        R[CHK, r] = c
        budget -= c
    return budget


def _vtc_heads(th, toff, tw, thead, ntn):
    """Each tenant's earliest waiting request by (arrival, id) (``thead``; where ``tw`` > 0): its heap's top."""
    for u in range(ntn):
        thead[u] = th[toff[u]] if tw[u] > 0 else -1


def _ltr_next(now, starve_s, Qi, Qf, S, R):
    """ltr: the next admission candidate from the starving requests (the queue's first current entry, when it
    starves), or -1."""
    h = S[QH]
    while h < S[QE] and not _ltr_valid(Qi, h, R):
        h += 1
    S[QH] = h
    if S[QS] < h:
        S[QS] = h
    if h < S[QE] and now >= Qf[h] + starve_s:
        return Qi[0, h]
    return -1


def _loop(C, Fc, H, R, F, order, arr_t, suffix, by_rank, hoff, hid, marks, work_at, mb, mbl):
    """The engine's server loop (:meth:`Engine._server` with ``_plan`` and ``_commit``) for the runs
    :func:`unsupported` accepts. Returns (status, end_time, S, SF, wq_start, wq_end, trace floats, trace ints)."""
    n = R.shape[1]
    bs, cap, B, max_seqs = C[C_BS], C[C_CAP], C[C_B], C[C_MAXSEQS]
    pc_on, Hb, eb, n_arr, varr, trace_on = C[C_PC], C[C_HB], C[C_EB], C[C_NARR], C[C_VARR], C[C_TRACE]
    pol, starve, starve_s = C[C_POL], C[C_STARVE], Fc[7]
    v1, chunked = C[C_V1], C[C_CHUNKED]
    ntn, w_prompt, w_out = C[C_NTEN], C[C_WP], C[C_WO]
    # the arrays the helpers take are borrowed views (no reference counting on each call: :func:`_borrowed`) of
    # the arguments (the caller holds them) and of one integer and one float buffer, which the returned S and SF
    # (views of them) keep alive to the end
    R, F, C, Fc, order, arr_t = _borrowed(R), _borrowed(F), _borrowed(C), _borrowed(Fc), _borrowed(order), \
        _borrowed(arr_t)
    suffix, by_rank, hoff, hid = _borrowed(suffix), _borrowed(by_rank), _borrowed(hoff), _borrowed(hid)
    marks, work_at, mb, mbl = _borrowed(marks), _borrowed(work_at), _borrowed(mb), _borrowed(mbl)
    nt = ntn if ntn > 0 else 1
    lq = 2 * n + 2 if pol == POL_LTR else 1
    nh = hid.shape[0]
    nhe = 1
    for a in range(nh):
        if hid[a] + 1 > nhe:
            nhe = hid[a] + 1
    fcap = 2 * n + 16
    ws = np.empty(N_S + 4 * nt + 11 * n + (2 * n + 2) + (2 * n + 1) + (ntn + 1 if ntn > 0 else 1)
                  + (n if pol == POL_VTC else 1) + 4 * lq + bs + 3 * nhe + 3 * fcap + (n + 1), np.int64)
    wsf = np.empty(2 + 2 * lq, np.float64)
    S_out = ws[:N_S]                   # returned
    SF_out = wsf[:2]
    S, o = _part(ws, 0, N_S)
    SF, of = _part(wsf, 0, 2)
    S[:] = 0
    SF[:] = 0.0
    tc, o = _part(ws, o, nt)           # vtc: the tenants' counters
    tw, o = _part(ws, o, nt)           # vtc: waiting requests per tenant
    thead, o = _part(ws, o, nt)        # vtc: each tenant's earliest waiting request
    tin, o = _part(ws, o, nt)          # vtc: decoding requests per tenant
    tc[:] = 0
    tw[:] = 0
    tin[:] = 0
    last_left = -1
    qtok = C[C_Q]
    paused, o = _part(ws, o, n)
    ro, o = _part(ws, o, n)            # preemptive policies: the residents in the last plan's rank order
    W, o = _part(ws, o, 2 * n + 2)     # preemptive policies: the waiting requests, sorted (W[S[WH]:S[WE]])
    wk, o = _part(ws, o, 2 * n + 1)    # a ranked plan's walk
    pend, o = _part(ws, o, n)
    cands, o = _part(ws, o, n)
    placed, o = _part(ws, o, n)
    disp, o = _part(ws, o, n)
    resumed, o = _part(ws, o, n)
    # vtc: each tenant's waiting requests, a heap by (arrival, id) in th[toff[u]:toff[u] + tw[u]]
    toff, o = _part(ws, o, ntn + 1 if ntn > 0 else 1)
    toff[:] = 0
    if pol == POL_VTC:
        for r in range(n):
            toff[R[TEN, r] + 1] += 1
        for u in range(ntn):
            toff[u + 1] += toff[u]
    th, o = _part(ws, o, n if pol == POL_VTC else 1)
    # ltr: the waiting requests by (waiting since, id) (starvation guard) and by (score, id)
    Qi, o = _part(ws, o, 2 * lq)
    Qi = Qi.reshape((2, lq))
    Hi, o = _part(ws, o, 2 * lq)
    Hi = Hi.reshape((2, lq))
    Qf, of = _part(wsf, of, lq)
    Hs, of = _part(wsf, of, lq)
    ckv = Fc[3]
    INF = math.inf
    S[LRUH] = -1
    S[LRUT] = -1
    cnt, o = _part(ws, o, bs)
    cnt[:] = 0
    ref, o = _part(ws, o, nhe)
    lprev, o = _part(ws, o, nhe)
    lnext, o = _part(ws, o, nhe)
    for a in range(nhe):
        ref[a] = -1
        lprev[a] = -1
        lnext[a] = -1
    fk, o = _part(ws, o, fcap)
    fid, o = _part(ws, o, fcap)
    fcv, o = _part(ws, o, fcap)
    run, o = _part(ws, o, n)           # residents in running (admission) order
    pre, o = _part(ws, o, n)           # residents in prefill
    skl, o = _part(ws, o, n)           # residents skipped in this step
    wheap, o = _part(ws, o, n + 1)
    adds, o = _part(ws, o, n)
    if o != ws.shape[0]:                   # pragma: no cover - the parts fill the buffer exactly
        raise AssertionError("the work buffer's parts do not add up")
    wq_s = np.empty(2 * n + 16, np.float64)
    wq_e = np.empty(2 * n + 16, np.float64)
    nwq = 0
    tr_f = np.empty((16 if trace_on else 1, 2), np.float64)
    tr_i = np.empty((16 if trace_on else 1, 5), np.int64)
    ntr = 0
    status = OK
    end_time = 0.0
    now = 0.0
    a0 = 0.0
    inc = 0.0
    while True:
        # ---- arrivals up to now
        if S[CURSOR] < n_arr and arr_t[S[CURSOR]] <= now:
            c = S[CURSOR]
            while c < n_arr and arr_t[c] <= now:
                r = order[c]
                c += 1
                if r >= S[LVHI]:
                    S[LVHI] = r + 1
                if R[NFITS, r]:
                    R[ST, r] = _REJECTED
                    continue
                R[ST, r] = _WAITING
                F[WS, r] = F[ARR, r]
                if pol == POL_VTC:          # VTC.on_arrival: lift an idle tenant's counter
                    t = R[TEN, r]
                    if tw[t] == 0:
                        lo = -1
                        for u in range(ntn):
                            if tw[u] > 0 and (lo < 0 or tc[u] < tc[lo]):
                                lo = u
                        if lo >= 0:
                            if tc[lo] > tc[t]:
                                tc[t] = tc[lo]
                        elif last_left >= 0 and tc[last_left] > tc[t]:
                            tc[t] = tc[last_left]
                if pol >= POL_LAS:          # its key is frozen while it waits (it generates nothing)
                    F[KEY, r] = _key_of(r, R, F, S, pol, qtok, mb, mbl)
                if pol == POL_STATIC:       # (the call with fewer arrays: each call counts their references)
                    _wpush(wheap, S, R[RANK, r])
                else:
                    _enqueue(r, pol, starve, R, F, S, wheap, W, tw, th, toff, Qi, Qf, Hs, Hi)
            S[CURSOR] = c
        if S[NRES] == 0 and S[NWAIT] == 0:
            if S[CURSOR] >= n_arr:
                end_time = now
                break
            t = arr_t[S[CURSOR]]
            _note_marks(t, False, False, 0, 0.0, 0.0, 0.0, marks, work_at, S)
            now = t
            continue
        S[NDEC] += 1
        # live requests (waiting, running, paused) have ids in [S[LVLO], S[LVHI]): every ingested id is below
        # LVHI, and LVLO passes only a prefix of ids that have finished or been rejected (final states), so the
        # scans below visit the same live requests in the same order as a scan of every id
        lv = S[LVLO]
        while lv < S[LVHI] and (R[ST, lv] == _FINISHED or R[ST, lv] == _REJECTED):
            lv += 1
        S[LVLO] = lv
        if nwq + n + 1 > wq_s.shape[0]:            # room for this decision's admissions
            wq_s = np.concatenate((wq_s, np.empty(nwq + n + 1, np.float64)))
            wq_e = np.concatenate((wq_e, np.empty(nwq + n + 1, np.float64)))
        ranked = False
        if pol >= POL_LAS:
            # (priority, id) fresh: only the cohort's keys move (a request's key changes only as it generates;
            # one that completes its prefill joins the cohort or finishes), the others' were set when they last
            # generated or arrived
            _refresh_keys(run, S[NRUN], R, F, S[CLOCK], pol, qtok, mb, mbl)
            if v1:
                ranked = S[NWAIT] > 0 or S[NPAUSED] > 0 or S[NEED] + S[OTHER] > cap
            else:
                ranked = S[NWAIT] > 0 or S[NPAUSED] > 0 or S[NEED] + S[OTHER] + S[ADJ] > cap
        # ---- plan (:meth:`Batching._plan`, V1, non-preemptive; preemptive policies when nobody is
        # outside the batch and every resident's blocks fit, else :meth:`Batching._plan_ranked`)
        preempted = False
        pf_tokens = 0
        free = 0
        extra = 0
        total = 0
        budget = B
        if ranked:
            S[NWQ] = nwq
            if not v1:
                S[NWQ] = nwq
                pf_tokens = _plan_v0_preemptive(now, C, Fc, SF, R, F, S, cnt, fk, fid, fcv, run, pre, paused, wq_s,
                                                wq_e, ro, W, placed, disp, resumed, wk)
            else:
                pf_tokens = _plan_ranked(now, C, Fc, SF, R, F, S, cnt, fk, fid, fcv, run, pre, paused, hoff, hid, ref,
                                         lprev, lnext, wq_s, wq_e, ro, W, cands, placed, disp, resumed, tw, wk, pend)
            nwq = S[NWQ]
            free = cap - (S[NEED] + S[OTHER] + S[ADJ])
        while not ranked:
            if S[NSKIP]:                                    # _unskip
                for a in range(S[NSKIP]):
                    r = skl[a]
                    R[SKF, r] = 0
                    if R[PREF, r] == R[TGT, r] and (R[ST, r] == _RUNNING or R[ST, r] == _PAUSED):
                        S[OTHER] -= R[BLK, r]
                        _join(r, R, S, cnt, fk, fid, fcv, bs)
                S[NSKIP] = 0
            if pc_on:
                _pc_reconcile(S, ref, lprev, lnext, cap, eb)
            budget = B
            preempted = False
            extra = 0
            total = 0
            frz = -1      # the prefill whose allocation failed: vLLM keeps its chunk while preempting for it
            while True:
                if chunked:
                    b0 = B - S[NCOH]
                    budget = _chunks(b0 if b0 > 0 else 0, R, F, S, pre, tc, pol, frz)
                    if v1:
                        extra = 0
                        for a in range(S[NPRE]):
                            r = pre[a]
                            extra += (R[PREF, r] + R[CHK, r] + bs - 1) // bs - R[BLK, r]
                total = S[NEED] + S[OTHER] + extra + S[ADJ]
                if total <= cap:
                    break
                # the victim among the residents (running order)
                nr = S[NRUN]
                v = -1
                for a in range(nr):
                    r = run[a]
                    if v < 0:
                        v = r
                    elif varr:
                        if F[ARR, r] > F[ARR, v]:
                            v = r
                    elif _key_after(R, F, tc, pol, r, v):
                        v = r
                preempted = True
                if v1 and S[NSKIP] == 0:
                    # _first_misfit
                    clock = S[CLOCK]
                    for a in range(nr):
                        r = run[a]
                        if R[INC, r]:
                            g = R[GB, r] + clock
                            adds[a] = 1 if (R[PP, r] + g - 1) % bs == 0 else 0
                        elif R[CHK, r]:
                            adds[a] = (R[PREF, r] + R[CHK, r] + bs - 1) // bs - R[BLK, r]
                        else:
                            adds[a] = 0
                    over = total - cap
                    later = 0
                    i = 0
                    for a in range(nr - 1, -1, -1):
                        if over - later <= 0:
                            i = a + 1
                            break
                        later += adds[a]
                    if run[i] != v and R[CHK, run[i]] and not R[INC, run[i]]:
                        frz = run[i]
                    if run[i] == v:
                        nskip = nr - i - 1
                        for a in range(nskip):
                            skl[a] = run[i + 1 + a]
                        _evict(v, now, R, F, S, cnt, run, pre, hoff, hid, ref, lprev, lnext, bs, eb, SF, C, Fc)
                        if pol == POL_STATIC:
                            _wpush(wheap, S, R[RANK, v])
                        else:
                            _enqueue(v, pol, starve, R, F, S, wheap, W, tw, th, toff, Qi, Qf, Hs, Hi)
                        for a in range(nskip):                 # _skip
                            r = skl[a]
                            if R[INC, r]:
                                _leave(r, R, S, cnt, bs)
                                R[BLK, r] = (R[PP, r] + R[GEN, r] - 1 + bs - 1) // bs
                                S[OTHER] += R[BLK, r]
                            else:
                                R[CHK, r] = 0
                            R[SKF, r] = 1
                        S[NSKIP] = nskip
                        S[ONESTEP] = 1
                        continue
                _evict(v, now, R, F, S, cnt, run, pre, hoff, hid, ref, lprev, lnext, bs, eb, SF, C, Fc)
                if pol == POL_STATIC:
                    _wpush(wheap, S, R[RANK, v])
                else:
                    _enqueue(v, pol, starve, R, F, S, wheap, W, tw, th, toff, Qi, Qf, Hs, Hi)
            if S[NSKIP] and S[NCOH] == 0:
                anyc = False
                for a in range(S[NPRE]):
                    if R[CHK, pre[a]]:
                        anyc = True
                if not anyc:
                    continue                                   # vLLM: an empty step; schedule() again
            break
        for a in range(S[NPRE] if not ranked and v1 else 0):
            r = pre[a]
            if R[CHK, r]:
                R[BLK, r] = (R[PREF, r] + R[CHK, r] + bs - 1) // bs
                if pc_on:
                    _pc_register(r, R[PREF, r] + R[CHK, r], R, S, hoff, hid, ref, lprev, lnext, Hb, eb)
        if not ranked:
            S[OTHER] += extra
            if pc_on:
                _pc_reconcile(S, ref, lprev, lnext, cap, eb)
                total = S[NEED] + S[OTHER] + S[ADJ]
            free = cap - total
            if chunked:
                for a in range(S[NPRE]):
                    pf_tokens += R[CHK, pre[a]]
            if v1 and preempted and S[NWAIT]:
                S[ONESTEP] = 1
        slots = max_seqs - S[NRES]
        admitted = 0
        if not ranked and S[NWAIT] and slots > 0 and not (v1 and preempted):
            src = 0
            while S[NWAIT] > 0:
                if slots <= 0:
                    break
                if pol == POL_STATIC:
                    r = by_rank[wheap[0]]
                elif pol == POL_VTC:       # the earliest request of the tenant with the smallest counter
                    _vtc_heads(th, toff, tw, thead, ntn)
                    r = -1
                    for u in range(ntn):
                        if tw[u] > 0:
                            h0 = thead[u]
                            if r < 0:
                                r = h0
                            else:
                                cu, cr = tc[u], tc[R[TEN, r]]
                                if cu < cr or (cu == cr and (F[ARR, h0] < F[ARR, r]
                                                             or (F[ARR, h0] == F[ARR, r] and h0 < r))):
                                    r = h0
                    if r < 0:
                        break
                elif pol == POL_LTR:       # starving (oldest first), then by score; ties by id
                    r = _ltr_next(now, starve_s, Qi, Qf, S, R) if starve else -1
                    src = 0
                    if r < 0:
                        while S[NHK] > 0:
                            x = Hi[0, 0]
                            if R[ST, x] == _WAITING and Hi[1, 0] == R[WV, x] and not (starve and now >= F[WS, x] + starve_s):
                                break
                            _h_pop(Hs, Hi, S)      # no longer waiting, or starving (then it is in the queue's order)
                        if S[NHK] == 0:
                            break
                        r = Hi[0, 0]
                        src = 1
                else:                      # preemptive policies admit in their ranked plans only
                    break
                # _admit_need
                target = R[PP, r] + R[GEN, r]
                if R[SWP, r]:               # swapped out: its KV comes back
                    if R[PREF, r] == R[TGT, r]:
                        if chunked and budget < 1:
                            break
                        c = 0
                        need = (R[PP, r] + R[GEN, r] + bs - 1) // bs
                    else:
                        left = R[TGT, r] - R[PREF, r]
                        if chunked:
                            c = left if left < budget else budget
                            if c <= 0:
                                break
                        else:
                            c = left
                            if admitted and pf_tokens + c > B:
                                break
                        need = ((R[PREF, r] + c if v1 else R[TGT, r]) + bs - 1) // bs
                    R[CHK, r] = c
                    R[HIT, r] = 0
                    if need > free:
                        break
                elif v1:
                    h = 0
                    nfree = 0
                    if pc_on:
                        h, nfree = _pc_hit(r, target, hoff, hid, ref, Hb)
                    e = eb if pc_on else 0
                    cached = h * e * bs
                    if (target + bs - 1) // bs - h * e + nfree * e > free:
                        break
                    c = target - cached
                    if c > budget:
                        c = budget
                    if c <= 0:
                        break
                    R[CHK, r] = c
                    R[HIT, r] = h
                    need = (c + bs - 1) // bs + nfree * e
                else:                       # V0: the whole prefill's blocks at admission
                    if chunked:
                        c = target if target < budget else budget
                        if c <= 0:
                            break
                    else:
                        c = target
                        if admitted and pf_tokens + c > B:     # a longer prompt is prefilled alone
                            break
                    R[CHK, r] = c
                    R[HIT, r] = 0
                    need = (target + bs - 1) // bs
                    if need > free:
                        break
                if pol == POL_STATIC:
                    _wpop(wheap, S)
                else:
                    if pol == POL_LTR:
                        if src:
                            _h_pop(Hs, Hi, S)
                        else:
                            S[QH] += 1
                    S[NWAIT] -= 1
                free -= need
                slots -= 1
                admitted += 1
                pf_tokens += c
                budget -= c if c else 1
                # _admit
                R[ST, r] = _RUNNING
                if pol == POL_VTC:          # VTC.on_admit: charge the prompt at the first admission
                    t = R[TEN, r]
                    _vtc_pop(th, toff, tw, F, t)
                    if tw[t] == 0:
                        last_left = t
                    if not R[CHG, r]:
                        R[CHG, r] = 1
                        tc[t] += w_prompt * R[PP, r]
                run[S[NRUN]] = r
                S[NRUN] += 1
                S[NRES] += 1
                if F[ADM, r] != F[ADM, r]:
                    F[ADM, r] = now
                if nwq == wq_s.shape[0]:
                    wq_s = np.concatenate((wq_s, np.empty(nwq, np.float64)))
                    wq_e = np.concatenate((wq_e, np.empty(nwq, np.float64)))
                wq_s[nwq] = F[WS, r]
                wq_e[nwq] = now
                nwq += 1
                if R[SWP, r]:               # swapped back in
                    S[HOSTU] -= R[SWB, r]
                    SF[PENDING] += R[SWB, r] * Fc[8]
                    S[NSWI] += 1
                    R[SWP, r] = 0
                    R[SWB, r] = 0
                    if R[PREF, r] == R[TGT, r]:
                        _join(r, R, S, cnt, fk, fid, fcv, bs)
                    else:
                        R[BLK, r] = ((R[PREF, r] + c if v1 else R[TGT, r]) + bs - 1) // bs
                        S[OTHER] += R[BLK, r]
                        pre[S[NPRE]] = r
                        S[NPRE] += 1
                    if pc_on:
                        free = cap - (S[NEED] + S[OTHER] + S[ADJ])
                        _pc_reconcile(S, ref, lprev, lnext, cap, eb)
                    continue
                R[TGT, r] = target
                cached = 0
                if pc_on:
                    cached = R[HIT, r] * Hb
                    S[PCQ] += target
                    S[PCHIT] += cached
                    if R[HIT, r]:
                        _pc_take(r, R[HIT, r], R, S, hoff, hid, ref, lprev, lnext, eb)
                    _pc_register(r, cached + c, R, S, hoff, hid, ref, lprev, lnext, Hb, eb)
                R[PREF, r] = cached
                if cached > R[HIGH, r]:
                    R[HIGH, r] = cached
                R[BLK, r] = (cached + c + bs - 1) // bs if v1 else (target + bs - 1) // bs
                S[OTHER] += R[BLK, r]
                pre[S[NPRE]] = r
                S[NPRE] += 1
                if pc_on:
                    free = cap - (S[NEED] + S[OTHER] + S[ADJ])
                    _pc_reconcile(S, ref, lprev, lnext, cap, eb)
        # ---- the iteration (:meth:`Iterations._iteration`)
        used = cap - free
        if used > cap:
            status = ERR_KV
            end_time = now
            break
        S[USED] = used
        if used > S[MAXUSED]:
            S[MAXUSED] = used
        kind = 0
        k = 1
        n_dec = S[NCOH]
        C0 = 0
        if pf_tokens:
            ctx = 0
            pairs = 0
            for a in range(S[NPRE]):
                r = pre[a]
                c = R[CHK, r]
                if c:
                    p0 = R[PREF, r]
                    ctx += p0 + c
                    pairs += c * p0 + c * (c + 1) // 2
            if chunked:
                ctx += S[SL] + n_dec * S[CLOCK]
                kind = 1
            else:
                n_dec = 0
                kind = 2              # whole-prompt prefill-first: the cohort waits for this iteration
            C0 = ctx
            dt = iteration_time(Fc, pf_tokens, n_dec, ctx, pairs if Fc[4] else 0) + SF[PENDING]
            if now + dt > H:
                end_time = H
                break
        else:
            if n_dec == 0:
                status = ERR_PROGRESS
                end_time = now
                break
            C0 = S[SL] + n_dec * S[CLOCK]
            a0 = iteration_time(Fc, 0, n_dec, C0, 0)
            if SF[PENDING] or S[ONESTEP]:
                S[ONESTEP] = 0
                dt = a0 + SF[PENDING]
                if now + dt > H:
                    end_time = H
                    break
                a0, inc = dt, 0.0
            else:
                while S[NF] > 0 and fcv[0] != R[CV, fid[0]]:        # _k_complete
                    _fpop(fk, fid, fcv, S)
                k = fk[0] - S[CLOCK]
                # _k_memory
                Fm = cap - used if (pol < POL_LAS or not v1) else cap - (S[NEED] + S[OTHER])
                if k > 1 and not Fm >= n_dec * ((k - 2) // bs + 1):
                    q = Fm // n_dec
                    rem = Fm - q * n_dec
                    acc = 0
                    clock = S[CLOCK]
                    for o in range(1, bs + 1):
                        m = (bs - o - clock + 1) % bs
                        w = cnt[m]
                        if w:
                            acc += w
                            if acc > rem:
                                k2 = bs * q + o
                                if k2 < k:
                                    k = k2
                                break
                inc = ckv * n_dec
                t_bound = INF
                cur = S[CURSOR]
                if cur < n_arr:
                    if pol == POL_STATIC and S[NWAIT] > 0:
                        head = wheap[0]
                        c = cur
                        if suffix[c] < head:
                            while R[NFITS, order[c]] or R[RANK, order[c]] > head:
                                c += 1
                            t_bound = arr_t[c]
                    else:
                        t_bound = arr_t[cur]
                if (pol == POL_LAS or pol == POL_MLFQ or pol == POL_RR) and k > 1 and (S[NWAIT] or S[NPAUSED]):
                    # _passing_iterations: fewest iterations until a member ranks after an outside request
                    # the outside requests (waiting: W, paused: in rank order) are two sorted lists; the first
                    # outside request ranked after member m is the earlier of the two lists' first after m
                    best = -1
                    wh, we, npz = S[WH], S[WE], S[NPAUSED]
                    omax = -1                               # rr: only whether one ranks after m matters
                    if we > wh:
                        omax = W[we - 1]
                    if npz and (omax < 0 or _kless(R, F, omax, paused[npz - 1])):
                        omax = paused[npz - 1]
                    for a in range(S[NRUN]):
                        m = run[a]
                        if omax < 0 or not R[INC, m] or not _kless(R, F, m, omax):
                            continue
                        g = R[GB, m] + S[CLOCK]
                        if pol == POL_RR:
                            kk2 = R[TURN, m] + qtok - g
                        else:
                            lo = _bisect(W, wh, we, R, F, m)
                            x = W[lo] if lo < we else -1
                            lo = _bisect(paused, 0, npz, R, F, m)
                            if lo < npz and (x < 0 or _kless(R, F, paused[lo], x)):
                                x = paused[lo]
                            lvl = int(F[KEY, x])
                            earlier = F[ARR, m] < F[ARR, x] or (F[ARR, m] == F[ARR, x] and m < x)
                            kk2 = _tokens_to_level(m, g, lvl + 1 if earlier else lvl, R, pol, qtok, mb, mbl)
                            if kk2 < 0:
                                continue
                        if best < 0 or kk2 < best:
                            best = kk2
                    if best >= 0 and best < k:
                        k = best if best > 1 else 1
                if pol == POL_VTC and k > 1 and S[NWAIT] > 0:
                    # VTC.next_decision: iterations until the admission head's tenant changes
                    _vtc_heads(th, toff, tw, thead, ntn)
                    nheads = 0
                    hb_ = -1
                    for u in range(ntn):
                        tin[u] = 0
                        if tw[u] > 0:
                            nheads += 1
                            if hb_ < 0:
                                hb_ = u
                            else:
                                x0, x1 = thead[u], thead[hb_]
                                if tc[u] < tc[hb_] or (tc[u] == tc[hb_] and (F[ARR, x0] < F[ARR, x1]
                                                                           or (F[ARR, x0] == F[ARR, x1] and x0 < x1))):
                                    hb_ = u
                    if nheads >= 2:
                        for a in range(S[NRUN]):
                            r = run[a]
                            if R[INC, r]:
                                tin[R[TEN, r]] += 1
                        kq = -1
                        for u in range(ntn):
                            if tw[u] == 0 or u == hb_:
                                continue
                            sv = w_out * (tin[hb_] - tin[u])
                            if sv <= 0:
                                continue
                            du = tc[u] - tc[hb_]
                            x0, x1 = thead[u], thead[hb_]
                            earlier = F[ARR, x0] < F[ARR, x1] or (F[ARR, x0] == F[ARR, x1] and x0 < x1)
                            if earlier:
                                kk2 = -(-du // sv)
                                if kk2 < 1:
                                    kk2 = 1
                            else:
                                kk2 = du // sv + 1
                            if kq < 0 or kk2 < kq:
                                kq = kk2
                        if kq >= 0 and kq < k:
                            k = kq if kq > 1 else 1
                if pol == POL_LTR and starve and k > 1 and S[NWAIT] > 0:
                    # ltr's next_decision: the earliest time a waiting request starts starving
                    # (the queue's first current entry that does not starve; before S[QS] none)
                    tq = INF
                    q = S[QS] if S[QS] > S[QH] else S[QH]
                    while q < S[QE] and not (_ltr_valid(Qi, q, R) and not now >= Qf[q] + starve_s):
                        q += 1
                    S[QS] = q
                    if q < S[QE]:
                        tq = Qf[q] + starve_s
                    if tq < t_bound:
                        t_bound = tq
                if t_bound < INF and k > 1:
                    x = t_bound - now
                    if x > a0:
                        kt = first_k_reaching(a0, inc, x)
                        while kt < k and now + decode_run_s(kt, a0, inc) < t_bound:
                            kt += 1
                        if kt < k:
                            k = kt
                    else:
                        k = 1
                dt = decode_run_s(k, a0, inc)
                if now + dt > H:
                    k = last_k_within(a0, inc, H - now)
                    if k <= 0:
                        end_time = H
                        break
                    dt = decode_run_s(k, a0, inc)
        if trace_on:
            if ntr == tr_f.shape[0]:
                tr_f = np.concatenate((tr_f, np.empty((ntr, 2), np.float64)))
                tr_i = np.concatenate((tr_i, np.empty((ntr, 5), np.int64)))
            tr_f[ntr, 0] = now
            tr_f[ntr, 1] = now + dt
            tr_i[ntr, 0] = k
            tr_i[ntr, 1] = pf_tokens
            tr_i[ntr, 2] = n_dec
            tr_i[ntr, 3] = C0
            tr_i[ntr, 4] = used
            ntr += 1
        t1 = now + dt
        # ---- commit (:meth:`Iterations._commit`)
        S[NITER] += k
        if SF[PENDING]:
            SF[SWAPS] += SF[PENDING]
            SF[PENDING] = 0.0
        t0 = now
        if S[NWA] < marks.shape[0]:
            _note_marks(t1, False, kind == 0 and k > 1, n_dec, a0, inc, t0, marks, work_at, S)
        if kind != 2:                  # the cohort decodes k iterations (V0 whole prompts: it waits)
            S[WORK] += S[NCOH] * k
            if k > 1:
                _advance(k - 1, S, cnt, bs)
                u2 = S[NEED] + S[OTHER] + S[ADJ]
                if u2 > cap:
                    status = ERR_RUN_KV
                    end_time = t1
                    break
                if u2 > S[MAXUSED]:
                    S[MAXUSED] = u2
                if pc_on:
                    _pc_reconcile(S, ref, lprev, lnext, cap, eb)
            _advance(1, S, cnt, bs)
            clock = S[CLOCK]
            if pol == POL_RR and S[NCOH] > 0:       # RoundRobin.on_tokens: a used-up quantum re-queues at its end
                for a in range(S[NRUN]):
                    r = run[a]
                    if R[INC, r]:
                        g = R[GB, r] + clock
                        used_q = g - R[TURN, r]
                        if used_q >= qtok:
                            gc = R[TURN, r] + (used_q // qtok) * qtok
                            R[TURN, r] = gc
                            ii = gc - (g - k)
                            F[TAU, r] = t0 + decode_run_s(ii, a0, inc) if (k > 1 and ii < k) else t1
            if pol == POL_VTC and S[NCOH] > 0:      # VTC.on_tokens: every decoded token charges its tenant
                for a in range(S[NRUN]):
                    r = run[a]
                    if R[INC, r]:
                        tc[R[TEN, r]] += w_out * k
            while S[NF] > 0:                                   # _pop_finished, then leave + finish each
                r = fid[0]
                if fcv[0] != R[CV, r]:
                    _fpop(fk, fid, fcv, S)
                elif fk[0] == clock:
                    _fpop(fk, fid, fcv, S)
                    _leave(r, R, S, cnt, bs)
                    _release_finish(r, t1, R, F, S, run, hoff, hid, ref, lprev, lnext, eb)
                else:
                    break
        if kind != 0:
            done = False
            npf = 0
            for a in range(S[NPRE]):                       # this iteration's chunks (the list may shrink)
                if R[CHK, pre[a]]:
                    adds[npf] = pre[a]
                    npf += 1
            for a in range(npf):
                r = adds[a]
                p1 = R[PREF, r] + R[CHK, r]
                lim = p1 if p1 < R[PP, r] else R[PP, r]
                if lim > R[HIGH, r]:
                    S[WORK] += lim - (R[HIGH, r] if R[HIGH, r] > R[PREF, r] else R[PREF, r])
                    R[HIGH, r] = lim
                R[PREF, r] = p1
                R[CHK, r] = 0
                if p1 == R[TGT, r]:
                    done = True
                    R[GEN, r] += 1
                    S[WORK] += 1
                    if pol == POL_VTC:
                        tc[R[TEN, r]] += w_out
                    elif pol == POL_RR:
                        used_q = R[GEN, r] - R[TURN, r]
                        if used_q >= qtok:
                            R[TURN, r] = R[TURN, r] + (used_q // qtok) * qtok
                            F[TAU, r] = t1
                    if F[FT, r] != F[FT, r]:
                        F[FT, r] = t1
                    S[OTHER] -= R[BLK, r]
                    if R[GEN, r] == R[OO, r]:
                        _release_finish(r, t1, R, F, S, run, hoff, hid, ref, lprev, lnext, eb)
                    else:
                        _join(r, R, S, cnt, fk, fid, fcv, bs)
            if done:
                m = 0
                for a in range(S[NPRE]):
                    r = pre[a]
                    if R[PREF, r] != R[TGT, r]:
                        pre[m] = r
                        m += 1
                S[NPRE] = m
        end_time = t1
        if S[NWA] < marks.shape[0]:
            _note_marks(t1, True, False, 0, 0.0, 0.0, 0.0, marks, work_at, S)
        now = t1
    clock = S[CLOCK]
    for r in range(n):                                     # the cohort's generated tokens
        if R[INC, r]:
            R[GEN, r] = R[GB, r] + clock
    S[NWQ] = nwq
    return status, end_time, S_out, SF_out, wq_s[:nwq].copy(), wq_e[:nwq].copy(), tr_f[:ntr].copy(), \
        tr_i[:ntr].copy()


_HELPERS = (_part, _fsift_up, _iless, _isift_up, _isift_down, _refresh_keys, decode_run_s, last_k_within,
            first_k_reaching, iteration_time, _heap_less, _fsift_down, _fpush, _fpop, _wpush, _wpop, _list_remove,
            _join, _leave, _advance, _lru_remove, _lru_append, _pc_ref, _pc_hit, _pc_take, _pc_register, _pc_release,
            _pc_reconcile, _note_marks, _release_finish, _evict, _chunks, _requeue, _vtc_heads, _enqueue, _vtc_push,
            _vtc_pop, _ltr_valid, _q_push, _h_push, _h_pop, _ltr_next, _key_after, _generated, _mlfq_level, _key_of,
            _tokens_to_level, _kless, _bisect, _w_insert, _resort, _keep_order, _admit_need, _admit, _plan_ranked,
            _admit_need_v0, _plan_v0_preemptive)


def dense_hash_ids(lens: np.ndarray, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hoff, hid)`` from the requests' numbers of prompt block hashes (``lens``) and those hashes, request by
    request (``flat``): each hash as a dense entry id numbered in order of first occurrence."""
    hoff = np.zeros(lens.shape[0] + 1, np.int64)
    hoff[1:] = np.cumsum(lens)
    if not flat.shape[0]:
        return hoff, np.zeros(0, np.int64)
    _, first, inv = np.unique(flat, return_index=True, return_inverse=True)
    dense = np.empty(first.shape[0], np.int64)
    dense[np.argsort(first, kind="stable")] = np.arange(first.shape[0], dtype=np.int64)
    return hoff, dense[inv.reshape(-1)]


def hash_ids(window_df, reqs) -> tuple[np.ndarray, np.ndarray]:
    """``(hoff, hid)``: the requests' prompt block hashes as dense entry ids numbered in order of first
    occurrence (request by request), ``hid[hoff[i]:hoff[i + 1]]`` those of request ``i``. Vectorised from
    the window's ``block_hashes`` column when it is a polars list of integers (the requests' ``hashes`` are
    that column's lists; :func:`dense_hash_ids`), else from the requests."""
    n = len(reqs)
    hoff = np.zeros(n + 1, np.int64)
    col = window_df["block_hashes"] if isinstance(window_df, pl.DataFrame) and "block_hashes" in window_df.columns \
        else None
    if col is not None and isinstance(col.dtype, pl.List) and col.dtype.inner.is_integer() and col.len() == n:
        lens = col.list.len().fill_null(0).to_numpy().astype(np.int64)
        flat = col.explode()
        flat = flat.filter(flat.is_not_null()).to_numpy()
        if flat.shape[0] == int(lens.sum()):
            return dense_hash_ids(lens, flat)
    lens = [len(r.hashes) if r.hashes else 0 for r in reqs]
    hoff[1:] = np.cumsum(lens)
    ids: dict = {}
    hid = np.fromiter((ids.setdefault(h, len(ids)) for r in reqs if r.hashes for h in r.hashes), np.int64,
                      int(hoff[-1]))
    return hoff, hid


@dataclass
class Outcome:
    """What the compiled loop leaves: per-request state arrays (indexed by request id) and the counters,
    from which :func:`portbench.sim.engine.simulate` builds the records in one go."""

    state: np.ndarray
    generated: np.ndarray
    preemptions: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    admitted_s: np.ndarray
    waiting_since: np.ndarray
    output_tokens: np.ndarray
    wq_s: np.ndarray           # the waiting intervals that ended (start, end)
    wq_e: np.ndarray
    work_at: np.ndarray        # useful work by each work mark
    tr_f: np.ndarray | None    # the step log (record_iterations): start_s, end_s
    tr_i: np.ndarray | None    # ... n_iterations, prefill_tokens, decode_seqs, context_tokens, kv_blocks_used


@dataclass
class Columns:
    """The requests as the compiled loop reads them, one array per field indexed by request id (= window row):
    prompt and (clipped) output tokens, the prefill target and progress at the start, static rank (0 for
    dynamic policies), never-fits flag, arrival time, VTC tenant index, the arrival order and its times,
    the suffix minimum of static ranks over the arrival order, and the prompt-hash ids (:func:`hash_ids`).
    Built from the :class:`Request` objects (:func:`columns_from_engine`) or straight from the window's
    columns (:mod:`portbench.sim.engine.columns`)."""

    prompt: np.ndarray
    output: np.ndarray
    target: np.ndarray
    generated: np.ndarray
    prefilled: np.ndarray
    high: np.ndarray
    rank: np.ndarray
    never_fits: np.ndarray
    arrival: np.ndarray
    tenant: np.ndarray | None     # tenant index into sorted(policy._counter) (vtc), else None
    order: np.ndarray
    arr_t: np.ndarray
    suffix: np.ndarray
    hoff: np.ndarray
    hid: np.ndarray


def columns_from_engine(eng, window_df=None) -> Columns:
    """:class:`Columns` of engine ``eng``'s requests (its :class:`Request` objects, static ranks prepared)."""
    reqs = eng.reqs
    n = len(reqs)
    if any(r.id != i for i, r in enumerate(reqs)):     # pragma: no cover - requests_from_window numbers rows
        raise AssertionError("request ids are not the window's rows")
    tenant = None
    if eng.policy.name == "vtc":
        tix = {t: i for i, t in enumerate(sorted(eng.policy._counter))}
        tenant = np.array([tix[r.tenant] for r in reqs], np.int64)
    hoff = np.zeros(n + 1, np.int64)
    hid = np.zeros(0, np.int64)
    if eng.pc_on:                       # prompt block hashes as dense entry ids
        hoff, hid = hash_ids(window_df, reqs)
    return Columns(
        prompt=np.array([r.prompt_tokens for r in reqs], np.int64),
        output=np.array([r.output_tokens for r in reqs], np.int64),
        target=np.array([r.prefill_target for r in reqs], np.int64),
        generated=np.array([r.generated for r in reqs], np.int64),
        prefilled=np.array([r.prefilled for r in reqs], np.int64),
        high=np.array([r.high for r in reqs], np.int64),
        rank=np.array([r.rank for r in reqs] if eng.static else np.zeros(n), np.int64),
        never_fits=np.array([r.never_fits for r in reqs], np.int64),
        arrival=np.array([r.arrival_s for r in reqs], np.float64),
        tenant=tenant,
        order=np.fromiter((r.id for r in eng.arrivals), np.int64, n),
        arr_t=np.asarray(eng.arr_t, dtype=np.float64),
        suffix=np.asarray(eng.suffix_min_rank if eng.suffix_min_rank is not None else [0] * (n + 1), dtype=np.int64),
        hoff=hoff, hid=hid)


def run(eng, window_df=None, cols: Columns | None = None) -> Outcome:
    """Run engine ``eng`` (a :class:`~portbench.sim.engine.core.Engine` set up by ``simulate``, static ranks
    prepared, not run) with the compiled loop; the engine's counters are left as the reference's ``run``
    leaves them, the requests' state is returned as arrays (:class:`Outcome`; the :class:`Request` objects
    are not updated). ``window_df``: the window table the requests were built from (prompt block hashes).
    ``cols``: the requests' :class:`Columns` when they were built without :class:`Request` objects (the
    engine then holds none: :mod:`portbench.sim.engine.columns`); else they are read from ``eng.reqs``."""
    if cols is None:
        cols = columns_from_engine(eng, window_df)
    n = cols.prompt.shape[0]
    prof = eng.prof
    R = np.zeros((N_RFIELDS, n), np.int64)
    F = np.full((7, n), np.nan)
    ltr = eng.policy.name in RANK_POLICIES
    vtc = eng.policy.name == "vtc"
    pname = eng.policy.name
    pol = {"las": POL_LAS, "mlfq": POL_MLFQ, "srpt_oracle": POL_SRPT, "rr": POL_RR}.get(pname)
    if pol is None:
        pol = POL_LTR if ltr else (POL_VTC if vtc else POL_STATIC)
    mb = np.zeros((1, 1), np.int64)
    mbl = np.zeros(1, np.int64)
    if pname == "mlfq":
        bounds = eng.policy._bounds
        mb = np.zeros((len(bounds), max(1, max(len(b) for b in bounds))), np.int64)
        mbl = np.array([len(b) for b in bounds], np.int64)
        for jj, b in enumerate(bounds):
            mb[jj, :len(b)] = b
    tenants = sorted(eng.policy._counter) if vtc else []
    R[PP] = cols.prompt
    R[OO] = cols.output
    R[TGT] = cols.target
    R[GEN] = cols.generated
    R[PREF] = cols.prefilled
    R[HIGH] = cols.high
    if eng.static:
        R[RANK] = cols.rank
    R[NFITS] = cols.never_fits
    if vtc:
        R[TEN] = cols.tenant
    if pname == "mlfq":
        R[JOIN] = eng.policy._join
    elif pname == "rr":
        F[TAU] = eng.policy._tau
        R[TURN] = eng.policy._turn
    F[ARR] = cols.arrival
    R[ST] = _NOT_ARRIVED
    F[KEY] = np.asarray(eng.policy._score, dtype=np.float64) if ltr else R[RANK]
    order = cols.order
    arr_t = cols.arr_t
    suffix = cols.suffix
    by_rank = np.empty(n, np.int64)
    by_rank[R[RANK]] = np.arange(n)
    hoff, hid = cols.hoff, cols.hid
    C = np.array([eng.bs, eng.cap, eng.B, eng.max_seqs, int(eng.pc_on), getattr(eng, "Hb", 1) if eng.pc_on else 1,
                  getattr(eng, "eb", 0) if eng.pc_on else 0, eng.n_arrivable,
                  int(eng.policy.name in VICTIM_ARRIVAL), len(eng.marks), int(eng.trace is not None),
                  pol, int(ltr and eng.policy.starvation_s is not None),
                  len(tenants), int(eng.policy.w_prompt) if vtc else 0, int(eng.policy.w_output) if vtc else 0,
                  int(getattr(eng.policy, "quantum_tokens", 1) or 1), int(eng.mode.name == "v1"), int(eng.mode.chunked),
                  int(eng.swap), int(eng.host_cap)], np.int64)
    Fc = np.array([prof.c0_s, prof.c_prefill_s, prof.c_decode_s, prof.c_kv_s, prof.c_attn_s, prof.floor_s,
                   float(prof.floor_tokens) if prof.floor_s > 0 else 1.0,
                   float(eng.policy.starvation_s or 0.0) if ltr else 0.0, float(eng.swap_s_block)], np.float64)
    marks = np.asarray(eng.marks, dtype=np.float64)
    work_at = np.zeros(len(marks), np.int64)
    status, end_time, S, SF, wq_s, wq_e, tr_f, tr_i = kernel()(C, Fc, float(eng.H), R, F, order, arr_t, suffix, by_rank,
                                                           hoff, hid, marks, work_at, mb, mbl)
    if status == ERR_KV:
        raise ConservationError(f"KV blocks in use {int(S[USED])} > capacity {eng.cap} at t={end_time}")
    if status == ERR_RUN_KV:
        raise ConservationError(f"KV blocks in use > capacity {eng.cap} in a decode run ending at t={end_time}")
    if status == ERR_PROGRESS:
        raise RuntimeError(f"simulator made no progress at t={end_time}: {int(S[NRES])} residents, "
                           f"{int(S[NWAIT])} waiting (scheduler {eng.sched.name})")
    # requests that arrived but were never ingested (the server stopped at the horizon), as ``_result`` does
    st = R[ST]
    cur = int(S[CURSOR])
    late = order[cur:int(eng.n_arrivable)]
    st[late] = np.where(R[NFITS, late] != 0, _REJECTED, _WAITING)
    ws = F[WS]
    ws = np.where(ws == ws, ws, F[ARR])     # waiting since: the arrival unless the loop set it
    eng.cursor = cur
    eng.end_time = float(end_time)
    eng.n_iter, eng.n_decisions, eng.n_preempt = int(S[NITER]), int(S[NDEC]), int(S[NPREEMPT])
    eng.max_used, eng.n_finished, eng.work = int(S[MAXUSED]), int(S[NFIN]), int(S[WORK])
    eng.pc_hit_tokens, eng.pc_query_tokens = int(S[PCHIT]), int(S[PCQ])
    eng.n_pause = int(S[NPAUSE])
    eng.n_swap_out, eng.n_swap_in, eng.swap_s = int(S[NSWO]), int(S[NSWI]), float(SF[SWAPS])
    nwa = int(S[NWA])
    return Outcome(state=st, generated=R[GEN], preemptions=R[PREEMPT], first_token_s=F[FT], finish_s=F[FIN],
                   admitted_s=F[ADM], waiting_since=ws, output_tokens=R[OO], wq_s=wq_s, wq_e=wq_e,
                   work_at=np.concatenate((work_at[:nwa].astype(np.float64),   # then the marks never reached
                                           np.full(int(np.sum(marks[nwa:] < math.inf)), float(eng.work)))),
                   tr_f=tr_f if eng.trace is not None else None, tr_i=tr_i if eng.trace is not None else None)
