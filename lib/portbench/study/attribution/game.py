"""Shapley values of a game given on every subset of k players (pure numpy; subsets as bit masks).

``v`` has shape ``(2^k, ...)``: ``v[mask]`` is the value of the subset whose bit ``i`` is player ``i``
(``v[0]`` is usually 0). The Shapley value of player ``i`` is

    phi_i = sum over subsets S not containing i of  |S|! (k - |S| - 1)! / k!  (v(S + i) - v(S)),

the average of i's marginal contribution over every order in which the players can be added. The values
are efficient (they sum to ``v(all) - v(none)``), symmetric, zero for a player that never changes the value
(a swap that is the identity), and additive over games. Trailing axes (conditions, bootstrap resamples)
are carried along.
"""

from __future__ import annotations

from math import factorial

import numpy as np


def popcount(masks) -> np.ndarray:
    """Number of set bits of each mask."""
    m = np.asarray(masks, dtype=np.int64)
    out = np.zeros(m.shape, dtype=np.int64)
    for b in range(63):
        out += (m >> b) & 1
    return out


def n_players(v) -> int:
    """k from ``len(v) = 2^k`` (ValueError otherwise)."""
    n = np.asarray(v).shape[0]
    k = int(round(np.log2(n))) if n > 0 else -1
    if k < 1 or 2 ** k != n:
        raise ValueError(f"a game on k players has 2^k values, got {n}")
    return k


def shapley(v) -> np.ndarray:
    """Shapley values ``(k, ...)`` of the game ``v`` ``(2^k, ...)`` (NaN where any subset's value is NaN)."""
    v = np.asarray(v, dtype=float)
    k = n_players(v)
    masks = np.arange(2 ** k)
    size = popcount(masks)
    w = np.array([factorial(s) * factorial(k - s - 1) / factorial(k) for s in range(k)])
    out = np.zeros((k,) + v.shape[1:])
    for i in range(k):
        without = masks[(masks >> i & 1) == 0]
        weights = w[size[without]].reshape((-1,) + (1,) * (v.ndim - 1))
        out[i] = np.sum(weights * (v[without | (1 << i)] - v[without]), axis=0)
    return out


def singles(v) -> np.ndarray:
    """``v({i}) - v({})`` for each player ``(k, ...)``: the effect of swapping that player alone."""
    v = np.asarray(v, dtype=float)
    k = n_players(v)
    return np.stack([v[1 << i] - v[0] for i in range(k)])


def interaction(v) -> np.ndarray:
    """``v(all) - v(none) - sum_i (v({i}) - v(none))``: 0 when the players add up (no interaction);
    positive when swaps reinforce each other, negative when they offset or overlap."""
    v = np.asarray(v, dtype=float)
    return (v[-1] - v[0]) - singles(v).sum(axis=0)


def smallest_sets(hit) -> list[int]:
    """The subsets of smallest size for which ``hit[mask]`` is True (every one of that size), or []."""
    hit = np.asarray(hit, dtype=bool)
    n_players(hit)
    masks = np.flatnonzero(hit)
    if masks.size == 0:
        return []
    size = popcount(masks)
    return [int(m) for m in masks[size == size.min()]]


def grouped(v, groups) -> np.ndarray:
    """The game on coarser players: ``groups`` is a list of disjoint masks covering every player; the value of a
    set of groups is ``v`` of the union of their masks. ``(2^len(groups), ...)``, for :func:`shapley`."""
    v = np.asarray(v, dtype=float)
    k = n_players(v)
    groups = [int(g) for g in groups]
    union = 0
    for g in groups:
        if g <= 0 or g & union or g >> k:
            raise ValueError(f"groups {groups}: expected disjoint non-empty masks of {k} players")
        union |= g
    if union != 2 ** k - 1:
        raise ValueError(f"groups {groups}: they must cover all {k} players")
    return np.stack([v[sum(g for i, g in enumerate(groups) if t >> i & 1)] for t in range(2 ** len(groups))])
