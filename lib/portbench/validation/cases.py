"""Which simulated findings the vLLM replay checks: the key reversal, a stable control, further reversals.

Input: the analysis' reversal table (``{results_dir}/analysis/reversals.parquet``; columns in
``portbench.study.analysis.COLUMNS["reversals"]``: ``a, b, source_1, source_2, region, metric, direction,
diff_1, diff_2`` (oriented: positive = a better), ``rel_1, rel_2, min_rel, p_1, p_2, p_adj_1,
p_adj_2, n_1, n_2, reversal, significant, practical``, ...). Only pairs whose two policies are *eligible*
are selected: by default those the wall-clock engine runs (:func:`engine_runnable`: the shared engine's
policies, and `sarathi` on an instance of its own); the confirmatory family takes every policy the virtual
vLLM engine runs (:func:`virtual_runnable`, ``select_cases(eligible=...)``), the engine that decides it.

* **Key reversal**: among rows with ``reversal & significant & practical`` (the analysis' stage
  ``significant_and_practical``) on a headline metric (the table's ``headline`` column: the analysis'
  pre-specified metrics; a secondary metric only when no headline one qualifies), the one with the
  largest smaller-side relative effect ``min(rel_1, rel_2)`` — the analysis' ``most_dramatic``
  definition restricted to runnable pairs. Ties: region, metric, a, b, source_1, source_2 in
  alphabetical order. Metrics a replay cannot measure (:data:`UNMEASURED_METRICS`: slowdown needs an
  isolated service time, tenant fairness a tenant) are left out of every case, and the selection says
  how many reversals that leaves out.
* **Stable control**: a runnable pair whose order is the same and significant on every source the
  validation replays -- the key reversal's two sources (every source of the table when there is no
  key reversal): for a (pair, region, metric), every source-pair row among those sources has no
  reversal, both sides significant and ``sign(diff_1) == sign(diff_2)``, and the rows cover those
  sources. Preferred at the key reversal's region and metric (so both cases are replayed under the
  same conditions), then on a headline metric, then the largest smallest effect over the sources.
* **Further reversals**: every other significant-and-practical reversal of a runnable pair, in the
  same order as the key reversal's (:func:`reversal_cases`); the run replays as many as its time
  budget allows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import polars as pl

from ..core.errors import DataError
from . import policies

REQUIRED = ("a", "b", "source_1", "source_2", "region", "metric", "diff_1", "diff_2", "rel_1", "rel_2",
            "reversal", "significant", "practical")
OPTIONAL_FLOAT = ("p_1", "p_2", "p_adj_1", "p_adj_2", "mean_a_1", "mean_b_1", "mean_a_2", "mean_b_2")


@dataclass(frozen=True)
class SideResult:
    """The simulation's verdict for one source: oriented mean difference (a - b), effect, p-values."""

    source: str
    diff: float
    rel: float
    p: float = float("nan")
    p_adj: float = float("nan")
    significant: bool = False
    mean_a: float = float("nan")
    mean_b: float = float("nan")


@dataclass(frozen=True)
class Case:
    """One finding to replay: scheduler pair, region, metric, and the simulation's per-source verdicts."""

    kind: str                      # "reversal" | "control"
    a: str
    b: str
    region: str
    metric: str
    sides: tuple[SideResult, ...]  # one per source the case involves
    rho: float | None = None
    direction: str | None = None
    notes: str = ""

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(s.source for s in self.sides)

    @property
    def schedulers(self) -> tuple[str, str]:
        return (self.a, self.b)

    @property
    def min_rel(self) -> float:
        return float(min(s.rel for s in self.sides))

    def side(self, source: str) -> SideResult:
        for s in self.sides:
            if s.source == source:
                return s
        raise KeyError(source)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sources"] = list(self.sources)
        d["min_rel"] = self.min_rel
        return d

    def describe(self) -> str:
        """One line: what the simulation found."""
        parts = []
        for s in self.sides:
            who = self.a if s.diff > 0 else self.b
            parts.append(f"{s.source}: {who} better by {100 * s.rel:.1f}% (p_adj={s.p_adj:.2g})")
        return (f"{self.kind}: {self.a} vs {self.b} on {self.metric} at {self.region} — " + "; ".join(parts))


def read_reversals(path: str | Path) -> pl.DataFrame:
    """The reversal table, checked for the columns case selection needs."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no reversal table: run the analysis (notebook 06 / `portbench analyze`) first")
    return check_reversals(pl.read_parquet(path), where=str(path))


def check_reversals(rev: pl.DataFrame, where: str = "reversals") -> pl.DataFrame:
    """The columns the selection needs (DataError otherwise); with a ``panel`` column (one block of rows per
    panel of sources, the headline panel first), only the headline panel's rows."""
    missing = [c for c in REQUIRED if c not in rev.columns]
    if missing:
        raise DataError(where, f"missing columns {missing}; expected at least {list(REQUIRED)}")
    if "panel" in rev.columns and rev.height:
        rev = rev.filter(pl.col("panel") == rev["panel"][0])
    for c in OPTIONAL_FLOAT:
        if c not in rev.columns:
            rev = rev.with_columns(pl.lit(float("nan")).alias(c))
    return rev


# Metrics a replay on the engine cannot measure, and why: cases on them are not selected.
UNMEASURED_METRICS = {
    "max_slowdown": "slowdown = E2E / the request's isolated service time, which the engine does not measure "
                    "(the simulator takes it from its cost model)",
    "slowdown_jain": "slowdown = E2E / the request's isolated service time, which the engine does not measure "
                     "(the simulator takes it from its cost model)",
    "tenant_service_gap": "the replayed requests carry no tenant",
    "tenant_jain": "the replayed requests carry no tenant",
}


# Policies the validation runs on an engine instance of their own (an engine-wide setting, not a per-request
# rule), and how: the policy-side code (policies.py) does not list them as runnable on the shared engine.
OWN_INSTANCE = {"sarathi": "FCFS on its own engine instance whose token budget is Sarathi-Serve's 512 x token_scale"}


def engine_runnable(name: str) -> bool:
    """Whether the validation can run ``name``: inside vLLM (``policies.runnable``) or on an instance
    of its own (:data:`OWN_INSTANCE`)."""
    return bool(policies.runnable(name) or name in OWN_INSTANCE)


def virtual_runnable(name: str) -> bool:
    """Whether the virtual vLLM engine (:mod:`.virtual`) runs ``name``: every built-in policy."""
    return policies.virtual_mode(name) != "excluded"


def _runnable_rows(rev: pl.DataFrame, eligible: Callable[[str], bool] = engine_runnable) -> pl.DataFrame:
    """Rows whose two policies are ``eligible`` (default :func:`engine_runnable`), on a metric a replay
    measures (:data:`UNMEASURED_METRICS`)."""
    names = sorted(set(rev["a"].to_list()) | set(rev["b"].to_list()))
    ok = [n for n in names if eligible(n)]
    return rev.filter(pl.col("a").is_in(ok) & pl.col("b").is_in(ok)
                      & ~pl.col("metric").is_in(list(UNMEASURED_METRICS)))


def _side(row: Mapping, k: int, significant: bool) -> SideResult:
    f = lambda key: float(row[key]) if row.get(key) is not None else float("nan")  # noqa: E731
    return SideResult(source=row[f"source_{k}"], diff=f(f"diff_{k}"), rel=f(f"rel_{k}"), p=f(f"p_{k}"),
                      p_adj=f(f"p_adj_{k}"), significant=significant, mean_a=f(f"mean_a_{k}"),
                      mean_b=f(f"mean_b_{k}"))


def _headline_col(rev: pl.DataFrame) -> pl.Expr:
    """1 for a row on one of the analysis' pre-specified headline metrics (its ``headline`` column), else 0;
    all 1 for a table without that column."""
    if "headline" in rev.columns:
        return pl.col("headline").fill_null(False).cast(pl.Int8).alias("_headline")
    return pl.lit(1, dtype=pl.Int8).alias("_headline")


def reversal_cases(rev: pl.DataFrame, region_loads: Mapping[str, float] | None = None,
                   eligible: Callable[[str], bool] = engine_runnable) -> list[Case]:
    """Every significant-and-practical reversal of a runnable pair: those on a headline metric first
    (the analysis' pre-specified metrics; its ``most_dramatic`` is one of them), each group the most
    dramatic first (largest min(rel_1, rel_2); ties: region, metric, a, b, source_1, source_2
    alphabetically)."""
    rev = _runnable_rows(check_reversals(rev), eligible)
    cand = rev.filter(pl.col("reversal") & pl.col("significant") & pl.col("practical"))
    if cand.height == 0:
        return []
    cand = cand.with_columns(pl.min_horizontal("rel_1", "rel_2").alias("_min_rel"), _headline_col(cand))
    cand = cand.sort(["_headline", "_min_rel", "region", "metric", "a", "b", "source_1", "source_2"],
                     descending=[True, True, False, False, False, False, False, False])
    out = []
    for i, row in enumerate(cand.iter_rows(named=True)):
        out.append(Case("reversal", row["a"], row["b"], row["region"], row["metric"],
                        (_side(row, 1, True), _side(row, 2, True)),
                        rho=(region_loads or {}).get(row["region"]), direction=row.get("direction"),
                        notes=("largest smaller-side relative effect among significant-and-practical reversals "
                               "of pairs vLLM can run") if i == 0 else
                              f"significant-and-practical reversal #{i + 1} by smaller-side effect"))
    return out


def key_reversal(rev: pl.DataFrame, region_loads: Mapping[str, float] | None = None) -> Case | None:
    """The significant-and-practical reversal of a runnable pair with the largest min(rel_1, rel_2)."""
    cases = reversal_cases(rev, region_loads)
    return cases[0] if cases else None


def stable_control(rev: pl.DataFrame, prefer: Case | None = None,
                   region_loads: Mapping[str, float] | None = None,
                   eligible: Callable[[str], bool] = engine_runnable) -> Case | None:
    """A runnable pair with the same, significant order on every source the validation replays (the
    key reversal's sources when there is one, else every source of the table; module docstring)."""
    rev = _runnable_rows(check_reversals(rev), eligible)
    if rev.height == 0:
        return None
    if prefer is not None:  # the control must not be the reversal's own pair; it is replayed on its sources
        rev = rev.filter(~((pl.col("a") == prefer.a) & (pl.col("b") == prefer.b))
                         & pl.col("source_1").is_in(list(prefer.sources)) & pl.col("source_2").is_in(list(prefer.sources)))
        all_sources = sorted(prefer.sources)
    else:
        all_sources = sorted(set(rev["source_1"].to_list()) | set(rev["source_2"].to_list()))
    if rev.height == 0:
        return None
    rev = rev.with_columns(same=(pl.col("diff_1").sign() * pl.col("diff_2").sign()) > 0)
    rev = rev.with_columns(_headline_col(rev))
    groups = (rev.group_by(["a", "b", "region", "metric"])
              .agg(ok=(pl.col("same") & pl.col("significant") & ~pl.col("reversal")).all(),
                   headline=pl.col("_headline").max(),
                   n_src=pl.col("source_1").append(pl.col("source_2")).n_unique(),
                   min_rel=pl.min_horizontal("rel_1", "rel_2").min()))
    groups = groups.filter(pl.col("ok") & (pl.col("n_src") == len(all_sources)))
    if groups.height == 0:
        return None
    if prefer is not None:
        groups = groups.with_columns(pref=(pl.col("region") == prefer.region).cast(pl.Int8)
                                     + (pl.col("metric") == prefer.metric).cast(pl.Int8))
    else:
        groups = groups.with_columns(pref=pl.lit(0, dtype=pl.Int8))
    g = groups.sort(["pref", "headline", "min_rel", "region", "metric", "a", "b"],
                    descending=[True, True, True, False, False, False, False]).row(0, named=True)
    rows = rev.filter((pl.col("a") == g["a"]) & (pl.col("b") == g["b"]) & (pl.col("region") == g["region"])
                      & (pl.col("metric") == g["metric"]))
    sides: dict[str, SideResult] = {}
    for row in rows.iter_rows(named=True):
        for k in (1, 2):
            sides.setdefault(row[f"source_{k}"], _side(row, k, True))
    return Case("control", g["a"], g["b"], g["region"], g["metric"],
                tuple(sides[s] for s in sorted(sides)), rho=(region_loads or {}).get(g["region"]),
                direction=rows["direction"][0] if "direction" in rows.columns else None,
                notes="same order, significant on every replayed source"
                      + (" (at the reversal's region and metric)" if g["pref"] == 2 else ""))


@dataclass
class Selection:
    """The cases to replay (the key reversal, the stable control, then every further
    significant-and-practical reversal of a runnable pair, most dramatic first), and what was left
    out of selection and why."""

    cases: list[Case]
    excluded: dict[str, str] = field(default_factory=dict)   # scheduler -> why vLLM cannot run it
    messages: list[str] = field(default_factory=list)

    def table(self) -> pl.DataFrame:
        """One row per (case, source): what the simulation found."""
        rows = [{"case": c.kind, "a": c.a, "b": c.b, "region": c.region, "rho": c.rho, "metric": c.metric,
                 "source": s.source, "diff_oriented": s.diff, "rel_effect": s.rel, "p_adj": s.p_adj,
                 "better": c.a if s.diff > 0 else c.b} for c in self.cases for s in c.sides]
        schema = {"case": pl.Utf8, "a": pl.Utf8, "b": pl.Utf8, "region": pl.Utf8, "rho": pl.Float64,
                  "metric": pl.Utf8, "source": pl.Utf8, "diff_oriented": pl.Float64, "rel_effect": pl.Float64,
                  "p_adj": pl.Float64, "better": pl.Utf8}
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def select_cases(rev: pl.DataFrame, region_loads: Mapping[str, float] | None = None,
                 schedulers: Sequence[str] | None = None,
                 eligible: Callable[[str], bool] = engine_runnable) -> Selection:
    """The key reversal and the stable control from a reversal table (either may be missing); the pairs
    whose two policies are ``eligible`` (default: the wall-clock engine's, :func:`engine_runnable`)."""
    rev = check_reversals(rev)
    names = sorted(set(schedulers or []) | set(rev["a"].to_list()) | set(rev["b"].to_list()))
    excluded = {n: policies.engine_policy(n).note for n in names if not eligible(n)}
    msgs = []
    revs = reversal_cases(rev, region_loads, eligible)
    key = revs[0] if revs else None
    if key is None:
        n_sp = rev.filter(pl.col("reversal") & pl.col("significant") & pl.col("practical")).height
        msgs.append(f"no significant-and-practical reversal of a pair vLLM can run ({n_sp} such reversals in "
                    "total, all involving an excluded policy)" if n_sp else
                    "the analysis found no significant-and-practical reversal")
    sp = rev.filter(pl.col("reversal") & pl.col("significant") & pl.col("practical"))
    unmeasured = sp.filter(pl.col("metric").is_in(list(UNMEASURED_METRICS)))
    if unmeasured.height:
        why = sorted({UNMEASURED_METRICS[m] for m in unmeasured["metric"].unique().to_list()})
        msgs.append(f"{unmeasured.height} significant-and-practical reversals on "
                    f"{', '.join(sorted(unmeasured['metric'].unique().to_list()))} not replayed: {'; '.join(why)}")
    ctrl = stable_control(rev, key, region_loads, eligible)
    if ctrl is None:
        msgs.append("no runnable pair keeps the same significant order on every replayed source")
    return Selection([c for c in (key, ctrl) if c is not None] + revs[1:], excluded, msgs)


def planted_reversals(sources: Sequence[str] = ("azure", "burstgpt", "bailian"),
                      region: str = "overload", metric: str = "ttft_p99") -> pl.DataFrame:
    """A small reversal table with a known answer (for tests and demonstrations).

    fcfs vs vtc reverses most (but vtc cannot run in the engine), fcfs vs srpt_oracle next (the key
    reversal), fcfs vs sjf_prompt less (a further reversal), and sjf_oracle beats random on every
    source (the stable control).
    """
    rows = []

    def add(a, b, diffs, rels, p):
        for i in range(len(sources)):
            for j in range(i + 1, len(sources)):
                d1, d2 = diffs[i], diffs[j]
                rows.append({"a": a, "b": b, "source_1": sources[i], "source_2": sources[j], "region": region,
                             "metric": metric, "direction": "lower", "diff_1": d1, "diff_2": d2,
                             "rel_1": rels[i], "rel_2": rels[j], "p_1": p, "p_2": p, "p_adj_1": p * 10,
                             "p_adj_2": p * 10, "reversal": bool(np.sign(d1) * np.sign(d2) < 0),
                             "significant": True, "practical": bool(min(rels[i], rels[j]) >= 0.05)})

    n = len(sources)
    add("fcfs", "sjf_prompt", [0.8] + [-0.5] * (n - 1), [0.30] + [0.20] * (n - 1), 1e-4)
    add("fcfs", "srpt_oracle", [1.5] + [-1.2] * (n - 1), [0.60] + [0.50] * (n - 1), 1e-5)
    add("fcfs", "vtc", [2.0] + [-1.8] * (n - 1), [0.90] + [0.80] * (n - 1), 1e-6)
    add("random", "sjf_oracle", [-0.9] * n, [0.40] * n, 1e-5)
    return pl.DataFrame(rows)
