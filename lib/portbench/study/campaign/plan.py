"""The campaign's grid: windows x regions x schedulers x replicates, per-run seeds, shard fingerprints.

See :mod:`portbench.study.campaign` for the definitions (seeds, shards, fingerprints).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from ...core import plugins as plugin_loader
from ...core.config import (CampaignConfig, PlanSettings, PredictorsConfig, RequestRecordsConfig,
                           SimulationConfig, StandinsConfig)
from ...core.errors import PortbenchError
from ...core.io import canonical_json, sha256_hex
from ...data import windows as windows_mod
from ...sim import schedulers as scheduler_registry
from ...sim.request import PREDICTION_COLUMNS
from .engines import Engine, SimEngine, scheduler_options

FORMAT_VERSION = 2      # 2: capacity = sustainable throughput, engine section, load columns

# How capacity is measured (part of the capacity cache key): see portbench.sim.regions.saturation.
CAPACITY_METHOD = "steady-backlog-v1"


SEED_TAG = "portbench-run-seed-v1"


# canonical_json's serialisation (sorted keys, compact, ASCII) of the seed's list of plain values, with one encoder
# made once: a run's seed is computed for every run of the campaign
_SEED_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def run_seed(base_seed: int, window_id: str, scheduler: str, region: str, replicate: int) -> int:
    """The deterministic 63-bit seed of one run (see the module docstring)."""
    digest = hashlib.sha256(_SEED_JSON.encode(
        [SEED_TAG, int(base_seed), str(window_id), str(scheduler), str(region), int(replicate)]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)) or "x"


def replicates(sim: SimulationConfig) -> list[int]:
    return list(range(int(sim.replicates)))


@dataclass(frozen=True)
class WindowRef:
    """A window of the campaign: id, source, provenance, SHA-256, and ``block_size`` = tokens per block of
    its ``block_hashes`` column (the source's ``block_size`` as frozen in the manifest; None: the window
    has no prompt block hashes). The engine gets it through ``Engine.for_window``."""

    id: str
    source: str
    provenance: str
    sha256: str
    block_size: int | None = None

    def fingerprint(self) -> dict:
        """What the shard keys record of the window (``block_size`` only when there are hashes)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if not (k == "block_size" and v is None)}


@dataclass(frozen=True)
class ShardSpec:
    """One task: every scheduler x replicate of one (window, region)."""

    window: WindowRef
    region: str
    rho: float
    schedulers: tuple
    replicates: tuple
    record_replicates: tuple  # replicates whose per-request records are kept (empty: none)
    key: str                  # fingerprint hash (16 hex)
    name: str                 # file stem: <window>__<region>__<key>
    fingerprint: str          # canonical JSON of the fingerprint

    @property
    def records_name(self) -> str:
        return f"{self.name}__r{'-'.join(map(str, self.record_replicates))}" if self.record_replicates else ""


@dataclass
class Plan:
    """The campaign's grid for one parameter set."""

    windows: list[WindowRef]
    regions: dict[str, float]
    schedulers: list[str]
    replicates: list[int]
    metrics: list[str]
    profile: str
    common: dict
    capacity_keys: dict[str, str]   # window id -> capacity cache key
    shards: list[ShardSpec]
    hash: str

    @property
    def n_runs(self) -> int:
        return len(self.windows) * len(self.regions) * len(self.schedulers) * len(self.replicates)


def _records_selection(rr: RequestRecordsConfig | None, windows: Sequence[WindowRef], regions: Iterable[str],
                       reps: Sequence[int]):
    """(window ids, regions, replicates) whose per-request records are kept."""
    if rr is None:
        return set(), set(), ()
    n = rr.windows_per_source
    seen: dict[str, int] = {}
    chosen_w = set()
    for w in windows:
        seen[w.source] = seen.get(w.source, 0) + 1
        if n in (None, "all") or seen[w.source] <= cast(int, n):
            chosen_w.add(w.id)
    r = rr.regions
    chosen_r = set(regions) if r in ("all", None) else set(r) & set(regions)
    r_reps = rr.replicates
    chosen_rep = tuple(reps) if r_reps in ("all", None) else tuple(sorted(set(cast(tuple, r_reps)) & set(reps)))
    return chosen_w, chosen_r, chosen_rep


def window_refs(manifest: Mapping, sources: Iterable[str], campaign: CampaignConfig) -> list[WindowRef]:
    """The campaign's windows of the windows' ``manifest`` (manifest order; the first
    ``campaign.windows_per_source`` per source; only the parameters' ``sources`` (``cfg.source_names()``) -- one
    left out with ``sources: {name: null}`` is not simulated)."""
    entries = windows_mod.select_entries(manifest, list(sources), campaign.windows_per_source)
    return [WindowRef(e["id"], e["source"], e["provenance"], e["sha256"], windows_mod.hash_block_size(manifest, e))
            for e in entries]


def _refs(windows) -> list[WindowRef]:
    return [w[0] if isinstance(w, tuple) else w for w in windows]


def needs_predictions(schedulers: Sequence[str]) -> bool:
    """Whether any of ``schedulers`` reads the windows' frozen predictions (uses ``predicted``)."""
    return any("predicted" in scheduler_registry.uses(n) for n in schedulers)


def _given_inputs(windows: Sequence) -> dict[str, dict]:
    """Run inputs of explicitly given ``(WindowRef, df)`` windows beyond the frozen table: a hash of the
    prediction columns they carry (their tenants are part of the window's hash)."""
    out = {}
    for w in windows:
        if isinstance(w, tuple):
            ref, df = w
            cols = [c for c in PREDICTION_COLUMNS if c in df.columns]
            out[ref.id] = {"predictions": sha256_hex([df[c].to_list() for c in cols]) if cols else None,
                           "tenants": "given"}
    return out


def run_inputs(P: PredictorsConfig, standins_cfg: StandinsConfig, sim: SimulationConfig, manifest: Mapping,
               refs: Sequence[WindowRef], schedulers: Sequence[str]) -> dict[str, dict]:
    """Per window, what a run is given besides the frozen window table (part of the shard fingerprint):
    the fingerprint key of the source's frozen predictions (when a scheduler reads them; ``P``, ``standins_cfg``:
    :func:`portbench.data.predictors.fingerprint`) and how its tenants are read (``sim.tenant_model``,
    :func:`portbench.data.windows.tenant_label`)."""
    need = needs_predictions(schedulers)
    if need:
        from ...data import predictors   # lightgbm and scikit-learn: not imported by the campaign's workers
    keys: dict[str, str] = {}
    out = {}
    for w in refs:
        if need and w.source not in keys:
            keys[w.source] = predictors.fingerprint_key(predictors.fingerprint(P, standins_cfg, manifest, w.source,
                                                                               w.source))
        out[w.id] = {"predictions": keys.get(w.source),
                     "tenants": windows_mod.tenant_label(manifest, w.source, sim.tenant_model)}
    return out


def plan_common(s: SimulationConfig, plugins: Sequence[str], engine: Engine) -> dict:
    """What every run of a campaign shares and that changes results (``Plan.common``): the engine's model and
    metrics, the capacity policy and the other settings of the ``simulation`` section ``s``, the plug-ins'
    SHA-256 (``plugins``: ``cfg.plugins``)."""
    metric_list = list(engine.metric_names(s))
    model = engine.fingerprint(s)
    policy = s.capacity_policy
    common = {
        "format": FORMAT_VERSION,
        "model": model,
        "capacity_policy": policy,
        "capacity_options": scheduler_options(s, policy),
        "horizon_factor": s.horizon_factor,
        "seed": s.seed,
        "predictor_sigma": s.predictor_sigma,
        "slo": s.slo_dicts,
        "edf_slo": s.edf_slo,
        "tenant_model": s.tenant_model,
        "metrics": metric_list,
        "engine": s.engine.as_dict(),
    }
    if s.arrival_jitter:                 # only when on: the default study's fingerprints are unchanged
        common["arrival_jitter"] = True
    if plugins:
        common["plugins"] = plugin_loader.fingerprint(plugin_loader.specs(plugins))
    return common


def make_plan(settings: PlanSettings, *, engine: Engine | None = None, windows: Sequence | None = None,
              manifest: Mapping | None = None) -> Plan:
    """The grid, seeds' keys and shard fingerprints of the campaign of ``settings`` (:class:`PlanSettings`,
    ``cfg.plan_settings``; nothing is computed).

    ``manifest``: the window manifest (:func:`portbench.data.windows.load_manifest`, loaded once by the caller's
    stage); ``windows`` replaces the manifest's windows: a list of :class:`WindowRef` or of ``(WindowRef,
    window_df)`` pairs (tests and benchmarks use it). One of the two is required. A scheduler that is not registered fails here, at once ("scheduler X is not registered;
    load its plug-in ..."). The plug-ins (``settings.plugins``) are part of every fingerprint, by SHA-256.
    """
    engine = engine or SimEngine()
    s = settings.simulation
    scheds = scheduler_registry.names(s.schedulers)
    if windows is not None:
        wins = _refs(windows)
        inputs = _given_inputs(windows)
    elif manifest is None:
        raise PortbenchError("make_plan needs the window manifest (windows.load_manifest) or the windows")
    else:
        wins = window_refs(manifest, settings.source_names(), settings.campaign)
        inputs = run_inputs(settings.predictors, settings.standins, s, manifest, wins, scheds)
    regs = s.loads
    reps = replicates(s)
    common = plan_common(s, settings.plugins, engine)
    metric_list = common["metrics"]
    cap_model = engine.capacity_fingerprint(s) if hasattr(engine, "capacity_fingerprint") else common["model"]
    cap_common = {**{k: common[k] for k in ("format", "capacity_policy", "capacity_options")}, "model": cap_model,
                  "engine": s.engine.reference.as_dict()}     # capacity is measured on the reference engine
    capacity_keys = {w.id: sha256_hex({"window_sha256": w.sha256, "method": CAPACITY_METHOD, **cap_common,
                                       **({"block_size": w.block_size} if w.block_size else {})})[:16] for w in wins}
    rec_w, rec_r, rec_reps = _records_selection(settings.campaign.request_records, wins, regs, reps)
    opts = {name: scheduler_options(s, name) for name in scheds}
    shards = []
    for w in wins:
        for region, rho in regs.items():
            fp = {"common": common, "window": w.fingerprint(), "capacity_key": capacity_keys[w.id],
                  "region": region, "rho": rho, "schedulers": scheds, "scheduler_options": opts,
                  "replicates": reps, "inputs": inputs.get(w.id)}
            text = canonical_json(fp)
            key = hashlib.sha256(text.encode()).hexdigest()[:16]
            keep = rec_reps if (w.id in rec_w and region in rec_r) else ()
            shards.append(ShardSpec(window=w, region=region, rho=rho, schedulers=tuple(scheds),
                                    replicates=tuple(reps), record_replicates=tuple(keep), key=key,
                                    name=f"{_safe(w.id)}__{_safe(region)}__{key}", fingerprint=text))
    plan_hash = sha256_hex([sh.name + "/" + sh.records_name for sh in shards])[:16]
    return Plan(windows=wins, regions=regs, schedulers=scheds, replicates=reps, metrics=metric_list,
                profile=engine.profile_name(s), common=common, capacity_keys=capacity_keys, shards=shards,
                hash=plan_hash)
