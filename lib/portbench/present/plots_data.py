"""Descriptive tables and figures of the traces and the frozen windows (notebooks 01 and 02).

Every figure function returns a matplotlib figure made with :func:`portbench.present.figures.figure`;
the notebook saves it with :func:`portbench.present.figures.save`. Sources are always labelled through
:func:`portbench.core.provenance.label`, so a stand-in is marked as one on every axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import polars as pl

from ..data import standins, synth
from ..data.standins import burstgpt as standin_burstgpt, evidence as standin_evidence
from ..data.standins import StandinInputs
from . import figures
from .figures import figure

FIGURE_PREFIX_02 = "02_freeze_windows"

CV_BUCKET_S = 600.0          # inter-arrival CV is computed per 10-minute bucket of arrival time
CV_MIN_REQUESTS = 10         # buckets with fewer requests get no CV (too few gaps to mean anything)
NICE_BINS_S = (1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 6 * 3600.0, 86400.0)
MAX_BINS = 400               # rate-over-time plots use the smallest nice bin giving at most this many bins
TIME_UNITS = ((2 * 86400.0, 86400.0, "days"), (3 * 3600.0, 3600.0, "hours"), (120.0, 60.0, "minutes"),
              (0.0, 1.0, "s"))
P90 = 90
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")
LOG_SCALE_RATIO = 20.0       # window-statistic panels switch to a log axis when max/min exceeds this


# --------------------------------------------------------------------------- tables


def time_unit(span_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for a time axis covering ``span_s`` seconds."""
    for threshold, scale, name in TIME_UNITS:
        if span_s >= threshold:
            return scale, name
    return TIME_UNITS[-1][1], TIME_UNITS[-1][2]


def auto_bin_s(span_s: float) -> float:
    """The smallest of :data:`NICE_BINS_S` that cuts ``span_s`` into at most :data:`MAX_BINS` bins."""
    for b in NICE_BINS_S:
        if span_s / b <= MAX_BINS:
            return b
    return NICE_BINS_S[-1]


def rate_over_time(arrival_s: pl.Series | np.ndarray, bin_s: float | None = None) -> pl.DataFrame:
    """Requests per bin and rate (req/s) over time: columns ``t_s`` (bin start), ``requests``, ``rate_rps``.

    Bins start at the first request. The last bin is cut at the last request: its rate divides by
    the part of the bin the trace covers, and it is dropped when that is less than half a bin
    (too short to give a meaningful rate).
    """
    t = np.asarray(arrival_s, dtype=np.float64)
    if t.size == 0:
        return pl.DataFrame(schema={"t_s": pl.Float64, "requests": pl.Int64, "rate_rps": pl.Float64})
    t0, t1 = float(t.min()), float(t.max())
    b = bin_s or auto_bin_s(t1 - t0)
    edges = t0 + b * np.arange(int(np.floor((t1 - t0) / b)) + 2)
    counts, _ = np.histogram(t, bins=edges)
    width = np.minimum(edges[1:], t1) - edges[:-1]
    keep = width >= b / 2
    return pl.DataFrame({"t_s": edges[:-1][keep], "requests": counts[keep].astype(np.int64),
                         "rate_rps": counts[keep] / width[keep]})


def interarrival_cv_by_bucket(arrival_s: pl.Series | np.ndarray, bucket_s: float = CV_BUCKET_S,
                              min_requests: int = CV_MIN_REQUESTS) -> pl.DataFrame:
    """Coefficient of variation of inter-arrival gaps per bucket: ``t_s``, ``requests``, ``cv``.

    A gap belongs to the bucket of its later request; CV = population std / mean of the gaps
    (1 for a Poisson process, > 1 for bursty arrivals). Null where the bucket has fewer than
    ``min_requests`` requests or all gaps are zero.
    """
    t = np.sort(np.asarray(arrival_s, dtype=np.float64))
    gaps = np.diff(t)
    bucket = np.floor((t[1:] - t[0]) / bucket_s).astype(np.int64) if t.size > 1 else np.array([], np.int64)
    df = pl.DataFrame({"bucket": bucket, "gap": gaps})
    out = (df.group_by("bucket").agg(pl.len().alias("requests"), pl.col("gap").mean().alias("mean"),
                                     pl.col("gap").std(ddof=0).alias("std"))
           .sort("bucket")
           .with_columns((pl.col("bucket") * bucket_s + float(t[0] if t.size else 0.0)).alias("t_s"),
                         pl.when((pl.col("requests") >= min_requests) & (pl.col("mean") > 0))
                         .then(pl.col("std") / pl.col("mean")).otherwise(None).alias("cv")))
    return out.select("t_s", "requests", "cv")


def trace_summary(canonical: pl.DataFrame) -> dict[str, float]:
    """Requests, span, mean rate, overall inter-arrival CV and prompt/output mean, median, p90 of a canonical table."""
    t = np.sort(canonical["arrival_s"].to_numpy())
    gaps = np.diff(t)
    span = float(t[-1] - t[0]) if t.size else 0.0
    out = {"requests": canonical.height, "span_s": span,
           "mean_rate_rps": (t.size - 1) / span if span > 0 else float("nan"),
           "interarrival_cv": float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else float("nan")}
    for col, short in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
        v = canonical[col].to_numpy().astype(np.float64)
        out.update({f"{short}_mean": float(v.mean()), f"{short}_median": float(np.median(v)),
                    f"{short}_p90": float(np.percentile(v, P90))})
    return out


def summary_table(canon_by_source: Mapping[str, pl.DataFrame], labels: Mapping[str, str]) -> pl.DataFrame:
    """One row of :func:`trace_summary` per source, with its display label."""
    rows = [{"source": s, "label": labels.get(s, s), **trace_summary(df)} for s, df in canon_by_source.items()]
    return pl.DataFrame(rows)


# --------------------------------------------------------------------------- figures


def _axes_list(axes) -> list:
    return list(np.atleast_1d(axes).ravel())


def plot_rate_over_time(canon_by_source: Mapping[str, pl.DataFrame], labels: Mapping[str, str],
                        bin_s: float | None = None):
    """Request rate over each trace (one panel per source, its own time axis)."""
    n = len(canon_by_source)
    fig, axes = figure(n, 1, figsize=(8, 2.4 * n), squeeze=False)
    for ax, (s, df) in zip(_axes_list(axes), canon_by_source.items()):
        t = df["arrival_s"]
        r = rate_over_time(t, bin_s)
        b = float(r["t_s"][1] - r["t_s"][0]) if r.height > 1 else (bin_s or 1.0)
        scale, unit = time_unit(float(t.max() - t.min()))
        ax.step(r["t_s"].to_numpy() / scale, r["rate_rps"].to_numpy(), where="post", lw=1)
        ax.set_title(f"{labels.get(s, s)}: {df.height:,} requests, {b:g}-s bins")
        ax.set_xlabel(f"time since the trace's first request ({unit})")
        ax.set_ylabel("request rate (req/s)")
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


def _ecdf(ax, values: np.ndarray, label: str, **kw) -> None:
    v = np.sort(np.asarray(values, dtype=np.float64))
    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label, **kw)


def plot_length_distributions(tables: Mapping[str, pl.DataFrame], labels: Mapping[str, str],
                              title: str | None = None):
    """ECDFs of prompt and output tokens per table (log x axis), two panels; dotted lines mark the medians."""
    fig, axes = figure(1, 2, figsize=(9, 3.4))
    for ax, col, name in zip(axes, ("prompt_tokens", "output_tokens"), ("prompt", "output")):
        for i, (key, df) in enumerate(tables.items()):
            v = df[col].to_numpy()
            _ecdf(ax, v, f"{labels.get(key, key)} (n={df.height:,})", color=f"C{i}")
            ax.axvline(float(np.median(v)), color=f"C{i}", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} length (tokens, log scale)")
        ax.set_ylabel("fraction of requests ≤ x")
        ax.set_ylim(0, 1.02)
    handles, names = axes[0].get_legend_handles_labels()
    fig.suptitle(title or "Prompt and output lengths (dotted: medians)")
    fig.tight_layout()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(names), 2),
               fontsize=8, frameon=False)
    return fig


def plot_interarrival_cv(canon_by_source: Mapping[str, pl.DataFrame], labels: Mapping[str, str],
                         bucket_s: float = CV_BUCKET_S):
    """Inter-arrival CV per time bucket for each source; the dashed line is a Poisson process (CV = 1)."""
    n = len(canon_by_source)
    fig, axes = figure(n, 1, figsize=(8, 2.4 * n), squeeze=False)
    for ax, (s, df) in zip(_axes_list(axes), canon_by_source.items()):
        cv = interarrival_cv_by_bucket(df["arrival_s"], bucket_s).drop_nulls("cv")
        scale, unit = time_unit(float(df["arrival_s"].max() - df["arrival_s"].min()))
        ax.plot(cv["t_s"].to_numpy() / scale, cv["cv"].to_numpy(), marker="o", ms=3, lw=1)
        ax.axhline(1.0, ls="--", color="grey", lw=1, label="Poisson (CV = 1)")
        ax.set_title(f"{labels.get(s, s)}: inter-arrival CV per {bucket_s / 60:g}-min bucket")
        ax.set_xlabel(f"time since the trace's first request ({unit})")
        ax.set_ylabel("inter-arrival CV (–)")
        top = float(cv["cv"].max()) if cv.height else 1.0
        ax.set_ylim(0, max(1.0, top) * 1.3)
        ax.legend(loc="lower right", framealpha=0.9)
    fig.tight_layout()
    return fig


def plot_window_placement(manifest: Mapping, canon_by_source: Mapping[str, pl.DataFrame],
                          labels: Mapping[str, str]):
    """Where the frozen windows sit: each real trace's rate over time with its windows shaded.

    Stand-in windows have no position in a real trace. When the generator has a timeline of its
    own (different ``t_start``), each window is a mark at its start on that timeline; when it has
    none (every window an independent stationary stream, all ``t_start`` equal) each window is a
    bar of its duration. Titles say which.
    """
    by_source: dict[str, list[Mapping]] = {}
    for e in manifest["windows"]:
        by_source.setdefault(e["source"], []).append(e)
    n = len(by_source)
    fig, axes = figure(n, 1, figsize=(8, 2.6 * n), squeeze=False)
    for ax, (s, entries) in zip(_axes_list(axes), by_source.items()):
        starts = np.array([e["t_start"] for e in entries])
        durations = np.array([e["duration_s"] for e in entries])
        if entries[0]["provenance"] == "real" and s in canon_by_source:
            _placement_real(ax, canon_by_source[s]["arrival_s"], starts, durations)
            ax.set_title(f"{labels.get(s, s)}: {len(entries)} windows in the real trace")
        elif np.ptp(starts) == 0:
            scale, unit = time_unit(float(durations.max()))
            ax.barh(np.arange(len(entries)), durations / scale, height=0.8, color="C2")
            ax.set_xlabel(f"window duration ({unit})")
            ax.set_ylabel("window index")
            ax.set_title(f"{labels.get(s, s)}: {len(entries)} synthetic windows, each an independent "
                         "stream (no common timeline)")
        else:
            scale, unit = time_unit(float(np.ptp(starts)))
            ax.scatter(starts / scale, np.arange(len(entries)), marker="o", s=14, color="C2")
            ax.set_xlabel(f"window start on the stand-in generator's timeline ({unit})")
            ax.set_ylabel("window index")
            ax.set_title(f"{labels.get(s, s)}: {len(entries)} synthetic windows (not a real trace)")
            ax.text(0.01, 0.97, f"median window duration {np.median(durations):.3g} s"
                    + (f"\ntimeline: {entries[0]['time_axis']}" if entries[0].get("time_axis") else ""),
                    transform=ax.transAxes, va="top", fontsize=7,
                    bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"})
        ax.yaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def _placement_real(ax, arrival_s: pl.Series, starts: np.ndarray, durations: np.ndarray) -> None:
    scale, unit = time_unit(float(arrival_s.max() - arrival_s.min()))
    r = rate_over_time(arrival_s)
    ax.step(r["t_s"].to_numpy() / scale, r["rate_rps"].to_numpy(), where="post", lw=0.8, color="0.35",
            label="trace request rate")
    for i, (a, d) in enumerate(zip(starts, durations)):
        ax.axvspan(a / scale, (a + d) / scale, color="C1", alpha=0.45, lw=0, label="frozen window" if i == 0 else None)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("request rate (req/s)")
    ax.set_xlabel(f"time since the trace's first request ({unit})")
    ax.legend(loc="upper right", fontsize=7, framealpha=0.9)


STAT_PANELS = (("rate_rps", "request rate (req/s)"), ("interarrival_cv", "inter-arrival CV (–)"),
               ("prompt_mean", "mean prompt length (tokens)"), ("output_mean", "mean output length (tokens)"))


def plot_window_stats(table: pl.DataFrame, panels: Sequence[tuple[str, str]] = STAT_PANELS):
    """Per-window statistics by source (one dot per window over a box plot); labels mark stand-ins."""
    order = list(dict.fromkeys(table["label"].to_list()))
    fig, axes = figure(1, len(panels), figsize=(3.1 * len(panels), 3.6))
    for ax, (col, name) in zip(_axes_list(axes), panels):
        data = [table.filter(pl.col("label") == lab)[col].drop_nulls().to_numpy() for lab in order]
        ax.boxplot(data, showfliers=False, widths=0.5)
        rng = np.random.default_rng(0)  # jitter of the dots only
        for i, d in enumerate(data, start=1):
            ax.scatter(i + rng.uniform(-0.15, 0.15, d.size), d, s=9, alpha=0.7, color=f"C{i - 1}", zorder=3)
        ax.set_xticks(range(1, len(order) + 1), order, fontsize=8, rotation=35,
                      ha="right", rotation_mode="anchor")
        ax.set_ylabel(name)
        values = np.concatenate([d for d in data if d.size]) if any(d.size for d in data) else np.array([])
        if values.size and values.min() > 0 and values.max() / values.min() > LOG_SCALE_RATIO:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(mticker.NullFormatter())
        ax.set_title(name.split(" (")[0], fontsize=10)
    fig.suptitle("Frozen windows: one dot per window")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- window summaries


def window_summary(table: pl.DataFrame) -> pl.DataFrame:
    """Per source (label): windows, provenance and the median over windows of each window statistic."""
    return (table.group_by("source", "label", "provenance", maintain_order=True)
            .agg(pl.len().alias("windows"), pl.col("n_requests").first().alias("requests_per_window"),
                 pl.col("duration_s").median().alias("median_duration_s"),
                 *[pl.col(c).median().alias(f"median_{c}") for c in
                   ("rate_rps", "interarrival_cv", "prompt_mean", "output_mean")],
                 pl.col("rate_rps").min().alias("min_rate_rps"), pl.col("rate_rps").max().alias("max_rate_rps")))


def placement_coverage(manifest: Mapping, canon_by_source: Mapping[str, pl.DataFrame]) -> pl.DataFrame:
    """For each real source: trace span, where the first window starts and the last ends (fraction of the span)."""
    rows = []
    for s, df in canon_by_source.items():
        entries = [e for e in manifest["windows"] if e["source"] == s and e["provenance"] == "real"]
        if not entries:
            continue
        t0, t1 = float(df["arrival_s"].min()), float(df["arrival_s"].max())
        span = t1 - t0
        first = min(e["t_start"] for e in entries)
        last = max(e["t_start"] + e["duration_s"] for e in entries)
        covered = sum(e["duration_s"] for e in entries)
        rows.append({"source": s, "windows": len(entries), "trace_span_s": span,
                     "first_start_frac": (first - t0) / span, "last_end_frac": (last - t0) / span,
                     "covered_frac": covered / span,
                     "requests_in_windows_frac": sum(e["n_requests"] for e in entries) / df.height})
    return pl.DataFrame(rows)


def _is_figure_file(obj) -> bool:
    return isinstance(obj, (str, Path)) and Path(obj).suffix in FIGURE_SUFFIXES and Path(obj).is_file()


def show(obj, heading: str | None = None) -> None:
    """Display a result of unknown shape in a notebook: text as Markdown, tables, figures, dicts of those."""
    from IPython.display import Image, Markdown, display

    if _is_figure_file(obj):
        if Path(obj).suffix == ".png":  # a saved figure: show the PNG, skip its PDF twin
            display(Image(filename=str(obj)))
            plt.close("all")  # the same figure, if its maker left it open, is not shown twice
        return
    if heading:
        display(Markdown(f"**{heading}**"))
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            show(v, str(k))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            show(v)
    elif isinstance(obj, str):
        display(Markdown(obj))
    elif obj is not None:
        display(obj)


# --------------------------------------------------------------------------- ingest (notebook 01)


def ingest_table(report: Mapping) -> pl.DataFrame:
    """One row per source of an ingest report: provenance, file, rows read/valid/excluded (by reason), span, rate."""
    rows = []
    for s, r in (report.get("sources") or {}).items():
        excluded = r.get("excluded") or {}
        rows.append({"source": s, "provenance": r.get("provenance"), "file": r.get("file"),
                     "skipped": bool(r.get("skipped")), "rows_read": r.get("rows_read"),
                     "rows_valid": r.get("rows_valid"), "rows_excluded": sum(excluded.values()) if excluded else 0,
                     "excluded_by_reason": ", ".join(f"{k}: {v:,}" for k, v in excluded.items()) or "none",
                     "span_s": r.get("span_s"), "rate_rps": r.get("rate_rps"),
                     "note": r.get("reason") if r.get("skipped") else ""})
    schema = {"source": pl.String, "provenance": pl.String, "file": pl.String, "skipped": pl.Boolean,
              "rows_read": pl.Int64, "rows_valid": pl.Int64, "rows_excluded": pl.Int64,
              "excluded_by_reason": pl.String, "span_s": pl.Float64, "rate_rps": pl.Float64, "note": pl.String}
    return pl.DataFrame(rows, schema=schema)


def representative_window(table: pl.DataFrame, provenance: str = "real") -> str | None:
    """Id of the window of ``provenance`` whose inter-arrival CV is closest to that provenance's median."""
    t = table.filter(pl.col("provenance") == provenance).drop_nulls("interarrival_cv")
    if t.height == 0:
        return None
    med = t["interarrival_cv"].median()
    return t.sort((pl.col("interarrival_cv") - med).abs(), "id")["id"][0]


# --------------------------------------------------------------------------- stand-ins beside their evidence (02)


def _save_lengths(fig, axes, title: str, name: str, description: str, figures_dir: str | Path) -> list[str]:
    """Finish a stand-in's two length panels (prompt, output ECDFs; log x), title them, save and close."""
    for ax, which in zip(axes, ("prompt", "output")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{which} length (tokens)")
        ax.set_ylabel("cumulative fraction of requests")
    axes[0].legend(loc="lower right", fontsize=7)
    fig.suptitle(title)
    return list(figures.save(fig, f"{FIGURE_PREFIX_02}/{name}", figures_dir, close=True,
                             description=description).values())


def plot_evidence(inp: StandinInputs, figures_dir: str | Path) -> list[str]:
    """Figures of the stand-ins beside their real evidence (PNG + PDF through ``figures.save``)."""
    ev = standins.burstgpt_evidence(inp)
    fit = standins.burstgpt_arrival_estimates(inp)
    bg_windows = standins.standin_windows(inp, "burstgpt")
    bg = pl.concat([df for _, df in bg_windows])
    bg_label, bl_label = inp.label("burstgpt"), inp.label("bailian")
    paths: list[str] = []

    fig, axes = figure(1, 2, figsize=(10, 3.8))
    roll = ev.rollup["numeric_distributions"] if ev.rollup else None
    for ax, metric, raw_key in ((axes[0], "prompt_tokens", "input_tokens"), (axes[1], "output_tokens", "output_tokens")):
        _ecdf(ax, ev.pool[metric].to_numpy(), f"BurstGPT real slices (n={ev.pool.height})")
        _ecdf(ax, bg[metric].to_numpy(), f"{bg_label} (n={bg.height})", linestyle="--")
        if roll:
            xs = [max(float(roll[raw_key][f"p{q}"]), 1.0) for q in standins.PERCENTILES]
            ax.plot(xs, [q / 100 for q in standins.PERCENTILES], "o", color="black",
                    label=f"{standin_burstgpt._rollup_desc(ev)}: " + "/".join(f"p{q}" for q in standins.PERCENTILES))
    paths += _save_lengths(fig, axes, "BurstGPT stand-in lengths vs. the real evidence", "standin_burstgpt_lengths",
                           "ECDFs of prompt and output lengths: BurstGPT stand-in vs the real slices it resamples "
                           "and the third-party percentiles of the first 60k rows", figures_dir)

    real_w = standins.real_burstgpt_windows(inp)
    fig, axes = figure(1, 2, figsize=(10, 3.8))
    real_g = np.concatenate([standins.window_normalised_gaps(g, inp.window_size) for g in ev.gaps])
    std_g = np.concatenate([standin_evidence._norm_gaps(df["arrival_s"].to_numpy()) for _, df in bg_windows])
    floor = 1e-4
    _ecdf(axes[0], np.maximum(real_g, floor), f"BurstGPT real slices ({real_g.size} gaps)")
    _ecdf(axes[0], np.maximum(std_g, floor), f"{bg_label} ({std_g.size} gaps)", linestyle="--")
    axes[0].set_xscale("log")
    axes[0].set_xlabel(f"inter-arrival gap / mean gap of its {inp.window_size}-request window "
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
    paths += list(figures.save(fig, f"{FIGURE_PREFIX_02}/standin_burstgpt_arrivals", figures_dir, close=True,
                               description="BurstGPT stand-in burstiness vs the real slices: ECDF of "
                                           "window-normalised gaps and per-window inter-arrival CVs, with the "
                                           "Gamma CV used and its 95% CI").values())

    bl_windows = standins.standin_windows(inp, "bailian")
    bl = pl.concat([df for _, df in bl_windows])
    q = standins.read_qwen_rows(inp)
    fig, axes = figure(1, 2, figsize=(10, 3.8))
    for ax, metric in zip(axes, ("prompt_tokens", "output_tokens")):
        _ecdf(ax, q[metric].to_numpy(), f"Qwen traceA rows, real, different service (n={q.height})")
        _ecdf(ax, bl[metric].to_numpy(), f"{bl_label} from ServeGen m-small (n={bl.height})", linestyle="--")
    paths += _save_lengths(fig, axes, "Bailian stand-in lengths vs. the only real Qwen rows available (weak comparison)",
                           "standin_bailian_lengths", "ECDFs of prompt and output lengths: Bailian stand-in (ServeGen "
                           "m-small) vs the only real Qwen rows available (a weak comparison: a different service)",
                           figures_dir)

    data = standins.load_servegen(standins.servegen_folder(inp))
    used = data.used_rows()
    days = data.starts / 86400.0
    fig, ax = figure(figsize=(10, 3.8))
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
    paths += list(figures.save(fig, f"{FIGURE_PREFIX_02}/standin_servegen_timeline", figures_dir, close=True,
                               description="ServeGen m-small over 14 days: total request rate and active "
                                           "clients of the used clients, with the Bailian stand-in window "
                                           "starts").values())
    return paths


def counterfactual_demo(inp: StandinInputs, window_df: pl.DataFrame, figures_dir: str | Path, *,
                        window_id: str | None = None, window_label: str = "real window",
                        provenance: str = "real", cv: float | None = None) -> tuple[pl.DataFrame, dict[str, str]]:
    """One window beside its ``burstiness`` variant (:func:`portbench.data.standins.burstiness_comparison`):
    its table and a figure of cumulative arrivals (paths returned)."""
    table, variant, vlabel = standins.burstiness_comparison(window_df, inp.standins.counterfactual,
                                                            window_id=window_id, window_label=window_label,
                                                            provenance=provenance, cv=cv)
    target = float(cv if cv is not None else inp.standins.counterfactual.burstiness_cv)
    fig, ax = figure(figsize=(7, 4))
    for name, df, style in ((window_label, window_df, "-"), (vlabel, variant, "--")):
        a = df["arrival_s"].to_numpy()
        ax.step(a, np.arange(1, a.size + 1), where="post", linestyle=style, label=name)
    ax.set_xlabel("time since the window's first request (s)")
    ax.set_ylabel("requests arrived (count)")
    ax.legend(fontsize=8)
    ax.set_title(f"Same requests and mean rate, different burstiness ({window_id or 'window'})")
    paths = figures.save(fig, f"{FIGURE_PREFIX_02}/counterfactual_burstiness", figures_dir,
                         description=f"cumulative arrivals of window {window_id or '(unnamed)'} and of its "
                                     f"burstiness counterfactual (target CV {target:g}): same requests and "
                                     "span, gaps redrawn")
    return table, paths


# --------------------------------------------------------------------------- learned length predictors


def _err(table: pl.DataFrame, stat: str) -> tuple[np.ndarray, np.ndarray]:
    v = table[stat].to_numpy().astype(float)
    lo = table[f"{stat}_ci_low"].to_numpy().astype(float)
    hi = table[f"{stat}_ci_high"].to_numpy().astype(float)
    return v, np.vstack([np.nan_to_num(v - lo), np.nan_to_num(hi - v)])


def plot_predictor_accuracy(summary: pl.DataFrame):
    """Per source (home predictors): Kendall τ of the regressor (sjf_predicted, edf) and of the ranker
    (ltr) with the true lengths, beside the former noisy oracle's τ; and the MAE of log lengths; 95%
    bootstrap CIs over windows. ``summary`` = :func:`portbench.study.honest.accuracy`'s second table."""
    home = summary.filter(pl.col("home"))
    labels = home["target_label"].to_list()
    x = np.arange(len(labels))
    fig, (ax, ax2) = figure(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    w = 0.27
    for k, (stat, name) in enumerate((("tau", "regressor (sjf_predicted, edf)"), ("ranker_tau", "ranker (ltr)"),
                                      ("noisy_oracle_tau", "former noisy oracle (reads the truth)"))):
        v, e = _err(home, stat)
        ax.bar(x + (k - 1) * w, v, w, yerr=e if stat != "noisy_oracle_tau" else None, capsize=3, label=name,
               hatch="//" if stat == "noisy_oracle_tau" else None, alpha=0.6 if stat == "noisy_oracle_tau" else 1.0)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(x, labels)
    ax.set_ylabel("Kendall τ with the true output length\n(per window, mean over windows)")
    ax.set_ylim(min(-0.05, float(np.nanmin(home["tau"].to_numpy())) - 0.05), 1.0)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Learned predictors, trained outside the frozen windows")
    v, e = _err(home, "mae_log")
    ax2.bar(x, v, 0.5, yerr=e, capsize=3, color="C3")
    ax2.set_xticks(x, labels, rotation=15)
    ax2.set_ylabel("MAE of log length (0.69 = ×2)")
    ax2.set_title("Regressor error")
    fig.tight_layout()
    return fig


def plot_predictor_transfer(summary: pl.DataFrame):
    """Kendall τ of every (trained on -> used on) predictor pair as a heatmap (diagonal: home)."""
    srcs = summary["target"].unique(maintain_order=True).to_list()
    lab = dict(zip(summary["target"], summary["target_label"]))
    M = np.full((len(srcs), len(srcs)), np.nan)
    for r in summary.iter_rows(named=True):
        M[srcs.index(r["train"]), srcs.index(r["target"])] = r["tau"] if r["tau"] is not None else np.nan
    fig, ax = figure(figsize=(5.6, 4.4))
    im = ax.imshow(M, cmap="RdBu", vmin=-1, vmax=1)
    for i in range(len(srcs)):
        for j in range(len(srcs)):
            if np.isfinite(M[i, j]):
                ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", fontsize=10,
                        fontweight="bold" if i == j else None)
    ax.set_xticks(range(len(srcs)), [lab[s] for s in srcs], rotation=30, ha="right")
    ax.set_yticks(range(len(srcs)), [lab[s] for s in srcs])
    ax.set_xlabel("used on (windows of)")
    ax.set_ylabel("trained on")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="Kendall τ with the true lengths")
    ax.set_title("Does a length predictor port?")
    fig.tight_layout()
    return fig
