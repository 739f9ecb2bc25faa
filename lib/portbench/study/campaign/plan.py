"""The campaign's grid: windows x regions x schedulers x replicates, per-run seeds, shard fingerprints.

See :mod:`portbench.study.campaign` for the definitions (seeds, shards, fingerprints).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...core.config import Config, RequestRecordsConfig, SimulationConfig
from ...core.io import canonical_json, sha256_hex
from ...data import windows as windows_mod
from ...sim import schedulers as scheduler_registry
from .engines import Engine, SimEngine, scheduler_options

FORMAT_VERSION = 1


SEED_TAG = "portbench-run-seed-v1"


def run_seed(base_seed: int, window_id: str, scheduler: str, region: str, replicate: int) -> int:
    """The deterministic 63-bit seed of one run (see the module docstring)."""
    digest = hashlib.sha256(canonical_json(
        [SEED_TAG, int(base_seed), str(window_id), str(scheduler), str(region), int(replicate)]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)) or "x"


def replicates(sim: SimulationConfig) -> list[int]:
    return list(range(int(sim.replicates)))


@dataclass(frozen=True)
class WindowRef:
    id: str
    source: str
    provenance: str
    sha256: str


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
        if n in (None, "all") or seen[w.source] <= n:
            chosen_w.add(w.id)
    r = rr.regions
    chosen_r = set(regions) if r in ("all", None) else set(r) & set(regions)
    r_reps = rr.replicates
    chosen_rep = tuple(reps) if r_reps in ("all", None) else tuple(sorted(set(r_reps) & set(reps)))
    return chosen_w, chosen_r, chosen_rep


def window_refs(cfg: Config, manifest: Mapping | None = None) -> list[WindowRef]:
    """The campaign's windows (manifest order; the first ``campaign.windows_per_source`` per source)."""
    manifest = manifest if manifest is not None else windows_mod.load_manifest(cfg)
    entries = windows_mod.select_entries(manifest, None, cfg.campaign.windows_per_source)
    return [WindowRef(e["id"], e["source"], e["provenance"], e["sha256"]) for e in entries]


def _refs(windows) -> list[WindowRef]:
    return [w[0] if isinstance(w, tuple) else w for w in windows]


def make_plan(cfg: Config, *, engine: Engine | None = None, windows: Sequence | None = None,
              manifest: Mapping | None = None) -> Plan:
    """The grid, seeds' keys and shard fingerprints for ``P`` (nothing is computed).

    ``windows`` replaces the manifest's windows: a list of :class:`WindowRef` or of
    ``(WindowRef, window_df)`` pairs (tests and benchmarks use it).
    """
    engine = engine or SimEngine()
    s = cfg.simulation
    wins = _refs(windows) if windows is not None else window_refs(cfg, manifest)
    regs = s.loads
    scheds = scheduler_registry.names(s.schedulers)
    reps = replicates(s)
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
        "metrics": metric_list,
    }
    cap_common = {k: common[k] for k in ("format", "model", "capacity_policy", "capacity_options")}
    capacity_keys = {w.id: sha256_hex({"window_sha256": w.sha256, **cap_common})[:16] for w in wins}
    rec_w, rec_r, rec_reps = _records_selection(cfg.campaign.request_records, wins, regs, reps)
    opts = {name: scheduler_options(s, name) for name in scheds}
    shards = []
    for w in wins:
        for region, rho in regs.items():
            fp = {"common": common, "window": dataclasses.asdict(w), "capacity_key": capacity_keys[w.id],
                  "region": region, "rho": rho, "schedulers": scheds, "scheduler_options": opts,
                  "replicates": reps}
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
