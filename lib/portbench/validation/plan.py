"""The pre-registration of the real-engine verdicts: ``papermill_params/validation_plan.yaml``.

Frozen from the analysis' own tables before any engine runs, and committed:

* **rules** -- alpha, the practical size delta, the TOST margin, the share of A/A pairs, the effect the design
  is sized for (>= 25 %), the draw seed, and how each case is chosen (below);
* **sigma_r** -- the replay-to-replay SD of the window-level log metric the design is sized with, its date
  and where it comes from (an earlier run's A/A pairs; until one exists, the stored repeat replays' range,
  0.05-0.20, marked ``measured: false``), and the design it gives (:func:`.design.size`: k windows x r pairs);
* **cases** -- chosen by the analysis' own strength (``strength = min(effect_1, effect_2) / delta``, the
  measure by which ``study/analysis/reversals.py`` names the most dramatic reversal):

  1. ``key``: the results' most dramatic reversal -- among the headline panel's significant-and-practical
     reversals on a headline metric, the largest strength (ties: region, metric, a, b), exactly the
     analysis' ``most_dramatic``;
  2. ``control``: the strongest stable comparison on the key's two sources -- significant and practical on
     both, same sign, a headline metric, another scheduler pair (ties as above);
  3. ``draws``: <= 2 seeded random draws among the comparisons strong on both sides (the analysis' ports
     table: ``four_way`` ``same_order`` and ``reversal`` across sources of the headline panel), one same-order
     and one reversed. The plan fixes a seeded order of candidates for each; the run registers the first whose
     engine-scale prediction keeps the campaign's sign and size (:func:`pick_draw`), so a draw is tested only
     where the engine could show it;
  4. ``planted``: fcfs vs ``delay_shortest`` on the key's sources, region and a latency metric (known order);

* **code_version** -- the git commit at freeze (for the record) and the SHA-256 of the package's source that
  decides a verdict (:data:`CODE_PATHS`), which is what the check compares;
* **changes** -- a dated change log (each refreeze adds an entry saying what and why);
* **seal** -- the SHA-256 of everything above it.

:func:`check` refuses (DataError, one message) when the file was edited after it was frozen or the code
differs from the frozen one; ``python -m portbench.validation plan freeze --why "..."`` (re)freezes it,
``... check`` checks it, ``... show`` prints the cases.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import polars as pl
import yaml

from ..core.errors import DataError, PortbenchError
from . import design

PLAN_FILE = "papermill_params/validation_plan.yaml"
CODE_PATHS = ("lib/portbench/validation", "lib/portbench/vllm", "lib/portbench/sim")
SEAL_MARK = "seal: "
ROLES = ("key", "control", "draw_same", "draw_reversed", "planted")
HEADER = ("# The pre-registration of the real-engine verdicts (issue #38; docs/validation.md). Written by\n"
          "# `python -m portbench.validation plan freeze --why '...'` -- do not edit by hand: the run refuses a file\n"
          "# whose seal does not match, or code whose source hash differs from code_version.source_sha256.\n")

DEFAULT_RULES: dict[str, Any] = {
    "alpha": 0.05,
    "delta": 0.05,
    "tost_margin_log": 0.1,
    "aa_share": design.AA_SHARE,
    "target_effect": 0.25,
    "power": design.POWER,
    "draw_seed": 38,
    "draw_candidates": 5,
    "design_seed": 0,
    "key": "the most dramatic reversal: headline panel, headline metric, reversal & significant & practical, "
           "largest strength = min(effect_1, effect_2) / delta (ties: region, metric, a, b)",
    "control": "the strongest stable comparison on the key's two sources: significant and practical on both, "
               "same sign, headline metric, another scheduler pair (largest strength; ties as the key)",
    "draws": "one same-order and one reversed comparison strong on both sides (ports table, across sources, "
             "headline panel), drawn in a seeded order; the first whose engine-scale prediction keeps the "
             "campaign's sign and size is registered",
    "planted": "fcfs vs delay_shortest on the key's sources and region, e2e_mean (fcfs better: known order)",
    "verdict": "per side a one-sided exact sign-flip test over windows on paired log-ratios; holds / reverses when "
               "every side decides (intersection-union), Holm over the <= 4 cases, the two directions split",
}
SIGMA_R_ASSUMED: dict[str, Any] = {"value": 0.2, "measured": False, "date": "2026-12-03",
                   "source": "assumed: the upper end of log(repeat / first) of the stored repeat replays at moderate "
                             "load, 0.05-0.20 (issue #38); replace with the A/A pairs' sigma_r of a real run"}


# --------------------------------------------------------------------------- code version


def source_sha256(root: Path, paths: Sequence[str] = CODE_PATHS) -> str:
    """SHA-256 over the ``*.py`` files under ``paths`` (relative path and bytes, sorted)."""
    h = hashlib.sha256()
    for p in paths:
        for f in sorted((Path(root) / p).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


# --------------------------------------------------------------------------- case selection


def _headline(rev: pl.DataFrame) -> pl.DataFrame:
    if "panel" in rev.columns and rev.height:
        rev = rev.filter(pl.col("panel") == rev["panel"][0])
    if "headline" in rev.columns:
        rev = rev.filter(pl.col("headline"))
    return rev


ORDER = ["strength", "region", "metric", "a", "b", "source_1", "source_2"]
DESC = [True, False, False, False, False, False, False]


def _entry(row: Mapping, role: str, rule: str) -> dict:
    s1, s2 = row["source_1"], row["source_2"]
    return {"id": role, "role": "draw" if role.startswith("draw") else "primary", "a": row["a"], "b": row["b"],
            "metric": row["metric"], "region": row["region"], "sources": [s1, s2],
            "campaign_sign": {s1: int(np.sign(row["diff_1"])), s2: int(np.sign(row["diff_2"]))},
            "selection": {"rule": rule, "strength": float(row["strength"]),
                          "campaign_rel": {s1: float(row["rel_1"]), s2: float(row["rel_2"])},
                          "reversal": bool(row["reversal"])}}


def key_case(rev: pl.DataFrame) -> dict | None:
    """The most dramatic reversal (module docstring), as a plan entry."""
    sp = _headline(rev).filter(pl.col("reversal") & pl.col("significant") & pl.col("practical"))
    if sp.height == 0:
        return None
    return _entry(sp.sort(ORDER, descending=DESC).row(0, named=True), "key", DEFAULT_RULES["key"])


def control_case(rev: pl.DataFrame, key: Mapping | None) -> dict | None:
    """The strongest stable comparison on the key's sources (module docstring)."""
    h = _headline(rev).filter(~pl.col("reversal") & pl.col("significant") & pl.col("practical")
                              & ((pl.col("diff_1").sign() * pl.col("diff_2").sign()) > 0))
    if key is not None:
        srcs = list(key["sources"])
        h = h.filter(pl.col("source_1").is_in(srcs) & pl.col("source_2").is_in(srcs)
                     & ~((pl.col("a") == key["a"]) & (pl.col("b") == key["b"])))
    if h.height == 0:
        return None
    return _entry(h.sort(ORDER, descending=DESC).row(0, named=True), "control", DEFAULT_RULES["control"])


def draw_candidates(rev: pl.DataFrame, ports: pl.DataFrame | None, chosen: Sequence[Mapping], *, seed: int,
                    n: int) -> dict[str, list[dict]]:
    """Per kind (``draw_same``, ``draw_reversed``) up to ``n`` candidates in a seeded random order among the
    comparisons strong on both sides (ports table; without one, significant and practical on both sides of the
    reversal table), the chosen cases left out."""
    h = _headline(rev)
    keys = ["a", "b", "region", "metric", "source_1", "source_2"]
    if ports is not None and ports.height:
        p = ports
        if "kind" in p.columns:
            p = p.filter(pl.col("kind") == "across_sources")
        if "panel" in p.columns and "panel" in rev.columns and rev.height:
            p = p.filter(pl.col("panel") == rev["panel"][0])
        p = p.filter(pl.col("four_way").is_in(["same_order", "reversal"])).rename({"region_1": "region"}) \
            if "region_1" in p.columns else p.filter(pl.col("four_way").is_in(["same_order", "reversal"]))
        pool = h.join(p.select(*keys, "four_way"), on=keys, how="inner")
    else:
        pool = h.filter(pl.col("significant") & pl.col("practical")).with_columns(
            pl.when(pl.col("reversal")).then(pl.lit("reversal")).otherwise(pl.lit("same_order")).alias("four_way"))
    taken = {(c["a"], c["b"], c["region"], c["metric"], tuple(sorted(c["sources"]))) for c in chosen}
    out: dict[str, list[dict]] = {}
    for role, fw in (("draw_same", "same_order"), ("draw_reversed", "reversal")):
        g = pool.filter(pl.col("four_way") == fw).sort(keys)
        rows = [r for r in g.iter_rows(named=True)
                if (r["a"], r["b"], r["region"], r["metric"], tuple(sorted((r["source_1"], r["source_2"])))) not in taken]
        rng = np.random.default_rng([int(seed), len(role)])
        idx = rng.permutation(len(rows))[:n]
        out[role] = [_entry(rows[int(i)], role, DEFAULT_RULES["draws"] + f" (seed {seed}, draw {j + 1})")
                     for j, i in enumerate(idx)]
    return out


def planted_case(key: Mapping | None, sources: Sequence[str] = ()) -> dict:
    srcs = list(key["sources"]) if key is not None else list(sources)
    return {"id": "planted", "role": "planted", "a": design.PLANTED[0], "b": design.PLANTED[1], "metric": "e2e_mean",
            "region": key["region"] if key is not None else "moderate", "sources": srcs,
            "campaign_sign": {s: 1 for s in srcs},
            "selection": {"rule": DEFAULT_RULES["planted"], "strength": None}}


def pick_draw(candidates: Sequence[Mapping], prediction: Callable[[Mapping], Mapping[str, float]],
              delta: float) -> tuple[dict | None, list[dict]]:
    """The first candidate whose engine-scale prediction (``prediction(entry)`` -> per source effect) keeps the
    campaign's sign and size (>= ``delta``), and the reasons the ones before it were passed over."""
    from .verdict import not_testable_reason

    passed: list[dict] = []
    for c in candidates:
        pred = dict(prediction(c))
        why = not_testable_reason(c, pred, delta)
        if why is None:
            return {**c, "prediction": pred}, passed
        passed.append({"pair": [c["a"], c["b"]], "metric": c["metric"], "region": c["region"],
                       "sources": c["sources"], "reason": why})
    return None, passed


# --------------------------------------------------------------------------- the file


def plan_path(root: Path) -> Path:
    return Path(root) / PLAN_FILE


def _body_bytes(doc: Mapping) -> bytes:
    return (HEADER + yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, width=110)).encode()


def build(root: Path, rev: pl.DataFrame, ports: pl.DataFrame | None, *, why: str, previous: Mapping | None = None,
          sigma_r: Mapping | None = None, today: str | None = None, sims: int = 1000) -> dict:
    """The plan document (without its seal) from the analysis' tables."""
    rules: dict[str, Any] = dict(DEFAULT_RULES)
    if previous:
        rules.update({k: v for k, v in (previous.get("rules") or {}).items() if k in DEFAULT_RULES})
    sr: dict[str, Any] = dict(sigma_r or (previous or {}).get("sigma_r") or SIGMA_R_ASSUMED)
    key = key_case(rev)
    ctrl = control_case(rev, key)
    chosen = [c for c in (key, ctrl) if c is not None]
    draws = draw_candidates(rev, ports, chosen, seed=int(rules["draw_seed"]), n=int(rules["draw_candidates"]))
    m = len(chosen) + sum(1 for v in draws.values() if v)
    size = design.size(float(sr["value"]), effect=math.log1p(float(rules["target_effect"])), m=max(m, 1),
                       alpha=float(rules["alpha"]), sims=sims)
    date = today or dt.date.today().isoformat()
    changes = list((previous or {}).get("changes") or [])
    changes.append({"date": date, "what": "frozen" if not changes else "refrozen", "why": why})
    return {"rules": rules, "sigma_r": sr,
            "design": {"k": size["k"], "r": size["r"], "replays_per_side": size["replays_per_side"],
                       "power": round(size["power"], 3), "target_reached": size["target_reached"], "effect_log": round(size["effect"], 4),
                       "resolvable_effect_log": size["resolvable_effect"], "cases": m,
                       "what": f"k windows x r pairs per side ({int(100 * rules['aa_share'])} % of pairs A/A), "
                               f"power for a {int(100 * rules['target_effect'])} % effect at Holm's strictest level "
                               "over the cases, both sides deciding, sigma_r as above"},
            "cases": [c for c in (key, ctrl) if c is not None],
            "draw_candidates": draws, "planted": planted_case(key),
            "code_version": {"git_commit_at_freeze": git_commit(root), "source_sha256": source_sha256(root),
                             "source_paths": list(CODE_PATHS)},
            "changes": changes}


def write(root: Path, doc: Mapping) -> str:
    """Write the plan with its seal; returns the seal (SHA-256 of the body)."""
    body = _body_bytes(doc)
    seal = hashlib.sha256(body).hexdigest()
    path = plan_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body + f"{SEAL_MARK}{seal}\n".encode())
    return seal


def read(root: Path) -> tuple[dict, str, str]:
    """``(document, recorded seal, seal of the body as it is now)``; DataError naming the file when it is
    missing or malformed."""
    path = plan_path(root)
    if not path.is_file():
        raise DataError(path, "no validation plan: freeze one with `python -m portbench.validation plan freeze "
                              "--why 'first freeze'` after the analysis (make analyze) and commit it")
    data = path.read_bytes()
    i = data.rfind(b"\n" + SEAL_MARK.encode())
    if i < 0:
        raise DataError(path, f"no `{SEAL_MARK.strip()}` line: refreeze it (python -m portbench.validation plan freeze)")
    body, recorded = data[:i + 1], data[i + 1 + len(SEAL_MARK):].decode().strip()
    try:
        doc = yaml.safe_load(body)
    except yaml.YAMLError as e:
        raise DataError(path, f"cannot read the validation plan ({e})") from None
    if not isinstance(doc, dict) or not {"rules", "cases", "code_version", "changes"} <= set(doc):
        raise DataError(path, "expected rules, cases, code_version and changes")
    return doc, recorded, hashlib.sha256(body).hexdigest()


def check(root: Path) -> dict:
    """The frozen plan, after checking its seal and the code; DataError (one message) otherwise. Returns
    ``{"doc", "sha256", "code_version"}`` (what summary.json's ``preregistration`` records)."""
    doc, recorded, now = read(root)
    path = plan_path(root)
    if recorded != now:
        raise DataError(path, f"edited after it was frozen (seal {recorded[:12]}..., content {now[:12]}...): "
                              "refreeze it with `python -m portbench.validation plan freeze --why '...'` and commit it")
    code = source_sha256(root, doc["code_version"].get("source_paths", CODE_PATHS))
    if code != doc["code_version"]["source_sha256"]:
        raise DataError(path, f"the code differs from the frozen one (source SHA-256 {code[:12]}... now, "
                              f"{doc['code_version']['source_sha256'][:12]}... frozen, under "
                              f"{', '.join(CODE_PATHS)}): refreeze with `python -m portbench.validation plan freeze "
                              "--why '...'` saying what changed, and commit it")
    return {"doc": doc, "sha256": recorded,
            "code_version": {"git_commit_at_freeze": doc["code_version"].get("git_commit_at_freeze"),
                             "source_sha256": code}}


def entries(doc: Mapping) -> list[dict]:
    """The family's cases for :func:`.verdict.case_verdicts`: key and control (the draws join once registered)."""
    return [dict(c) for c in doc.get("cases") or []]


def pilot_sigma(path: Path, metrics: Sequence[str]) -> dict:
    """A ``sigma_r`` block from the A/A pilot's file (``portbench validate --pilot`` writes ``pilot.json`` with each
    metric's value per source and ``pooled``; a hand-written file may give one number per metric): the largest of the
    per-metric (pooled) values over ``metrics`` (the cases' metrics), with every value, its date and its machine note
    or load average."""
    try:
        d = json.loads(Path(path).read_text())
        by = {m: float(v["pooled"] if isinstance(v, Mapping) else v) for m, v in d["sigma_r"].items()}
        sources = sorted({s for v in d["sigma_r"].values() if isinstance(v, Mapping) for s in v} - {"pooled"})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(path, f"cannot read the pilot's sigma_r ({e}): expected its `sigma_r` per metric") from None
    use = [m for m in metrics if m in by]
    if not use:
        raise DataError(path, f"no sigma_r for the cases' metrics {sorted(set(metrics))} (it has {sorted(by)})")
    worst = max(use, key=lambda m: by[m])
    note = (d.get("machine") or {}).get("note", "")
    load = d.get("loadavg_start")
    if not note and isinstance(load, list) and load:
        note = f"load average {float(load[0]):.1f} at its start"
    return {"value": round(by[worst], 4), "metric": worst, "by_metric": by, "measured": True,
            "date": str(d.get("date")), "pairs": d.get("aa_pairs"),
            "source": f"the A/A pilot ({Path(path).as_posix()}; {d.get('source') or ', '.join(sources)}, "
                      f"{d.get('region')}): the largest over the cases' metrics" + (f"; its note: {note}" if note else "")}


def measured_sigma(value: float, pairs: int, date: str, run: str) -> dict:
    """A ``sigma_r`` block from a run's A/A pairs (to refreeze with)."""
    return {"value": round(float(value), 4), "measured": True, "date": date, "pairs": int(pairs),
            "source": f"the A/A pairs of the run {run}"}


# --------------------------------------------------------------------------- command


def _tables(results: Path) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    rp = results / "analysis" / "reversals.parquet"
    if not rp.is_file():
        raise DataError(rp, "no reversal table: run the analysis (make analyze) first")
    pp = results / "analysis" / "ports.parquet"
    return pl.read_parquet(rp), (pl.read_parquet(pp) if pp.is_file() else None)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m portbench.validation plan",
                                 description="Freeze, check or show the real-engine validation's pre-registration.")
    ap.add_argument("action", choices=("freeze", "check", "show"))
    ap.add_argument("--root", default=".", help="the repository root (default: .)")
    ap.add_argument("--results", default="data/results", help="the results folder with analysis/ (default: data/results)")
    ap.add_argument("--why", default=None, help="freeze: why (first freeze, or what changed); goes into `changes`")
    ap.add_argument("--sigma-r", type=float, default=None, help="freeze: a measured sigma_r (with --sigma-date, --sigma-run)")
    ap.add_argument("--sigma-pilot", default=None, help="freeze: the A/A pilot's file (portbench validate --pilot)")
    ap.add_argument("--sigma-pairs", type=int, default=0)
    ap.add_argument("--sigma-date", default=None)
    ap.add_argument("--sigma-run", default="")
    a = ap.parse_args(argv)
    root = Path(a.root)
    try:
        if a.action == "freeze":
            if not a.why:
                raise PortbenchError("freeze needs --why '...' (first freeze, or what changed and why)")
            prev = read(root)[0] if plan_path(root).is_file() else None
            rev, ports = _tables(root / a.results)
            sr = (measured_sigma(a.sigma_r, a.sigma_pairs, a.sigma_date or dt.date.today().isoformat(), a.sigma_run)
                  if a.sigma_r is not None else None)
            if a.sigma_pilot:
                key = key_case(rev)
                ctrl = control_case(rev, key)
                sr = pilot_sigma(root / a.sigma_pilot, [c["metric"] for c in (key, ctrl) if c is not None])
            seal = write(root, build(root, rev, ports, why=a.why, previous=prev, sigma_r=sr))
            print(f"froze {PLAN_FILE} (seal {seal[:12]}...): commit it")
        else:
            info = check(root)
            print(f"{PLAN_FILE}: seal {info['sha256'][:12]}..., code {info['code_version']['source_sha256'][:12]}... ok")
            if a.action == "show":
                doc = info["doc"]
                for c in [*doc["cases"], *[x for v in doc["draw_candidates"].values() for x in v[:1]], doc["planted"]]:
                    st = c["selection"].get("strength")
                    print(f"  {c['id']:14s} {c['a']} vs {c['b']}, {c['metric']} at {c['region']}, "
                          f"{' vs '.join(c['sources'])}, strength {st if st is None else round(st, 2)}")
                print(f"  design: k = {doc['design']['k']} windows x r = {doc['design']['r']} pairs per side, "
                      f"sigma_r = {doc['sigma_r']['value']} ({'measured' if doc['sigma_r']['measured'] else 'assumed'})")
    except PortbenchError as e:
        print(f"portbench: {e}", file=sys.stderr)
        return 2
    return 0


