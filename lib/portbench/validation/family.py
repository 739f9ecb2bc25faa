"""The confirmatory family on the virtual vLLM engine at the campaign's own settings (needs vLLM).

The virtual vLLM engine (:mod:`.virtual`) has no model and no wall-clock cost, so it can run exactly
what the campaign ran, where the finding exists: every pre-registered window of every case at the
case's region, both policies, with the campaign's profile (cost model, KV cache, token budget, context
limit), prefix caching as the campaign's ``engine.prefix_caching``, token counts unscaled, the window
rescaled with **the campaign's capacity of that window** (the runs table's ``capacity_rps``) to the
region's load, the campaign's horizon and replicate 0's seed; ``sarathi`` with its own budget as in
the campaign. That is :class:`.virtual_campaign.VirtualEngine`, the ``vllm-virtual`` campaign backend.

Each run is made twice from the same inputs: on vLLM's scheduler and on the simulator
(:class:`~portbench.study.campaign.engines.SimEngine`: the re-simulation under the engine's settings,
which at the campaign's settings is the campaign's own replicate-0 run -- ``resim_matches_campaign``
says how many agree with the runs table, which they all do unless the campaign's files are older than
the code). So the two verdicts of :mod:`.confirm` are asked where the finding exists: step 1 (does the
finding survive the engine's settings) compares the campaign with these re-simulations, step 2 (does
the engine reproduce the simulator) compares vLLM's scheduler with them, and the confirmatory tests run
on the virtual engine's per-window values.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Mapping, Sequence

import polars as pl

from ..core.config import CampaignConfig, DataSettings, PathsConfig, PredictorsConfig, SimulationConfig
from ..core.errors import DataError
from ..data import windows as windows_mod
from ..study.campaign.engines import SimEngine
from ..study.campaign.files import runs_path
from ..study.campaign.plan import run_seed, window_refs
from ..study.campaign.run import run_tables
from .cases import Case

KEY = ("source", "window_id", "region", "scheduler")
CAMPAIGN_REL_TOL = 1e-9    # the campaign path sums closed-form decode runs in another order (virtual_campaign.REL_TOL)


def todo(conf: Sequence[Case], windows: Mapping[str, Sequence[str]]) -> list[tuple[str, str, str, float, str]]:
    """The family's runs, each once: ``(source, window_id, region, rho, scheduler)`` for every case, side,
    pre-registered window of that side's source and policy of the pair, in case order."""
    out: list[tuple[str, str, str, float, str]] = []
    seen: set[tuple] = set()
    for c in conf:
        for s in c.sources:
            for wid in windows.get(s, []):
                for sched in c.schedulers:
                    k = (s, wid, c.region, sched)
                    if k not in seen:
                        seen.add(k)
                        out.append((s, wid, c.region, float(c.rho if c.rho is not None else math.nan), sched))
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
        conf: Sequence[Case], windows: Mapping[str, Sequence[str]], *, manifest: Mapping,
        log=None) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """The family's runs on the virtual vLLM engine and on the simulator at the campaign's settings (module
    docstring): two per-window metric tables (``KEY`` + ``rho``, ``horizon_s``, ``capacity_rps``, the metrics)
    and what ran (runs, wall seconds of each side, agreement with the campaign's replicate-0 runs). ``manifest``: the
    windows' manifest, loaded once by the stage (:attr:`portbench.validation.Plan.manifest`); ``data``: where the
    windows, predictions and the campaign's results are; ``P``, ``sim``, ``campaign``: the ``predictors``,
    ``simulation`` and ``campaign`` sections."""
    from .virtual_campaign import VirtualEngine      # imports vLLM

    t0 = time.perf_counter()
    paths = data.paths
    work = todo(conf, windows)
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
    for s, wid, region, _rho, sched in work:
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
        log(f"confirmatory family on the virtual vLLM engine at the campaign's settings: {len(work)} runs "
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
