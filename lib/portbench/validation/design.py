"""The paired replay design of the real-engine verdicts: which replay runs when, and how many.

One *side* of a case is one source of a pre-registered case (:mod:`.plan`): policies ``a`` and ``b`` on
``k`` windows of that source, ``r`` pairs per window. A *pair* is two replays of one window back to back;
25 % of a side's pairs (rounded, spread evenly over the windows, at least one a/b pair per window) are
*A/A pairs*: one policy against itself (which of a and b: seeded, alternating), measuring the
replay-to-replay noise sigma_r and any order effect. The pairs of a window follow the ABBA pattern
(a b | b a | b a | a b | ...) from a seeded random start per window; the windows of a side run in a
seeded random order, a side's replays together (so slow drift of the machine cancels within a window).

Contract with the engine side (``validation/engine``, helper s40-38e), written down first
-----------------------------------------------------------------------------------------

**Input of the engine: the replay specs** (:func:`replay_specs`, a polars frame in execution order; one
row per replay):

===============  ======  =============================================================================
column           type    meaning
===============  ======  =============================================================================
``order``        int     execution order, 0, 1, 2, ... (the engine runs the rows in this order)
``case``         str     case id of the plan (``key``, ``control``, ``draw_same``, ``draw_reversed``,
                         ``planted``)
``source``       str     the side: the source whose window is replayed
``window``       str     the window id (``data/windows`` manifest)
``policy``       str     the policy this replay runs (a portbench policy name, or ``delay_shortest``)
``pair``         int     pair id, unique within (case, source); both replays of a pair share it
``position``     int     0 = the pair's first replay, 1 = its second
``is_aa``        bool    the pair runs one policy twice (an A/A pair)
``slot``         str     ``a`` or ``b``: the label the analysis gives this replay (for an A/A pair the
                         ABBA slot it fills, so the A/A pairs go through exactly the test of the a/b pairs)
===============  ======  =============================================================================

**Output of the engine: the per-replay table** (polars; what :mod:`.verdict` reads; one row per replay that
ran, a replay that failed is left out, so a missing row means *no data*): every column above (``order`` may
be dropped), plus

* ``replay_index`` (int): the replay's place in the engine's actual execution order (warm-up replays not
  counted; it differs from ``order`` only if the engine reordered),
* ``machine_speed`` (float): the machine's speed logged for that replay (the engine's measured speed factor;
  used to report, not to correct),
* one column per window-level metric the case needs, on the replay's own requests: ``ttft_p90``,
  ``tpot_p90``, ``e2e_mean`` (seconds), ``slo_medium`` (share), ... named as ``portbench.sim.metrics``
  names them. Ratio metrics must be > 0 (their log is taken).

The **planted reversal** is a case ``planted`` with ``a = fcfs`` and ``b = delay_shortest`` (a plug-in
scheduler that deliberately holds back the shortest waiting requests; defined on the engine side), whose
order is known: fcfs is better on every metric of latency, on every source.

How many: :func:`power_table` and :func:`size` choose ``k`` (windows) and ``r`` (pairs per window) from
sigma_r, the replay-to-replay SD of the window-level log metric, as measured by an earlier run's A/A
pairs and stored in ``papermill_params/validation_plan.yaml`` with its date (until a measurement exists,
the value the stored repeat replays give, 0.05-0.20, marked *assumed*), for effects >= 25 %; the
resolvable effect of a design is :func:`resolvable_effect`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import polars as pl

from ..core.errors import ParameterError

AA_SHARE = 0.25
SPEC_COLUMNS = ("order", "case", "source", "window", "policy", "pair", "position", "is_aa", "slot")
TABLE_COLUMNS = ("case", "source", "window", "policy", "pair", "position", "is_aa", "slot", "replay_index",
                 "machine_speed")
SPEC_SCHEMA = {"order": pl.Int64, "case": pl.Utf8, "source": pl.Utf8, "window": pl.Utf8, "policy": pl.Utf8,
               "pair": pl.Int64, "position": pl.Int64, "is_aa": pl.Boolean, "slot": pl.Utf8}
PLANTED = ("fcfs", "delay_shortest")


@dataclass(frozen=True)
class Side:
    """One side of a case to replay: the two policies on ``windows`` of ``source``, ``r`` pairs each."""

    case: str
    source: str
    a: str
    b: str
    windows: tuple[str, ...]
    r: int


def aa_counts(k: int, r: int, share: float = AA_SHARE, seed: int = 0) -> list[int]:
    """A/A pairs per window: ``round(share * k * r)`` in all, as even as possible over the ``k`` windows
    (which windows get one more: seeded), never all ``r`` pairs of a window (>= 1 a/b pair per window)."""
    if k < 1 or r < 1:
        raise ParameterError("validation design", (k, r), "k >= 1 windows and r >= 1 pairs per window")
    total = min(int(round(share * k * r)), k * (r - 1))
    base, extra = divmod(total, k)
    rng = np.random.default_rng([int(seed), k, r])
    more = set(rng.permutation(k)[:extra].tolist())
    return [base + (1 if j in more else 0) for j in range(k)]


def abba(r: int, start_b: bool) -> list[tuple[str, str]]:
    """The (first, second) slots of ``r`` pairs in ABBA order: ab, ba, ba, ab, ab, ba, ...; ``start_b``
    swaps every pair (ba, ab, ab, ba, ...)."""
    out = []
    for i in range(r):
        ab = (i % 4) in (0, 3)
        if start_b:
            ab = not ab
        out.append(("a", "b") if ab else ("b", "a"))
    return out


def side_specs(side: Side, seed: int) -> list[dict]:
    """The replays of one side (module docstring), in execution order (``order`` left to the caller)."""
    k = len(side.windows)
    if k == 0:
        return []
    rng = np.random.default_rng([int(seed), *[ord(c) for c in f"{side.case}|{side.source}"]])
    aa = aa_counts(k, side.r, seed=int(rng.integers(2**31)))
    window_order = rng.permutation(k)
    rows: list[dict] = []
    pair = 0
    for j in window_order:
        w = side.windows[int(j)]
        slots = abba(side.r, bool(rng.integers(2)))
        aa_at = set(rng.permutation(side.r)[:aa[int(j)]].tolist())    # which of the window's pairs are A/A
        for i, (s0, s1) in enumerate(slots):
            is_aa = i in aa_at
            same = (side.a if rng.integers(2) == 0 else side.b) if is_aa else None
            for pos, slot in enumerate((s0, s1)):
                pol = same if same is not None else (side.a if slot == "a" else side.b)
                rows.append({"case": side.case, "source": side.source, "window": w, "policy": pol,
                             "pair": pair, "position": pos, "is_aa": is_aa, "slot": slot})
            pair += 1
    return rows


def replay_specs(sides: Sequence[Side], seed: int) -> pl.DataFrame:
    """The replay specs of every side, in execution order: the sides in the order given, each side's
    replays together (module docstring; columns :data:`SPEC_COLUMNS`)."""
    rows = [r for s in sides for r in side_specs(s, seed)]
    for i, r in enumerate(rows):
        r["order"] = i
    if not rows:
        return pl.DataFrame(schema=SPEC_SCHEMA)
    return pl.DataFrame(rows, schema=SPEC_SCHEMA).select(list(SPEC_COLUMNS))


# --------------------------------------------------------------------------- power


POWER = 0.8
TARGET_EFFECT = math.log(1.25)          # effects >= 25 %: log(1.25) on the log scale
SIGMA_R_STORED = (0.05, 0.20)           # the stored repeats' log(repeat / first), moderate load (issue #38)


def ab_pairs(k: int, r: int) -> float:
    """Mean a/b pairs per window of a side (the rest are A/A)."""
    return (k * r - sum(aa_counts(k, r))) / k


def sign_flip_matrix(k: int) -> np.ndarray:
    """All 2^k sign patterns (rows) of the exact sign-flip test (:func:`.verdict.sign_flip_p`)."""
    return np.array(list(itertools.product((1.0, -1.0), repeat=k)))


def min_windows(m: int, alpha: float) -> int:
    """The fewest windows at which the exact one-sided sign-flip test can decide at Holm's strictest level
    with the two directions split: 2^-k < alpha / (2 m)."""
    return int(math.floor(math.log2(2 * max(m, 1) / alpha))) + 1


def power(effect: float, k: int, r: int, sigma_r: float, *, tau: float = 0.0, m: int = 4, alpha: float = 0.05,
          sides: int = 2, sims: int = 2000, seed: int = 0) -> float:
    """Simulated power of a case: each of ``sides`` sides must decide in the effect's direction. A window's
    effect = ``effect`` + N(0, tau^2) (the true effect's spread over windows) + N(0, 2 sigma_r^2 / r_ab) (the
    mean of its r_ab a/b pairs, each the difference of two replays with noise sigma_r); the one-sided exact
    sign-flip test at Holm's strictest level alpha / (2 m) (the two directions split)."""
    if k < 1 or k > 16:
        raise ParameterError("validation design", k, "1 to 16 windows per side for the power calculation")
    rab = ab_pairs(k, r)
    rng = np.random.default_rng([int(seed), k, r])
    sd = math.sqrt(tau ** 2 + 2 * sigma_r ** 2 / rab)
    w = effect + sd * rng.standard_normal((sides, sims, k))
    S = sign_flip_matrix(k)                               # (2^k, k)
    obs = w.sum(-1)                                       # (sides, sims)
    p = np.empty_like(obs)
    step = max(1, 2**20 // (sides * S.shape[0]))          # simulations per chunk: <= 8 MB of permutation sums
    for i in range(0, sims, step):
        perm = np.einsum("pk,qsk->qsp", S, w[:, i:i + step])   # (sides, chunk, 2^k)
        p[:, i:i + step] = np.mean(perm >= obs[:, i:i + step, None] - 1e-12, axis=-1)
    return float(np.all(p < alpha / (2 * max(m, 1)), axis=0).mean())


def resolvable_effect(k: int, r: int, sigma_r: float, *, tau: float = 0.0, m: int = 4, alpha: float = 0.05,
                      target: float = POWER, sims: int = 1000, seed: int = 0) -> float:
    """The smallest effect (log scale, step 0.005) a design of ``k`` windows x ``r`` pairs resolves with power
    ``target`` (:func:`power`); inf where the exact test cannot decide with ``k`` windows."""
    if k < min_windows(m, alpha) or not math.isfinite(sigma_r):
        return math.inf
    lo, hi = 0.0, 0.005
    while power(hi, k, r, sigma_r, tau=tau, m=m, alpha=alpha, sims=sims, seed=seed) < target:
        lo, hi = hi, hi * 2
        if hi > 5:
            return math.inf
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        if power(mid, k, r, sigma_r, tau=tau, m=m, alpha=alpha, sims=sims, seed=seed) >= target:
            hi = mid
        else:
            lo = mid
    return round(hi, 3)


def power_table(sigmas: Sequence[float] = (0.05, 0.10, 0.20), ks: Sequence[int] = (6, 8, 10, 12),
                rs: Sequence[int] = (2, 4, 6), *, effect: float = TARGET_EFFECT, tau: float = 0.0, m: int = 4,
                alpha: float = 0.05, sims: int = 1000, seed: int = 0) -> pl.DataFrame:
    """Power for ``effect`` and the resolvable effect per (sigma_r, k, r), with the replays per side."""
    rows = []
    for s in sigmas:
        for k in ks:
            for r in rs:
                rows.append({"sigma_r": s, "k": k, "r": r, "replays_per_side": 2 * k * r,
                             "power": power(effect, k, r, s, tau=tau, m=m, alpha=alpha, sims=sims, seed=seed),
                             "resolvable_effect": resolvable_effect(k, r, s, tau=tau, m=m, alpha=alpha, sims=sims,
                                                                    seed=seed)})
    return pl.DataFrame(rows)


def size(sigma_r: float, *, effect: float = TARGET_EFFECT, tau: float = 0.0, m: int = 4, alpha: float = 0.05,
         max_replays_per_side: int | None = None, ks: Sequence[int] = tuple(range(6, 17)),
         rs: Sequence[int] = (2, 3, 4, 5, 6, 8), sims: int = 1000, seed: int = 0) -> dict:
    """The design with the fewest replays per side (ties: fewer windows) whose power for ``effect`` reaches
    :data:`POWER`, within ``max_replays_per_side``; where none does, the largest design that fits, its power
    stated. Returns k, r, replays per side, power, and the resolvable effect."""
    kmin = min_windows(m, alpha)
    cands = sorted(((2 * k * r, k, r) for k in ks for r in rs if k >= kmin
                    and (max_replays_per_side is None or 2 * k * r <= max_replays_per_side)))
    if not cands:
        raise ParameterError("validation design", max_replays_per_side,
                             f"room for at least {2 * kmin * 2} replays per side ({kmin} windows x 2 pairs: the "
                             f"fewest at which the exact test can decide at alpha = {alpha} over {m} cases)")
    best = None
    for n, k, r in cands:
        pw = power(effect, k, r, sigma_r, tau=tau, m=m, alpha=alpha, sims=sims, seed=seed)
        if pw >= POWER:
            best = (n, k, r, pw, True)
            break
    if best is None:
        n, k, r = cands[-1]
        best = (n, k, r, power(effect, k, r, sigma_r, tau=tau, m=m, alpha=alpha, sims=sims, seed=seed), False)
    n, k, r, pw, ok = best
    return {"k": k, "r": r, "replays_per_side": n, "power": pw, "target_reached": ok, "effect": effect,
            "sigma_r": sigma_r, "tau": tau, "cases": m, "alpha": alpha,
            "resolvable_effect": resolvable_effect(k, r, sigma_r, tau=tau, m=m, alpha=alpha, sims=sims, seed=seed)}
