"""Two questions, two verdicts, and the confirmatory family's tests.

Every comparison here takes per-window metric tables (one row per ``source, window_id, region,
scheduler`` with one column per metric: :func:`.verdict.engine_metric_rows` on the per-request records
of *any* replayer -- the wall-clock one, :mod:`.replay`, or the virtual vLLM engine -- or the
re-simulation's rows), so the verdicts serve every engine.

* **Per-window effect** (:func:`window_effects`): for a pair (a, b) on one source, per window the
  oriented difference ``a - b`` (positive = a better), relative for a ratio- or count-scale metric
  (divided by the mean of |a| and |b|, as ``stats.relative_effect``) and absolute for a proportion.
* **Step 1, does the finding survive the engine's settings?** (:func:`survives_settings`): the
  campaign's per-source sign vs the re-simulation under the engine's exact settings (same windows,
  limits, KV cache, budget, prefix caching, token scale). It survives when every side keeps the
  campaign's sign with at least the practical size (``analysis.delta``, ``delta_absolute`` for
  proportions); otherwise the case is
  *not testable on this engine*: the engine could not show the finding even if the simulator were
  perfect.
* **Step 2, does the engine reproduce the re-simulation?** (:func:`engine_vs_resim`): per side the
  paired per-window difference of effects ``engine - re-simulation``, its mean with a
  (1 - 2 alpha) t interval, and a TOST at the pre-set ``margin``: *reproduced* when every side is
  equivalent (both one-sided tests reject at alpha: the interval lies inside +-margin), *not
  reproduced* when a side differs beyond the margin (the one-sided test of ``|difference| >
  margin`` rejects at alpha: the interval lies entirely outside), *inconclusive* otherwise.
* **Confirmatory test** (:func:`confirm_case`): per side the one-sided exact Wilcoxon signed-rank
  test of the engine's per-window differences in the simulated direction; the case's p-value is the
  largest of its sides' (intersection-union: the case is confirmed only when every side is), and the
  family's p-values are adjusted with Holm (:func:`holm`) over the <= 5 pre-registered cases.
* **Can the run confirm anything?** (:func:`confirmability`, ``summary.json`` ``confirmability``): with n windows
  per source the smallest one-sided exact p is 1/2^n and Holm multiplies the family's smallest by its size m, so
  no case can be confirmed unless m / 2^n < alpha (the reduced run's 3 windows cannot: a smoke run).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import polars as pl
from scipy import stats as sst

from ..sim import metrics
from ..study import stats
from .cases import Case

CORRECTION = "holm"      # the confirmatory family's correction (one name everywhere)
# The engines a case can be judged on, and the one the pre-registration names to decide it (written into
# preregistration.json before any replay): the virtual vLLM engine (vLLM's V1 scheduler in a virtual clock at the
# campaign's own settings: every policy, every pre-registered window, deterministic; validation/family.py); the
# wall-clock CPU engine (scaled token counts and limits, timing noise) is reported beside it, exploratory.
ENGINES = {"virtual": "virtual vLLM engine (vLLM 0.32's V1 scheduler in a virtual clock) at the campaign's own "
                      "settings: its profile (cost model, KV cache, token budget, context limit), prefix caching, "
                      "token counts unscaled, the campaign's capacity per window; sarathi with its own budget",
           "wall_clock": "wall-clock vLLM CPU engine (the replays; token counts and limits scaled by token_scale): "
                         "exploratory"}
DECIDING_ENGINE = "virtual"
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable on this engine")


# --------------------------------------------------------------------------- effects


def window_effects(runs: pl.DataFrame, source: str, region: str, metric: str, a: str, b: str,
                   direction: str | None = None, *, with_level: bool = False):
    """Windows where both a and b were measured and the per-window oriented effect of a over b
    (relative for ratio metrics, absolute for proportions; replicates averaged); ``with_level``: also the
    per-window level (|a| + |b|) / 2 (in which an absolute effect's noise is counted)."""
    direction = direction or metrics.direction(metric)
    empty: tuple = ([], np.array([]), np.array([])) if with_level else ([], np.array([]))
    if runs.height == 0 or metric not in runs.columns:
        return empty
    sub = (runs.filter((pl.col("source") == source) & (pl.col("region") == region) & pl.col("scheduler").is_in([a, b]))
           .group_by(["window_id", "scheduler"]).agg(pl.col(metric).mean()))
    if sub.height == 0:
        return empty
    wide = sub.pivot(on="scheduler", index="window_id", values=metric).sort("window_id")
    if a not in wide.columns or b not in wide.columns:
        return empty
    wide = wide.drop_nulls([a, b]).filter(pl.col(a).is_not_nan() & pl.col(b).is_not_nan())
    va, vb = wide[a].to_numpy().astype(float), wide[b].to_numpy().astype(float)
    d = stats.orient(va, direction) - stats.orient(vb, direction)
    level = (np.abs(va) + np.abs(vb)) / 2.0
    relative = metric_scale(metric) != "proportion"
    if relative:
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.where(level > 0, d / level, 0.0)
    if with_level:
        return wide["window_id"].to_list(), d, (np.ones_like(level) if relative else level)
    return wide["window_id"].to_list(), d


def metric_scale(metric: str) -> str:
    """The metric's scale (``metrics.scale``): proportions -> absolute effects, ratio and count -> relative."""
    return metrics.scale(metric)


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided t interval at ``level`` over ``n`` values."""

    mean: float
    lo: float
    hi: float
    n: int
    level: float

    def to_dict(self) -> dict:
        return asdict(self)


def mean_ci(x, level: float) -> Interval:
    """Mean of ``x`` and its t interval (NaN bounds for fewer than two values)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level)
    m = float(x.mean())
    if n < 2:
        return Interval(m, math.nan, math.nan, n, level)
    se = float(x.std(ddof=1) / math.sqrt(n))
    h = float(sst.t.ppf(0.5 + level / 2, n - 1) * se)
    return Interval(m, m - h, m + h, n, level)


# --------------------------------------------------------------------------- tests


def one_sided_wilcoxon(d, sign: int) -> float:
    """p of the exact Wilcoxon signed-rank test of H1 "the differences ``d`` lean to ``sign``"
    (+1: positive); zeros dropped (p = 1 when none is left). Its floor over n non-zero differences is 1/2^n."""
    d = np.asarray(d, float)
    d = d[np.isfinite(d) & (d != 0)]
    if d.size == 0 or sign == 0:
        return 1.0
    alt = "greater" if sign > 0 else "less"
    method = "exact" if d.size <= 50 and np.unique(np.abs(d)).size == d.size else "auto"
    return float(sst.wilcoxon(d, alternative=alt, method=method).pvalue)


def intersection_union(p_sides: Sequence[float]) -> float:
    """p of the intersection-union test: H1 holds on every side, so the case's p is the largest side's
    (NaN sides count as 1)."""
    p = [1.0 if not math.isfinite(float(x)) else float(x) for x in p_sides]
    return max(p) if p else 1.0


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error), through the analysis' ``stats.adjust_pvalues``."""
    arr = np.asarray(p, float)
    return stats.adjust_pvalues(arr, CORRECTION) if arr.size else arr


@dataclass(frozen=True)
class Tost:
    """Equivalence of a paired mean difference to 0 within +-margin, and the test beyond it."""

    mean: float
    lo: float              # (1 - 2 alpha) t interval
    hi: float
    n: int
    margin: float
    p_equivalent: float    # TOST: max of the two one-sided p-values (H0: mean <= -margin or mean >= margin)
    p_beyond: float        # H0: |mean| <= margin, one-sided toward the side of the observed mean
    verdict: str           # reproduced | not reproduced | inconclusive

    def to_dict(self) -> dict:
        return asdict(self)


def tost(x, margin: float, alpha: float) -> Tost:
    """Paired t TOST of ``x`` (per-window differences) at ``margin``: ``reproduced`` when equivalent
    (p_equivalent < alpha, i.e. the (1 - 2 alpha) interval inside +-margin), ``not reproduced`` when the
    mean differs beyond the margin (p_beyond < alpha), ``inconclusive`` otherwise or with < 2 windows."""
    ci = mean_ci(x, 1 - 2 * alpha)
    n, m = ci.n, ci.mean
    if n < 2:
        return Tost(m, ci.lo, ci.hi, n, margin, math.nan, math.nan, "inconclusive")
    xs = np.asarray(x, float)
    xs = xs[np.isfinite(xs)]
    se = float(xs.std(ddof=1) / math.sqrt(n))
    df = n - 1
    if se == 0:
        p_eq = 0.0 if abs(m) < margin else 1.0
        p_bey = 0.0 if abs(m) > margin else 1.0
    else:
        p_low = float(sst.t.sf((m + margin) / se, df))      # H0: mean <= -margin
        p_up = float(sst.t.cdf((m - margin) / se, df))      # H0: mean >= margin
        p_eq = max(p_low, p_up)
        p_bey = float(sst.t.sf((abs(m) - margin) / se, df))  # H0: |mean| <= margin
    verdict = "reproduced" if p_eq < alpha else ("not reproduced" if p_bey < alpha else "inconclusive")
    return Tost(m, ci.lo, ci.hi, n, margin, p_eq, p_bey, verdict)


# --------------------------------------------------------------------------- the two verdicts


def practical_size(metric: str, delta: float, delta_absolute: float) -> float:
    """The practical size in effect units: ``delta`` (relative) for ratio and count metrics, ``delta_absolute``
    for proportions (the analysis' two thresholds)."""
    return float(delta_absolute if metric_scale(metric) == "proportion" else delta)


def survives_settings(case: Case, resim_runs: pl.DataFrame, *, delta: float, level: float,
                      campaign_runs: pl.DataFrame | None = None, delta_absolute: float | None = None) -> dict:
    """Step 1: per side the campaign's effect and the re-simulation's under the engine's settings (mean
    per-window effect with its t interval, in the same units: :func:`window_effects`; the campaign's over its
    own windows when ``campaign_runs`` is given, else its relative effect).

    The question depends on the case's kind (``question``): a **reversal** survives when every side of the
    re-simulation keeps the campaign's sign with |effect| >= the practical size (:func:`practical_size`: the
    finding is a practically large reversal); a **control** (a pair whose order is the same on every source) asks
    whether *the order holds*: every side keeps the campaign's sign with its ``level`` interval excluding 0 -- the
    control was chosen for a significant, stable order, not for its size, so the size rule would call a small but
    clear order "not testable". ``survives`` is the answer in both cases (``order_holds`` too for a control)."""
    direction = case.direction or metrics.direction(case.metric)
    size = practical_size(case.metric, delta, delta if delta_absolute is None else delta_absolute)
    control = case.kind == "control"
    sides, ok = [], True
    for s in case.sides:
        wins, e = window_effects(resim_runs, s.source, case.region, case.metric, case.a, case.b, direction)
        ci = mean_ci(e, level)
        sign = int(np.sign(s.diff)) if math.isfinite(s.diff) else 0
        same_sign = bool(ci.n > 0 and sign != 0 and np.sign(ci.mean) == sign)
        if control:
            clear = bool(math.isfinite(ci.lo) and math.isfinite(ci.hi) and (ci.lo > 0 or ci.hi < 0))
            keeps = same_sign and clear
        else:
            keeps = same_sign and abs(ci.mean) >= size
        ok = ok and keeps
        if campaign_runs is not None:
            camp = mean_ci(window_effects(campaign_runs, s.source, case.region, case.metric, case.a, case.b,
                                          direction)[1], level).to_dict()
        else:
            camp = {"mean": sign * float(s.rel) if math.isfinite(s.rel) else math.nan, "lo": math.nan,
                    "hi": math.nan, "n": 0, "level": level}
        sides.append({"source": s.source, "campaign_effect": camp, "resim_effect": ci.to_dict(),
                      "keeps_sign_and_size" if not control else "keeps_order": keeps})
    out = {"survives": bool(ok and sides), "practical_size": size,
           "question": "does the order hold" if control else "does the reversal survive", "sides": sides}
    if control:
        out["order_holds"] = out["survives"]
        out["rule"] = (f"every side keeps the campaign's sign with its {level:.0%} interval excluding 0 (no size rule: "
                       "a control is chosen for a stable, significant order)")
    return out


def engine_vs_resim(case: Case, engine_runs: pl.DataFrame, resim_runs: pl.DataFrame, *, margin: float,
                    alpha: float) -> dict:
    """Step 2: per side the engine's and the re-simulation's per-window effects on the same windows, their
    means with (1 - 2 alpha) intervals, and :func:`tost` of the paired difference (engine - re-simulation).
    The case: ``reproduced`` when every side is, ``not reproduced`` when any side is, else ``inconclusive``."""
    direction = case.direction or metrics.direction(case.metric)
    level = 1 - 2 * alpha
    sides: list[dict] = []
    for s in case.sides:
        we, e = window_effects(engine_runs, s.source, case.region, case.metric, case.a, case.b, direction)
        wr, r = window_effects(resim_runs, s.source, case.region, case.metric, case.a, case.b, direction)
        common = sorted(set(we) & set(wr))
        ie, ir = {w: i for i, w in enumerate(we)}, {w: i for i, w in enumerate(wr)}
        ee = np.array([e[ie[w]] for w in common])
        rr = np.array([r[ir[w]] for w in common])
        t = tost(ee - rr, margin, alpha)
        sides.append({"source": s.source, "windows": len(common), "engine_effect": mean_ci(ee, level).to_dict(),
                      "resim_effect": mean_ci(rr, level).to_dict(),
                      "sign_agrees": bool(len(common) and np.sign(ee.mean()) == np.sign(rr.mean()) != 0),
                      "difference": t.to_dict()})
    v = [sd["difference"]["verdict"] for sd in sides]
    verdict = ("reproduced" if v and all(x == "reproduced" for x in v) else
               "not reproduced" if "not reproduced" in v else "inconclusive")
    return {"verdict": verdict, "margin": float(margin), "alpha": float(alpha), "sides": sides}


def confirm_case(case: Case, engine_runs: pl.DataFrame) -> dict:
    """One confirmatory case on the engine: per side the one-sided Wilcoxon test in the simulated
    direction (the campaign's sign), the intersection-union p (largest side's). Holm: :func:`holm`."""
    direction = case.direction or metrics.direction(case.metric)
    sides: list[dict] = []
    for s in case.sides:
        _, d = window_effects(engine_runs, s.source, case.region, case.metric, case.a, case.b, direction)
        sign = int(np.sign(s.diff)) if math.isfinite(s.diff) else 0
        sides.append({"source": s.source, "direction": sign, "windows": int(d.size),
                      "p_one_sided": one_sided_wilcoxon(d, sign)})
    return {"sides": sides, "p_iut": intersection_union([x["p_one_sided"] for x in sides])}


def confirm_family(results: Sequence[dict], alpha: float) -> list[dict]:
    """Holm over the family's intersection-union p-values: each result gains ``p_holm`` and ``confirmed``."""
    p_adj = holm([r["p_iut"] for r in results])
    return [{**r, "p_holm": float(pa), "confirmed": bool(pa < alpha)} for r, pa in zip(results, p_adj)]


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def min_p_one_sided(windows: int) -> float:
    """The smallest p the one-sided exact Wilcoxon signed-rank test can give over ``windows`` non-zero differences:
    1/2^n, every difference on the tested side (the 2^n equally likely sign patterns under H0; ties in the
    magnitudes change the ranks, not that count). 1 without a window."""
    return 0.5 ** windows if windows > 0 else 1.0


def confirmability(windows: int, cases: int, alpha: float, *, preregistered: int | None = None) -> dict:
    """Can the confirmatory family confirm any case at all with ``windows`` windows per source, whatever the engine
    measures? A case's intersection-union p is at least :func:`min_p_one_sided` (that of its sides with the fewest
    windows), and Holm multiplies the family's smallest p by the number of ``cases``: a confirmation needs
    ``cases / 2^windows < alpha`` (:func:`confirm_family`'s strict rule). ``min_windows``: the fewest windows per
    source for which it is possible. ``preregistered``: the pre-registration's windows per source, said in the
    reason when the run tested fewer."""
    m = max(int(cases), 1)
    p = min_p_one_sided(int(windows))
    p_holm = min(1.0, m * p)
    need = 1
    while min(1.0, m * min_p_one_sided(need)) >= alpha and need < 64:
        need += 1
    ok = bool(cases > 0 and p_holm < alpha)
    pre = (f" (the pre-registration fixed {preregistered})" if preregistered is not None and preregistered != windows
           else "")
    reason = (f"with {_n(windows, 'window')} per source{pre} the smallest one-sided exact p is 1/2^{windows} = {p:.3g}; "
              f"Holm over {_n(cases, 'case')} makes the smallest adjusted p {p_holm:.3g}, "
              + (f"below α = {alpha:g}: a case can be confirmed" if ok else
                 f"not below α = {alpha:g}: no case can be confirmed, whatever the engine measures")
              + f" ({need} windows per source are the fewest that can confirm one)")
    out = {"can_confirm": ok, "windows": int(windows), "cases": int(cases), "alpha": float(alpha), "min_p": p,
           "min_p_holm": p_holm, "min_windows": need, "reason": reason}
    if preregistered is not None:
        out["windows_preregistered"] = int(preregistered)
    return out


def tested_windows(rows: Sequence[dict]) -> int | None:
    """The windows per source the confirmatory tests of ``rows`` (:func:`verdicts` / :func:`combine`) had at best:
    per case the fewest over its sides (its intersection-union p's floor), the most over the cases; None without a
    confirmatory case."""
    per_case = [min((int(sd["windows"]) for sd in r["confirmatory"]["sides"]), default=0)
                for r in rows if r.get("role") == "confirmatory" and r.get("confirmatory")]
    return max(per_case) if per_case else None


def case_verdict(survives: dict, ev: dict) -> str:
    """The case's verdict: ``not testable on this engine`` when the finding does not survive the engine's
    settings in re-simulation (for a control: its order does not hold there), else step 2's (reproduced / not
    reproduced / inconclusive)."""
    return "not testable on this engine" if not survives["survives"] else ev["verdict"]


def outcome_words(row: dict) -> str:
    """The confirmatory outcome of a case in words: a reversal is "confirmed" / "not confirmed"; a control's
    question is whether its order holds, so "order holds (confirmed)" / "order not shown (not confirmed)"."""
    ok = bool((row.get("confirmatory") or {}).get("confirmed"))
    if row.get("kind") == "control":
        return "order holds on the engine (confirmed)" if ok else "order not shown on the engine (not confirmed)"
    return "confirmed" if ok else "not confirmed"


def case_label(c: Case) -> str:
    return f"{c.kind} {c.a} vs {c.b} ({c.metric}, {c.region}, {'/'.join(c.sources)})"


def verdicts(confirmatory: Sequence[Case], exploratory: Sequence[Case], engine_runs: pl.DataFrame,
             resim_runs: pl.DataFrame, *, alpha: float, delta: float, margin: float,
             delta_absolute: float | None = None, campaign_runs: pl.DataFrame | None = None) -> list[dict]:
    """Per case (confirmatory first): ``survives_settings`` (step 1), ``engine_vs_resim`` (step 2),
    ``verdict`` (:func:`case_verdict`); confirmatory cases also ``confirmatory`` (one-sided tests, the
    intersection-union p, its Holm adjustment over the family, ``confirmed``). Exploratory cases carry the
    same effect sizes and intervals but no test outcome beyond step 2's interval (``role``)."""
    conf = confirm_family([confirm_case(c, engine_runs) for c in confirmatory], alpha) if confirmatory else []
    out = []
    for i, c in enumerate([*confirmatory, *exploratory]):
        surv = survives_settings(c, resim_runs, delta=delta, level=1 - 2 * alpha, campaign_runs=campaign_runs,
                                 delta_absolute=delta_absolute)
        ev = engine_vs_resim(c, engine_runs, resim_runs, margin=margin, alpha=alpha)
        row = {"case": case_label(c), "kind": c.kind, "a": c.a, "b": c.b, "region": c.region, "metric": c.metric,
               "sources": list(c.sources), "role": "confirmatory" if i < len(confirmatory) else "exploratory",
               "campaign_sign": {s.source: int(np.sign(s.diff)) if math.isfinite(s.diff) else 0 for s in c.sides},
               "survives_settings": surv, "engine_vs_resim": ev, "verdict": case_verdict(surv, ev)}
        if i < len(confirmatory):
            row["confirmatory"] = conf[i]
        out.append(row)
    return out


def combine(by_engine: dict[str, list[dict]], deciding: str = DECIDING_ENGINE) -> list[dict]:
    """One row per case from :func:`verdicts` run once per engine (``by_engine``: engine -> rows, the same cases
    in the same order; an engine may judge only the first ones, e.g. the confirmatory family): the deciding
    engine's ``survives_settings``, ``engine_vs_resim``, ``verdict`` and ``confirmatory`` (where it has no row
    for a case, the first engine that has), ``decided_by``, ``decided_as_preregistered`` and ``by_engine`` with
    every engine's own four."""
    keep = ("survives_settings", "engine_vs_resim", "verdict", "confirmatory")
    n = max((len(rows) for rows in by_engine.values()), default=0)
    out = []
    for i in range(n):
        per = {e: rows[i] for e, rows in by_engine.items() if i < len(rows)}
        lead = deciding if deciding in per else next(iter(per))
        row = per[lead]
        for e, other in per.items():
            if other["case"] != row["case"] or other["role"] != row["role"]:
                raise ValueError(f"engine {e}'s case {i} is {other['case']!r}, not {row['case']!r}")
        out.append({**row, "decided_by": lead, "decided_as_preregistered": lead == deciding,
                    "by_engine": {e: {k: r[k] for k in keep if k in r} for e, r in per.items()}})
    return out


def verdict_counts(rows: Sequence[dict]) -> dict:
    """Counts per role: verdicts (:data:`VERDICTS`) and, for the confirmatory family, how many are confirmed."""
    out = {}
    for role in ("confirmatory", "exploratory"):
        rs = [r for r in rows if r["role"] == role]
        out[role] = {"cases": len(rs), **{v: sum(r["verdict"] == v for r in rs) for v in VERDICTS}}
        if role == "confirmatory":
            out[role]["confirmed"] = sum(bool(r["confirmatory"]["confirmed"]) for r in rs)
    return out


def verdict_line(counts: dict) -> str:
    """One line: the confirmatory family's outcome and the exploratory verdicts."""
    c, e = counts.get("confirmatory", {}), counts.get("exploratory", {})
    part = lambda d: ", ".join(f"{d[v]} {v}" for v in VERDICTS if d.get(v))  # noqa: E731
    return (f"confirmatory: {c.get('confirmed', 0)} of {c.get('cases', 0)} confirmed (Holm); {part(c) or 'no case'}"
            f" | exploratory ({e.get('cases', 0)} cases): {part(e) or 'none'}")
