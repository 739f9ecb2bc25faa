"""Conformance at the campaign's settings: the plan's cases on the virtual vLLM engine (needs vLLM).

The virtual vLLM engine (:mod:`.virtual`) steps vLLM's real V1 scheduler in a virtual clock whose step times
are **the simulator's own cost model** (the campaign's profile), every policy vLLM lacks running as the
project's scheduler class; the windows, capacities, horizon and seeds are the campaign's replicate 0. So it
can run exactly what the campaign ran: every case of the plan (:mod:`.plan`), each side on its source's
windows at the case's region, both policies -- and on the simulator beside it (the re-simulation, which at the
campaign's settings is the campaign's own run: ``resim_matches_campaign`` says how many agree).

What it measures is an **agreement rate** (:func:`conformance`): the share of the cases' sides on which the
virtual engine orders the two policies as the simulator does (the sign of the mean per-window effect), and
the share of windows. It shows that vLLM's scheduler, given the simulator's step times, schedules these cases
so that the order comes out the same. It **cannot** confirm or refute a finding: the step times are the
simulator's, so the order under a real clock is not asked -- that is the wall-clock engine's verdict
(:mod:`.verdict`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import polars as pl

from ..core.config import CampaignConfig, DataSettings, PathsConfig, PredictorsConfig, SimulationConfig
from ..core.errors import DataError
from ..data import windows as windows_mod
from ..study.campaign.engines import SimEngine
from ..study.campaign.files import runs_path
from ..study.campaign.plan import run_seed, window_refs
from ..study.campaign.run import run_tables

KEY = ("source", "window_id", "region", "scheduler")
CAMPAIGN_REL_TOL = 1e-9    # the campaign path sums closed-form decode runs in another order (virtual_campaign.REL_TOL)


def todo(entries: Sequence[Mapping], windows: Mapping[str, Sequence[str]]) -> list[tuple[str, str, str, str]]:
    """The runs, each once: ``(source, window_id, region, scheduler)`` for every case (plan entry), side, window
    of that side's source and policy of the pair, in case order."""
    out: list[tuple[str, str, str, str]] = []
    seen: set[tuple] = set()
    for c in entries:
        for s in c["sources"]:
            for wid in windows.get(s, []):
                for sched in (c["a"], c["b"]):
                    k = (s, wid, c["region"], sched)
                    if k not in seen:
                        seen.add(k)
                        out.append(k)
    return out


def campaign_capacities(paths: PathsConfig) -> dict[str, float]:
    """Per window the capacity the campaign rescaled it with (``runs.parquet``'s ``capacity_rps``; empty without
    a runs table: :func:`run` then measures it as the campaign does)."""
    path = runs_path(paths.results_dir)
    if not Path(path).is_file():
        return {}
    caps = pl.read_parquet(path, columns=["window_id", "capacity_rps"]).unique("window_id")
    return dict(zip(caps["window_id"].to_list(), caps["capacity_rps"].to_list()))


def campaign_replicate0(paths: PathsConfig, keys: Sequence[tuple]) -> pl.DataFrame:
    """The campaign's replicate-0 rows of ``keys`` ((source, window, region, scheduler)) from ``runs.parquet``."""
    path = runs_path(paths.results_dir)
    if not Path(path).is_file() or not keys:
        return pl.DataFrame()
    want = pl.DataFrame([dict(zip(KEY, k)) for k in keys])
    runs = pl.read_parquet(path).filter(pl.col("replicate") == 0)
    return runs.join(want, on=list(KEY), how="semi")


def run(data: DataSettings, P: PredictorsConfig, sim: SimulationConfig, campaign: CampaignConfig,
        entries: Sequence[Mapping], windows: Mapping[str, Sequence[str]], *, manifest: Mapping,
        log=None) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """The cases' runs on the virtual vLLM engine and on the simulator at the campaign's settings (module
    docstring): two per-window metric tables (``KEY`` + ``rho``, ``horizon_s``, ``capacity_rps``, the metrics)
    and what ran (runs, wall seconds of each side, agreement with the campaign's replicate-0 runs). ``manifest``: the
    windows' manifest, loaded once by the stage (:attr:`portbench.validation.Plan.manifest`); ``data``: where the
    windows, predictions and the campaign's results are; ``P``, ``sim``, ``campaign``: the ``predictors``,
    ``simulation`` and ``campaign`` sections."""
    from .virtual_campaign import VirtualEngine      # imports vLLM

    t0 = time.perf_counter()
    paths = data.paths
    work = todo(entries, windows)
    caps = campaign_capacities(paths)
    man = manifest
    refs = {w.id: w for w in window_refs(man, list(data.sources), campaign)}
    names = sorted({x for *_, x in work})
    srcs = sorted({s for s, *_ in work})
    tables = run_tables(data, P, sim, windows_mod.load_windows(data, sources=srcs, manifest=man), names, manifest=man,
                        workers=campaign.workers)
    base_s, base_v = SimEngine(), VirtualEngine()
    rows_v, rows_s = [], []
    wall_v = wall_s = 0.0
    prepared: dict[tuple[str, str], tuple[pl.DataFrame, float]] = {}
    for s, wid, region, sched in work:
        if wid not in refs or wid not in tables:
            raise DataError(Path(paths.windows_dir), f"window {wid} of the pre-registration is not in the campaign")
        es, ev = base_s.for_window(refs[wid]), base_v.for_window(refs[wid])
        if (wid, region) not in prepared:
            cap = caps.get(wid)
            if cap is None:      # not in the runs table: measured as the campaign measures it
                cap = float(es.capacity(tables[wid], sim)["capacity_rps"])
                caps[wid] = cap
            prepared[(wid, region)] = es.prepare(tables[wid], float(sim.region_loads[region]), float(cap), sim)
        scaled, horizon = prepared[(wid, region)]
        seed = run_seed(sim.seed, wid, sched, region, 0)
        base = {"source": s, "window_id": wid, "region": region, "scheduler": sched,
                "rho": float(sim.region_loads[region]), "horizon_s": float(horizon), "capacity_rps": float(caps[wid])}
        t = time.perf_counter()
        v = ev.run(scaled, sched, seed, horizon, sim)
        t1 = time.perf_counter()
        r = es.run(scaled, sched, seed, horizon, sim)
        wall_v += t1 - t
        wall_s += time.perf_counter() - t1
        rows_v.append({**base, "steps": int(v.counters.get("steps", 0)), "wall_s": t1 - t, **v.metrics})
        rows_s.append({**base, **r.metrics})
    vdf, sdf = pl.DataFrame(rows_v), pl.DataFrame(rows_s)
    info = {"runs": len(work), "windows": {s: list(windows.get(s, [])) for s in srcs}, "wall_s": time.perf_counter() - t0,
            "virtual_s": wall_v, "simulator_s": wall_s,
            "settings": "the campaign's: profile " + str(sim.profile) + ", engine " + str(sim.engine.as_dict())
                        + ", token counts unscaled, the campaign's capacity per window, replicate 0's seed",
            "resim_matches_campaign": agreement(sdf, campaign_replicate0(paths, [tuple(r[k] for k in KEY) for r in rows_s]))}
    if log:
        log(f"conformance at the campaign's settings (virtual vLLM engine): {len(work)} runs "
            f"(+ the same on the simulator) in {info['wall_s']:.0f} s (vLLM's scheduler {wall_v:.0f} s, simulator "
            f"{wall_s:.0f} s)")
    return vdf, sdf, info


def agreement(resim: pl.DataFrame, campaign: pl.DataFrame) -> dict:
    """How many re-simulated runs equal the campaign's replicate-0 run on every metric (within
    :data:`CAMPAIGN_REL_TOL`), of those the runs table has."""
    if resim.height == 0 or campaign.height == 0:
        return {"compared": 0, "identical": 0}
    metrics = [c for c in resim.columns if c in campaign.columns and c not in (*KEY, "rho", "horizon_s", "capacity_rps")
               and resim[c].dtype.is_numeric()]
    j = resim.join(campaign.select(*KEY, *metrics), on=list(KEY), suffix="_campaign")
    same = 0
    for row in j.iter_rows(named=True):
        ok = True
        for m in metrics:
            a, b = row[m], row[f"{m}_campaign"]
            if a is None or b is None:
                ok = ok and a is None and b is None
                continue
            a, b = float(a), float(b)
            ok = ok and ((a == b) or (a != a and b != b) or abs(a - b) <= CAMPAIGN_REL_TOL * max(abs(a), abs(b)))
        same += ok
    return {"compared": j.height, "identical": int(same)}


def window_effects(runs: pl.DataFrame, source: str, region: str, metric: str, a: str, b: str) -> dict[str, float]:
    """Per window, the oriented effect of ``a`` over ``b`` on ``metric`` (positive = a better; :func:`.verdict.oriented`:
    a log-ratio, a difference for proportions)."""
    from .verdict import oriented

    if runs.height == 0 or metric not in runs.columns:
        return {}
    sub = runs.filter((pl.col("source") == source) & (pl.col("region") == region) & pl.col("scheduler").is_in([a, b]))
    wide = sub.group_by(["window_id", "scheduler"]).agg(pl.col(metric).mean()).pivot(
        on="scheduler", index="window_id", values=metric) if sub.height else pl.DataFrame()
    if a not in wide.columns or b not in wide.columns:
        return {}
    wide = wide.drop_nulls([a, b]).sort("window_id")
    d = oriented(wide[a].to_numpy(), wide[b].to_numpy(), metric)
    return {w: float(x) for w, x in zip(wide["window_id"].to_list(), d) if math.isfinite(float(x))}


def conformance(entries: Sequence[Mapping], virtual: pl.DataFrame, simulator: pl.DataFrame,
                info: Mapping | None = None) -> dict:
    """``summary.json["conformance_at_campaign_settings"]``: per case and side, the virtual engine's and the
    simulator's mean effect and whether their signs agree; per window the same; the agreement rates
    (module docstring: an agreement rate, never a confirmation)."""
    rows, win_same, win_n = [], 0, 0
    for c in entries:
        for s in c["sources"]:
            v = window_effects(virtual, s, c["region"], c["metric"], c["a"], c["b"])
            m = window_effects(simulator, s, c["region"], c["metric"], c["a"], c["b"])
            common = sorted(set(v) & set(m))
            same_w = sum(1 for w in common if np.sign(v[w]) == np.sign(m[w]))
            win_same += same_w
            win_n += len(common)
            mv = float(np.mean([v[w] for w in common])) if common else math.nan
            ms = float(np.mean([m[w] for w in common])) if common else math.nan
            rows.append({"case": c["id"], "pair": [c["a"], c["b"]], "metric": c["metric"], "region": c["region"],
                         "source": s, "windows": len(common), "virtual_effect": mv, "simulator_effect": ms,
                         "campaign_sign": int(c["campaign_sign"][s]) if "campaign_sign" in c else None,
                         "same_sign": bool(common) and bool(np.sign(mv) == np.sign(ms)),
                         "windows_same_sign": same_w})
    sides = [r for r in rows if r["windows"]]
    return {"ran": True, "sides": len(sides),
            "agreement_rate": float(np.mean([r["same_sign"] for r in sides])) if sides else math.nan,
            "window_agreement_rate": win_same / win_n if win_n else math.nan, "windows": win_n, "by_side": rows,
            "resim_matches_campaign": (info or {}).get("resim_matches_campaign"),
            "what_it_shows": "vLLM's V1 scheduler stepped with the simulator's own step times (the campaign's "
                             "profile, windows, capacities and seeds) orders each case's policies as the simulator "
                             "does: scheduling conformance. Not a confirmation: no real clock is involved; the "
                             "order under real timing is the wall-clock engine's verdict (cases)"}
