"""The real-engine verdicts on orders: does the order predicted for the engine hold under its real clock?

Input: the per-replay table of the paired design (:mod:`.design`'s docstring: one row per replay, with
``case, source, window, policy, pair, position, is_aa, slot, replay_index, machine_speed`` and the
window-level metrics) and, per case, the plan's entry (:mod:`.plan`) and the engine-scale prediction.

* **Paired log-ratio** (:func:`pair_effects`): per pair, the oriented effect of slot ``a`` over slot ``b``,
  positive = ``a`` better: ``log(b / a)`` for a metric where lower is better (latencies), ``log(a / b)``
  where higher is better; an absolute difference for a proportion (SLO attainment), whose log is not a
  scale of its own. Pairs are clustered by window: the window's effect is the mean of its a/b pairs.
* **Per side** (:func:`side_test`): one-sided exact sign-flip permutation test over the windows' effects
  (all ``2^k`` sign patterns for ``k <= 16``, else a seeded sample of 2^16 that includes the observed one),
  in the direction of the engine-scale prediction and in the opposite one; the mean effect with a 95 % t
  interval over windows; the equivalence test (TOST, ``t`` over windows) of the engine's effect against the
  prediction within +-:data:`TOST_MARGIN`; Kendall's tau of the two policies' order per window against the
  predicted order (with two policies tau is +1 or -1 per window; its mean is reported).
* **Per case** (:func:`case_verdicts`): *holds* when every side decides in the predicted direction,
  *reverses* when every side decides in the opposite one; a side decides when its one-sided p, as the
  case's largest (intersection-union), Holm-adjusted over the <= 4 cases and doubled for the two
  directions, is below ``alpha``; *undetermined* otherwise, with the effect the run could resolve
  (:func:`.design.resolvable_effect` at the run's own k, r and measured sigma_r); *not testable* with a
  reason class: ``no data`` (a side with fewer than two windows of a/b pairs), ``the engine-scale
  prediction flips the sign`` or ``the prediction falls below delta`` (a drawn case only: the two primary
  cases are tested whatever the prediction says, against the prediction).
* **The A/A check** (:func:`aa_check`): the A/A pairs (one policy twice, labelled by the ABBA slot they fill)
  through the same per-side test: the share of sides on which the test declares an order where there is
  none (the false-reversal rate; <= alpha on simulated null data, ``tests/test_validation_design.py``);
  sigma_r = SD of the A/A pairs' log-ratios / sqrt(2); the order effect = mean of log(first / second).
* **The planted reversal** (:func:`planted`): the case ``planted`` (fcfs vs ``delay_shortest``, known
  order: fcfs better) is *detected* when its verdict is *holds* with fcfs predicted better.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np
import polars as pl
from scipy import stats as sst

from ..sim import metrics
from ..study import stats
from . import design

ALPHA = 0.05
TOST_MARGIN = 0.1          # on the log scale: the engine's effect within +-0.1 of the prediction (about 10 %)
EXACT_MAX_WINDOWS = 16
MC_DRAWS = 2**16
VERDICTS = ("holds", "reverses", "undetermined", "not testable")
REASONS = {"no_data": "no data",
           "flips": "the engine-scale prediction flips the sign",
           "below_delta": "the prediction falls below delta"}


def is_log(metric: str) -> bool:
    """Log-ratios for ratio and count metrics; an absolute difference for proportions."""
    return metrics.scale(metric) != "proportion"


def oriented(va, vb, metric: str) -> np.ndarray:
    """Effect of ``a`` over ``b`` (positive = a better) from their values (module docstring)."""
    va, vb = np.asarray(va, float), np.asarray(vb, float)
    lower = metrics.direction(metric) == "lower"
    if is_log(metric):
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.log(vb) - np.log(va)
    else:
        d = vb - va
    return -d if not lower else d


def pair_effects(table: pl.DataFrame, metric: str, *, aa: bool = False) -> pl.DataFrame:
    """Per pair (``case, source, window, pair``): the oriented effect ``d`` of slot a over slot b (A/A pairs
    with ``aa``, a/b pairs otherwise), and ``order_d`` = the same of the first replay over the second."""
    cols = ["case", "source", "window", "pair"]
    empty = pl.DataFrame(schema={"case": pl.Utf8, "source": pl.Utf8, "window": pl.Utf8, "pair": pl.Int64,
                                 "d": pl.Float64, "order_d": pl.Float64})
    if table.height == 0 or metric not in table.columns:
        return empty
    sub = table.filter(pl.col("is_aa") == aa).select(*cols, "slot", "position", pl.col(metric).cast(pl.Float64))
    a = sub.filter(pl.col("slot") == "a").select(*cols, pl.col(metric).alias("va"), pl.col("position").alias("pa"))
    b = sub.filter(pl.col("slot") == "b").select(*cols, pl.col(metric).alias("vb"))
    m = a.join(b, on=cols, how="inner").drop_nulls(["va", "vb"]).filter(pl.col("va").is_not_nan()
                                                                         & pl.col("vb").is_not_nan())
    if m.height == 0:
        return empty
    d = oriented(m["va"].to_numpy(), m["vb"].to_numpy(), metric)
    first_a = m["pa"].to_numpy() == 0
    # the first replay's effect over the second: = d when slot a ran first
    order_d = np.where(first_a, d, -d)
    return (m.select(cols).with_columns(pl.Series("d", d), pl.Series("order_d", order_d))
            .filter(pl.col("d").is_finite()).sort(cols))


def window_effects(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per (case, source, window): mean of its pairs' ``d`` and their number."""
    return (pairs.group_by(["case", "source", "window"]).agg(pl.col("d").mean(), pl.len().alias("pairs"))
            .sort(["case", "source", "window"]))


# --------------------------------------------------------------------------- the test


def sign_flip_p(x, sign: int, seed: int = 0) -> float:
    """p of the one-sided sign-flip permutation test of H1 "the values ``x`` lean to ``sign``" (+1: positive),
    statistic = their sum: the share of the 2^k sign patterns (exact for k <= 16, else a seeded sample
    that includes the observed pattern) whose sum is at least as far in ``sign``'s direction. 1 for no value
    or ``sign`` 0; its floor is 1/2^k."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    k = x.size
    if k == 0 or sign == 0:
        return 1.0
    obs = float(sign * x.sum())
    tol = 1e-12 * max(1.0, float(np.abs(x).sum()))
    if k <= EXACT_MAX_WINDOWS:
        return float(np.mean(sign * (design.sign_flip_matrix(k) @ x) >= obs - tol))
    rng = np.random.default_rng(seed)
    s = rng.choice((1.0, -1.0), size=(MC_DRAWS - 1, k))
    return float((1 + np.sum(sign * (s @ x) >= obs - tol)) / MC_DRAWS)


def mean_ci(x, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided t interval (NaN bounds for fewer than two values)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    h = float(sst.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - h, m + h


def tost(x, target: float, margin: float = TOST_MARGIN, alpha: float = ALPHA) -> dict:
    """t-test TOST over windows: is the mean of ``x`` within ``target`` +- ``margin``? ``equivalent`` when both
    one-sided tests reject at ``alpha`` (the 1 - 2 alpha interval lies inside), ``different`` when the interval
    lies wholly outside, ``inconclusive`` otherwise or with fewer than two windows / no target."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    m, lo, hi = mean_ci(x, 1 - 2 * alpha)
    out = {"target": target, "margin": margin, "mean": m, "lo": lo, "hi": hi, "p": math.nan,
           "verdict": "inconclusive"}
    if x.size < 2 or not math.isfinite(target):
        return out
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    if se == 0:
        p = 0.0 if abs(m - target) < margin else 1.0
    else:
        p = max(float(sst.t.sf((m - target + margin) / se, x.size - 1)),
                float(sst.t.cdf((m - target - margin) / se, x.size - 1)))
    out["p"] = p
    out["verdict"] = ("equivalent" if p < alpha else
                      "different" if (lo > target + margin or hi < target - margin) else "inconclusive")
    return out


@dataclass
class SideResult:
    """The per-side statistics of one case."""

    source: str
    sign: int                  # the direction tested as "holds": the engine-scale prediction's sign
    windows: int
    pairs: int
    effect: float              # mean over windows of the window's mean paired effect
    ci: tuple[float, float]    # 95 % t interval over windows
    p_predicted: float         # one-sided sign-flip p in the predicted direction
    p_opposite: float
    tau: float                 # mean Kendall tau (two policies: +1 / -1 per window) against the prediction
    tost: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci"] = list(self.ci)
        return d


def side_test(w: np.ndarray, sign: int, prediction: float = math.nan, pairs: int = 0, source: str = "",
              seed: int = 0) -> SideResult:
    """One side's statistics from its windows' effects ``w`` (module docstring)."""
    w = np.asarray(w, float)
    w = w[np.isfinite(w)]
    m, lo, hi = mean_ci(w)
    tau = float(np.mean(np.sign(w) * sign)) if w.size and sign else math.nan
    return SideResult(source=source, sign=int(sign), windows=int(w.size), pairs=int(pairs), effect=m, ci=(lo, hi),
                      p_predicted=sign_flip_p(w, sign, seed), p_opposite=sign_flip_p(w, -sign, seed), tau=tau,
                      tost=tost(w, prediction))


# --------------------------------------------------------------------------- cases


def _sign(x: float | None) -> int:
    return int(np.sign(x)) if x is not None and math.isfinite(float(x)) else 0


def not_testable_reason(entry: Mapping, prediction: Mapping[str, float], delta: float) -> str | None:
    """For a drawn case, the reason class it is not tested (:data:`REASONS`), from its engine-scale prediction
    per side: a missing prediction is ``no data``; a sign other than the campaign's, ``flips``; a size below
    ``delta`` (on the effect's own scale), ``below_delta``. The primary cases (``key``, ``control``,
    ``planted``) are always tested: None."""
    if entry.get("role") != "draw":
        return None
    for s in entry["sources"]:
        p = prediction.get(s)
        if p is None or not math.isfinite(float(p)):
            return REASONS["no_data"]
        if _sign(p) != int(entry["campaign_sign"][s]):
            return REASONS["flips"]
    for s in entry["sources"]:
        if abs(float(prediction[s])) < delta:
            return REASONS["below_delta"]
    return None


def tested_sign(entry: Mapping, prediction: Mapping[str, float], source: str) -> int:
    """The direction a side is tested in: the engine-scale prediction's sign, else the campaign's."""
    return _sign(prediction.get(source)) or int(entry["campaign_sign"][source])


def case_verdicts(entries: Sequence[Mapping], table: pl.DataFrame, predictions: Mapping[str, Mapping[str, float]],
                  *, alpha: float = ALPHA, delta: float = math.log1p(0.05), sigma_r: float = math.nan,
                  r: int | None = None, seed: int = 0) -> list[dict]:
    """Every case's verdict (module docstring). ``entries``: the plan's cases (``id, role, a, b, metric, region,
    sources, campaign_sign`` per source); ``predictions[id][source]``: the engine-scale effect on the
    verdict's scale; ``delta``: the practical size on that scale (log(1.05) by default)."""
    rows: list[dict] = []
    for e in entries:
        pred = dict(predictions.get(e["id"], {}))
        pe = pair_effects(table.filter(pl.col("case") == e["id"]) if table.height else table, e["metric"])
        we = window_effects(pe)
        sides = []
        for s in e["sources"]:
            g = we.filter(pl.col("source") == s)
            sides.append(side_test(g["d"].to_numpy(), tested_sign(e, pred, s), pred.get(s, math.nan),
                                   int(g["pairs"].sum()) if g.height else 0, s, seed))
        reason = not_testable_reason(e, pred, delta)
        if reason is None and any(sd.windows < 2 for sd in sides):
            reason = REASONS["no_data"]
        rows.append({"entry": e, "sides": sides, "reason": reason, "prediction": pred,
                     "p_hold": max(sd.p_predicted for sd in sides) if sides else 1.0,
                     "p_rev": max(sd.p_opposite for sd in sides) if sides else 1.0})
    # the smaller of the two directions' p, doubled (two directions), Holm over the tested cases of the family;
    # the planted reversal is a check of the procedure, tested on its own (not in the family)
    tested = [i for i, row in enumerate(rows) if row["reason"] is None and row["entry"].get("role") != "planted"]
    p_case = [min(1.0, 2 * min(rows[i]["p_hold"], rows[i]["p_rev"])) for i in tested]
    adj = stats.adjust_pvalues(np.asarray(p_case, float), "holm") if tested else np.array([])
    for j, i in enumerate(tested):
        rows[i]["p_holm"] = float(adj[j])
    for row in rows:
        if row["reason"] is None and row["entry"].get("role") == "planted":
            row["p_holm"] = min(1.0, 2 * min(row["p_hold"], row["p_rev"]))
    out = []
    for row in rows:
        e, sides = row["entry"], row["sides"]
        k = min((sd.windows for sd in sides), default=0)
        if row["reason"] is not None:
            verdict, p_holm = "not testable", math.nan
        else:
            p_holm = row["p_holm"]
            if p_holm < alpha:
                verdict = "holds" if row["p_hold"] <= row["p_rev"] else "reverses"
            else:
                verdict = "undetermined"
        m = 1 if e.get("role") == "planted" else max(len(tested), 1)
        resolvable = (design.resolvable_effect(k, r or 1, sigma_r, m=m, alpha=alpha)
                      if k >= 1 and math.isfinite(sigma_r) else math.nan)
        reason = row["reason"]
        if verdict == "undetermined":
            reason = (f"no decision at alpha = {alpha} after Holm over {m} case(s); the run resolves a paired "
                      f"effect of {resolvable:.3f} (log) with 80 % power" if math.isfinite(resolvable) else
                      f"no decision at alpha = {alpha} after Holm over {m} case(s); with {k} windows the exact test "
                      "cannot decide (or sigma_r is unknown)")
        out.append({
            "id": e["id"], "pair": [e["a"], e["b"]], "metric": e["metric"], "region": e["region"],
            "sources": list(e["sources"]), "selection": e.get("selection", {}),
            "prediction": {s: {"effect": row["prediction"].get(s), "campaign_sign": int(e["campaign_sign"][s]),
                               "tested_sign": sd.sign} for s, sd in zip(e["sources"], sides)},
            "k": k, "r": r, "effect": {sd.source: sd.effect for sd in sides},
            "ci": {sd.source: list(sd.ci) for sd in sides}, "verdict": verdict, "reason": reason,
            "p_holm": p_holm, "resolvable_effect": resolvable,
            "scale": "log-ratio, positive = a better" if is_log(e["metric"]) else "difference, positive = a better",
            "sides": [sd.to_dict() for sd in sides]})
    return out


# --------------------------------------------------------------------------- A/A and planted


def aa_check(table: pl.DataFrame, metric_of: Mapping[str, str], *, alpha: float = ALPHA, seed: int = 0) -> dict:
    """The A/A pairs of every case (``metric_of[case]``: the case's metric): per side the sign-flip test of the
    slot-labelled A/A log-ratios over windows, both directions at alpha / 2; ``false_reversal_rate`` = the
    share of sides that declare an order (there is none); ``sigma_r`` = SD of the A/A log-ratios / sqrt(2),
    pooled over the ratio metrics' cases; the order effect = mean log(first / second) with its 95 % interval."""
    per, ds, orders = [], [], []
    for case, metric in metric_of.items():
        pe = pair_effects(table.filter(pl.col("case") == case) if table.height else table, metric, aa=True)
        if pe.height == 0:
            continue
        if is_log(metric):
            ds.append(pe["d"].to_numpy())
            orders.append(pe["order_d"].to_numpy())
        for (src,), g in window_effects(pe).group_by(["source"], maintain_order=True):
            w = g["d"].to_numpy()
            p = min(1.0, 2 * min(sign_flip_p(w, 1, seed), sign_flip_p(w, -1, seed)))
            per.append({"case": case, "source": src, "windows": int(w.size), "pairs": int(g["pairs"].sum()),
                        "p": p, "declared": bool(p < alpha)})
    d = np.concatenate(ds) if ds else np.array([])
    o = np.concatenate(orders) if orders else np.array([])
    om, olo, ohi = mean_ci(o)
    testable = [x for x in per if x["windows"] >= 2]
    return {"pairs": int(sum(x["pairs"] for x in per)),
            "sigma_r": float(d.std(ddof=1) / math.sqrt(2)) if d.size > 1 else math.nan,
            "false_reversal_rate": (float(np.mean([x["declared"] for x in testable])) if testable else math.nan),
            "sides_tested": len(testable), "order_effect": {"mean": om, "ci": [olo, ohi]},
            "sides": per,
            "definition": "A/A pairs (one policy twice) labelled by their ABBA slot through the per-side test at "
                          f"alpha = {alpha} (two-sided); false_reversal_rate = share of sides declaring an order; "
                          "sigma_r = SD of the A/A log-ratios / sqrt(2) (replay-to-replay SD of the window-level "
                          "log metric); order_effect = mean log(first replay / second) of the A/A pairs"}


def planted(results: Sequence[Mapping], case_id: str = "planted") -> dict:
    """Whether the planted reversal (fcfs vs delay_shortest, fcfs better) was found: its verdict *holds* with
    fcfs predicted better on every side. ``detected`` None when the run has no planted case."""
    for r in results:
        if r["id"] == case_id:
            a_better = all(p["tested_sign"] == (1 if r["pair"][0] == "fcfs" else -1) for p in r["prediction"].values())
            return {"detected": bool(r["verdict"] == "holds" and a_better), "verdict": r["verdict"],
                    "pair": r["pair"], "metric": r["metric"], "effect": r["effect"], "ci": r["ci"]}
    return {"detected": None, "reason": "the run has no planted case"}


# --------------------------------------------------------------------------- summary.json


SUMMARY_KEYS = ("cases", "aa", "planted", "preregistration", "conformance_at_campaign_settings")
CASE_KEYS = ("pair", "metric", "region", "sources", "selection", "prediction", "k", "r", "effect", "ci", "verdict",
             "reason")
AA_KEYS = ("pairs", "sigma_r", "false_reversal_rate")


def summary_core(results: Sequence[Mapping], aa: Mapping, preregistration: Mapping,
                 conformance: Mapping | None) -> dict:
    """The part of ``data/results/validation/summary.json`` a check reads (issue #38's key names): ``cases`` (the
    family, planted left out), ``aa``, ``planted``, ``preregistration`` (``sha256``, ``code_version``),
    ``conformance_at_campaign_settings`` (:func:`.family.conformance`; None where it did not run)."""
    return {"cases": [dict(c) for c in results if c.get("id") != "planted"], "aa": dict(aa),
            "planted": planted(results),
            "preregistration": {"sha256": preregistration.get("sha256"),
                                "code_version": preregistration.get("code_version")},
            "conformance_at_campaign_settings": dict(conformance) if conformance is not None else
            {"ran": False, "reason": "not run (needs vLLM and the campaign's runs)"}}


def check_summary(s: Mapping) -> list[str]:
    """What a summary lacks of the key contract (empty when complete)."""
    out = [f"summary: no `{k}`" for k in SUMMARY_KEYS if k not in s]
    for i, c in enumerate(s.get("cases") or []):
        out += [f"cases[{i}]: no `{k}`" for k in CASE_KEYS if k not in c]
        if c.get("verdict") not in VERDICTS:
            out.append(f"cases[{i}]: verdict {c.get('verdict')!r} not one of {', '.join(VERDICTS)}")
    out += [f"aa: no `{k}`" for k in AA_KEYS if k not in (s.get("aa") or {})]
    if "detected" not in (s.get("planted") or {}):
        out.append("planted: no `detected`")
    out += [f"preregistration: no `{k}`" for k in ("sha256", "code_version") if k not in (s.get("preregistration") or {})]
    return out
