"""The validation's run (``portbench validate`` / ``make validate``): does the order the simulator predicts for a real
engine hold under that engine's clock?

Steps (each stage's module says more):

1. **Plan check** (:func:`.plan.check`): the committed pre-registration ``papermill_params/validation_plan.yaml``
   -- its seal and the code's source hash -- or the run refuses (one message, nothing runs).
2. **Step table** (:func:`.stages.step_table`): the engine's step time on fixed shapes, on an in-process engine with
   the run's settings (:func:`.engine.settings_for`: every token-valued setting explicit, at the run's token scale).
3. **Inputs and predictions** (:func:`.stages.inputs`, :func:`.stages.predictions`): per source the engine's capacity
   at its own scale, the windows (``k`` per source, seeded) as the engine replays them, and per case the virtual
   engine's prediction of each side's effect with the engine's step table and settings. The drawn cases are
   registered now (:func:`.plan.pick_draw`: the first candidate whose prediction keeps the campaign's sign and size).
4. **Design** (:func:`.design.replay_specs`): per side ``k`` windows x ``r`` pairs in seeded ABBA order, 25 % A/A; the
   planted reversal (fcfs vs ``delay_shortest``) beside the cases.
5. **Replays** (:func:`.stages.replays`, :mod:`.engine`): one engine instance per policy, all started and warmed
   up first; cut at the time budget (a replay not run is no data).
6. **Verdicts** (:mod:`.verdict`): per case holds / reverses / undetermined / not testable; the A/A check; the
   planted reversal; ``summary.json``.

Modes: ``full`` (``make validate``: each window's requests that arrive in its first :data:`HORIZON_FULL_S` /
horizon factor seconds at the case's load, at least 20, sized to ``validation.time_budget_s``), ``long`` (``make validate-long``: whole windows, ``validation.long_time_budget_s``),
``reduced`` (``make all``: two windows per side, two pairs, the A/A pairs on one instance, every case's prediction,
``validation.reduced_time_budget_s``). ``device="cuda"`` is :mod:`.gpu`'s.

Outputs under ``{results_dir}/validation/``: ``summary.json``, ``raw/`` (``step_grid.parquet``, ``replays.parquet``,
``replay_requests.parquet``, ``run.json``: everything the analysis reads, so :func:`analyze` redoes it from files),
``engine_profile_step_grid.json``, the instances' step logs ``iterations_*.jsonl``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import polars as pl

from ..core import io
from ..core.config import Config
from ..core.errors import PortbenchError
from ..data import windows as windows_mod
from ..study.campaign.run import run_tables
from . import design, engine, family, predict, replay, stages, verdict
from . import plan as plan_mod
from .common import base_profile, how_to_enable, out_dir, summary_path

MODES = ("full", "long", "reduced")
HORIZON_FULL_S = 10.0      # a replay's observation in `make validate` (the window's first requests, >= 20);
                           # `make validate-long`: whole windows
REDUCED_K, REDUCED_R = 2, 2
LONG_BUDGET_S = 3 * 3600.0   # `make validate-long`: whole windows
RESERVE_S = 120.0            # of the budget, after the last replay: the fidelity report, the summary, the shutdown


def _log(progress: bool) -> Callable[[str], None]:
    t0 = time.monotonic()

    def log(msg: str) -> None:
        if progress:
            print(f"[portbench] validation [{time.monotonic() - t0:6.0f} s] {msg}", flush=True)
    return log


def _write_json(path: Path, obj: Any) -> None:
    io.write_text(path, json.dumps(obj, indent=1, default=io.json_default) + "\n")


def repo_root() -> Path:
    """The checkout whose pre-registration the run checks (the package's own, where it is run from a checkout)."""
    return Path(__file__).resolve().parents[3]


def choose_windows(manifest: Mapping, sources, k: int, seed: int) -> dict[str, list[str]]:
    """``k`` window ids per source, the first ``k`` of a permutation seeded by ``seed`` and the source's name (so
    fewer windows are the first of more)."""
    out = {}
    for s in sources:
        ids = [w["id"] for w in manifest["windows"] if w["source"] == s]
        salt = int.from_bytes(hashlib.sha256(s.encode()).digest()[:4], "big")
        out[s] = [ids[i] for i in np.random.default_rng([int(seed), salt]).permutation(len(ids))[:k]]
    return out


@dataclasses.dataclass
class Run:
    """What one run is given: the plan (its entries, the planted case, the design), the settings and the windows."""

    entries: list[dict]
    planted: dict | None
    candidates: dict[str, list[dict]]
    k: int
    r: int
    rules: dict
    preregistration: dict
    sigma_r: dict


def _from_plan(doc: Mapping, pre: Mapping, mode: str) -> Run:
    """The run of ``mode`` from the checked plan: ``reduced`` (``make all``) replays only the planted case on its
    first source, on ``REDUCED_K`` windows x ``REDUCED_R`` pairs, and predicts the primary cases (no draw)."""
    k, r = int(doc["design"]["k"]), int(doc["design"]["r"])
    planted = dict(doc["planted"]) if doc.get("planted") else None
    cands = {kk: [dict(x) for x in v] for kk, v in (doc.get("draw_candidates") or {}).items()}
    if mode == "reduced":
        k, r, cands = min(k, REDUCED_K), min(r, REDUCED_R), {}
        if planted is not None:
            planted = {**planted, "sources": planted["sources"][:1],
                       "campaign_sign": {s: planted["campaign_sign"][s] for s in planted["sources"][:1]}}
    return Run([dict(e) for e in doc.get("cases") or []], planted, cands, k, r, dict(doc.get("rules") or {}),
               {"sha256": pre["sha256"], "code_version": pre["code_version"]}, dict(doc.get("sigma_r") or {}))


def run(cfg: Config, *, mode: str = "full", progress: bool = True) -> dict:
    """The validation (module docstring) on the CPU engine; ``summary.json``. A missing vLLM is a "skipped" summary,
    never an error; a plan that does not check is an error (one message)."""
    if mode not in MODES:
        raise PortbenchError(f"validation mode {mode!r}: one of {', '.join(MODES)}")
    out = out_dir(cfg.paths)
    status = replay.engine_status("cpu", cfg.validation.vllm_version)
    if not status.ok:
        s = {"ran": False, "skipped_because": status.reason, "how_to_enable": how_to_enable()}
        _write_json(summary_path(cfg.paths), s)
        _log(progress)(f"skipped: {status.reason}")
        return s
    pre = plan_mod.check(repo_root())
    return execute(cfg, _from_plan(pre["doc"], pre, mode), mode=mode, out=out, device="cpu", progress=progress)


def execute(cfg: Config, R: Run, *, mode: str, out: Path, device: str, progress: bool = True,
            settings: engine.Settings | None = None, budget_s: float | None = None,
            max_horizon_s: float | None = -1.0, twins: bool | None = None, conformance: bool | None = None) -> dict:
    """Steps 2-6 of the module docstring for the plan ``R`` (tests call it with a plan of their own); ``conformance``:
    run the conformance at the campaign's settings (default: in full and long runs)."""

    log = _log(progress)
    t_start = time.monotonic()
    v, sim = cfg.validation, cfg.simulation
    budget = float(budget_s if budget_s is not None else
                   {"full": v.time_budget_s, "long": LONG_BUDGET_S}.get(mode, v.reduced_time_budget_s))
    deadline = t_start + budget - (RESERVE_S if mode in ("full", "long") else RESERVE_S / 4)   # the replays' end
    base = base_profile(sim)
    S = settings or engine.settings_for(v.engine(device), base, device=device, seed=int(v.seed))
    horizon_cap = (None if mode == "long" else HORIZON_FULL_S) if max_horizon_s == -1.0 else max_horizon_s
    (out / "raw").mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    log(f"{mode} run on vLLM's {device} build: settings {S.to_dict()}; budget {budget:.0f} s")
    # 2. the engine's step table
    g = v.step_grid
    table, step_info = stages.step_table(S, g, base, out, rounds=int(g.rounds if mode in ("full", "long") else g.reduced_rounds),
                                         seed=int(v.seed), log=log)
    # 3. windows, capacities, predictions; the draws registered on their predictions
    man = windows_mod.load_manifest(cfg.data.paths)
    cases = [*R.entries, *[c for v_ in R.candidates.values() for c in v_]] + ([R.planted] if R.planted else [])
    srcs = sorted({s for c in cases for s in c["sources"]})
    wins = choose_windows(man, srcs, R.k, int(v.window_seed))
    tables = windows_mod.load_windows(cfg.data, sources=srcs, manifest=man)
    pols = sorted({p for c in cases for p in (c["a"], c["b"])} - {engine.PLANTED})
    tables = run_tables(cfg.data, cfg.predictors, sim, tables, pols, manifest=man,
                        workers=int(cfg.campaign.workers))     # frozen predictions and tenants, as the campaign's
    src_of = {w["id"]: w["source"] for w in man["windows"]}
    inp = stages.inputs(cases, tables, wins, lambda w: src_of.get(w, ""), table, S, sim,
                        backlog=stages.backlog_size(S, mode not in ("full", "long")),
                        hash_blocks={s: windows_mod.hash_block_size(man, {"source": s}) for s in srcs},
                        max_horizon_s=horizon_cap, log=log)
    preds = stages.predictions(cases, inp, wins, table, S, sim)
    eff = {cid: {s: p["effect"] for s, p in side.items()} for cid, side in preds.items()}
    delta = math.log1p(float(R.rules.get("delta", 0.05)))
    registered, passed_over = [], {}
    for kind, cands in sorted(R.candidates.items()):
        got, passed = plan_mod.pick_draw(cands, lambda c: eff.get(c["id"], {}), delta)
        passed_over[kind] = passed
        if got is not None:
            registered.append({k_: x for k_, x in got.items() if k_ != "prediction"})
    entries = [*R.entries, *registered]
    log("predictions at the engine's scale: " + "; ".join(
        f"{cid}: " + ", ".join(f"{s} {x:+.3f}" for s, x in e.items()) for cid, e in eff.items()))
    # 4. the design
    replayed = [] if mode == "reduced" else entries        # the reduced run replays the planted case alone
    sides = [design.Side(e["id"], s, e["a"], e["b"], tuple(wins[s]), R.r)
             for e in [*replayed, *([R.planted] if R.planted else [])] for s in e["sources"]]
    specs = design.replay_specs(sides, int(R.rules.get("design_seed", 0)))
    log(f"design: {len(sides)} sides x {R.k} windows x {R.r} pairs = {specs.height} replays")
    # 5. the replays
    twin = (mode != "reduced") if twins is None else twins
    tab, rec = stages.replays(specs, inp, S, table, sim, out, deadline=deadline, twins=twin, log=log)
    # conformance at the campaign's settings (virtual engine vs simulator: an agreement rate, not a verdict)
    conf = _conformance(cfg.data, cfg.predictors, sim, cfg.campaign, entries, wins, man, log) \
        if (mode in ("full", "long") if conformance is None else conformance) else None
    # the fidelity report (absolute latency, no pass mark): while the time budget allows
    fid = predict.fidelity_report(tab, rec, inp.window, table, S.resim(), sim, deadline=t_start + budget - 15.0) \
        if tab.height else {}
    # 6. the verdicts (from what the run wrote: analyze() redoes them from the files)
    info = {"mode": mode, "device": device, "vllm": status_line(), "settings": S.to_dict(),
            "entries": entries, "planted": R.planted, "rules": R.rules, "sigma_r_planned": R.sigma_r,
            "preregistration": R.preregistration, "effects": eff, "predictions": preds,
            "draws": {"registered": [e["id"] for e in registered], "passed_over": passed_over},
            "design": {"k": R.k, "r": R.r, "replays_planned": specs.height, "max_horizon_s": horizon_cap,
                       "twins": twin, "budget_s": budget},
            "capacity": inp.capacity, "windows": wins, "step_table": {
                k_: step_info[k_] for k_ in ("shapes", "rounds", "steps", "wall_s", "startup_s", "fit", "repeat_noise")},
            "fidelity": fid, "conformance": conf, "loadavg_start": list(load0), "loadavg_end": list(os.getloadavg()),
            "wall_s": time.monotonic() - t_start}
    _write_json(out / "raw" / "run.json", info)
    specs.write_parquet(out / "raw" / "specs.parquet")
    summary = verdicts(info, tab)
    _write_json(summary_path(cfg.paths), summary)
    for c in [*summary["cases"], summary["planted"]]:
        log(f"{c.get('id', 'planted')}: {c.get('pair')} ({c.get('metric')}): {c.get('verdict')}"
            + (f" -- {c['reason']}" if c.get("reason") else ""))
    aa = summary["aa"]
    log(f"A/A: sigma_r {aa['sigma_r']:.3f} over {aa['pairs']} pairs, false-reversal rate {aa['false_reversal_rate']}; "
        f"done in {info['wall_s']:.0f} s")
    return summary


def verdicts(info: Mapping, tab: pl.DataFrame) -> dict:
    """The summary (``summary.json``) from a run's record (``raw/run.json``) and its per-replay table: every case's
    verdict (:func:`.verdict.case_verdicts`), the A/A check, the planted reversal."""
    rules = info["rules"]
    planted = [info["planted"]] if info.get("planted") else []
    every = [*info["entries"], *planted]
    results = verdict.case_verdicts(every, tab, info["effects"], alpha=float(rules.get("alpha", 0.05)),
                                    delta=math.log1p(float(rules.get("delta", 0.05))),
                                    sigma_r=float((info.get("sigma_r_planned") or {}).get("value", math.nan)),
                                    r=int(info["design"]["r"]))
    aa = verdict.aa_check(tab, {e["id"]: e["metric"] for e in every})
    device = info["device"]
    core = verdict.summary_core(results, aa, info["preregistration"], info.get("conformance"))
    return {
        **core, "ran": True, "mode": info["mode"],
        "label": ("on a real engine (vLLM CPU build, tiny model): the order under the CPU engine's cost structure; the "
                  "A100 claim stays the simulator's" if device == "cpu" else
                  "on a real engine (vLLM on a CUDA GPU): the order under that GPU's cost structure"),
        "engine": {"device": device, "vllm": info["vllm"], "settings": info["settings"]},
        "draws": info["draws"], "predictions": info["predictions"], "sigma_r_planned": info["sigma_r_planned"],
        "design": {**info["design"], "replays_run": tab.height},
        "capacity_rps": {s: c["capacity_rps"] for s, c in info["capacity"].items()},
        "step_table": info["step_table"], "fidelity_report": info.get("fidelity", {}),
        "machine": {"loadavg_start": info["loadavg_start"], "loadavg_end": info["loadavg_end"],
                    "machine_speed": _quantiles(tab, "machine_speed")},
        "wall_s": info["wall_s"]}


def analyze(cfg: Config) -> dict:
    """The summary again from the last run's raw files (``raw/run.json``, ``raw/replays.parquet``), no engine: a GPU
    run's files are analysed on this machine so."""
    raw = out_dir(cfg.paths) / "raw"
    f, t = raw / "run.json", raw / "replays.parquet"
    if not (f.is_file() and t.is_file()):
        raise PortbenchError(f"no validation run to analyse under {raw} (run.json and replays.parquet): run `make "
                             "validate` first, or copy a GPU run's validation folder there")
    summary = verdicts(json.loads(f.read_text()), pl.read_parquet(t))
    _write_json(summary_path(cfg.paths), summary)
    return summary


def _conformance(data, predictors, sim, campaign, entries: list[dict], wins: Mapping, man: Mapping,
                 log) -> dict | None:
    """:func:`.family.conformance` of the cases on their windows (None where vLLM's scheduler cannot run here)."""
    try:
        v, s, info = family.run(data, predictors, sim, campaign, entries, wins, manifest=dict(man), log=log)
    except ImportError as e:
        log(f"conformance at the campaign's settings not run: {e}")
        return None
    return family.conformance(entries, v, s, info)


def status_line() -> str:
    dist, ver = replay.installed_vllm()
    return f"{dist} {ver}"


def _quantiles(tab: pl.DataFrame, col: str) -> dict:
    if col not in tab.columns or tab.height == 0:
        return {}
    x = tab[col].drop_nans().drop_nulls()
    return {"median": stages.finite(x.median()), "q10": stages.finite(x.quantile(0.1)),
            "q90": stages.finite(x.quantile(0.9))} if x.len() else {}


def pilot(cfg: Config, *, sources: tuple[str, ...] = ("azure",), region: str = "overload", k: int = 6,
          r: int = 2, max_horizon_s: float | None = HORIZON_FULL_S, metrics_: tuple[str, ...] = ("ttft_p90", "e2e_mean",
                                                                                          "tpot_p90"),
          step_grid: Path | None = None, progress: bool = True) -> dict:
    """The A/A pilot that gives the plan its sigma_r (``portbench validate --pilot``): on each source, ``k`` windows x
    ``r`` A/A pairs of fcfs (its two replays on two instances, as an a/b pair's are) in ABBA slot order, and one
    planted pair (fcfs vs ``delay_shortest``) per window, at ``region``'s load with the engine's settings. Writes
    ``raw/pilot.parquet`` and ``pilot.json`` under the validation folder: per source and metric sigma_r = SD of the
    A/A log-ratios / sqrt(2) (:func:`.verdict.aa_check`'s definition), with the date and the machine's load.
    ``step_grid``: an earlier run's ``raw/step_grid.parquet`` to fit the step table from instead of measuring it.
    (Mooncake is not a default source: at token scale 1 the CPU engine serves it at ~0.04 req/s, so one overload
    replay of its first 20 requests lasts ~10 min.)"""
    log = _log(progress)
    out = out_dir(cfg.paths) / "pilot"
    v, sim = cfg.validation, cfg.simulation
    base = base_profile(sim)
    S = engine.settings_for(v.engine("cpu"), base, device="cpu", seed=int(v.seed))
    load0 = os.getloadavg()
    t0 = time.monotonic()
    if step_grid is not None:
        table = stages.table_from(pl.read_parquet(step_grid), S, base)
        log(f"step table fitted from {step_grid}")
    else:
        table, _ = stages.step_table(S, v.step_grid, base, out, rounds=int(v.step_grid.reduced_rounds),
                                     seed=int(v.seed), log=log)
    man = windows_mod.load_manifest(cfg.data.paths)
    wins = choose_windows(man, sources, k, int(v.window_seed))
    tables = windows_mod.load_windows(cfg.data, sources=list(sources), manifest=man)
    src_of = {w["id"]: w["source"] for w in man["windows"]}
    cases = [{"id": f"pilot_{s}", "a": "fcfs", "b": "fcfs", "metric": metrics_[0], "region": region, "sources": [s]}
             for s in sources]
    inp = stages.inputs(cases, tables, wins, lambda w: src_of.get(w, ""), table, S, sim, backlog=stages.backlog_size(
        S, True), hash_blocks={s: windows_mod.hash_block_size(man, {"source": s}) for s in sources},
        max_horizon_s=max_horizon_s, log=log)
    # the planted pairs reuse the pilot's windows: same case key
    rows: list[dict] = []
    rng = np.random.default_rng(int(v.seed) + 38)
    for s in sources:
        for w in wins[s]:
            for s0, s1 in design.abba(r, bool(rng.integers(2))):
                for pos, slot in enumerate((s0, s1)):
                    rows.append({"case": f"pilot_{s}", "source": s, "window": w, "policy": "fcfs",
                                 "pair": len(rows) // 2, "position": pos, "is_aa": True, "slot": slot})
            first_b = bool(rng.integers(2))
            for pos, slot in enumerate(("b", "a") if first_b else ("a", "b")):
                rows.append({"case": f"pilot_{s}", "source": s, "window": w,
                             "policy": "fcfs" if slot == "a" else engine.PLANTED, "pair": len(rows) // 2,
                             "position": pos, "is_aa": False, "slot": slot})
    specs = pl.DataFrame(rows).with_row_index("order").with_columns(pl.col("order").cast(pl.Int64))
    tab, _ = stages.replays(specs, inp, S, table, sim, out, log=log)
    res: dict[str, Any] = {"date": dt.date.today().isoformat(), "region": region, "rho": float(sim.region_loads[region]),
                           "k": k, "r": r, "max_horizon_s": max_horizon_s, "settings": S.to_dict(),
                           "loadavg_start": list(load0), "loadavg_end": list(os.getloadavg()),
                           "wall_s": time.monotonic() - t0, "capacity_rps": {s: c["capacity_rps"]
                                                                              for s, c in inp.capacity.items()},
                           "sigma_r": {}, "planted": {}, "machine_speed": _quantiles(tab, "machine_speed")}
    for m in metrics_:
        aa = verdict.pair_effects(tab, m, aa=True)
        pe = verdict.pair_effects(tab, m, aa=False)
        res["sigma_r"][m] = {s: stages.finite(float(g["d"].std()) / math.sqrt(2)) for (s,), g in
                             aa.group_by(["source"], maintain_order=True)}
        res["sigma_r"][m]["pooled"] = stages.finite(float(aa["d"].std()) / math.sqrt(2)) if aa.height > 1 else None
        res["planted"][m] = {s: {"mean": float(g["d"].mean()), "positive": int((g["d"] > 0).sum()), "pairs": g.height}
                             for (s,), g in pe.group_by(["source"], maintain_order=True)}
    res["aa_pairs"] = int(tab.filter(pl.col("is_aa")).height // 2)
    res["definition"] = ("sigma_r = SD over A/A pairs of the oriented log-ratio (slot a over slot b) / sqrt(2); "
                         "planted: mean oriented effect of fcfs (a) over delay_shortest (b), positive = fcfs better")
    _write_json(out / "pilot.json", res)
    log(f"pilot: sigma_r {res['sigma_r']}; planted {res['planted']}")
    return res
