"""The pre-registered confirmatory family: written, and hashed, after the step grid (fixed shapes, no case window) and before any case's run.

:func:`build` fixes, from the analysis' reversal table and the campaign's runs alone:

* **Cases** (<= 5): the key reversal and the stable control (:func:`.cases.select_cases`, as before),
  then at most ``extra_reversals`` further significant-and-practical reversals of the headline panel
  on a headline metric, drawn at random with the recorded ``draw_seed``, **stratified by source pair**
  (:func:`draw_reversals`: the source pairs in a seeded random order, one reversal drawn from each in
  turn), so that the family is not the largest simulated effects (the winner's curse).
* Per case: metric, direction (per source, the campaign's sign: the direction each one-sided test takes).
* **Windows** (:func:`power`): per source the smallest number of windows n (between ``min_windows`` and
  ``max_windows``) at which every case's intersection-union test has at least ``power_target`` power at
  Holm's strictest threshold alpha / m, simulated by resampling the campaign's per-window effects of
  the case (:func:`.confirm.window_effects`) and adding the engine's noise (a window's metric varies by
  ``noise_cv`` (relative) between repeated engine replays, so an effect of two such values by
  sqrt(2) x ``noise_cv``); the one-sided exact Wilcoxon test of :func:`.confirm.one_sided_wilcoxon`.
  A case that cannot reach the target within ``max_windows`` stays in the family, its power recorded.
* The windows themselves (random per source, ``validation.window_seed``), alpha and the correction (Holm).

:func:`write` stores it as canonical JSON (sorted keys, no timestamp: the same inputs give the same
bytes) and returns its SHA-256, which goes into ``summary.json``; :func:`check` verifies the file
against a recorded hash before the verdicts are computed.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import polars as pl
from scipy import stats as sst

from ..core import io
from ..core.errors import DataError
from . import cases as cases_mod
from .cases import Case
from . import confirm
from .confirm import CORRECTION, window_effects

MAX_CASES = 5


@dataclass(frozen=True)
class PowerSettings:
    """How the number of windows is chosen (:func:`power`)."""

    alpha: float
    target: float
    noise_cv: float
    min_windows: int
    max_windows: int
    simulations: int
    seed: int


def _source_pair(c: Case) -> str:
    return "/".join(sorted(c.sources))


def draw_reversals(candidates: Sequence[Case], k: int, seed: int, exclude: Sequence[Case] = ()) -> list[Case]:
    """At most ``k`` reversals drawn at random from ``candidates`` (those of ``exclude``: same pair,
    region, metric and sources, left out), stratified by source pair: the pairs in a random order (seeded),
    one reversal drawn from each pair in turn, until ``k`` are drawn or none is left."""
    ident = lambda c: (c.a, c.b, c.region, c.metric, tuple(sorted(c.sources)))  # noqa: E731
    skip = {ident(c) for c in exclude}
    strata: dict[str, list[Case]] = {}
    for c in candidates:
        if ident(c) not in skip:
            strata.setdefault(_source_pair(c), []).append(c)
    rng = np.random.default_rng(int(seed))
    order = [sorted(strata)[i] for i in rng.permutation(len(strata))]
    pools = {p: sorted(strata[p], key=ident) for p in order}
    out: list[Case] = []
    while len(out) < k and any(pools.values()):
        for p in order:
            if len(out) >= k:
                break
            if pools[p]:
                out.append(pools[p].pop(int(rng.integers(len(pools[p])))))
    return [Case(c.kind, c.a, c.b, c.region, c.metric, c.sides, rho=c.rho, direction=c.direction,
                 notes=f"drawn at random (seed {seed}) from the {_source_pair(c)} stratum")
            for c in out]


def choose_cases(rev: pl.DataFrame, region_loads: Mapping[str, float], *, extra: int, seed: int,
                 eligible: Callable[[str], bool] | None = None) -> tuple[list[Case], list[Case], list[str]]:
    """``(confirmatory, exploratory, messages)``: the key reversal, the control and <= ``extra`` reversals
    drawn by :func:`draw_reversals` from the headline panel's significant-and-practical reversals on headline
    metrics whose two policies are ``eligible``; exploratory: every other such reversal (any metric a replay
    measures), most dramatic first."""
    sel = cases_mod.select_cases(rev, region_loads, eligible=eligible or cases_mod.engine_runnable)
    fixed = [c for c in sel.cases[:2] if c.kind in ("reversal", "control")]
    key = [c for c in fixed if c.kind == "reversal"]
    rest = [c for c in sel.cases if c not in fixed]
    if key:   # the control is replayed on the key reversal's sources
        fixed = [c if c.kind != "control" else _restrict(c, key[0].sources) for c in fixed]
    head = cases_mod.check_reversals(rev)
    head_metrics = set(head.filter(pl.col("headline"))["metric"].unique().to_list()) if "headline" in head.columns \
        else {c.metric for c in rest}
    pool = [c for c in rest if c.kind == "reversal" and c.metric in head_metrics]
    drawn = draw_reversals(pool, min(int(extra), MAX_CASES - len(fixed)), seed, exclude=key)
    chosen = fixed + drawn
    explore = [c for c in rest if not any(_same(c, d) for d in chosen)]
    return chosen, explore, list(sel.messages)


def _restrict(c: Case, sources: Sequence[str]) -> Case:
    sides = tuple(s for s in c.sides if s.source in sources)
    return Case(c.kind, c.a, c.b, c.region, c.metric, sides, rho=c.rho, direction=c.direction,
                notes=c.notes + f"; replayed on {', '.join(sources)}") if len(sides) == len(sources) else c


def _same(x: Case, y: Case) -> bool:
    return (x.a, x.b, x.region, x.metric, sorted(x.sources)) == (y.a, y.b, y.region, y.metric, sorted(y.sources))


def case_power(effects: Sequence[np.ndarray], signs: Sequence[int], n: int, ps: PowerSettings, m: int,
               rng: np.random.Generator, levels: Sequence[np.ndarray] | None = None) -> float:
    """Simulated power of one case's intersection-union test with ``n`` windows per side at Holm's strictest
    threshold alpha / m: resample each side's campaign effects (windows with their ``levels``: 1 for relative
    effects, the metric's level for absolute ones), add the engine's noise (sqrt(2) x noise_cv x level), run
    the one-sided exact Wilcoxon test per side; the share of simulations in which every side rejects."""
    if not effects or any(e.size == 0 for e in effects) or any(s == 0 for s in signs):
        return 0.0
    levels = levels if levels is not None else [np.ones_like(e) for e in effects]
    thr = ps.alpha / max(int(m), 1)
    ok = np.ones(ps.simulations, bool)
    for e, lv, s in zip(effects, levels, signs):
        idx = rng.integers(0, e.size, size=(ps.simulations, n))
        d = e[idx] + rng.normal(0.0, 1.0, size=idx.shape) * math.sqrt(2.0) * ps.noise_cv * lv[idx]
        p = sst.wilcoxon(d, alternative="greater" if s > 0 else "less", axis=-1, method="exact").pvalue
        ok &= np.asarray(p) < thr
    return float(ok.mean())


def power(the_cases: Sequence[Case], runs: pl.DataFrame, ps: PowerSettings) -> dict:
    """The windows per source of the family (module docstring) and every case's power at it."""
    m = len(the_cases)
    eff, lev = [], []
    for c in the_cases:
        got = [window_effects(runs, s.source, c.region, c.metric, c.a, c.b, c.direction, with_level=True)
               for s in c.sides]
        eff.append(([g[1] for g in got], [int(np.sign(s.diff)) if math.isfinite(s.diff) else 0 for s in c.sides]))
        lev.append([g[2] for g in got])
    table: dict[int, list[float]] = {}
    chosen = None
    for n in range(int(ps.min_windows), int(ps.max_windows) + 1):
        rng = np.random.default_rng([int(ps.seed), n])
        table[n] = [case_power(e, s, n, ps, m, rng, lv) for (e, s), lv in zip(eff, lev)]
        if all(x >= ps.target for x in table[n]):
            chosen = n
            break
    n_use = chosen if chosen is not None else int(ps.max_windows)
    return {"windows_per_source": n_use, "target_reached": chosen is not None,
            "power_at_n": table[n_use], "power_by_n": {str(k): v for k, v in table.items()},
            "campaign_windows": [[int(x.size) for x in e] for e, _ in eff],
            "campaign_effect_mean": [[float(np.mean(x)) if x.size else math.nan for x in e] for e, _ in eff],
            "campaign_effect_sd": [[float(np.std(x, ddof=1)) if x.size > 1 else math.nan for x in e] for e, _ in eff],
            "threshold": ps.alpha / max(m, 1), "settings": ps.__dict__}


def case_entry(c: Case, power_at_n: float) -> dict:
    """What the file fixes for one case."""
    return {"kind": c.kind, "a": c.a, "b": c.b, "region": c.region, "rho": c.rho, "metric": c.metric,
            "direction": c.direction, "notes": c.notes,
            "sides": [{"source": s.source, "campaign_sign": int(np.sign(s.diff)) if math.isfinite(s.diff) else 0,
                       "campaign_diff": s.diff, "campaign_rel": s.rel, "campaign_p_adj": s.p_adj} for s in c.sides],
            "test": "one-sided exact Wilcoxon signed-rank over windows per source, in the campaign's direction; "
                    "intersection-union over the sources (case p = the largest side's)",
            "power": power_at_n}


def document(the_cases: Sequence[Case], pw: dict, windows: Mapping[str, Sequence[str]], *, alpha: float,
             inputs: Mapping, draw_seed: int, extra: int, margin: float) -> dict:
    """The pre-registration as a plain dict (what :func:`write` stores)."""
    return {"what": "portbench real-engine validation: pre-registered confirmatory family",
            "cases": [case_entry(c, p) for c, p in zip(the_cases, pw["power_at_n"])],
            "n_cases": len(the_cases), "windows_per_source": pw["windows_per_source"],
            "windows": {s: list(w) for s, w in sorted(windows.items())},
            "alpha": float(alpha), "correction": CORRECTION,
            "confirmed_when": "both (every) one-sided tests in the simulated direction reject (intersection-union) "
                              f"and the case's p, Holm-adjusted over the {len(the_cases)} cases, is below alpha",
            "equivalence_margin": float(margin),
            "decided_by": {"engine": confirm.DECIDING_ENGINE, "what": confirm.ENGINES[confirm.DECIDING_ENGINE],
                           "also_reported": [e for e in confirm.ENGINES if e != confirm.DECIDING_ENGINE]},
            "draw": {"seed": int(draw_seed), "extra_reversals": int(extra), "stratified_by": "source pair"},
            "power": pw, "inputs": dict(inputs),
            "exploratory": "every other case and statistic: sign and effect-size agreement with intervals, "
                           "no significance language"}


def canonical(doc: Mapping) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, default=io.json_default) + "\n").encode()


def sha256(doc: Mapping) -> str:
    return hashlib.sha256(canonical(doc)).hexdigest()


def write(path: Path, doc: Mapping) -> str:
    """Write the pre-registration (canonical JSON) and return its SHA-256."""
    data = canonical(doc)
    io.write_text(Path(path), data.decode())
    return hashlib.sha256(data).hexdigest()


def check(path: Path, expected: str) -> dict:
    """The pre-registration read back; DataError when its bytes no longer hash to ``expected``."""
    data = Path(path).read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise DataError(path, f"the pre-registration changed after it was written (SHA-256 {got[:12]}..., "
                              f"recorded {expected[:12]}...): rerun the validation")
    return json.loads(data)


def cases_from(doc: Mapping) -> list[Case]:
    """The confirmatory cases of a pre-registration document."""
    out = []
    for e in doc["cases"]:
        sides = tuple(cases_mod.SideResult(source=s["source"], diff=float(s["campaign_diff"]),
                                           rel=float(s["campaign_rel"]), p_adj=float(s["campaign_p_adj"]),
                                           significant=True) for s in e["sides"])
        out.append(Case(e["kind"], e["a"], e["b"], e["region"], e["metric"], sides, rho=e["rho"],
                        direction=e["direction"], notes=e["notes"]))
    return out
