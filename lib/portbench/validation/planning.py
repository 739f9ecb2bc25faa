"""The validation's plan (:func:`plan`): the cases (the pre-registered confirmatory family and the exploratory
rest), the family's power calculation and document, the windows (chosen at random, seeded), the engine check;
starts nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from ..core.config import (
    AnalysisConfig,
    Config,
    PathsConfig,
    ValidationConfig,
    VllmEngineConfig,
)
from ..core.errors import PortbenchError
from ..data import windows
from ..study.analysis import cube as analysis_cube
from ..study.campaign import plan as campaign_plan
from . import (
    cases,
    confirm,
    policies,
    prereg,
    replay,
)
from .common import DECIDING_ELIGIBLE, _sha, engine_spec, params_fingerprint, reversals_path


def choose_windows(manifest: dict, sources, k: int, seed: int) -> dict[str, list[str]]:
    """``k`` window ids per source, drawn at random without replacement (seeded by ``seed`` and the
    source's name: the first ``k`` of a seeded permutation, so fewer windows are the first of more), in the drawn
    order (the first ones also serve the fidelity replays)."""
    out = {}
    for s in sources:
        ids = [w["id"] for w in manifest["windows"] if w["source"] == s]
        salt = int.from_bytes(hashlib.sha256(s.encode()).digest()[:4], "big")
        rng = np.random.default_rng([int(seed), salt])
        out[s] = [ids[i] for i in rng.permutation(len(ids))[:k]] if ids else []     # k + 1 windows: the same k first
    return out


@dataclasses.dataclass
class Plan:
    """What the validation would run, and whether it can run here."""

    status: replay.EngineStatus
    device: str | None
    reduced: bool
    selection: cases.Selection | None
    windows: dict[str, list[str]]          # source -> window ids (random, seeded)
    spec: replay.EngineSpec | None
    engine: VllmEngineConfig | None
    messages: list[str]
    confirmatory: list[cases.Case] = dataclasses.field(default_factory=list)   # the pre-registered family
    exploratory: list[cases.Case] = dataclasses.field(default_factory=list)
    preregistration: dict | None = None    # the document prereg.write stores before any engine run
    manifest: dict | None = dataclasses.field(default=None, repr=False)   # the windows' manifest, loaded once

    @property
    def runnable(self) -> bool:
        return bool(self.status.ok and self.confirmatory and self.windows)

    @property
    def cases(self) -> list[cases.Case]:
        """The cases as replayed: the confirmatory family (the control on the key reversal's sources), then
        the exploratory ones."""
        return [*self.confirmatory, *self.exploratory]

    def replays(self) -> pl.DataFrame:
        """One row per (case, source, scheduler) the run would replay (optional cases included)."""
        rows = []
        for i, c in enumerate(self.cases):
            for s in c.sources:
                for sched in c.schedulers:
                    rows.append({"case": c.kind, "order": i, "required": i < len(self.confirmatory), "source": s,
                                 "region": c.region,
                                 "rho": c.rho, "scheduler": sched, "engine_mode": policies.engine_policy(sched).mode,
                                 "windows": len(self.windows.get(s, []))})
        schema = {"case": pl.Utf8, "order": pl.Int64, "required": pl.Boolean, "source": pl.Utf8, "region": pl.Utf8,
                  "rho": pl.Float64, "scheduler": pl.Utf8, "engine_mode": pl.Utf8, "windows": pl.Int64}
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)

    def to_dict(self) -> dict:
        return {"status": dataclasses.asdict(self.status), "device": self.device, "reduced": self.reduced,
                "cases": [c.to_dict() for c in self.cases], "confirmatory_cases": len(self.confirmatory),
                "excluded": self.selection.excluded if self.selection else {},
                "windows": self.windows, "messages": self.messages,
                "engine_args": self.spec.engine_kwargs() if self.spec else None}


def _device(status: replay.EngineStatus) -> str | None:
    return status.device if status.ok else None


def plan(cfg: Config, reversals: pl.DataFrame | None = None, *, reduced: bool = False) -> Plan:
    """Select the cases (the pre-registered confirmatory family, :mod:`.prereg`, and the exploratory
    rest), size the windows by the power calculation, choose them, check the engine; starts nothing.
    ``reversals`` overrides the analysis' file; ``reduced``: the fewer windows of ``make all``. The windows' manifest
    is read here, once for the run (:attr:`Plan.manifest`: the family, the replays and the analysis use it)."""
    v = cfg.validation
    status = replay.engine_status(v.device, v.vllm_version)
    device = _device(status) or ("cpu" if v.device == "cpu" else "cuda")
    msgs: list[str] = []
    conf: list = []
    explore: list = []
    selection, doc = None, None
    try:
        rev = reversals if reversals is not None else cases.read_reversals(reversals_path(cfg.paths))
        selection = cases.select_cases(rev, cfg.simulation.region_loads)
        # the family: every policy the deciding (virtual) engine runs is eligible; the exploratory cases are the
        # wall-clock engine's only (the virtual engine runs the family alone): pairs it can run
        conf, explore, m = prereg.choose_cases(rev, cfg.simulation.region_loads, extra=v.confirmatory.extra_reversals,
                                               seed=v.confirmatory.draw_seed, eligible=DECIDING_ELIGIBLE)
        explore = [c for c in explore if cases.engine_runnable(c.a) and cases.engine_runnable(c.b)]
        msgs += m
    except PortbenchError as e:
        msgs.append(str(e))
    wins: dict[str, list[str]] = {}
    man = None
    if conf:
        pool: dict | str        # the campaign's windows of the manifest (where it has values), or why there are none
        try:
            man = windows.load_manifest(cfg.paths)      # once for the whole run: Plan.manifest
            ids = {r.id for r in campaign_plan.window_refs(man, cfg.source_names(), cfg.campaign)}
            pool = {**man, "windows": [w for w in man["windows"] if w["id"] in ids]}
        except PortbenchError as e:
            pool = f"windows: {e}"
        inputs = {"reversals_sha256": _sha(reversals_path(cfg.paths)) if reversals is None else "given",
                  "params_fingerprint": params_fingerprint(cfg.tree)}
        wins, doc = family_document(v, cfg.analysis, conf, explore, pool,
                                    lambda: campaign_window_values(cfg.paths, lambda: analysis_cube.load_runs(cfg.analysis, cfg.plan_settings, man)),
                                    reduced=reduced, messages=msgs, inputs=inputs)
    spec = None
    try:
        spec = engine_spec(v, cfg.simulation, device)
    except PortbenchError as e:
        msgs.append(f"engine configuration: {e}")
    return Plan(status, device, reduced, selection, wins, spec, v.engine(device), msgs, conf, explore, doc, man)


# The deciding engine's noise in the power calculation: the virtual vLLM engine is deterministic (a run repeats bit
# for bit: no model, a virtual clock), so the windows alone carry the uncertainty.
VIRTUAL_NOISE = {"cv": 0.0, "how": "the deciding engine, the virtual vLLM engine, is deterministic (a run repeats bit "
                                   "for bit: no model, a virtual clock); the windows alone carry the uncertainty"}


def family_document(v: ValidationConfig, analysis: AnalysisConfig, conf: list, explore: list, pool: dict | str,
                    values: Callable[[], pl.DataFrame], *, reduced: bool, messages: list[str], inputs: dict,
                    noise: dict | None = None) -> tuple[dict[str, list[str]], dict]:
    """The windows (per source, :func:`choose_windows` from ``pool``: the manifest's windows the campaign has
    values of, or why there are none -- said in ``messages`` after the power calculation's) and the
    pre-registration document of the family ``conf`` (``inputs``: the hashes it records): the power calculation
    (:func:`power_plan` on ``values()``) with the deciding engine's noise ``noise`` (default: the virtual engine's,
    none: :data:`VIRTUAL_NOISE`; with the wall-clock engine deciding, its measured repeat noise,
    :func:`.steps.repeat_cv`, else ``validation.confirmatory.noise_cv``)."""
    if noise is None and confirm.DECIDING_ENGINE == "virtual":
        noise = VIRTUAL_NOISE
    pw = power_plan(v, analysis, conf, values, reduced=reduced, messages=messages, noise=noise)
    srcs = sorted({s for c in [*conf, *explore] for s in c.sources})
    wins: dict[str, list[str]] = {}
    if isinstance(pool, str):
        messages.append(pool)
    else:
        wins = choose_windows(pool, srcs, int(pw["windows_per_source"]), int(v.window_seed))
    doc = prereg.document(conf, pw, {s: wins.get(s, []) for s in sorted({s for c in conf for s in c.sources})},
                          alpha=float(analysis.alpha), draw_seed=v.confirmatory.draw_seed,
                          extra=v.confirmatory.extra_reversals, margin=float(v.equivalence_margin),
                          inputs={**inputs, "run": "reduced" if reduced else "full"})
    return wins, doc


def campaign_window_values(paths: PathsConfig, runs: Callable[[], pl.DataFrame]) -> pl.DataFrame:
    """The campaign's per-window metric values as the analysis used them (``analysis/window_values.parquet`` under
    ``paths.results_dir``: replicate-averaged, one column per metric), else the campaign's runs table (``runs()``,
    ``analysis.load_runs``; read only then)."""
    f = Path(paths.results_dir) / "analysis" / "window_values.parquet"
    if f.is_file():
        wv = pl.read_parquet(f)
        return wv.pivot(on="metric", index=["source", "window_id", "region", "scheduler"], values="value")
    return runs()


def power_plan(v: ValidationConfig, analysis: AnalysisConfig, conf: list, values: Callable[[], pl.DataFrame], *,
               reduced: bool, messages: list[str], noise: dict | None = None) -> dict:
    """The power calculation of :mod:`.prereg` on the campaign's per-window values (``values()``:
    :func:`campaign_window_values`) with ``validation.confirmatory``'s settings, the engine's noise the
    measured one (``noise``: :func:`.steps.repeat_cv`) when finite, else ``confirmatory.noise_cv`` (which one:
    ``noise_cv_source``); without campaign values, the largest window count (said in ``messages``)."""
    c = v.confirmatory
    hi = int(v.reduced_windows_per_source if reduced else v.windows_per_source)
    measured = (noise or {}).get("cv")
    deterministic = noise is VIRTUAL_NOISE
    use_measured = isinstance(measured, float) and math.isfinite(measured) and (measured > 0 or deterministic)
    cv = float(min(measured, 0.99)) if use_measured and measured is not None else float(c.noise_cv)
    how = (noise or {}).get("how", "")
    src = {"noise_cv": cv, "noise_cv_source": (how if deterministic else f"measured: {how} ({noise['rounds']} rounds)")
           if use_measured and noise else "parameter validation.confirmatory.noise_cv (nothing measured)"}
    ps = prereg.PowerSettings(alpha=float(analysis.alpha), target=float(analysis.power.target),
                              noise_cv=cv, min_windows=min(int(c.min_windows), hi), max_windows=hi,
                              simulations=int(c.power_simulations), seed=int(c.draw_seed))
    try:
        runs = values()
    except PortbenchError as e:
        messages.append(f"power calculation: no campaign runs ({e}); {hi} windows per source")
        return {"windows_per_source": hi, "target_reached": False, "power_at_n": [math.nan] * len(conf),
                "settings": ps.__dict__, "note": "no campaign runs table", **src}
    return {**prereg.power(conf, runs, ps), **src}
