"""Across hardware: does an order of schedulers port to another GPU / model? (issue #39)

Every ranking of the study comes from one cost model, the campaign's profile. This module re-runs the headline
panel's campaign on each profile of ``papermill_params/hardware_profiles.yaml`` (:func:`run_hardware`; one replicate,
each profile's own capacity measured, so an operating region is the same load relative to that hardware; results
under ``{results_dir}/hardware/<name>``) and compares the rankings **across hardware** -- the same source, region,
metric and scheduler pair on two profiles -- in the same four-way form as across sources and across regions
(:func:`hardware_block`), with the across-sources and across-regions headline of each profile beside it.

Intervals: windows resampled within each source with one index for every profile (the profiles ran the same
windows), so a resample re-runs every test on every profile (:data:`HARDWARE_BOOT` resamples).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import polars as pl
import yaml

from ...core.config import AnalysisInputs, Config
from ...core.errors import DataError
from ...data import windows as windows_mod
from ...data.windows import Manifest
from ...sim import profiles as profiles_mod
from .. import campaign, stats
from .common import headline_panel_of, panel_sources
from .cube import build_cube, metric_names, settings
from .ties import deltas
from .uncertainty import interval_entry

PROFILES_FILE = "papermill_params/hardware_profiles.yaml"
HARDWARE_BOOT = 200
# Profiles stored as data files (portbench.sim.profiles.save_profile) by :func:`write_profile_files`: built the same
# way as the registered ones (calibration.build_profile) from the measured operator rows; as files, so that adding
# one does not touch the simulator's code (whose hash is part of every run's key).
PROFILE_FILES = {
    "papermill_params/profiles/h100_80gb_llama2_7b.json": profiles_mod.ProfileSpec(
        "h100_80gb_llama2_7b", "h100_80gb", "llama2_7b",
        "calibrated directly on the measured H100 Llama-2-7B operator rows (Vidur), fitted the same way as "
        "a100_80gb_llama2_7b on the A100 rows: the A100 -> H100 difference is measured, not assumed"),
}


def write_profile_files(root: Path) -> list[Path]:
    """(Re)write the profile files of :data:`PROFILE_FILES` under ``root`` from the measured rows."""
    return [profiles_mod.save_profile(profiles_mod.build_profile(spec), Path(root) / rel)
            for rel, spec in PROFILE_FILES.items()]


def read_profiles(root: Path) -> list[dict]:
    """The profiles of :data:`PROFILES_FILE` (each ``name``, ``profile``, ``label`` -- the figures' name for it, default
    ``name`` --, ``what``, ``provenance``); DataError naming the file and entry when one is malformed or names no
    profile."""
    path = Path(root) / PROFILES_FILE
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise DataError(path, f"cannot read the hardware profiles ({err})") from None
    rows = (data or {}).get("profiles") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise DataError(path, "expected `profiles:` a list of entries with name, profile, what, provenance")
    out = []
    for i, e in enumerate(rows):
        if not isinstance(e, dict) or not {"name", "profile"} <= set(e):
            raise DataError(path, f"profiles[{i}]: expected name and profile (a registered name or a profile JSON)")
        prof = str(e["profile"])
        if prof not in profiles_mod.PROFILES:
            p = Path(prof) if Path(prof).is_absolute() else Path(root) / prof
            if not p.is_file():
                raise DataError(path, f"profiles[{i}] ({e['name']}): {prof} is neither a registered profile ("
                                      f"{', '.join(profiles_mod.PROFILES)}) nor an existing profile JSON")
            prof = str(p)
        out.append({"name": str(e["name"]), "profile": prof, "label": str(e.get("label") or e["name"]),
                    "what": str(e.get("what", "")),
                    "provenance": str(e.get("provenance", ""))})
    return out


def not_available(root: Path) -> dict:
    data = yaml.safe_load((Path(root) / PROFILES_FILE).read_text()) or {}
    return {k: str(v) for k, v in (data.get("not_available") or {}).items()}


def hardware_dir(results_dir: Path, name: str) -> Path:
    return Path(results_dir) / "hardware" / name


def headline_sources(panels: dict, source_names: list[str], manifest: Manifest) -> list[str]:
    """The headline panel's sources (the first available all-real panel of ``panels``, ``analysis.panels``, as the
    analysis picks it) among the manifest's sources (``source_names``: ``cfg.source_names()``)."""
    prov = {e["source"]: e.get("provenance", "real") for e in manifest["windows"]}
    present = [s for s in source_names if s in prov]
    pan = panel_sources({k: list(v) for k, v in panels.items()}, present, prov)
    hp = headline_panel_of(pan, prov)
    return list(pan[hp]["sources"]) if hp in pan and pan[hp]["available"] else present


def run_hardware(cfg: Config, sources, *, manifest: Manifest, progress: bool = True) -> dict[str, pl.DataFrame]:
    """Simulate ``sources``' windows (every scheduler and region, one replicate) on every profile of
    :data:`PROFILES_FILE`; each profile measures its own capacity. Returns name -> runs (cached by the campaign's
    shards: a second call reads them)."""
    out = {}
    refs = [r for r in campaign.window_refs(manifest, cfg.source_names(), cfg.campaign) if r.source in set(sources)]
    tables = windows_mod.load_windows(cfg.data, sorted({r.source for r in refs}),
                                      per_source=cfg.campaign.windows_per_source, manifest=manifest)
    for e in read_profiles(cfg.paths.root):
        sub = cfg.with_overrides({"paths.results_dir": str(hardware_dir(cfg.paths.results_dir, e["name"])),
                                  "simulation.profile": e["profile"], "simulation.replicates": 1,
                                  "campaign.request_records": None})
        scheds = campaign.make_plan(sub.plan_settings, manifest=manifest).schedulers
        given = campaign.run_tables(sub.data, sub.predictors, sub.simulation, {r.id: tables[r.id] for r in refs},
                                    scheds, manifest=manifest, workers=sub.campaign.workers)
        campaign.reuse_capacities(cfg, sub)    # used only where the record's key (window, model, policy) matches
        if progress:
            print(f"[portbench] hardware profile {e['name']} ...", flush=True)
        out[e["name"]] = campaign.run(sub, windows=[(r, given[r.id]) for r in refs], progress=progress,
                                      verbose=False).runs
    return out


def load_hardware(root: Path, results_dir: Path) -> dict[str, pl.DataFrame]:
    """The runs of :func:`run_hardware` per profile name (those simulated)."""
    out = {}
    for e in read_profiles(root):
        p = campaign.runs_path(hardware_dir(results_dir, e["name"]))
        if p.is_file():
            out[e["name"]] = pl.read_parquet(p)
    return out


def hardware_block(config: AnalysisInputs, runs_by_profile: dict[str, pl.DataFrame], *,
                   boot: int = HARDWARE_BOOT) -> dict:
    """``summary.json["across_hardware"]``: per profile the headline (across sources, across regions); across
    hardware (every profile pair, same source, region, metric and pair) the concordance with its interval and the
    four-way shares, pooled and per profile pair and per source."""
    from . import ports
    from .reversals import tenant_na

    entries = {e["name"]: e for e in read_profiles(config.paths.root)}
    names = [n for n in entries if n in runs_by_profile]
    if len(names) < 2:
        return {"available": False, "profiles": names,
                "reason": "fewer than two profiles simulated (notebook 03 runs them: hardware.run_hardware)"}
    cfg = settings(config.analysis, config.window_size)
    cubes = {n: build_cube(runs_by_profile[n], metric_spec=config.analysis.metrics,
                           all_metrics=metric_names(config.simulation.slo), scheduler_order=config.simulation.schedulers,
                           source_order=config.source_names(), names=config.display_names) for n in names}
    first = cubes[names[0]]
    srcs = [s for s in first.sources if all(s in c.sources for c in cubes.values())]
    for n, c in cubes.items():
        if c.schedulers != first.schedulers or c.regions != first.regions or any(
                c.windows[s] != first.windows[s] for s in srcs):
            raise DataError(hardware_dir(config.paths.results_dir, n), "the profile's runs cover other schedulers, "
                            "regions or windows than the first profile's: simulate them again (hardware.run_hardware)")
    panels = panel_sources(cfg["panels"], srcs, first.provenance)
    hp = headline_panel_of(panels, first.provenance)
    sources = panels[hp]["sources"] if hp in panels and panels[hp]["available"] else srcs
    head = [first.metrics.index(m) for m in cfg["headline_metrics"] if m in first.metrics]
    blocks = ports.block_lengths(first, head) if ports.INTERVAL == "block" else None
    point, bt, per = {}, {}, {}
    for n in names:
        c = cubes[n]
        point[n], bt[n] = ports.source_classes(c, head, cfg, deltas(c, cfg), tenant_na(c), boot=boot, seed=cfg["seed"],
                                               sources=sources, blocks=blocks)
        h = ports.headline_numbers(c, point[n], bt[n], sources)
        prof = profiles_mod.get_profile(entries[n]["profile"])
        per[n] = {**entries[n], "concordance": h["concordance"], "four_way": h["four_way"],
                  "sides": ports.side_shares(point[n], sources),
                  "cost": {"c0_ms": 1e3 * prof.c0_s, "c_prefill_us_per_token": 1e6 * prof.c_prefill_s,
                           "c_decode_us_per_seq": 1e6 * prof.c_decode_s, "floor_ms": 1e3 * prof.floor_s,
                           "max_batched_tokens": int(prof.max_batched_tokens)},
                  "runs": int(runs_by_profile[n].height)}

    def counts(n1, n2, s):
        fw = stats.four_way(point[n1][s], point[n2][s])
        bfw = stats.four_way(bt[n1][s], bt[n2][s]) if bt[n1] is not None else None
        return stats.four_way_counts(fw), (stats.four_way_counts(bfw, axis=tuple(range(1, bfw.ndim)))
                                           if bfw is not None else None)

    def entry(cs):
        pc = sum(c[0] for c in cs)
        bc = sum(c[1] for c in cs) if cs[0][1] is not None else None
        return {**interval_entry(pc, bc), "four_way": ports._share_block(pc)}

    allc: list = []
    by_pair: dict = {}
    by_source: dict[str, list] = {s: [] for s in sources}
    for n1, n2 in combinations(names, 2):
        cs = [counts(n1, n2, s) for s in sources]
        by_pair[f"{n1} vs {n2}"] = entry(cs)
        for s, c in zip(sources, cs):
            by_source[s].append(c)
        allc += cs
    return {"available": True, "panel": hp, "sources": sources, "profiles": per, "bootstrap": boot,
            "definition": "across hardware: the same source, region, headline metric and scheduler pair on two cost "
                          "profiles (every profile pair), four-way classes and concordance = same / (same + reversal) "
                          "as across sources and regions; each profile's campaign: the headline panel, one replicate, "
                          "regions relative to that profile's own capacity",
            "across_hardware": entry(allc), "by_profile_pair": by_pair,
            "by_source": {s: entry(v) for s, v in by_source.items() if v},
            "not_available": not_available(config.paths.root)}
