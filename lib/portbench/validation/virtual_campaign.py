"""The study's runs on vLLM's own scheduler: the ``vllm-virtual`` campaign backend and its check (needs vLLM).

:class:`VirtualEngine` is a campaign engine (:class:`portbench.study.campaign.engines.Engine`) whose runs
go through the virtual vLLM engine (:mod:`.virtual`) instead of the simulator -- same capacity, region
rescaling, horizon, profile, seeds, policy options and metrics. ``portbench simulate --backend
vllm-virtual`` runs any grid on it (in .venv-vllm; its shards are keyed by the engine, so they never mix
with the simulator's).

:func:`check` is what ``make validate`` runs: a subset of the headline panel's (window, region) shards
-- every policy, replicate 0, each region on every source before the next, window by window -- as
many as fit ``budget_s``, each run on both engines from the same inputs; it reports, per run, whether
every metric agrees within :data:`REL_TOL` (the campaign path sums closed-form decode runs in another order than
the step-by-step engines: the two agree to ~1e-15, see :mod:`.conformance` for the step-by-step identity), and per condition (source, region, metric) the agreement of the two
rankings and how many of the campaign's significant-and-practical reversals among the runs keep their
sign on vLLM's scheduler.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats as sps

from ..core import io as fileio
from ..core.config import Config, EngineConfig, PathsConfig
from ..sim import metrics
from ..study.campaign.engines import RunResult, SimEngine, scheduler_options
from ..study.campaign.plan import make_plan, run_seed
from ..study.campaign.run import run_tables
from ..data import windows as windows_mod
from . import policies, virtual
from .conformance import out_folder


class VirtualEngine(SimEngine):
    """The campaign engine on vLLM's scheduler (module docstring)."""

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, sim) -> RunResult:
        prof = self.profile(sim)
        sched = self._scheduler(sim, scheduler)
        hb = self.hash_block_size
        pc = prefix_caching_on(self, scaled_df, sim)
        v = virtual.run(scaled_df, scheduler, prof, horizon_s=horizon_s, seed=seed, slo=sim.edf_slo_dict,
                        options=scheduler_options(sim, scheduler), prefix_caching=pc,
                        hash_block_tokens=hb if pc else None, budget=getattr(sched, "prefill_token_budget", None),
                        log_steps=False)
        values = metrics.compute(v.requests, horizon_s, sim.slo_dicts)
        return RunResult(counters=dict(v.counters), metrics=dict(values), records=v.requests)


def prefix_caching_on(engine: SimEngine, scaled_df, sim) -> bool:
    """Whether the runs of ``engine`` (one window's) on ``scaled_df`` use prefix caching: the trace has block hashes
    and ``engine.prefix_caching`` is not off -- the runs where the simulator's cache rule differs from vLLM's
    (README "vLLM in the loop")."""
    return (EngineConfig.of(sim.engine).prefix_caching != "off" and engine.hash_block_size is not None
            and "block_hashes" in scaled_df.columns)


def passed(summary: dict) -> bool:
    """:func:`check`'s verdict (``portbench vllm-virtual``'s exit status): some run ran and every run without prefix
    caching is identical on both engines -- the one-rule guarantee. Prefix-cached runs differ by the named cache rule
    (vLLM's 16-token cache of every computed block against the trace's hash blocks): counted, not a failure."""
    return bool(summary["runs"]) and summary["runs_without_prefix_caching_identical"] == summary["runs_without_prefix_caching"]


REL_TOL = 1e-9   # the campaign path advances decode runs in closed form: sums in another order than step by step


def _same(a: float, b: float) -> bool:
    return (a == b) or (a != a and b != b) or abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def check(cfg: Config, *, budget_s: float = 600.0, panel: str = "real", out_dir=None, progress: bool = True) -> dict:
    """Runs of the headline panel on both engines within ``budget_s`` (module docstring); writes
    ``{results_dir}/validation/vllm_virtual.json`` and returns it."""
    t0 = time.perf_counter()
    sim_cfg = cfg.simulation
    manifest = windows_mod.load_manifest(cfg.paths)      # once for the command: the plan, the windows, their inputs
    plan = make_plan(cfg.plan_settings, manifest=manifest)
    srcs = list(cfg.analysis.panels.get(panel) or [])
    by_src: dict[str, list] = {s: [w for w in plan.windows if w.source == s and w.provenance == "real"] for s in srcs}
    loads = dict(sim_cfg.region_loads)
    order = []                        # (window, region): each region on every source before the next region
    for k in range(max((len(v) for v in by_src.values()), default=0)):
        for region in loads:
            for s in srcs:
                if k < len(by_src[s]):
                    order.append((by_src[s][k], region))
    names = [n for n in plan.schedulers if policies.virtual_mode(n) != "excluded"]
    base_s, base_v = SimEngine(), VirtualEngine()
    rows = []
    shards = 0
    tables: dict = {}
    caps: dict = {}
    for w, region in order:
        if time.perf_counter() - t0 > budget_s:
            break
        if w.id not in tables:
            t = windows_mod.load_windows(cfg.data, [w.source], manifest=manifest)
            tables.update(run_tables(cfg.data, cfg.predictors, sim_cfg, {w.id: t[w.id]}, names, manifest=manifest,
                                     workers=cfg.campaign.workers))
        df = tables[w.id]
        es, ev = base_s.for_window(w), base_v.for_window(w)
        if w.id not in caps:
            caps[w.id] = es.capacity(df, sim_cfg)["capacity_rps"]
        cap = caps[w.id]
        rho = loads[region]
        scaled, horizon = es.prepare(df, rho, cap, sim_cfg)
        pc = prefix_caching_on(ev, scaled, sim_cfg)
        for pol in names:
            seed = run_seed(sim_cfg.seed, w.id, pol, region, 0)
            a = es.run(scaled, pol, seed, horizon, sim_cfg).metrics
            b = ev.run(scaled, pol, seed, horizon, sim_cfg).metrics
            for m in a:
                rows.append({"source": w.source, "window_id": w.id, "region": region, "scheduler": pol,
                             "metric": m, "simulator": float(a[m]), "vllm": float(b[m]), "prefix_caching": pc})
        shards += 1
        if progress:
            print(f"[vllm-virtual] {w.id} {region}: {len(names)} policies on both engines", flush=True)
    df = pl.DataFrame(rows) if rows else pl.DataFrame(schema={"source": pl.Utf8, "window_id": pl.Utf8,
                                                              "region": pl.Utf8, "scheduler": pl.Utf8,
                                                              "metric": pl.Utf8, "simulator": pl.Float64,
                                                              "vllm": pl.Float64, "prefix_caching": pl.Boolean})
    same = [_same(a, b) for a, b in zip(df["simulator"].to_list(), df["vllm"].to_list())]
    df = df.with_columns(pl.Series("identical", same))
    n_runs = df.select(["window_id", "region", "scheduler"]).unique().height
    per_run = (df.group_by(["window_id", "region", "scheduler"]).agg(pl.col("identical").all(),
                                                                     pl.col("prefix_caching").first())
               if df.height else pl.DataFrame(schema={"identical": pl.Boolean, "prefix_caching": pl.Boolean}))
    runs_identical = int(per_run["identical"].sum())
    no_pc = per_run.filter(~pl.col("prefix_caching"))
    # per condition: the two rankings of the schedulers' means over the subset's windows
    conds = []
    means = df.group_by(["source", "region", "metric", "scheduler"]).agg(pl.col("simulator").mean(),
                                                                        pl.col("vllm").mean())
    for key, g in means.group_by(["source", "region", "metric"]):
        # rounded to 9 significant digits: differences of summation order are not ranks
        x = np.array([float(f"{v:.9g}") for v in g["simulator"].to_numpy()])
        y = np.array([float(f"{v:.9g}") for v in g["vllm"].to_numpy()])
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() < 3 or np.unique(x[ok]).size < 2:
            continue
        tau = sps.kendalltau(x[ok], y[ok]).statistic if np.unique(y[ok]).size > 1 else float("nan")
        conds.append({"source": key[0], "region": key[1], "metric": key[2], "tau_b": float(tau),
                      "identical_means": bool(np.array_equal(x, y, equal_nan=True))})
    summary = {
        "vllm": virtual.check_version(), "panel": panel, "budget_s": budget_s, "wall_s": time.perf_counter() - t0,
        "windows": sorted(df["window_id"].unique().to_list()) if df.height else [], "shards": shards,
        "policies": names, "runs": int(n_runs), "runs_identical": int(runs_identical), "rel_tol": REL_TOL,
        # the one-rule guarantee (README "vLLM in the loop"): every run without prefix caching identical; with it,
        # vLLM's 16-token cache of every computed block vs the simulator's prompt hash blocks (the named rule)
        "runs_without_prefix_caching": no_pc.height, "runs_without_prefix_caching_identical": int(no_pc["identical"].sum()),
        "runs_with_prefix_caching": per_run.height - no_pc.height,
        "runs_with_prefix_caching_identical": int(runs_identical) - int(no_pc["identical"].sum()),
        "max_rel_diff": _max_rel(df),
        "conditions": len(conds), "conditions_identical_means": int(sum(c["identical_means"] for c in conds)),
        "tau_b_min": float(np.nanmin([c["tau_b"] for c in conds])) if conds else None,
        "reversals": _reversals_kept(cfg.paths, df, panel),
    }
    out = out_folder(cfg.paths, out_dir, "validation")
    fileio.atomic_write(out / "vllm_virtual_runs.parquet", df.write_parquet)
    text = json.dumps({**summary, "per_condition": conds}, indent=1, sort_keys=True) + "\n"
    fileio.atomic_write(out / "vllm_virtual.json", lambda t: Path(t).write_text(text))
    return summary


def _max_rel(df: pl.DataFrame) -> float | None:
    """Largest relative difference between the two engines' metric values (finite pairs)."""
    if not df.height:
        return None
    a, b = df["simulator"].to_numpy(), df["vllm"].to_numpy()
    ok = np.isfinite(a) & np.isfinite(b)
    d = np.abs(a[ok] - b[ok]) / np.maximum(np.maximum(np.abs(a[ok]), np.abs(b[ok])), 1e-300)
    return float(d.max()) if d.size else 0.0


def _reversals_kept(paths: PathsConfig, df: pl.DataFrame, panel: str) -> dict:
    """The campaign's significant-and-practical reversals whose two sides are both among the runs: how many keep
    their sign (and their size, within 1e-12 relative) on vLLM's scheduler, from the per-window values."""
    path = Path(paths.results_dir) / "analysis" / "reversals.parquet"
    if not path.is_file() or not df.height:
        return {"available": False, "reason": f"no {path} (run the analysis first: make all)"}
    rev = pl.read_parquet(path)
    need = {"a", "b", "metric", "region", "source_1", "source_2"}
    if not need <= set(rev.columns):
        return {"available": False, "reason": f"{path} has no columns {sorted(need - set(rev.columns))}"}
    if "panel" in rev.columns:
        rev = rev.filter(pl.col("panel") == panel)
    if "headline" in rev.columns:
        rev = rev.filter(pl.col("headline"))
    for c in ("reversal", "significant", "practical"):
        if c in rev.columns:
            rev = rev.filter(pl.col(c))
    kept = checked = signs = 0
    for r in rev.iter_rows(named=True):
        sides = []
        for src in (r["source_1"], r["source_2"]):
            d = df.filter((pl.col("source") == src) & (pl.col("region") == r["region"]) & (pl.col("metric") == r["metric"]))
            a = d.filter(pl.col("scheduler") == r["a"]).sort("window_id")
            b = d.filter(pl.col("scheduler") == r["b"]).sort("window_id")
            if not a.height or a.height != b.height:
                break
            sides.append(((a["simulator"] - b["simulator"]).mean(), (a["vllm"] - b["vllm"]).mean()))
        if len(sides) != 2:
            continue
        checked += 1
        if all(np.sign(s) == np.sign(v) for s, v in sides):
            signs += 1
            if all(_same(float(s), float(v)) for s, v in sides):
                kept += 1
    return {"available": True, "reversals": int(rev.height), "checked": checked, "kept_sign": signs,
            "kept_sign_and_size": kept}
