"""The leading property's robustness: is the property with the largest Shapley share the largest under every
tie rule and on every compared metric on its own?

The attribution's headline per source pair is its **leading property** (the player with the largest share of
the A -> B disagreement, pooled over the regions x metrics). That choice rests on two decisions of the analysis
that the bootstrap does not vary: the tie rule (``analysis.ties``) and the set of metrics pooled. So the
attribution is recomputed, from the same runs, under every tie rule of :data:`~portbench.core.config.TIE_RULES`
(point estimates) and on each metric alone (the chosen rule, pooled over the regions). The leading property is
**robust** when every variant has the same leader; otherwise it is **not robust**, and the variants that flip it
are named with their leader. A variant whose top two shares are equal has no leader (``None``), which counts as
a flip; a variant with no disagreement to split (the two sources rank alike there: every share undefined) has
nothing to attribute and is listed apart (``nothing_to_attribute``), not counted either way. Beside it: how often the leader leads in the bootstrap resamples of the chosen rule (the resamples keep
the tie rule's groups, so this is the narrower uncertainty), and its margin over the runner-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..analysis.common import _num

DEFINITION = ("the leading property (largest Shapley share of the A -> B disagreement, pooled over the regions x "
              "metrics) recomputed from the same runs under every tie rule (analysis.ties: point estimates) and on each "
              "compared metric alone (the chosen rule, pooled over the regions); robust = the same leader in every "
              "variant, else not robust (the flipping variants named); a variant whose top two shares are equal has "
              "no leader and counts as a flip; a variant where the sources rank alike has nothing to attribute and "
              "is listed apart")
TOP_TIE = 1e-12        # shares closer than this are equal (no leader)


def pooled_shares(phi, total, sel=None) -> np.ndarray:
    """Each player's share ``(k[, B])``: the sum of its Shapley values over the conditions where the
    disagreement is defined (and ``sel``, a boolean ``(R, M)`` mask, is True) / the sum of the disagreement.
    ``phi`` ``(k, R, M[, B])``, ``total`` ``(R, M[, B])``. NaN where that sum is not positive."""
    phi = np.asarray(phi, dtype=float)
    total = np.asarray(total, dtype=float)
    ok = np.isfinite(total)
    if sel is not None:
        s = np.asarray(sel, dtype=bool)
        ok = ok & s.reshape(s.shape + (1,) * (total.ndim - s.ndim))
    num = np.where(ok[None], phi, 0.0).sum(axis=(1, 2))
    den = np.where(ok, total, 0.0).sum(axis=(0, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def leader(shares, names: Sequence[str]) -> str | None:
    """The player with the largest share; None when no share is finite or the top two are equal."""
    x = np.asarray(shares, dtype=float)
    if x.size == 0 or not np.isfinite(x).any():
        return None
    x = np.where(np.isfinite(x), x, -np.inf)
    order = np.argsort(-x, kind="stable")
    if x.size > 1 and x[order[0]] - x[order[1]] <= TOP_TIE:
        return None
    return names[int(order[0])]


def margin(shares) -> float | None:
    """The largest share minus the second largest (None with fewer than two finite shares)."""
    x = np.asarray(shares, dtype=float)
    x = np.sort(x[np.isfinite(x)])[::-1]
    return float(x[0] - x[1]) if x.size > 1 else None


def leader_frequency(phi_b, total_b, names: Sequence[str], lead: str | None) -> float | None:
    """The share of bootstrap resamples whose pooled leader is ``lead`` (``phi_b`` ``(k, R, M, B)``)."""
    if lead is None or phi_b is None:
        return None
    s = pooled_shares(phi_b, total_b)                                   # (k, B)
    leads = [leader(s[:, b], names) for b in range(s.shape[1])]
    return float(np.mean([x == lead for x in leads])) if leads else None


def verdict(lead: str | None, variants: Mapping[str, str | None], nothing: Sequence[str] = ()) -> dict:
    """``robust`` when ``lead`` exists and every variant (but those in ``nothing``: nothing to attribute) has it
    as its leader; ``flips``: the other variants and their leaders."""
    flips = {k: v for k, v in variants.items() if v != lead and k not in nothing}
    robust = lead is not None and not flips
    return {"leader": lead, "robust": robust, "verdict": "robust" if robust else "not robust", "flips": flips,
            "nothing_to_attribute": [k for k in variants if k in nothing]}


def pair_robustness(names: Sequence[str], metrics: Sequence[str], chosen: str, by_rule: Mapping[str, tuple],
                    boot: tuple | None = None) -> dict:
    """The robustness of one pair's leading property. ``by_rule``: ``{tie rule: (phi (k, R, M), total (R, M))}``
    including ``chosen`` (the analysis' rule); ``boot``: ``(phi_b, total_b)`` of the chosen rule, or None."""
    names = list(names)
    phi, total = by_rule[chosen]
    base = pooled_shares(phi, total)
    lead = leader(base, names)

    def entry(shares) -> dict:
        return {"leader": leader(shares, names), "margin": _num(margin(shares)),
                "shares": {p: _num(float(v)) for p, v in zip(names, shares)}}

    rules = {r: entry(pooled_shares(*v)) for r, v in by_rule.items()}
    per_metric = {}
    for m, met in enumerate(metrics):
        sel = np.zeros(np.asarray(total).shape[:2], dtype=bool)
        sel[:, m] = True
        per_metric[met] = entry(pooled_shares(phi, total, sel))
    named = {**{f"tie rule {r}": e for r, e in rules.items() if r != chosen},
             **{f"metric {m}": e for m, e in per_metric.items()}}
    nothing = [k for k, e in named.items() if all(v is None for v in e["shares"].values())]
    out = verdict(lead, {k: e["leader"] for k, e in named.items()}, nothing)
    out.update({"tie_rule": chosen, "margin": _num(margin(base)),
                "bootstrap_leader_frequency": _num(leader_frequency(boot[0], boot[1], names, lead)) if boot else None,
                "by_tie_rule": rules, "by_metric": per_metric})
    return out


def summarise(pairs: Mapping[str, dict]) -> dict:
    """The ``attribution.robustness`` section: the definition, every pair's verdict and the count robust."""
    return {"definition": DEFINITION, "pairs": dict(pairs),
            "robust_pairs": sum(1 for p in pairs.values() if p["robust"]), "n_pairs": len(pairs)}
