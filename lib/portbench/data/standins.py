"""Labelled stand-ins for BurstGPT and Bailian, evidence comparisons, and counterfactual windows.

The official BurstGPT and Bailian/Qwen files are not available here (``../shared/traces/
PROVENANCE.md``). A *stand-in* is a synthetic workload built from the real evidence that is:
every stand-in window is flagged ``synthetic: True``, carries provenance ``standin`` and is shown
as e.g. "BurstGPT (stand-in)" (``sources.label``). Its results describe the stand-in, not the trace.

**BurstGPT stand-in** (generator :data:`BURSTGPT_GENERATOR`), from the mirror's real slices
(``standins.burstgpt.slices``: the first 400 rows of ``BurstGPT_1.csv`` and of ``BurstGPT_3.csv``):

* lengths and tenants: (prompt, output, model, log type) rows resampled with replacement from the
  slices' valid rows, read by the canonical BurstGPT adapter (``traces.read_file``: failures, i.e.
  0 response tokens, excluded and counted); tenant = ``"<model>/<log type>"`` as for real BurstGPT
  windows.
* arrivals: a Gamma renewal process (the BurstGPT paper's arrival model). The slices cover the
  first ~10 hours of two files at ~35 requests/hour, far below the full files' mean rates (959 and
  2,628 requests/hour for without_fails_1 and _2, from the guanxi data-quality table), so their
  rate describes a quiet night, not the trace. Their 1-second timestamp resolution adds a variance
  of 1/6 s^2 to gaps of ~100 s, negligible for the CV (``estimates`` reports the size), while at
  full-file rates it would create ties. Choice: **rate = the full-file mean rate of the configured
  official file** (``sources.burstgpt.file``; ``rate: slices`` uses the slices' rate instead).
  Windows are rescaled to target loads later, so the relative burst pattern (the CV) is what
  matters. **CV**: the raw pooled CV of the within-slice gaps (~3.7) is dominated by a few long
  gaps of the night-to-morning ramp at the start of each file: it mixes a slow rate change into
  burstiness, and a Gamma renewal process with that CV puts ~70 % of its gaps below a tenth of the
  mean, while the slices' own 200-request windows show CVs of about 1-4 (median ~2). Choice
  (``cv: window``): the CV of the gaps divided by their centred moving mean over ``windows.size``
  gaps, i.e. burstiness at the scale of one window, net of slower rate changes; it assumes the
  burst pattern per ``windows.size`` requests carries over from the slices' ~35 req/h to the full
  file's rate (no evidence at that rate is available). ``cv: pooled`` uses the raw pooled CV.
  Both come with 95 % moving-block bootstrap CIs (``bootstrap`` resamples, blocks of
  ``block_length`` gaps so bursts stay together; i.i.d. CIs are reported beside them).
* log types: the slices are Conversation-log-heavy (398/400 and 394/400) while the full files are
  API-heavy (e.g. 97.9 % API in without_fails_2). Choice: **no reweighting by default**
  (``reweight_log_types: false``): the slices hold only 8 valid API rows, so weighting them to
  the full-file share would make ~98 % of the stand-in's requests copies of 8 pairs. The stand-in
  therefore represents BurstGPT's Conversation-log traffic; :func:`evidence_tables` shows how far
  its lengths are from the full-file aggregates (which are shorter: API requests dominate them),
  and shows the reweighted variant beside it.

**Bailian stand-in** (generator :data:`BAILIAN_GENERATOR`), from ServeGen's ``language/m-small``
statistics of Bailian production (``standins.bailian.servegen_dir``): per client a
``chunk-N-trace.csv`` (2,016 windows of 600 s over 14 days: start, rate, CV, pattern, shape, scale)
and a ``chunk-N-dataset.json`` (6-hour buckets of input/output token PMFs, stored as text of a
dict, parsed with ``ast.literal_eval``). Clients without a dataset file are excluded and counted;
they include the largest clients (``estimates`` reports their share of the requests), so the
stand-in represents the traffic mix of the remaining clients.
A window starts at a time stride-sampled over the 14 days (one seeded uniform point per equal
time bucket). From there every client active in the current 600-s window (rate > 0) is a
*stationary* renewal process with that window's rate and CV; the pattern column picks the family
(Gamma: shape 1/CV^2; Weibull: shape solved for the CV). The recorded shape/scale columns are not
used: for Weibull windows the recorded shape is a separate fit whose CV differs from the
window's measured CV (``estimates`` reports by how much), and the recorded scales are not in
units of the window's rate. Clients are superposed; at each 600-s boundary the process continues
with the next window's active clients and parameters (each segment starts in equilibrium; the data
say nothing about the joins) until ``windows.size`` requests are collected. Each request's input
and output tokens are drawn independently (the data give only marginals) from its client's PMFs
of the latest non-empty 6-hour bucket at or before its 600-s window (ServeGen's own rule);
0-token bins are dropped and the PMF renormalised. Tenant = ``"client-<N>"``.

**Freezing.** :func:`build_windows` returns ``(meta, df)`` per window; ``meta["generator"]`` =
``{name, params, seed}`` with everything needed to rebuild (rate, CV, sizes, start time, client
list, evidence checksums), the per-window seed derived from ``standins.seed``, the source name and
the window index through ``numpy.random.SeedSequence``. :func:`regenerate` rebuilds a window from
that record and the evidence files, after checking their SHA-256 (``IntegrityError`` otherwise).

**Counterfactuals** (:func:`counterfactual`): ``burstiness`` (same requests and span, gaps redrawn
from a Gamma renewal process with a target CV), ``lengths`` (another source's (prompt, output)
pairs resampled into the same arrivals), ``load`` (rate x factor, pattern kept).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy import stats as sstats

from . import registry, synth, traces
from ..core.errors import DataError, IntegrityError, ParameterError, check_choice
from ..core.provenance import label

BURSTGPT_GENERATOR = "burstgpt-standin/gamma-renewal+resampled-pairs/v1"
BAILIAN_GENERATOR = "bailian-standin/servegen-superposed-renewal/v1"
COUNTERFACTUAL_KINDS = ("burstiness", "lengths", "load")
RATE_CHOICES = ("full_file", "slices")
CV_CHOICES = ("window", "pooled")
STANDIN_SOURCES = ("burstgpt", "bailian")
GUANXI_TABLE = "guanxi_table_00_data_quality.csv"
FNSTGGL_ROLLUP = "fnstggl_burstgpt1_first60k_statistical_rollups.json"
PERCENTILES = (50, 90, 95, 99)
TIMESTAMP_RESOLUTION_S = 1.0          # BurstGPT timestamps are whole seconds
SERVEGEN_TRACE_COLUMNS = ("start", "rate", "cv", "pattern", "shape", "scale")
SERVEGEN_FAMILIES = {"Gamma": "gamma", "Weibull": "weibull"}
FIGURE_PREFIX = "02_freeze_windows"


# --------------------------------------------------------------------------- parameters


def validate_params(P: Mapping) -> None:
    """Check the ``standins`` section (called by ``params.load``); raises ParameterError."""
    S = P.get("standins") or {}
    seed = S.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ParameterError("standins.seed", seed, "a non-negative integer")
    b = S.get("burstgpt") or {}
    slices = b.get("slices")
    if not isinstance(slices, list) or not slices or not all(isinstance(s, str) and s for s in slices):
        raise ParameterError("standins.burstgpt.slices", slices, "a non-empty list of paths under the mirror")
    if not isinstance(b.get("aggregates"), str):
        raise ParameterError("standins.burstgpt.aggregates", b.get("aggregates"), "a folder under the mirror")
    check_choice("standins.burstgpt.rate", b.get("rate"), RATE_CHOICES)
    check_choice("standins.burstgpt.cv", b.get("cv"), CV_CHOICES)
    if not isinstance(b.get("reweight_log_types"), bool):
        raise ParameterError("standins.burstgpt.reweight_log_types", b.get("reweight_log_types"), "true or false")
    for key, low in (("bootstrap", 100), ("block_length", 1)):
        v = b.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ParameterError(f"standins.burstgpt.{key}", v, f"an integer >= {low}")
    c = S.get("bailian") or {}
    for key in ("servegen_dir", "qwen_rows"):
        if not isinstance(c.get(key), str) or not c.get(key):
            raise ParameterError(f"standins.bailian.{key}", c.get(key), "a path under the mirror")
    cf = S.get("counterfactual") or {}
    cv = cf.get("burstiness_cv")
    if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not (cv > 0 and math.isfinite(cv)):
        raise ParameterError("standins.counterfactual.burstiness_cv", cv, "a positive number")
    cs = cf.get("seed")
    if isinstance(cs, bool) or not isinstance(cs, int) or cs < 0:
        raise ParameterError("standins.counterfactual.seed", cs, "a non-negative integer")


def mirror(P: Mapping | None = None) -> Path:
    """The data mirror holding the evidence (``registry.resolve_mirror``); DataError when absent."""
    from ..core import config as params_mod
    from . import registry

    P = P if P is not None else params_mod.load()
    root = registry.resolve_mirror(P)
    if root is None or not Path(root).is_dir():
        raise DataError(str(root or "data mirror"), "the data mirror with the stand-in evidence was not found "
                        "(set paths.mirror or $PORTBENCH_DATA_MIRROR)")
    return Path(root)


# --------------------------------------------------------------------------- checksums


def _evidence_digest(root: Path, rel: str, P: Mapping | None = None) -> str:
    """SHA-256 of one evidence file, or (``rel`` ending in ``/``) of a folder (``registry.tree_sha256``)."""
    p = root / rel.rstrip("/")
    if rel.endswith("/"):
        if not p.is_dir():
            raise DataError(p, "evidence folder not found")
        return registry.tree_sha256(p, P)
    if not p.is_file():
        raise DataError(p, "evidence file not found")
    return registry.sha256_of(p, P)


def _evidence_names(P: Mapping, source: str) -> list[str]:
    S = P["standins"]
    if source == "burstgpt":
        b = S["burstgpt"]
        return [*b["slices"], f"{b['aggregates'].rstrip('/')}/{GUANXI_TABLE}"]
    if source == "bailian":
        return [S["bailian"]["servegen_dir"].rstrip("/") + "/"]
    raise ParameterError("source", source, "a source with a stand-in: " + ", ".join(STANDIN_SOURCES))


def evidence_sha256(P: Mapping, source: str) -> dict[str, str]:
    """``{relative path: sha256}`` of a stand-in's evidence (a folder ends with ``/``)."""
    root = mirror(P)
    return {rel: _evidence_digest(root, rel, P) for rel in _evidence_names(P, source)}


def verify_evidence(root: Path, recorded: Mapping[str, str], P: Mapping | None = None) -> None:
    """IntegrityError naming the first evidence file whose SHA-256 differs from ``recorded``."""
    for rel, want in recorded.items():
        try:
            got = _evidence_digest(root, rel, P)
        except DataError as e:
            raise IntegrityError(f"stand-in evidence {rel}: {e.problem} under {root}") from None
        if got != want:
            raise IntegrityError(f"stand-in evidence {rel} under {root}: sha256 {got}, but the window "
                                 f"was generated from {want}")


def window_seed(P: Mapping, source: str, index: int) -> int:
    """Per-window seed: ``SeedSequence([standins.seed, key(source), index])`` (53 bits)."""
    return synth.derive_seed(P["standins"]["seed"], source, int(index))


# --------------------------------------------------------------------------- BurstGPT evidence


def read_burstgpt_slice(path: Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Valid rows of a BurstGPT CSV slice through the canonical reader (``traces.read_file``):
    ``row, timestamp_s, prompt_tokens, output_tokens, model, log_type``, and counts of the rows it
    excludes (failures: 0 response tokens)."""
    df, report = traces.read_file(path, "burstgpt")
    out = df.select(pl.col("row").cast(pl.Int64), pl.col("arrival_s").alias("timestamp_s").cast(pl.Float64),
                    pl.col("prompt_tokens").cast(pl.Int64), pl.col("output_tokens").cast(pl.Int64),
                    pl.col("model").cast(pl.String), pl.col("log_type").cast(pl.String)).sort("row")
    excluded = {str(k): int(v) for k, v in report["excluded"].items()}
    return out, {"rows": int(report["rows_read"]), "valid": out.height,
                 "excluded": sum(excluded.values()), "excluded_by_reason": excluded}


@dataclass
class BurstGPTEvidence:
    """The real BurstGPT rows and aggregates a stand-in is built from."""

    slices: list[str]                       # relative paths under the mirror, in pool order
    pool: pl.DataFrame                      # slice, row, timestamp_s, prompt/output_tokens, model, log_type, tenant
    gaps: list[np.ndarray]                  # gaps between consecutive valid requests, per slice
    counts: dict[str, dict[str, Any]]       # per slice: rows, valid, excluded
    full_files: list[dict[str, Any]]        # guanxi data-quality table, one entry per full file
    rollup: dict[str, Any] | None = None    # fnstggl first-60k rollups (comparison only)


_CACHE: dict[Any, Any] = {}


def _burstgpt_pool(root: Path, slices: Sequence[str]) -> tuple[pl.DataFrame, list[np.ndarray], dict]:
    frames, gaps, counts = [], [], {}
    for rel in slices:
        df, report = read_burstgpt_slice(root / rel)
        frames.append(df.with_columns(pl.lit(rel).alias("slice")))
        gaps.append(np.diff(df["timestamp_s"].to_numpy().astype(np.float64)))
        counts[rel] = report
    pool = pl.concat(frames).select(
        "slice", "row", "timestamp_s", "prompt_tokens", "output_tokens", "model", "log_type",
        (pl.col("model").fill_null("unknown") + "/" + pl.col("log_type").fill_null("unknown")).alias("tenant"))
    return pool, gaps, counts


def read_full_file_table(path: Path) -> list[dict[str, Any]]:
    """The guanxi data-quality table: per full BurstGPT file ``file_id, rows, days,
    requests_per_hour, model_counts, log_type_counts`` (rows without rates are skipped)."""
    if not path.is_file():
        raise DataError(path, "BurstGPT aggregate table not found")
    raw = pl.read_csv(path, infer_schema=False)
    need = ("file_id", "raw_rows", "duration_days_inclusive", "mean_raw_requests_per_hour",
            "model_frequencies", "log_type_frequencies")
    missing = [c for c in need if c not in raw.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}")
    rows = []
    for i, r in enumerate(raw.iter_rows(named=True), start=1):
        if not r["mean_raw_requests_per_hour"]:
            continue  # the failure-audit row carries no rates
        try:
            rows.append({"file_id": r["file_id"], "rows": int(float(r["raw_rows"])),
                         "days": float(r["duration_days_inclusive"]),
                         "requests_per_hour": float(r["mean_raw_requests_per_hour"]),
                         "model_counts": {k: int(v) for k, v in json.loads(r["model_frequencies"]).items()},
                         "log_type_counts": {k: int(v) for k, v in json.loads(r["log_type_frequencies"]).items()}})
        except (ValueError, TypeError, AttributeError) as e:
            raise DataError(path, f"unparsable aggregate ({e})", row=i) from None
    if not rows:
        raise DataError(path, "no file rows with rates")
    return rows


def _rollup_desc(ev: BurstGPTEvidence) -> str:
    n = int(ev.rollup["numeric_distributions"]["input_tokens"]["count"]) if ev.rollup else 0
    return f"BurstGPT_1 first {n:,} rows"


def read_rollup(path: Path) -> dict[str, Any]:
    """The fnstggl rollup of BurstGPT_1's first rows (token quantiles, subgroup counts)."""
    if not path.is_file():
        raise DataError(path, "BurstGPT rollup not found")
    try:
        data = json.loads(path.read_text())
        data["numeric_distributions"]["input_tokens"]["p50"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(path, f"not the expected rollup JSON ({e})") from None
    return data


def burstgpt_evidence(P: Mapping) -> BurstGPTEvidence:
    """Read (once per process) the slices and aggregates named in ``standins.burstgpt``."""
    root = mirror(P)
    b = P["standins"]["burstgpt"]
    agg = root / b["aggregates"]
    key = ("burstgpt", str(root), tuple(b["slices"]), b["aggregates"],
           tuple(_evidence_digest(root, rel, P) for rel in b["slices"]))
    if key not in _CACHE:
        pool, gaps, counts = _burstgpt_pool(root, b["slices"])
        rollup = read_rollup(agg / FNSTGGL_ROLLUP) if (agg / FNSTGGL_ROLLUP).is_file() else None
        _CACHE[key] = BurstGPTEvidence(list(b["slices"]), pool, gaps, counts,
                                       read_full_file_table(agg / GUANXI_TABLE), rollup)
    return _CACHE[key]


def full_file_id(official_file: str | None) -> str:
    """The aggregate table's id of an official BurstGPT file: ``BurstGPT_2.csv`` -> ``without_fails_2``."""
    m = re.search(r"_(\d+)\.csv$", official_file or "")
    if not m:
        raise ParameterError("sources.burstgpt.file", official_file,
                             "a BurstGPT file name like BurstGPT_without_fails_2.csv")
    return f"without_fails_{m.group(1)}"


def _full_file_row(ev: BurstGPTEvidence, file_id: str) -> dict[str, Any]:
    rows = [r for r in ev.full_files if r["file_id"] == file_id]
    if len(rows) != 1:
        raise DataError(GUANXI_TABLE, f"no aggregate row for {file_id} (have {[r['file_id'] for r in ev.full_files]})")
    return rows[0]


def _pooled_rate_cv(gaps: Sequence[np.ndarray]) -> tuple[float, float]:
    g = np.concatenate(gaps)
    return float(g.size / g.sum()), float(g.std() / g.mean())


def window_normalised_gaps(gaps: np.ndarray, span: int) -> np.ndarray:
    """Each gap divided by the centred moving mean of the ``span`` gaps around it (fewer at the
    ends): rate changes slower than ``span`` requests are removed, burstiness inside them kept."""
    g = np.asarray(gaps, dtype=np.float64)
    h = max(int(span) // 2, 1)
    c = np.concatenate([[0.0], np.cumsum(g)])
    i = np.arange(g.size)
    lo, hi = np.maximum(i - h, 0), np.minimum(i + h + 1, g.size)
    local = (c[hi] - c[lo]) / (hi - lo)
    return np.divide(g, local, out=np.zeros_like(g), where=local > 0)


def _block_resample(g: np.ndarray, block: int, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """``n_boot`` moving-block resamples of ``g`` (rows), each of ``len(g)`` values."""
    n = g.size
    b = min(block, n)
    n_blocks = -(-n // b)
    starts = rng.integers(0, n - b + 1, size=(n_boot, n_blocks))
    idx = (starts[:, :, None] + np.arange(b)[None, None, :]).reshape(n_boot, -1)[:, :n]
    return g[idx]


def _bootstrap_ci(series: Sequence[np.ndarray], stat, *, n_boot: int, block: int,
                  rng: np.random.Generator) -> list[float]:
    pooled = np.concatenate([_block_resample(g, block, rng, n_boot) for g in series], axis=1)
    return [float(v) for v in np.percentile(stat(pooled), [2.5, 97.5])]


def fit_gamma_arrivals(gaps: Sequence[np.ndarray], *, n_boot: int, block: int, span: int,
                       rng: np.random.Generator) -> dict[str, Any]:
    """Rate and CV of within-slice gaps with moving-block (and i.i.d.) bootstrap 95 % CIs.

    ``cv_pooled``: CV of the raw pooled gaps. ``cv_window``: CV of the gaps normalised by their
    ``span``-gap moving mean (:func:`window_normalised_gaps`), i.e. burstiness at a window's scale.
    """
    rate, cv = _pooled_rate_cv(gaps)
    norm = [window_normalised_gaps(g, span) for g in gaps]
    cv_w = float(np.concatenate(norm).std() / np.concatenate(norm).mean())
    out: dict[str, Any] = {"rate_rps": rate, "cv_pooled": cv, "cv_window": cv_w, "cv_window_span_gaps": int(span),
                           "n_gaps": int(sum(g.size for g in gaps))}

    def rate_of(x: np.ndarray) -> np.ndarray:
        return x.shape[1] / x.sum(axis=1)

    def cv_of(x: np.ndarray) -> np.ndarray:
        return x.std(axis=1) / x.mean(axis=1)

    for suffix, b in (("", block), ("_iid", 1)):
        out[f"rate_ci{suffix}"] = _bootstrap_ci(gaps, rate_of, n_boot=n_boot, block=b, rng=rng)
        out[f"cv_pooled_ci{suffix}"] = _bootstrap_ci(gaps, cv_of, n_boot=n_boot, block=b, rng=rng)
        out[f"cv_window_ci{suffix}"] = _bootstrap_ci(norm, cv_of, n_boot=n_boot, block=b, rng=rng)
    return out


def burstgpt_arrival_estimates(P: Mapping, *, bootstrap: bool = True) -> dict[str, Any]:
    """The BurstGPT arrival estimates and the rate/CV the stand-in uses (see the module docstring)."""
    ev = burstgpt_evidence(P)
    b = P["standins"]["burstgpt"]
    span = int(P["windows"]["size"])
    official = (P.get("sources") or {}).get("burstgpt", {}).get("file")
    key = ("burstgpt-fit", id(ev), b["bootstrap"], b["block_length"], P["standins"]["seed"], bootstrap,
           b["rate"], b["cv"], span, official)
    if key in _CACHE:
        return _CACHE[key]
    if bootstrap:
        fit = fit_gamma_arrivals(ev.gaps, n_boot=b["bootstrap"], block=b["block_length"], span=span,
                                 rng=synth.rng_from(P["standins"]["seed"], "burstgpt", "bootstrap"))
    else:
        rate, cv = _pooled_rate_cv(ev.gaps)
        norm = np.concatenate([window_normalised_gaps(g, span) for g in ev.gaps])
        fit = {"rate_rps": rate, "cv_pooled": cv, "cv_window": float(norm.std() / norm.mean()),
               "cv_window_span_gaps": span, "n_gaps": int(sum(g.size for g in ev.gaps))}
    all_gaps = np.concatenate(ev.gaps)
    var = float(all_gaps.var())
    quant_var = 2 * TIMESTAMP_RESOLUTION_S ** 2 / 12   # two independently rounded timestamps
    real_cv = [synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in real_burstgpt_windows(P, span)]
    fit.update({
        "per_slice": {rel: {"rate_rps": float(g.size / g.sum()), "cv_pooled": float(g.std() / g.mean()),
                            "cv_window": float(np.std(window_normalised_gaps(g, span))
                                               / np.mean(window_normalised_gaps(g, span))),
                            "n_gaps": int(g.size), "zero_gaps": int((g == 0).sum()),
                            "median_gap_over_mean": float(np.median(g) / g.mean())}
                      for rel, g in zip(ev.slices, ev.gaps)},
        "real_window_cv": {"windows": len(real_cv), "overlapping": True, "size": span,
                           "median": float(np.median(real_cv)) if real_cv else None,
                           "min": float(np.min(real_cv)) if real_cv else None,
                           "max": float(np.max(real_cv)) if real_cv else None},
        "zero_gaps": int((all_gaps == 0).sum()),
        "timestamp_resolution_s": TIMESTAMP_RESOLUTION_S,
        "resolution_cv_relative_effect": float(math.sqrt(max(var - quant_var, 0.0) / var) - 1.0) if var > 0 else 0.0,
        "rate_rph_slices": fit["rate_rps"] * 3600.0,
        "full_file_rates_rph": {r["file_id"]: r["requests_per_hour"] for r in ev.full_files},
    })
    fid = full_file_id(official)
    full_rate = _full_file_row(ev, fid)["requests_per_hour"] / 3600.0
    fit["rate_choice"] = b["rate"]
    fit["rate_file"] = fid
    fit["rate_rps_full_file"] = full_rate
    fit["rate_rps_used"] = full_rate if b["rate"] == "full_file" else fit["rate_rps"]
    fit["cv_choice"] = b["cv"]
    fit["cv_used"] = fit["cv_window"] if b["cv"] == "window" else fit["cv_pooled"]
    fit["slices_vs_full_file_rate_ratio"] = fit["rate_rps"] / full_rate
    _CACHE[key] = fit
    return fit


def log_type_shares(P: Mapping) -> dict[str, dict[str, float]]:
    """Log-type shares of the slices' valid rows and of the configured full file."""
    ev = burstgpt_evidence(P)
    counts = ev.pool.group_by("log_type").len().sort("log_type")
    n = counts["len"].sum()
    slices = {r["log_type"]: r["len"] / n for r in counts.iter_rows(named=True)}
    fid = full_file_id((P.get("sources") or {}).get("burstgpt", {}).get("file"))
    full = _full_file_row(ev, fid)["log_type_counts"]
    tot = sum(full.values())
    return {"slices": slices, "full_file": {k: v / tot for k, v in sorted(full.items())}, "full_file_id": fid}


def _log_type_weights(P: Mapping, reweight: bool) -> dict[str, float] | None:
    """Per-log-type row weight making the pool's log-type shares equal the full file's (or None)."""
    if not reweight:
        return None
    shares = log_type_shares(P)
    missing = [k for k, v in shares["full_file"].items() if v > 0 and k not in shares["slices"]]
    if missing:
        raise DataError("burstgpt slices", f"no valid rows of log type(s) {missing} to reweight toward")
    return {k: shares["full_file"].get(k, 0.0) / v for k, v in shares["slices"].items()}


def _row_weights(pool: pl.DataFrame, weights: Mapping[str, float] | None) -> np.ndarray | None:
    if weights is None:
        return None
    missing = set(pool["log_type"].unique().to_list()) - set(weights)
    if missing:
        raise DataError("burstgpt slices", f"no weight recorded for log type(s) {sorted(missing)}")
    return pool["log_type"].replace_strict(dict(weights), return_dtype=pl.Float64).to_numpy()


def _burstgpt_params(P: Mapping, size: int, reweight: bool | None = None) -> dict[str, Any]:
    ev = burstgpt_evidence(P)
    fit = burstgpt_arrival_estimates(P, bootstrap=False)
    b = P["standins"]["burstgpt"]
    reweight = b["reweight_log_types"] if reweight is None else reweight
    return {
        "size": int(size),
        "evidence": evidence_sha256(P, "burstgpt"),
        "slices": list(ev.slices),
        "pairs": {"n": ev.pool.height, "rule": "valid rows (Response tokens > 0, Request tokens > 0) of the "
                  "slices, in slice and file order; drawn with replacement",
                  "log_type_weights": _log_type_weights(P, reweight)},
        "arrivals": {"family": "gamma", "rate_rps": fit["rate_rps_used"], "cv": fit["cv_used"],
                     "rate_basis": (f"full-file mean rate of {fit['rate_file']}" if fit["rate_choice"] == "full_file"
                                    else "pooled within-slice gaps"),
                     "cv_basis": (f"within-slice gaps over their {fit['cv_window_span_gaps']}-gap moving mean"
                                  if fit["cv_choice"] == "window" else "pooled within-slice gaps")},
        "tenant": "<model>/<log type> of the resampled row",
    }


def _burstgpt_window(pool: pl.DataFrame, params: Mapping[str, Any], seed: int) -> pl.DataFrame:
    size = int(params["size"])
    rng = synth.rng_from(seed)
    process = synth.Renewal("gamma", params["arrivals"]["rate_rps"], params["arrivals"]["cv"])
    arrival = synth.renewal_window(process, size, rng)
    idx = synth.resample_pairs(pool.height, size, rng, _row_weights(pool, params["pairs"]["log_type_weights"]))
    rows = pool[idx]
    return synth.window_frame(arrival, rows["prompt_tokens"].to_numpy(), rows["output_tokens"].to_numpy(),
                              rows["tenant"].to_list())


# --------------------------------------------------------------------------- ServeGen (Bailian)


@dataclass
class ServeGenData:
    """Parsed ServeGen client statistics of one folder (e.g. ``language/m-small``)."""

    folder: Path
    digest: str
    trace_clients: tuple[int, ...]          # every client with a trace file
    clients: tuple[int, ...]                # clients with both files (used), ascending
    excluded: tuple[int, ...]               # clients with a trace file but no dataset file
    window_s: int
    starts: np.ndarray                      # window starts (s), shared by all clients
    rate: np.ndarray                        # (len(trace_clients), n_windows) req/s
    cv: np.ndarray
    pattern: np.ndarray                     # "" / "Gamma" / "Weibull"
    shape: np.ndarray                       # recorded shape (not used for generation)
    bucket_starts: dict[int, np.ndarray]    # per used client: starts of non-empty 6-h buckets
    bucket_s: int
    _raw: dict[int, dict[int, tuple[str, str]]] = field(repr=False, default_factory=dict)
    _pmfs: dict[tuple[int, int, str], synth.EmpiricalPMF] = field(repr=False, default_factory=dict)

    @property
    def n_windows(self) -> int:
        return int(self.starts.size)

    def row_of(self, client: int) -> int:
        """Row of ``client`` in the per-client arrays."""
        return self.trace_clients.index(client)

    def used_rows(self) -> np.ndarray:
        """Rows of the used clients (those with a dataset), in ``clients`` order."""
        return np.array([self.row_of(c) for c in self.clients], dtype=np.int64)

    def bucket_for(self, client: int, t: float) -> int:
        """Start of the latest non-empty 6-h bucket at or before the 600-s window holding ``t``
        (ServeGen's rule); the earliest non-empty bucket when none precedes it."""
        b = self.bucket_starts[client]
        w0 = (int(t // self.window_s)) * self.window_s
        i = int(np.searchsorted(b, w0, side="right")) - 1
        return int(b[max(i, 0)])

    def pmf(self, client: int, bucket: int, what: str) -> synth.EmpiricalPMF:
        """The ``input_tokens`` / ``output_tokens`` PMF of a client's bucket (parsed on first use)."""
        key = (client, bucket, what)
        if key not in self._pmfs:
            text = self._raw[client][bucket][0 if what == "input_tokens" else 1]
            where = f"{self.folder / f'chunk-{client}-dataset.json'} bucket {bucket} {what}"
            pmf = synth.EmpiricalPMF.parse(text, where)
            if pmf is None:
                raise DataError(where, "empty PMF in a bucket listed as non-empty")
            self._pmfs[key] = pmf
        return self._pmfs[key]


def _client_id(name: str, suffix: str) -> int | None:
    m = re.fullmatch(r"chunk-(\d+)-" + re.escape(suffix), name)
    return int(m.group(1)) if m else None


def _read_servegen_trace(path: Path) -> pl.DataFrame:
    schema = dict(zip(SERVEGEN_TRACE_COLUMNS, (pl.Int64, pl.Float64, pl.Float64, pl.String, pl.Float64, pl.Float64)))
    try:
        df = pl.read_csv(path, has_header=False, schema=schema)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(path, f"not a 6-column ServeGen trace (start, rate, cv, pattern, shape, scale): {e}") from None
    df = df.with_columns(pl.col("pattern").fill_null(""))
    for col in ("start", "rate", "cv"):
        if df[col].null_count():
            row = int(np.nonzero(df[col].is_null().to_numpy())[0][0]) + 1
            raise DataError(path, "missing value", row=row, column=col)
    bad = ~df["pattern"].is_in(["", *SERVEGEN_FAMILIES])
    if bad.any():
        row = int(np.nonzero(bad.to_numpy())[0][0]) + 1
        raise DataError(path, f"unknown pattern {df['pattern'][row - 1]!r} (expected Gamma, Weibull or empty)",
                        row=row, column="pattern")
    rate, cv, pat = df["rate"].to_numpy(), df["cv"].to_numpy(), df["pattern"].to_numpy()
    checks = ((rate < 0, "rate", "negative rate"),
              ((rate > 0) & (pat == ""), "pattern", "active window (rate > 0) without an arrival pattern"),
              ((rate == 0) & (pat != ""), "pattern", "idle window (rate 0) with an arrival pattern"),
              ((rate > 0) & ~(cv > 0), "cv", "active window without a positive CV"))
    for mask, col, problem in checks:
        if mask.any():
            raise DataError(path, problem, row=int(np.nonzero(mask)[0][0]) + 1, column=col)
    return df


def load_servegen(folder: str | Path) -> ServeGenData:
    """Parse a ServeGen client folder once per process (PMF texts are parsed lazily, on first use)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(folder, "ServeGen folder not found")
    digest = registry.tree_sha256(folder)
    key = ("servegen", str(folder.resolve()), digest)
    if key in _CACHE:
        return _CACHE[key]
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    trace_ids = sorted(i for i in (_client_id(n, "trace.csv") for n in names) if i is not None)
    data_ids = sorted(i for i in (_client_id(n, "dataset.json") for n in names) if i is not None)
    orphans = sorted(set(data_ids) - set(trace_ids))
    if orphans:
        raise DataError(folder, f"dataset file(s) without a trace file for client(s) {orphans}")
    if not trace_ids:
        raise DataError(folder, "no chunk-N-trace.csv files")
    frames = {i: _read_servegen_trace(folder / f"chunk-{i}-trace.csv") for i in trace_ids}
    ref = frames[trace_ids[0]]["start"].to_numpy()
    window_s = int(ref[1] - ref[0]) if ref.size > 1 else 0
    if ref.size < 2 or ref[0] != 0 or np.any(np.diff(ref) != window_s):
        raise DataError(folder / f"chunk-{trace_ids[0]}-trace.csv", "window starts are not 0, w, 2w, ...",
                        column="start")
    for i, df in frames.items():
        if not np.array_equal(df["start"].to_numpy(), ref):
            raise DataError(folder / f"chunk-{i}-trace.csv", "window starts differ from the other clients'",
                            column="start")
    raw: dict[int, dict[int, tuple[str, str]]] = {}
    buckets: dict[int, np.ndarray] = {}
    bucket_s = 0
    for i in data_ids:
        path = folder / f"chunk-{i}-dataset.json"
        try:
            obj = json.loads(path.read_text())
        except (ValueError, OSError) as e:
            raise DataError(path, f"not valid JSON ({e})") from None
        entries: dict[int, tuple[str, str]] = {}
        for ts, fields in obj.items():
            if not (isinstance(fields, dict) and isinstance(fields.get("input_tokens"), str)
                    and isinstance(fields.get("output_tokens"), str)):
                raise DataError(path, f"bucket {ts}: expected text PMFs of input_tokens and output_tokens")
            try:
                entries[int(ts)] = (fields["input_tokens"], fields["output_tokens"])
            except ValueError:
                raise DataError(path, f"bucket key {ts!r} is not an integer time") from None
        starts = np.array(sorted(entries), dtype=np.int64)
        if starts.size > 1:
            bucket_s = bucket_s or int(starts[1] - starts[0])
        nonempty = np.array([t for t in starts if entries[t][0].strip() != "{}" and entries[t][1].strip() != "{}"],
                            dtype=np.int64)
        if nonempty.size == 0:
            raise DataError(path, "every bucket's PMF is empty")
        raw[i], buckets[i] = entries, nonempty
    data = ServeGenData(
        folder=folder, digest=digest, trace_clients=tuple(trace_ids), clients=tuple(data_ids),
        excluded=tuple(sorted(set(trace_ids) - set(data_ids))), window_s=window_s, starts=ref,
        rate=np.stack([frames[i]["rate"].to_numpy() for i in trace_ids]),
        cv=np.stack([frames[i]["cv"].to_numpy() for i in trace_ids]),
        pattern=np.stack([frames[i]["pattern"].to_numpy().astype(str) for i in trace_ids]),
        shape=np.stack([frames[i]["shape"].fill_null(np.nan).to_numpy() for i in trace_ids]),
        bucket_starts=buckets, bucket_s=bucket_s, _raw=raw)
    _CACHE[key] = data
    return data


def _process(data: ServeGenData, row: int, w: int) -> synth.Renewal:
    family = SERVEGEN_FAMILIES[str(data.pattern[row, w])]
    return synth.Renewal(family, float(data.rate[row, w]), float(data.cv[row, w]))


def _bailian_window(data: ServeGenData, params: Mapping[str, Any], seed: int
                    ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """One Bailian stand-in window and facts about it (first arrival, segments, active clients)."""
    size = int(params["size"])
    clients = [int(c) for c in params["clients"]]
    rows = np.array([data.row_of(c) for c in clients], dtype=np.int64)
    rng_arr, rng_len = synth.rng_from(seed, "arrivals"), synth.rng_from(seed, "lengths")
    t = float(params["start_s"])
    w = int(t // data.window_s)
    need, times, who, first_active = size, [], [], None
    while need > 0:
        if w >= data.n_windows:
            raise DataError(data.folder, f"only {size - need} requests between {params['start_s']} s and the end "
                            f"of the trace; a window needs {size}")
        seg_end = float(data.starts[w] + data.window_s)
        active = np.nonzero(data.rate[rows, w] > 0)[0]
        if first_active is None:
            first_active = int(active.size)
        streams = [synth.renewal_interval(_process(data, int(rows[a]), w), t, seg_end, rng_arr, max_n=need)
                   for a in active]
        seg_t, which = synth.superpose(streams)
        take = min(need, seg_t.size)
        times.append(seg_t[:take])
        who.append(active[which[:take]])
        need -= take
        t, w = seg_end, w + 1
    arrival = np.concatenate(times)
    client_of = np.array(clients, dtype=np.int64)[np.concatenate(who)]
    prompt = np.empty(size, dtype=np.int64)
    output = np.empty(size, dtype=np.int64)
    bucket_of = np.array([data.bucket_for(int(c), float(x)) for c, x in zip(client_of, arrival)], dtype=np.int64)
    for c, bkt in sorted(set(zip(client_of.tolist(), bucket_of.tolist()))):
        sel = np.nonzero((client_of == c) & (bucket_of == bkt))[0]
        prompt[sel] = data.pmf(c, bkt, "input_tokens").sample(sel.size, rng_len)
        output[sel] = data.pmf(c, bkt, "output_tokens").sample(sel.size, rng_len)
    df = synth.window_frame(arrival, prompt, output, [f"client-{c}" for c in client_of])
    info = {"t_first_s": float(arrival[0]), "segments": len(times), "active_clients_at_start": first_active,
            "tenants": int(np.unique(client_of).size),
            "pmfs": sorted({(int(c), int(b)) for c, b in zip(client_of, bucket_of)})}
    return df, info


def servegen_folder(P: Mapping) -> Path:
    """The ServeGen folder of the Bailian stand-in."""
    return mirror(P) / P["standins"]["bailian"]["servegen_dir"]


def _bailian_params(P: Mapping, data: ServeGenData, size: int, start_s: float, index: int, n: int) -> dict:
    total = data.n_windows * data.window_s
    return {
        "size": int(size),
        "evidence": evidence_sha256(P, "bailian"),
        "servegen_dir": P["standins"]["bailian"]["servegen_dir"],
        "clients": list(data.clients),
        "excluded_clients": list(data.excluded),
        "start_s": float(start_s),
        "placement": {"bucket": int(index), "buckets": int(n), "span_s": [0.0, float(total)],
                      "rule": "uniform point in equal time bucket k of the trace span"},
        "window_s": data.window_s, "bucket_s": data.bucket_s,
        "arrivals": "per client and 600-s window: stationary renewal process (pattern Gamma -> gamma, "
                    "Weibull -> weibull) with the window's rate and CV; clients superposed",
        "lengths": "input and output tokens drawn independently from the client's PMFs of the latest "
                   "non-empty 6-h bucket at or before the arrival's window; 0-token bins dropped",
        "tenant": "client-<N>",
    }


def _bailian_start(data: ServeGenData, seed: int, index: int, n: int) -> float:
    total = data.n_windows * data.window_s
    lo, hi = index * total / n, (index + 1) * total / n
    return float(lo + synth.rng_from(seed, "placement").random() * (hi - lo))


# --------------------------------------------------------------------------- building and regenerating


def build_windows(P: Mapping, source: str, n_windows: int, size: int) -> list[tuple[dict, pl.DataFrame]]:
    """``n_windows`` stand-in windows of ``size`` requests: ``[(meta, df)]`` (see the module docstring)."""
    check_choice("source", source, STANDIN_SOURCES)
    for name, v in (("n_windows", n_windows), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ParameterError(name, v, "a positive integer")
    out = []
    if source == "burstgpt":
        ev = burstgpt_evidence(P)
        params = _burstgpt_params(P, size)
        for k in range(n_windows):
            seed = window_seed(P, source, k)
            df = _burstgpt_window(ev.pool, params, seed)
            out.append((_meta(BURSTGPT_GENERATOR, params, seed, t_start=0.0,
                              file=_common_folder(params["slices"]),
                              extra={"time_axis": "none: stationary renewal process, t_start is 0"}), df))
        return out
    data = load_servegen(servegen_folder(P))
    for k in range(n_windows):
        seed = window_seed(P, source, k)
        params = _bailian_params(P, data, size, _bailian_start(data, seed, k, n_windows), k, n_windows)
        df, info = _bailian_window(data, params, seed)
        out.append((_meta(BAILIAN_GENERATOR, params, seed, t_start=info["t_first_s"],
                          file=params["servegen_dir"].rstrip("/") + "/",
                          extra={"time_axis": "seconds from the start of the 14-day ServeGen trace",
                                 "active_clients_at_start": info["active_clients_at_start"],
                                 "tenants": info["tenants"], "segments_600s": info["segments"]}), df))
    return out


def _common_folder(paths: Sequence[str]) -> str:
    parents = {Path(p).parent.as_posix() for p in paths}
    return (parents.pop() + "/") if len(parents) == 1 else ", ".join(paths)


def _meta(name: str, params: Mapping, seed: int, *, t_start: float, file: str, extra: Mapping) -> dict:
    return {"generator": synth.generator_record(name, params, seed), "t_start": float(t_start), "file": file,
            "synthetic": True, "evidence_sha256": dict(params["evidence"]), "row_start": None, "row_end": None,
            **extra}


def regenerate(window_entry: Mapping, P: Mapping | None = None) -> pl.DataFrame:
    """Rebuild a frozen stand-in window from its ``generator`` record and the evidence files.

    The evidence checksums are verified first and, when the entry has a ``sha256``, so is the
    rebuilt table (IntegrityError on any mismatch). ``P`` locates the data mirror (default params).
    """
    gen = window_entry.get("generator")
    if not isinstance(gen, Mapping) or not {"name", "params", "seed"} <= set(gen):
        raise DataError(window_entry.get("id", "window"), "stand-in entry has no generator {name, params, seed}")
    name, params, seed = gen["name"], gen["params"], int(gen["seed"])
    root = mirror(P)
    verify_evidence(root, params["evidence"], P)
    if name == BURSTGPT_GENERATOR:
        key = ("pool", str(root), tuple(params["slices"]), tuple(sorted(params["evidence"].items())))
        if key not in _CACHE:  # keyed by the verified checksums, so a cached pool is the evidence's
            _CACHE[key] = _burstgpt_pool(root, params["slices"])[0]
        pool = _CACHE[key]
        if pool.height != params["pairs"]["n"]:
            raise IntegrityError(f"BurstGPT stand-in: {pool.height} valid pairs in the slices, "
                                 f"the generator recorded {params['pairs']['n']}")
        df = _burstgpt_window(pool, params, seed)
    elif name == BAILIAN_GENERATOR:
        data = load_servegen(root / params["servegen_dir"])
        if list(data.clients) != [int(c) for c in params["clients"]]:
            raise IntegrityError(f"Bailian stand-in: ServeGen clients {list(data.clients)} differ from the "
                                 f"recorded {params['clients']}")
        df, _ = _bailian_window(data, params, seed)
    else:
        raise DataError(window_entry.get("id", "window"), f"unknown stand-in generator {name!r}")
    want = window_entry.get("sha256")
    if want:
        from .windows import window_sha256  # windows imports this module: imported here, not at the top

        got = window_sha256(df)
        if got != want:
            raise IntegrityError(f"stand-in window {window_entry.get('id', '?')}: regenerated sha256 {got} differs "
                                 f"from the frozen {want} (generator code or numpy changed?)")
    return df


# --------------------------------------------------------------------------- counterfactuals


def _pairs_sha256(pairs: pl.DataFrame) -> str:
    h = hashlib.sha256()
    for c in ("prompt_tokens", "output_tokens"):
        h.update(np.ascontiguousarray(pairs[c].to_numpy(), dtype="<i8").tobytes())
    return h.hexdigest()


def counterfactual(window_df: pl.DataFrame, kind: str, *, seed: int, window_id: str | None = None,
                   **params: Any) -> tuple[pl.DataFrame, dict[str, Any]]:
    """A variant of a window changing one property; returns ``(df, definition)``.

    * ``burstiness`` (``cv``, optional ``family`` gamma|weibull): the same requests in the same order
      over the same span (so the same mean rate); the gaps are redrawn from a renewal process with
      the target CV and scaled to sum to the original span. The target is the process CV: the
      sample CV of a 200-request window scatters around it and, for heavy-tailed gaps, below it
      (``definition["after"]`` records the achieved value).
    * ``lengths`` (``pairs``: DataFrame with ``prompt_tokens``, ``output_tokens``; optional
      ``label``): arrivals and tenants kept, (prompt, output) pairs resampled with replacement.
    * ``load`` (``factor`` > 0): arrival times divided by ``factor`` (rate x factor, pattern kept).

    ``definition`` = ``{kind, params (JSON-serialisable), seed, window_id, before, after}``.
    """
    check_choice("kind", kind, COUNTERFACTUAL_KINDS)
    df = window_df.select(list(synth.WINDOW_SCHEMA))
    arr = df["arrival_s"].to_numpy().astype(np.float64)
    rng = synth.rng_from(seed, "counterfactual", kind)
    if kind == "burstiness":
        cv, family = params.get("cv"), params.get("family", "gamma")
        check_choice("family", family, ("gamma", "weibull"))
        if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not (cv > 0 and math.isfinite(cv)):
            raise ParameterError("cv", cv, "a positive target coefficient of variation")
        span = float(arr[-1] - arr[0]) if arr.size else 0.0
        if df.height < 2 or span <= 0:
            raise ParameterError("window_df", df.height, "a window of at least two requests with a positive span")
        process = synth.Renewal(family, (df.height - 1) / span, float(cv))
        gaps = process.gaps(df.height - 1, rng)
        new = synth.arrivals_from_gaps(gaps * (span / gaps.sum()))
        out = df.with_columns(pl.Series("arrival_s", new, dtype=pl.Float64))
        rec = {"cv": float(cv), "family": family, "rate_rps": process.rate, "span_s": span}
    elif kind == "lengths":
        pairs = params.get("pairs")
        if not isinstance(pairs, pl.DataFrame) or not {"prompt_tokens", "output_tokens"} <= set(pairs.columns):
            raise ParameterError("pairs", type(pairs).__name__, "a DataFrame with prompt_tokens and output_tokens")
        pairs = pairs.select(pl.col("prompt_tokens").cast(pl.Int64), pl.col("output_tokens").cast(pl.Int64))
        if pairs.height == 0 or pairs["prompt_tokens"].min() <= 0 or pairs["output_tokens"].min() <= 0:
            raise ParameterError("pairs", pairs.height, "at least one pair, all token counts positive")
        idx = synth.resample_pairs(pairs.height, df.height, rng)
        out = df.with_columns(pairs["prompt_tokens"][idx].alias("prompt_tokens"),
                              pairs["output_tokens"][idx].alias("output_tokens"))
        rec = {"pairs_n": pairs.height, "pairs_sha256": _pairs_sha256(pairs), "label": params.get("label")}
    else:
        factor = params.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
                factor > 0 and math.isfinite(factor)):
            raise ParameterError("factor", factor, "a positive number (rate multiplier)")
        out = df.with_columns((pl.col("arrival_s") / float(factor)).alias("arrival_s"))
        rec = {"factor": float(factor)}
    definition = {"kind": kind, "params": rec, "seed": int(seed), "window_id": window_id,
                  "before": _window_summary(df), "after": _window_summary(out)}
    return out, definition


def _window_summary(df: pl.DataFrame) -> dict[str, float]:
    rate, cv = synth.sample_rate_cv(df["arrival_s"].to_numpy())
    return {"n": df.height, "span_s": float(df["arrival_s"][-1] - df["arrival_s"][0]), "rate_rps": rate,
            "interarrival_cv": cv, "prompt_mean": float(df["prompt_tokens"].mean()),
            "output_mean": float(df["output_tokens"].mean())}


# --------------------------------------------------------------------------- evidence: data


def _standin_windows(P: Mapping, source: str) -> list[tuple[dict, pl.DataFrame]]:
    w = P["windows"]
    key = ("windows", source, json.dumps(P["standins"], sort_keys=True, default=str), w["per_source"], w["size"],
           str(mirror(P)), json.dumps((P.get("sources") or {}).get(source), sort_keys=True, default=str))
    if key not in _CACHE:
        _CACHE[key] = build_windows(P, source, w["per_source"], w["size"])
    return _CACHE[key]


def _pooled(windows: Sequence[tuple[dict, pl.DataFrame]]) -> pl.DataFrame:
    return pl.concat([df for _, df in windows])


def _norm_gaps(arrival_s: np.ndarray) -> np.ndarray:
    g = np.diff(np.asarray(arrival_s, dtype=np.float64))
    return g / g.mean() if g.size and g.mean() > 0 else g


def real_burstgpt_windows(P: Mapping, size: int | None = None) -> list[tuple[str, pl.DataFrame]]:
    """The slices' own windows of ``size`` consecutive valid requests (stride ``size // 4``; they
    overlap, so they are not independent): ``[(name, window table)]``."""
    size = size or P["windows"]["size"]
    ev = burstgpt_evidence(P)
    out = []
    for rel in ev.slices:
        rows = ev.pool.filter(pl.col("slice") == rel)
        for start in range(0, rows.height - size + 1, max(size // 4, 1)):
            part = rows.slice(start, size)
            out.append((f"{Path(rel).name}[{start}:{start + size}]",
                        synth.window_frame(part["timestamp_s"].to_numpy(), part["prompt_tokens"].to_numpy(),
                                           part["output_tokens"].to_numpy(), part["tenant"].to_list())))
    return out


def _percentile_row(values: np.ndarray, **cols: Any) -> dict[str, Any]:
    v = np.asarray(values, dtype=np.float64)
    row = {**cols, "n": int(v.size), "mean": float(v.mean())}
    row.update({f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES})
    return row


def _ks_lower_bound(sample: np.ndarray, quantiles: Mapping[int, float]) -> float:
    """max_p |F_sample(x_p) - p/100|: a lower bound on the KS distance to a distribution known only
    through its percentiles ``{p: x_p}`` (approximate: quantile conventions differ)."""
    s = np.sort(np.asarray(sample, dtype=np.float64))
    return float(max(abs(np.searchsorted(s, x, side="right") / s.size - p / 100) for p, x in quantiles.items()))


def _ks_row(a: np.ndarray, b: np.ndarray, **cols: Any) -> dict[str, Any]:
    res = sstats.ks_2samp(a, b)
    return {**cols, "ks": float(res.statistic), "p_value": float(res.pvalue), "n_standin": int(len(a)),
            "n_real": int(len(b))}


def _window_stat_rows(windows: Sequence[tuple[str, pl.DataFrame]], provenance: str, evidence: str) -> list[dict]:
    rows = []
    for name, df in windows:
        rate, cv = synth.sample_rate_cv(df["arrival_s"].to_numpy())
        rows.append({"provenance": provenance, "evidence": evidence, "window": name, "n": df.height,
                     "duration_s": float(df["arrival_s"][-1]), "rate_rps": rate, "interarrival_cv": cv,
                     "prompt_mean": float(df["prompt_tokens"].mean()),
                     "output_mean": float(df["output_tokens"].mean()),
                     "tenants": int(df["tenant"].n_unique())})
    return rows


def read_qwen_rows(P: Mapping) -> pl.DataFrame:
    """The real Qwen traceA rows (166, a thinned stratified sample): ``timestamp, prompt_tokens,
    output_tokens, window``."""
    path = mirror(P) / P["standins"]["bailian"]["qwen_rows"]
    if not path.is_file():
        raise DataError(path, "Qwen rows not found")
    df = pl.read_csv(path)
    need = ("timestamp", "input_length", "output_length", "window")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}")
    return df.select(pl.col("timestamp").cast(pl.Float64), pl.col("input_length").cast(pl.Int64).alias("prompt_tokens"),
                     pl.col("output_length").cast(pl.Int64).alias("output_tokens"), pl.col("window").cast(pl.Int64))


def servegen_client_table(P: Mapping) -> pl.DataFrame:
    """One row per ServeGen client: files present, excluded, active windows, rates, patterns."""
    data = load_servegen(servegen_folder(P))
    rows = []
    for c in data.trace_clients:
        r = data.row_of(c)
        act = data.rate[r] > 0
        rows.append({"client": c, "has_dataset": c in data.clients, "excluded": c in data.excluded,
                     "active_windows": int(act.sum()), "windows": data.n_windows,
                     "mean_rate_rps": float(data.rate[r].mean()),
                     "mean_rate_when_active_rps": float(data.rate[r][act].mean()) if act.any() else 0.0,
                     "share_of_requests": float(data.rate[r].sum() / data.rate.sum()),
                     "gamma_windows": int((data.pattern[r] == "Gamma").sum()),
                     "weibull_windows": int((data.pattern[r] == "Weibull").sum()),
                     "median_cv_when_active": float(np.median(data.cv[r][act])) if act.any() else float("nan"),
                     "nonempty_buckets": int(data.bucket_starts[c].size) if c in data.bucket_starts else 0})
    return pl.DataFrame(rows).with_columns(pl.lit("real").alias("provenance"),
                                           pl.lit("ServeGen language/m-small statistics").alias("evidence"))


def servegen_estimates(P: Mapping) -> dict[str, Any]:
    """Client counts, activity per 600-s window, and the Weibull shape check of the ServeGen folder."""
    data = load_servegen(servegen_folder(P))
    used = data.used_rows()
    active_used = (data.rate[used] > 0).sum(axis=0)
    active_all = (data.rate > 0).sum(axis=0)
    total_used = data.rate[used].sum(axis=0)
    wb = data.pattern == "Weibull"
    solved = np.array([synth.weibull_shape_for_cv(float(c)) for c in data.cv[wb]])
    rel = np.abs(data.shape[wb] - solved) / solved
    recorded_cv = np.array([synth.weibull_cv(float(k)) for k in data.shape[wb]])
    gm = data.pattern == "Gamma"
    return {
        "clients_with_trace": len(data.trace_clients), "clients_with_dataset": len(data.clients),
        "excluded": list(data.excluded), "n_excluded": len(data.excluded),
        "excluded_share_of_requests": float(data.rate[[data.row_of(c) for c in data.excluded]].sum() / data.rate.sum())
        if data.excluded else 0.0,
        "windows_per_client": data.n_windows, "window_s": data.window_s,
        "days": data.n_windows * data.window_s / 86400.0, "bucket_s": data.bucket_s,
        "active_per_window": {"min": int(active_used.min()), "median": float(np.median(active_used)),
                              "mean": float(active_used.mean()), "max": int(active_used.max())},
        "active_per_window_all_clients": {"min": int(active_all.min()), "median": float(np.median(active_all)),
                                          "max": int(active_all.max())},
        "idle_windows": int((active_used == 0).sum()),
        "total_rate_rps": {"min": float(total_used.min()), "median": float(np.median(total_used)),
                           "max": float(total_used.max())},
        "pattern_windows": {"Gamma": int(gm.sum()), "Weibull": int(wb.sum())},
        "gamma_shape_max_rel_diff_from_1_over_cv2": float(np.max(np.abs(data.shape[gm] * data.cv[gm] ** 2 - 1.0)))
        if gm.any() else 0.0,
        "weibull_recorded_shape_rel_diff": {"median": float(np.median(rel)), "p90": float(np.percentile(rel, 90)),
                                            "max": float(rel.max())} if wb.any() else {},
        "weibull_recorded_shape_cv_ratio_median": float(np.median(recorded_cv / data.cv[wb])) if wb.any() else 1.0,
    }


def servegen_length_mixture(P: Mapping) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The used clients' token PMFs over the 14 days, mixed with weights = expected requests
    (rate x 600 s of every active window, each window mapped to its bucket by ServeGen's rule):
    ``{"prompt_tokens": (values, probs), "output_tokens": (values, probs)}``."""
    data = load_servegen(servegen_folder(P))
    key = ("servegen-mixture", data.digest)
    if key in _CACHE:
        return _CACHE[key]
    weight: dict[tuple[int, int], float] = {}
    for c in data.clients:
        r = data.row_of(c)
        for w in np.nonzero(data.rate[r] > 0)[0]:
            k = (c, data.bucket_for(c, float(data.starts[w])))
            weight[k] = weight.get(k, 0.0) + float(data.rate[r, w]) * data.window_s
    out = {}
    for metric, what in (("prompt_tokens", "input_tokens"), ("output_tokens", "output_tokens")):
        vals, probs = [], []
        for (c, b), wgt in sorted(weight.items()):
            pmf = data.pmf(c, b, what)
            vals.append(pmf.values)
            probs.append(pmf.probs * wgt)
        v, p = np.concatenate(vals), np.concatenate(probs)
        uniq, inv = np.unique(v, return_inverse=True)
        out[metric] = (uniq, np.bincount(inv, weights=p) / p.sum())
    _CACHE[key] = out
    return out


def _mixture_row(values: np.ndarray, probs: np.ndarray, **cols: Any) -> dict[str, Any]:
    cdf = np.cumsum(probs)
    row = {**cols, "n": None, "mean": float(np.dot(values, probs))}
    row.update({f"p{q}": float(values[min(np.searchsorted(cdf, q / 100), values.size - 1)]) for q in PERCENTILES})
    return row


def _ks_to_discrete(sample: np.ndarray, values: np.ndarray, probs: np.ndarray) -> float:
    """KS distance between a sample's ECDF and a discrete distribution (evaluated on both supports)."""
    s = np.sort(np.asarray(sample, dtype=np.float64))
    grid = np.union1d(values, s)
    f_mix = np.concatenate([[0.0], np.cumsum(probs)])[np.searchsorted(values, grid, side="right")]
    f_s = np.searchsorted(s, grid, side="right") / s.size
    return float(np.max(np.abs(f_mix - f_s)))


def estimates(P: Mapping) -> dict[str, Any]:
    """Numbers for notebook 02's text: BurstGPT rate/CV with CIs and choices; ServeGen counts and
    the stand-in windows' activity."""
    bg = dict(burstgpt_arrival_estimates(P))
    ev = burstgpt_evidence(P)
    bg["slices"] = {rel: c for rel, c in ev.counts.items()}
    bg["pairs"] = ev.pool.height
    bg["log_type_shares"] = log_type_shares(P)
    bg["reweight_log_types"] = P["standins"]["burstgpt"]["reweight_log_types"]
    sg = servegen_estimates(P)
    wins = _standin_windows(P, "bailian")
    data = load_servegen(servegen_folder(P))
    used_pmfs = {(int(c), int(b)) for m, df in wins for c, b in
                 _pmfs_of(data, df, m["t_start"])}
    dropped = [data.pmf(c, b, "output_tokens").dropped_mass for c, b in used_pmfs] + \
              [data.pmf(c, b, "input_tokens").dropped_mass for c, b in used_pmfs]
    sg["standin_windows"] = [{"id_index": k, "t_start_s": m["t_start"], "day": m["t_start"] / 86400.0,
                              "active_clients_at_start": m["active_clients_at_start"], "tenants": m["tenants"],
                              "segments_600s": m["segments_600s"], "duration_s": float(df["arrival_s"][-1])}
                             for k, (m, df) in enumerate(wins)]
    sg["standin_active_at_start"] = {"min": min(w["active_clients_at_start"] for w in sg["standin_windows"]),
                                     "max": max(w["active_clients_at_start"] for w in sg["standin_windows"])}
    sg["pmfs_used"] = len(used_pmfs)
    sg["pmfs_used_with_zero_token_bins"] = int(sum(d > 0 for d in dropped))
    sg["zero_token_mass_dropped_max"] = float(max(dropped)) if dropped else 0.0
    return {"burstgpt": bg, "servegen": sg}


def _pmfs_of(data: ServeGenData, df: pl.DataFrame, t_first: float) -> list[tuple[int, int]]:
    clients = [int(t.split("-", 1)[1]) for t in df["tenant"].to_list()]
    times = t_first + df["arrival_s"].to_numpy()
    return sorted({(c, data.bucket_for(c, float(x))) for c, x in zip(clients, times)})


def evidence_tables(P: Mapping) -> dict[str, pl.DataFrame]:
    """Real evidence beside the stand-ins (tables with a ``provenance`` column where they compare).

    ``burstgpt_arrivals`` (rate/CV estimates and the full-file rates), ``burstgpt_lengths``
    (percentiles: slices, first-60k aggregate, stand-in, reweighted stand-in), ``burstgpt_ks``,
    ``burstgpt_mix`` (model and log-type shares), ``burstgpt_windows`` (per-window stats, real slice
    windows and stand-in windows), ``bailian_lengths``, ``bailian_ks``, ``bailian_windows``,
    ``servegen_clients``.
    """
    key = ("tables", json.dumps(P["standins"], sort_keys=True, default=str), json.dumps(P["windows"], sort_keys=True),
           str(mirror(P)), json.dumps(P.get("sources"), sort_keys=True, default=str))
    if key not in _CACHE:
        _CACHE[key] = _evidence_tables(P)
    return dict(_CACHE[key])


def _evidence_tables(P: Mapping) -> dict[str, pl.DataFrame]:
    ev = burstgpt_evidence(P)
    fit = burstgpt_arrival_estimates(P)
    std_label = label("burstgpt", "standin")
    bg_windows = _standin_windows(P, "burstgpt")
    bg = _pooled(bg_windows)
    slices_desc = " + ".join(Path(s).name for s in ev.slices)
    t: dict[str, pl.DataFrame] = {}

    arr_rows = [{"provenance": "real", "evidence": f"{slices_desc}: {ev_desc}", "quantity": q,
                 "estimate": fit[k], "ci_low": fit[f"{k2}_ci"][0], "ci_high": fit[f"{k2}_ci"][1],
                 "ci_iid_low": fit[f"{k2}_ci_iid"][0], "ci_iid_high": fit[f"{k2}_ci_iid"][1], "n": fit["n_gaps"]}
                for q, k, k2, ev_desc in (
                    ("rate_rps", "rate_rps", "rate", "pooled within-slice gaps"),
                    ("interarrival_cv", "cv_pooled", "cv_pooled", "CV of raw pooled within-slice gaps"),
                    ("interarrival_cv", "cv_window", "cv_window",
                     f"CV of gaps over their {fit['cv_window_span_gaps']}-gap moving mean (window scale)"))]
    rw = fit["real_window_cv"]
    if rw["windows"]:
        arr_rows.append({"provenance": "real", "evidence": f"{slices_desc}: median CV of {rw['windows']} overlapping "
                         f"{rw['size']}-request windows (range in the CI columns)", "quantity": "interarrival_cv",
                         "estimate": rw["median"], "ci_low": rw["min"], "ci_high": rw["max"], "ci_iid_low": None,
                         "ci_iid_high": None, "n": rw["windows"]})
    for fid, rph in fit["full_file_rates_rph"].items():
        arr_rows.append({"provenance": "real", "evidence": f"{fid} full file (guanxi aggregate)",
                         "quantity": "rate_rps", "estimate": rph / 3600.0, "ci_low": None, "ci_high": None,
                         "ci_iid_low": None, "ci_iid_high": None,
                         "n": int(_full_file_row(ev, fid)["rows"])})
    for q, k in (("rate_rps", "rate_rps_used"), ("interarrival_cv", "cv_used")):
        arr_rows.append({"provenance": "standin", "evidence": f"{std_label} generator parameter", "quantity": q,
                         "estimate": fit[k], "ci_low": None, "ci_high": None, "ci_iid_low": None,
                         "ci_iid_high": None, "n": None})
    t["burstgpt_arrivals"] = pl.DataFrame(arr_rows)

    len_rows = []
    roll = ev.rollup["numeric_distributions"] if ev.rollup else None
    roll_desc = _rollup_desc(ev)
    reweighted = _reweighted_pool_sample(P, bg.height)
    for metric, raw_key in (("prompt_tokens", "input_tokens"), ("output_tokens", "output_tokens")):
        len_rows.append(_percentile_row(ev.pool[metric].to_numpy(), provenance="real",
                                        evidence=f"{slices_desc}, valid rows", metric=metric))
        if roll:
            r = roll[raw_key]
            len_rows.append({"provenance": "real", "evidence": f"{roll_desc}, all log types, "
                             "failures included (fnstggl rollup)", "metric": metric, "n": int(r["count"]),
                             "mean": float(r["mean"]), **{f"p{q}": float(r[f"p{q}"]) for q in PERCENTILES}})
        len_rows.append(_percentile_row(bg[metric].to_numpy(), provenance="standin",
                                        evidence=f"{std_label}, {len(bg_windows)} windows pooled", metric=metric))
        if reweighted is not None:
            len_rows.append(_percentile_row(reweighted[metric].to_numpy(), provenance="standin",
                                            evidence=f"{std_label} variant: log types reweighted to "
                                            f"{fit['rate_file']} shares (not used)", metric=metric))
    t["burstgpt_lengths"] = pl.DataFrame(len_rows)

    real_w = real_burstgpt_windows(P)
    ks = []
    for metric in ("prompt_tokens", "output_tokens"):
        ks.append(_ks_row(bg[metric].to_numpy(), ev.pool[metric].to_numpy(), provenance="standin",
                          compared_with="real slices, valid rows", metric=metric, kind="two-sample KS"))
    ks.append(_ks_row(np.concatenate([_norm_gaps(df["arrival_s"].to_numpy()) for _, df in bg_windows]),
                      np.concatenate([window_normalised_gaps(g, P["windows"]["size"]) for g in ev.gaps]),
                      provenance="standin", compared_with="real slices, gaps over their window-scale moving mean",
                      metric="gap / mean gap",
                      kind="two-sample KS"))
    cv_std = np.array([synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in bg_windows])
    cv_real = np.array([synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in real_w])
    ks.append(_ks_row(cv_std, cv_real, provenance="standin",
                      compared_with=f"real slices' {len(real_w)} overlapping {P['windows']['size']}-request windows",
                      metric="window inter-arrival CV", kind="two-sample KS (real windows overlap)"))
    if roll:
        for metric, raw_key in (("prompt_tokens", "input_tokens"), ("output_tokens", "output_tokens")):
            q = {p: float(roll[raw_key][f"p{p}"]) for p in PERCENTILES}
            ks.append({"provenance": "standin", "compared_with": f"{roll_desc} ({len(PERCENTILES)} percentiles)",
                       "metric": metric, "kind": "KS lower bound from percentiles",
                       "ks": _ks_lower_bound(bg[metric].to_numpy(), q), "p_value": None,
                       "n_standin": bg.height, "n_real": int(roll[raw_key]["count"])})
    t["burstgpt_ks"] = pl.DataFrame(ks)

    mix = []
    for dim, col in (("model", "model"), ("log_type", "log_type")):
        for who, frame in (("real", ev.pool), ("standin", bg.with_columns(
                pl.col("tenant").str.split("/").list.get(0 if dim == "model" else 1).alias(col)))):
            counts = frame.group_by(col).len().sort(col)
            n = counts["len"].sum()
            for r in counts.iter_rows(named=True):
                mix.append({"provenance": who, "evidence": f"{slices_desc}, valid rows" if who == "real"
                            else std_label, "dimension": dim, "category": r[col], "count": int(r["len"]),
                            "share": r["len"] / n})
        for r in ev.full_files:
            counts = r["model_counts"] if dim == "model" else r["log_type_counts"]
            n = sum(counts.values())
            for cat, cnt in sorted(counts.items()):
                mix.append({"provenance": "real", "evidence": f"{r['file_id']} full file (guanxi aggregate)",
                            "dimension": dim, "category": cat, "count": int(cnt), "share": cnt / n})
        if ev.rollup:
            counts = ev.rollup["subgroup_counts"]["Model" if dim == "model" else "Log Type"]
            n = sum(counts.values())
            for cat, cnt in sorted(counts.items()):
                mix.append({"provenance": "real", "evidence": f"{roll_desc} (fnstggl rollup)",
                            "dimension": dim, "category": cat, "count": int(cnt), "share": cnt / n})
    t["burstgpt_mix"] = pl.DataFrame(mix)

    wrows = _window_stat_rows(real_w, "real", "BurstGPT slices (overlapping windows)")
    wrows += _window_stat_rows([(f"{k:02d}", df) for k, (_, df) in enumerate(bg_windows)], "standin", std_label)
    t["burstgpt_windows"] = pl.DataFrame(wrows)

    bl_label = label("bailian", "standin")
    bl_windows = _standin_windows(P, "bailian")
    bl = _pooled(bl_windows)
    q = read_qwen_rows(P)
    qdesc = f"Qwen traceA (to-C chat), {q.height} rows of a thinned stratified sample"
    mixture = servegen_length_mixture(P)
    sg_desc = "ServeGen m-small used clients' PMFs over 14 days, request-weighted (aggregate evidence)"
    brows, bks = [], []
    for metric in ("prompt_tokens", "output_tokens"):
        brows.append(_percentile_row(q[metric].to_numpy(), provenance="real", evidence=qdesc, metric=metric))
        brows.append(_percentile_row(bl[metric].to_numpy(), provenance="standin",
                                     evidence=f"{bl_label} (ServeGen m-small), {len(bl_windows)} windows pooled",
                                     metric=metric))
        bks.append(_ks_row(bl[metric].to_numpy(), q[metric].to_numpy(), provenance="standin",
                           compared_with=qdesc, metric=metric, kind="two-sample KS (different services)"))
        vals, probs = mixture[metric]
        brows.append(_mixture_row(vals, probs, provenance="real", evidence=sg_desc, metric=metric))
        bks.append({"provenance": "standin", "compared_with": sg_desc, "metric": metric,
                    "kind": "KS to the request-weighted PMF mixture (its own evidence)",
                    "ks": _ks_to_discrete(bl[metric].to_numpy(), vals, probs), "p_value": None,
                    "n_standin": bl.height, "n_real": None})
    t["bailian_lengths"] = pl.DataFrame(brows)
    t["bailian_ks"] = pl.DataFrame(bks)
    brw = _window_stat_rows([(f"{k:02d}", df) for k, (_, df) in enumerate(bl_windows)], "standin", bl_label)
    for r, (m, _) in zip(brw, bl_windows):
        r.update({"t_start_s": m["t_start"], "active_clients_at_start": m["active_clients_at_start"]})
    t["bailian_windows"] = pl.DataFrame(brw)
    t["servegen_clients"] = servegen_client_table(P)
    return t


def evidence_markdown(P: Mapping) -> str:
    """Notebook 02's text about the stand-ins, every number computed from :func:`estimates` and
    :func:`evidence_tables`."""
    est, t = estimates(P), evidence_tables(P)
    bg, sg = est["burstgpt"], est["servegen"]
    bl_std, bg_std = label("bailian", "standin"), label("burstgpt", "standin")
    ks = {(r["compared_with"], r["metric"]): r["ks"] for r in t["burstgpt_ks"].iter_rows(named=True)}
    ks_pairs = max(v for (c, _), v in ks.items() if c == "real slices, valid rows")
    ks_gap = next(v for (_, m), v in ks.items() if m == "gap / mean gap")
    roll_desc = _rollup_desc(burstgpt_evidence(P))
    lb = {m: v for (c, m), v in ks.items() if c.startswith(roll_desc)}
    mix = t["burstgpt_mix"].filter(pl.col("evidence").str.starts_with(roll_desc) & (pl.col("category") == "API log"))
    roll_api = float(mix["share"][0]) if mix.height else float("nan")
    lengths = {(r["evidence"], r["metric"]): r for r in t["burstgpt_lengths"].iter_rows(named=True)}

    def p50(prefix: str, metric: str) -> float:
        return next(r["p50"] for (e, m), r in lengths.items() if e.startswith(prefix) and m == metric)

    w = t["burstgpt_windows"]
    std_cv = w.filter(pl.col("provenance") == "standin")["interarrival_cv"]
    rw = bg["real_window_cv"]
    shares = bg["log_type_shares"]
    excluded_rows = sum(c["excluded"] for c in bg["slices"].values())
    n_api = round(shares["slices"].get("API log", 0.0) * bg["pairs"])
    reweighted = [r for (e, m), r in lengths.items() if "reweighted" in e and m == "output_tokens"]
    text = [
        f"**{bg_std}.** (prompt, output) pairs are resampled from the {bg['pairs']} valid rows of "
        f"{len(bg['slices'])} real slices ({excluded_rows} failure rows excluded); tenant = model/log type. "
        f"Arrivals: Gamma renewal process with rate {bg['rate_rps_used']:.3g} req/s "
        f"({'the mean rate of ' + bg['rate_file'] if bg['rate_choice'] == 'full_file' else 'the slices'}) and "
        f"CV {bg['cv_used']:.2f} (the {bg['cv_choice']} estimate). The slices themselves run at "
        f"{bg['rate_rps'] * 3600:.1f} req/h (95% CI {bg['rate_ci'][0] * 3600:.1f}-{bg['rate_ci'][1] * 3600:.1f}), "
        f"{bg['slices_vs_full_file_rate_ratio']:.1%} of the full file's rate: they are the quiet first hours of "
        f"the files, so only their burst pattern is used. The raw pooled CV of their gaps is {bg['cv_pooled']:.2f} "
        f"(95% block-bootstrap CI {bg['cv_pooled_ci'][0]:.2f}-{bg['cv_pooled_ci'][1]:.2f}), inflated by the "
        f"night-to-morning rate ramp; net of rate changes slower than {bg['cv_window_span_gaps']} requests it is "
        f"{bg['cv_window']:.2f} (CI {bg['cv_window_ci'][0]:.2f}-{bg['cv_window_ci'][1]:.2f}). The slices' own "
        f"{rw['windows']} overlapping {rw['size']}-request windows have CVs {rw['min']:.2f}-{rw['max']:.2f} "
        f"(median {rw['median']:.2f}); the stand-in's windows {std_cv.min():.2f}-{std_cv.max():.2f} (median "
        f"{std_cv.median():.2f}). The Gamma family matches rate and CV, not the shape of the gap distribution "
        f"(KS {ks_gap:.2f} on gaps over their window mean: it puts more gaps near zero). The 1-s timestamp "
        f"resolution changes the CV by {abs(bg['resolution_cv_relative_effect']):.1e} (relative).",
        f"Lengths reproduce the slices (KS at most {ks_pairs:.3f}). Against the aggregate of {roll_desc} "
        f"({roll_api:.0%} API log) they are long: median prompt {p50(bg_std, 'prompt_tokens'):.0f} vs "
        f"{p50(roll_desc, 'prompt_tokens'):.0f} tokens, median output {p50(bg_std, 'output_tokens'):.0f} vs "
        f"{p50(roll_desc, 'output_tokens'):.0f} (KS at least {lb.get('prompt_tokens', float('nan')):.2f} and "
        f"{lb.get('output_tokens', float('nan')):.2f}). The slices are "
        f"{shares['slices'].get('Conversation log', 0.0):.1%} Conversation log, while API logs dominate the full "
        f"files ({shares['full_file_id']}: {shares['full_file'].get('API log', 0.0):.1%} API log); the aggregate's "
        f"shorter lengths suggest that API requests are shorter. "
        f"Log types are "
        + ("reweighted to the full file's shares." if bg["reweight_log_types"] else
           f"not reweighted: the slices hold {n_api} API rows, and weighting them up makes the stand-in a few "
           f"repeated pairs" + (f" (output p99 {reweighted[0]['p99']:.0f} = p90 {reweighted[0]['p90']:.0f})"
                                if reweighted else "")
           + ". The stand-in represents BurstGPT's Conversation-log traffic."),
        f"**{bl_std}.** ServeGen m-small has {sg['clients_with_trace']} clients with trace files and "
        f"{sg['clients_with_dataset']} with length data; {sg['n_excluded']} "
        f"(clients {', '.join(map(str, sg['excluded']))}) "
        f"have no dataset file here and are excluded; they carry {sg['excluded_share_of_requests']:.0%} of the "
        f"requests, so the stand-in reflects the other clients' mix. Each of the {sg['windows_per_client']} "
        f"600-s windows has {sg['active_per_window']['min']}-{sg['active_per_window']['max']} active used clients "
        f"(median {sg['active_per_window']['median']:.0f}; {sg['idle_windows']} idle windows); the stand-in windows "
        f"start with {sg['standin_active_at_start']['min']}-{sg['standin_active_at_start']['max']} active.",
    ]
    blk = {(r["kind"], r["metric"]): r["ks"] for r in t["bailian_ks"].iter_rows(named=True)}
    own = max(v for (k, _), v in blk.items() if "own evidence" in k)
    other = {m: v for (k, m), v in blk.items() if "different services" in k}
    bl = {(r["provenance"], r["evidence"][:4], r["metric"]): r for r in t["bailian_lengths"].iter_rows(named=True)}
    q = {m: r for (prov, e, m), r in bl.items() if e == "Qwen"}
    s_ = {m: r for (prov, e, m), r in bl.items() if prov == "standin"}
    text.append(
        f"Its lengths reproduce the request-weighted PMFs they are drawn from (KS at most {own:.3f}). Beside the "
        f"only real Qwen rows here they are far shorter: median prompt {s_['prompt_tokens']['p50']:.0f} vs "
        f"{q['prompt_tokens']['p50']:.0f} tokens, median output {s_['output_tokens']['p50']:.0f} vs "
        f"{q['output_tokens']['p50']:.0f} (KS {other['prompt_tokens']:.2f} and {other['output_tokens']:.2f}). That "
        f"comparison is weak: the Qwen rows are {q['prompt_tokens']['n']} thinned rows of traceA (to-C chat), the "
        f"default real file is traceB (to-B API), and ServeGen m-small is a different Bailian service.")
    return "\n\n".join(text)


def _reweighted_pool_sample(P: Mapping, n: int) -> pl.DataFrame | None:
    """A sample of ``n`` pairs under log-type reweighting (for the evidence table), or None when the
    slices lack a log type the full file has."""
    ev = burstgpt_evidence(P)
    try:
        weights = _log_type_weights(P, True)
    except DataError:
        return None
    rng = synth.rng_from(P["standins"]["seed"], "burstgpt", "reweighted-variant")
    idx = synth.resample_pairs(ev.pool.height, n, rng, _row_weights(ev.pool, weights))
    return ev.pool[idx]


# --------------------------------------------------------------------------- evidence: figures


def _ecdf(ax, values: np.ndarray, lbl: str, **kw: Any) -> None:
    v = np.sort(np.asarray(values, dtype=np.float64))
    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=lbl, **kw)


def plot_evidence(P: Mapping, figures_dir: str | Path) -> list[str]:
    """Figures of the stand-ins beside their real evidence (PNG + PDF through ``figures.save``)."""
    from ..present import figures

    ev = burstgpt_evidence(P)
    fit = burstgpt_arrival_estimates(P)
    bg_windows = _standin_windows(P, "burstgpt")
    bg = _pooled(bg_windows)
    bg_label, bl_label = label("burstgpt", "standin"), label("bailian", "standin")
    paths: list[str] = []

    fig, axes = figures.figure(1, 2, figsize=(10, 3.8))
    roll = ev.rollup["numeric_distributions"] if ev.rollup else None
    for ax, metric, raw_key, name in ((axes[0], "prompt_tokens", "input_tokens", "prompt"),
                                      (axes[1], "output_tokens", "output_tokens", "output")):
        _ecdf(ax, ev.pool[metric].to_numpy(), f"BurstGPT real slices (n={ev.pool.height})")
        _ecdf(ax, bg[metric].to_numpy(), f"{bg_label} (n={bg.height})", linestyle="--")
        if roll:
            xs = [max(float(roll[raw_key][f"p{q}"]), 1.0) for q in PERCENTILES]
            ax.plot(xs, [q / 100 for q in PERCENTILES], "o", color="black",
                    label=f"{_rollup_desc(ev)}: " + "/".join(f"p{q}" for q in PERCENTILES))
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} length (tokens)")
        ax.set_ylabel("cumulative fraction of requests")
    axes[0].legend(loc="lower right", fontsize=7)
    fig.suptitle("BurstGPT stand-in lengths vs. the real evidence")
    paths += list(figures.save(fig, f"{FIGURE_PREFIX}/standin_burstgpt_lengths", figures_dir, close=True,
                               description="ECDFs of prompt and output lengths: BurstGPT stand-in vs the real "
                                           "slices it resamples and the third-party percentiles of the "
                                           "first 60k rows").values())

    real_w = real_burstgpt_windows(P)
    fig, axes = figures.figure(1, 2, figsize=(10, 3.8))
    real_g = np.concatenate([window_normalised_gaps(g, P["windows"]["size"]) for g in ev.gaps])
    std_g = np.concatenate([_norm_gaps(df["arrival_s"].to_numpy()) for _, df in bg_windows])
    floor = 1e-4
    _ecdf(axes[0], np.maximum(real_g, floor), f"BurstGPT real slices ({real_g.size} gaps)")
    _ecdf(axes[0], np.maximum(std_g, floor), f"{bg_label} ({std_g.size} gaps)", linestyle="--")
    axes[0].set_xscale("log")
    axes[0].set_xlabel(f"inter-arrival gap / mean gap of its {P['windows']['size']}-request window "
                       f"(floored at {floor:g})")
    axes[0].set_ylabel("cumulative fraction of gaps")
    axes[0].legend(loc="lower right", fontsize=7)
    cv_real = [synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in real_w]
    cv_std = [synth.sample_rate_cv(df["arrival_s"].to_numpy())[1] for _, df in bg_windows]
    axes[1].boxplot([cv_real, cv_std], showfliers=True)
    axes[1].set_xticks([1, 2], [f"real slice windows\n(n={len(cv_real)}, overlapping)",
                                f"{bg_label}\n(n={len(cv_std)})"])
    ci = fit["cv_window_ci"] if fit["cv_choice"] == "window" else fit["cv_pooled_ci"]
    axes[1].axhspan(*ci, color="grey", alpha=0.2, label=f"Gamma CV used ({fit['cv_choice']} estimate), 95% CI")
    axes[1].axhline(fit["cv_used"], color="grey")
    axes[1].axhline(fit["cv_pooled"], color="grey", linestyle=":", label="CV of raw pooled slice gaps")
    axes[1].set_ylabel("inter-arrival CV per window (dimensionless)")
    axes[1].legend(fontsize=7)
    fig.suptitle("BurstGPT stand-in burstiness vs. the real slices")
    paths += list(figures.save(fig, f"{FIGURE_PREFIX}/standin_burstgpt_arrivals", figures_dir, close=True,
                               description="BurstGPT stand-in burstiness vs the real slices: ECDF of "
                                           "window-normalised gaps and per-window inter-arrival CVs, with the "
                                           "Gamma CV used and its 95% CI").values())

    bl_windows = _standin_windows(P, "bailian")
    bl = _pooled(bl_windows)
    q = read_qwen_rows(P)
    fig, axes = figures.figure(1, 2, figsize=(10, 3.8))
    for ax, metric, name in ((axes[0], "prompt_tokens", "prompt"), (axes[1], "output_tokens", "output")):
        _ecdf(ax, q[metric].to_numpy(), f"Qwen traceA rows, real, different service (n={q.height})")
        _ecdf(ax, bl[metric].to_numpy(), f"{bl_label} from ServeGen m-small (n={bl.height})", linestyle="--")
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} length (tokens)")
        ax.set_ylabel("cumulative fraction of requests")
    axes[0].legend(loc="lower right", fontsize=7)
    fig.suptitle("Bailian stand-in lengths vs. the only real Qwen rows available (weak comparison)")
    paths += list(figures.save(fig, f"{FIGURE_PREFIX}/standin_bailian_lengths", figures_dir, close=True,
                               description="ECDFs of prompt and output lengths: Bailian stand-in (ServeGen "
                                           "m-small) vs the only real Qwen rows available (a weak comparison: "
                                           "a different service)").values())

    data = load_servegen(servegen_folder(P))
    used = data.used_rows()
    days = data.starts / 86400.0
    fig, ax = figures.figure(figsize=(10, 3.8))
    ax.plot(days, data.rate[used].sum(axis=0), lw=0.7, label="total rate of the used clients")
    ax.set_xlabel("time in the ServeGen trace (days)")
    ax.set_ylabel("request rate (req/s)")
    ax2 = ax.twinx()
    ax2.plot(days, (data.rate[used] > 0).sum(axis=0), lw=0.7, color="tab:orange", alpha=0.7,
             label="active clients")
    ax2.set_ylabel("active clients (count)")
    ax2.grid(False)
    for k, (m, _) in enumerate(bl_windows):
        ax.axvline(m["t_start"] / 86400.0, color="black", lw=0.5, alpha=0.5,
                   label=f"{bl_label} window starts" if k == 0 else None)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=7)
    ax.set_title(f"ServeGen m-small: {len(data.clients)} clients used "
                 f"({len(data.excluded)} without a dataset file excluded)")
    paths += list(figures.save(fig, f"{FIGURE_PREFIX}/standin_servegen_timeline", figures_dir, close=True,
                               description="ServeGen m-small over 14 days: total request rate and active "
                                           "clients of the used clients, with the Bailian stand-in window "
                                           "starts").values())
    return paths


def counterfactual_demo(P: Mapping, window_df: pl.DataFrame, figures_dir: str | Path, *,
                        window_id: str | None = None, window_label: str = "real window",
                        provenance: str = "real", cv: float | None = None) -> tuple[pl.DataFrame, dict[str, str]]:
    """One window beside its ``burstiness`` variant (target CV ``standins.counterfactual.burstiness_cv``):
    a table (one row each: ``provenance`` of the window, ``counterfactual`` for the variant, whose
    row carries its definition as JSON) and a figure of cumulative arrivals (paths returned)."""
    from ..present import figures

    cf = P["standins"]["counterfactual"]
    target = float(cv if cv is not None else cf["burstiness_cv"])
    variant, definition = counterfactual(window_df, "burstiness", seed=cf["seed"], window_id=window_id, cv=target)
    vlabel = f"burstiness variant (target CV {target:g}, synthetic)"
    rows = []
    for name, prov, df, d in ((window_label, provenance, window_df, None),
                              (vlabel, "counterfactual", variant, definition)):
        s = _window_summary(df)
        rows.append({"window": name, "provenance": prov, **s,
                     "definition": json.dumps(d, sort_keys=True) if d else None})
    table = pl.DataFrame(rows)
    fig, ax = figures.figure(figsize=(7, 4))
    for name, df, style in ((window_label, window_df, "-"), (vlabel, variant, "--")):
        a = df["arrival_s"].to_numpy()
        ax.step(a, np.arange(1, a.size + 1), where="post", linestyle=style, label=name)
    ax.set_xlabel("time since the window's first request (s)")
    ax.set_ylabel("requests arrived (count)")
    ax.legend(fontsize=8)
    ax.set_title(f"Same requests and mean rate, different burstiness ({window_id or 'window'})")
    paths = figures.save(fig, f"{FIGURE_PREFIX}/counterfactual_burstiness", figures_dir,
                         description=f"cumulative arrivals of window {window_id or '(unnamed)'} and of its "
                                     f"burstiness counterfactual (target CV {target:g}): same requests and "
                                     "span, gaps redrawn")
    return table, paths


def counterfactual_markdown(table: pl.DataFrame) -> str:
    """Notebook 02's sentence on what the burstiness counterfactual changed, from the table of
    :func:`counterfactual_demo` (first row the window, second the variant)."""
    base, cf = table.row(0, named=True), table.row(1, named=True)
    d = json.loads(cf["definition"])
    same_requests = (base["n"] == cf["n"] and base["prompt_mean"] == cf["prompt_mean"]
                     and base["output_mean"] == cf["output_mean"])
    same_rate = math.isclose(base["rate_rps"], cf["rate_rps"], rel_tol=1e-9)
    kept = (f"The same {base['n']} requests, in the same order and with the same lengths (mean prompt "
            f"{base['prompt_mean']:,.0f}, mean output {base['output_mean']:,.0f} tokens)," if same_requests else
            f"{cf['n']} requests (the window has {base['n']}),")
    rate = (f"over the same span of {base['span_s']:,.4g} s, so the mean rate is unchanged at "
            f"{base['rate_rps']:.3g} req/s" if same_rate else
            f"at {cf['rate_rps']:.3g} req/s (the window: {base['rate_rps']:.3g} req/s)")
    only = same_requests and same_rate
    return (f"**What changed.** {'Only the' if only else 'The'} gaps between arrivals: the inter-arrival CV "
            f"goes from {base['interarrival_cv']:.2f} in the window to {cf['interarrival_cv']:.2f} in the variant "
            f"(a {d['params']['family']} renewal process with target CV {d['params']['cv']:g}; a "
            f"{cf['n']}-request sample scatters around its target, and below it for heavy-tailed gaps). {kept} "
            f"arrive {rate}" + (": simulated on the two, schedulers would face the same work and load, "
                                "differing only in how bunched the arrivals are." if only else "."))
