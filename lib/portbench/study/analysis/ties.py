"""Paired side tests and statistical ties: which schedulers a ranking can tell apart.

**Side tests.** For every scheduler pair, source, region and metric: the paired two-sided Wilcoxon
signed-rank test over windows (:func:`portbench.study.stats.paired_wilcoxon`) of the oriented per-window
differences, the two means and the pair's effect on the metric's scale (relative for ratio metrics,
absolute for proportions, points of the window for counts: :func:`portbench.study.stats.effect_size`).
The same tests serve the tie rule and the reversals (which correct them in other families).

**Tie rules** (``analysis.ties``), which decide the *resolved* pairs of one ranking:

* ``significance`` (default): the pair's Wilcoxon test rejects at ``alpha`` after ``analysis.tie_correction``
  over the 78 pairs of that ranking (Benjamini-Hochberg by default: among the orders a ranking claims, the
  expected share of spurious ones is at most alpha), in the direction of the mean difference;
* ``significance_practical``: as above and the effect is at least delta (relative or absolute);
* ``tolerance``: the old rule, means within ``analysis.rank_tolerance`` of the next-better mean (single
  linkage) - a sensitivity row;
* ``exact``: only equal means tie.

For the significance rules the tie groups are :func:`portbench.study.stats.tie_partition` of the resolved
pairs: runs of the mean order whose members are pairwise unresolved, built greedily from the best (no
chaining). Every tied scheduler gets its group's mean (:func:`portbench.study.stats.group_values`), and all
ranking statistics use those values. **Bootstrap:** the groups are those of the full data; a resample
re-orders the groups by their resampled means (re-testing inside a resample would treat duplicated windows
as independent evidence). So CIs measure how stable the order of the resolved groups is, given what the
40 windows resolve.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import polars as pl

from ...core.config import TIE_RULES
from .. import stats
from .columns import COLUMNS
from .common import _frame, _num, _stat
from .cube import Cube

RULE_TEXT = {
    "significance": "tied unless the paired Wilcoxon test over windows tells them apart",
    "significance_practical": "tied unless the paired Wilcoxon test tells them apart and they differ by at least delta",
    "tolerance": "tied when the means are within the relative rank tolerance (single linkage; the old rule)",
    "exact": "tied only when the means are exactly equal",
}


def deltas(cube: Cube, cfg: dict) -> np.ndarray:
    """The practical threshold of every metric: ``delta`` (relative) for ratio metrics,
    ``delta_absolute`` (percentage points; of the window's requests for counts) for the others."""
    return np.array([cfg["delta"] if sc == "ratio" else cfg["delta_absolute"] for sc in cube.scales])


def side_tests(cube: Cube, window_size: float) -> dict[str, dict]:
    """Per source: ``mean_a``, ``mean_b`` (raw units), ``diff`` (oriented, + = a better), ``rel``
    (relative effect), ``effect`` (on the metric's scale) and ``test`` (:class:`~portbench.study.stats.PairedTest`),
    each of shape (regions, metrics, scheduler pairs) with pairs in ``np.triu_indices`` order."""
    ia, ib = np.triu_indices(len(cube.schedulers), 1)
    out = {}
    for s in cube.sources:
        raw = cube.values[s]
        xo = cube.oriented(s)
        d = xo[:, :, ia, :] - xo[:, :, ib, :]                         # (R, M, P, W)
        both = ~np.isnan(d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ma = np.nanmean(np.where(both, raw[:, :, ia, :], np.nan), axis=-1)
            mb = np.nanmean(np.where(both, raw[:, :, ib, :], np.nan), axis=-1)
            diff = np.nanmean(d, axis=-1)
        effect = np.stack([stats.effect_size(ma[:, m], mb[:, m], sc, window_size)
                           for m, sc in enumerate(cube.scales)], axis=1)
        out[s] = {"mean_a": ma, "mean_b": mb, "diff": diff, "rel": stats.relative_effect(ma, mb),
                  "effect": effect, "test": stats.paired_wilcoxon(d)}
    return out


@dataclass
class Ranking:
    """The rankings of every source under one tie rule (arrays per source)."""

    rule: str
    labels: dict[str, np.ndarray]             # (R, M, K) tie-group labels, 0 = best group; -1 = missing
    values: dict[str, np.ndarray]             # (R, M, K) oriented group means (exact ties within a group)
    boot: dict[str, np.ndarray | None]        # (R, M, K, B) the same per resample (groups fixed)
    resolved: dict[str, np.ndarray] | None    # (R, M, P) pairs the rule resolves (significance rules)
    p_tie: dict[str, np.ndarray] | None       # (R, M, P) p-values adjusted within each ranking

    def n_groups(self, s: str) -> np.ndarray:
        return stats.n_groups(self.labels[s])


def _adjust_within(p: np.ndarray, method: str) -> np.ndarray:
    """Adjust p-values ``(R, M, P)`` within each ranking (each (region, metric))."""
    if method == "none":
        return p.copy()
    groups = np.broadcast_to(np.arange(p.shape[0] * p.shape[1]).reshape(p.shape[:2])[..., None], p.shape)
    return stats.adjust_pvalues(p, method, groups).reshape(p.shape)


def rank(rule: str, cube: Cube, means: dict, boot: dict, side: dict, cfg: dict, delta: np.ndarray,
         with_boot: bool = True) -> Ranking:
    """Tie groups and group values of every source's rankings under ``rule`` (one of TIE_RULES)."""
    if rule not in TIE_RULES:
        raise ValueError(f"tie rule {rule!r}: expected one of {TIE_RULES}")
    K = len(cube.schedulers)
    labels, values, bvals, resolved, p_tie = {}, {}, {}, {}, {}
    for s in cube.sources:
        if rule in ("significance", "significance_practical"):
            t = side[s]["test"]
            p_adj = _adjust_within(t.pvalue, cfg["tie_correction"])
            res = stats.side_significant(p_adj, t.direction, side[s]["diff"], cfg["alpha"])
            if rule == "significance_practical":
                with np.errstate(invalid="ignore"):
                    res = res & (side[s]["effect"] >= delta[None, :, None])
            resolved[s], p_tie[s] = res, p_adj
            labels[s] = stats.tie_partition(means[s], stats.pair_matrix(res, K))
        else:
            labels[s] = stats.tolerance_labels(means[s], cfg["rank_tolerance"] if rule == "tolerance" else 0.0)
        values[s] = stats.group_values(means[s], labels[s])
        bvals[s] = stats.group_values(boot[s], labels[s], axis=-2) if with_boot and boot[s] is not None else None
    sig = rule in ("significance", "significance_practical")
    return Ranking(rule=rule, labels=labels, values=values, boot=bvals, resolved=resolved if sig else None,
                   p_tie=p_tie if sig else None)


@dataclass
class Restricted:
    """The rankings without the schedulers that are n/a on some sources (e.g. ``vtc`` where a trace has no
    tenants, :func:`portbench.study.analysis.reversals.tenant_na`). A comparison of two rankings that
    involves a source of ``sources`` uses these rankings on both sides: ``dropped`` are left out and the
    others re-ranked (their own side tests, tie correction over their own pairs, tie groups)."""

    sources: list[str]                 # sources where ``dropped`` are n/a
    dropped: list[str]
    cube: Cube                         # the cube without ``dropped``
    rk: Ranking                        # the chosen rule's rankings of every source on that cube
    others: dict[str, Ranking]         # the other rules' (point estimates)

    def uses(self, *sources: str) -> bool:
        """Whether a comparison between ``sources`` leaves ``dropped`` out."""
        return any(s in self.sources for s in sources)

    def reason(self, sources=None) -> str:
        srcs = list(sources) if sources is not None else self.sources
        return (f"{', '.join(self.dropped)}: n/a on {', '.join(srcs)} (no tenants in the trace: one tenant, so a "
                "tenant-fair policy has nothing to equalise); every comparison of rankings that involves one of these "
                f"sources ranks the other {len(self.cube.schedulers)} schedulers only, on both sides")


def restrict(na: dict[str, set[str]], cube: Cube, means: dict, boot: dict, cfg: dict, delta: np.ndarray,
             rule: str, other_rules=()) -> Restricted | None:
    """:class:`Restricted` rankings for the n/a schedulers ``na`` ({source: schedulers}); None when nothing
    is n/a or fewer than two schedulers would remain."""
    dropped = sorted(set().union(*na.values())) if na else []
    keep = [k for k, name in enumerate(cube.schedulers) if name not in dropped]
    if not dropped or len(keep) < 2:
        return None
    sub = Cube(sources=cube.sources, provenance=cube.provenance, regions=cube.regions, rho=cube.rho,
               metrics=cube.metrics, directions=cube.directions, schedulers=[cube.schedulers[k] for k in keep],
               windows=cube.windows, values={s: v[:, :, keep] for s, v in cube.values.items()},
               n_replicates={s: n[:, keep] for s, n in cube.n_replicates.items()}, notes=cube.notes, names=cube.names)
    m = {s: v[..., keep] for s, v in means.items()}
    b = {s: (v[:, :, keep] if v is not None else None) for s, v in boot.items()}
    side = side_tests(sub, cfg["window_size"])
    return Restricted(sources=[s for s in cube.sources if na.get(s)], dropped=dropped, cube=sub,
                      rk=rank(rule, sub, m, b, side, cfg, delta),
                      others={r: rank(r, sub, m, b, side, cfg, delta, with_boot=False) for r in other_rules if r != rule})


def tie_pairs_table(cube: Cube, side: dict, rk: Ranking, delta: np.ndarray) -> pl.DataFrame:
    """One row per (source, region, metric, scheduler pair): the test, the tie decision and the groups."""
    K = np.asarray(cube.schedulers, dtype=object)
    ia, ib = np.triu_indices(len(K), 1)
    frames = []
    for s in cube.sources:
        lab = rk.labels[s]
        ga, gb = lab[:, :, ia], lab[:, :, ib]
        t = side[s]["test"]
        res = rk.resolved[s] if rk.resolved is not None else (ga != gb)
        p_tie = rk.p_tie[s] if rk.p_tie is not None else np.full(ga.shape, np.nan)
        f = _frame({"region": cube.regions, "metric": cube.metrics, "pair": list(range(len(ia)))},
                   diff=side[s]["diff"], effect=side[s]["effect"], delta=np.broadcast_to(delta[None, :, None], ga.shape),
                   n_nonzero=t.n_nonzero, p=t.pvalue, p_tie=p_tie, resolved=res, group_a=ga + 1, group_b=gb + 1,
                   separated=ga != gb, conflict=(ga != gb) & ~res)
        f = f.with_columns(pl.col("pair").replace_strict(dict(enumerate(K[ia])), return_dtype=pl.Utf8).alias("a"),
                           pl.col("pair").replace_strict(dict(enumerate(K[ib])), return_dtype=pl.Utf8).alias("b"),
                           pl.lit(s).alias("source"), pl.lit(cube.provenance[s]).alias("provenance"))
        frames.append(f.select(list(COLUMNS["tie_pairs"])))
    return pl.concat(frames)


def _rule_counts(cube: Cube, rk: Ranking, sources: list[str], metric_idx: list[int]) -> dict:
    """Rankings, all-tied rankings and the mean number of tie groups over ``sources`` x regions x the metrics."""
    g = np.concatenate([rk.n_groups(s)[:, metric_idx].ravel() for s in sources]) if sources else np.zeros(0)
    ok = g > 0
    return {"rankings": int(ok.sum()), "all_tied": int((g[ok] == 1).sum()),
            "mean_groups": _num(g[ok].mean()) if ok.any() else None,
            "fully_resolved": int((g[ok] == len(cube.schedulers)).sum())}


def ties_summary(cube: Cube, side: dict, chosen: Ranking, others: dict[str, Ranking], cfg: dict,
                 delta: np.ndarray, headline_idx: list[int]) -> dict:
    """The ``ties`` section of summary.json: the rule, how much it resolves, conflicts of non-transitive
    pairs, and the same counts under the other rules (a sensitivity row each)."""
    S, K = cube.sources, len(cube.schedulers)
    n_pairs = K * (K - 1) // 2
    out: dict = {
        "rule": chosen.rule,
        "definition": f"two schedulers are {RULE_TEXT[chosen.rule]}; tie groups = runs of the mean order whose "
                      "members are pairwise tied, built greedily from the best (a proper partition, no chaining); "
                      "tied schedulers share their group's mean",
        "test": "two-sided Wilcoxon signed-rank over windows (the reversals' side test), "
                f"{cfg['tie_correction']} over the {n_pairs} scheduler pairs of each ranking, alpha = {cfg['alpha']}, "
                "in the direction of the mean difference",
        "bootstrap": "tie groups fixed at the full data's; each resample re-orders the groups by their resampled "
                     "means",
        "headline": _rule_counts(cube, chosen, S, headline_idx),
        "all_metrics": _rule_counts(cube, chosen, S, list(range(len(cube.metrics)))),
    }
    if chosen.resolved is not None:
        sel = np.zeros(len(cube.metrics), bool)
        sel[headline_idx] = True
        res = np.stack([chosen.resolved[s] for s in S])[:, :, sel]            # (S, R, Mh, P)
        eff = np.stack([side[s]["effect"] for s in S])[:, :, sel]
        labs = np.stack([chosen.labels[s] for s in S])[:, :, sel]
        valid = np.all(labs >= 0, axis=-1)[..., None] & np.ones(res.shape, bool)
        n = int(valid.sum())
        r = int((res & valid).sum())
        with np.errstate(invalid="ignore"):
            small = int((res & valid & (eff < delta[sel][None, None, :, None])).sum())
        conf = int(sum(stats.tie_conflicts(chosen.labels[s][:, sel],
                                           stats.pair_matrix(chosen.resolved[s][:, sel], K)).sum() for s in S))
        out["resolved_pairs"] = _stat(r / n if n else None, "fraction of scheduler pairs the rule resolves "
                                      "(headline metrics, every source and region)", n, resolved=r)
        out["resolved_below_delta"] = _stat(small / r if r else None, "of the resolved pairs, the fraction whose "
                                            "effect is below delta (consistent but practically small differences)",
                                            r, pairs=small)
        out["conflicts"] = _stat(conf, "pairs no test resolves that the partition still puts in different groups "
                                 "(resolution is not transitive: a ~ b, b ~ c, a resolved from c)", n - r)
    out["by_rule"] = {rule: {**_rule_counts(cube, rk, S, headline_idx), "definition": RULE_TEXT[rule],
                             "chosen": rule == chosen.rule}
                      for rule, rk in {chosen.rule: chosen, **others}.items()}
    return out
