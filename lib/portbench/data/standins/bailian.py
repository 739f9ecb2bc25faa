"""The Bailian stand-in: superposed per-client renewal processes and length PMFs from ServeGen's
statistics of Bailian production (see :mod:`portbench.data.standins`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .. import synth
from ...core import io
from ...core.errors import DataError
from .common import _CACHE, StandinInputs, evidence_sha256

SERVEGEN_TRACE_COLUMNS = ("start", "rate", "cv", "pattern", "shape", "scale")
SERVEGEN_FAMILIES = {"Gamma": "gamma", "Weibull": "weibull"}


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
    digest = io.tree_sha256(folder)
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


def servegen_folder(inp: StandinInputs) -> Path:
    """The ServeGen folder of the Bailian stand-in."""
    return inp.mirror / inp.standins.bailian.servegen_dir


def _bailian_params(inp: StandinInputs, data: ServeGenData, size: int, start_s: float, index: int, n: int) -> dict:
    total = data.n_windows * data.window_s
    return {
        "size": int(size),
        "evidence": evidence_sha256(inp, "bailian"),
        "servegen_dir": inp.standins.bailian.servegen_dir,
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


def read_qwen_rows(inp: StandinInputs) -> pl.DataFrame:
    """The real Qwen traceA rows (166, a thinned stratified sample): ``timestamp, prompt_tokens,
    output_tokens, window``."""
    path = inp.mirror / inp.standins.bailian.qwen_rows
    if not path.is_file():
        raise DataError(path, "Qwen rows not found")
    df = pl.read_csv(path)
    need = ("timestamp", "input_length", "output_length", "window")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}")
    return df.select(pl.col("timestamp").cast(pl.Float64), pl.col("input_length").cast(pl.Int64).alias("prompt_tokens"),
                     pl.col("output_length").cast(pl.Int64).alias("output_tokens"), pl.col("window").cast(pl.Int64))


def servegen_client_table(inp: StandinInputs) -> pl.DataFrame:
    """One row per ServeGen client: files present, excluded, active windows, rates, patterns."""
    data = load_servegen(servegen_folder(inp))
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


def servegen_estimates(inp: StandinInputs) -> dict[str, Any]:
    """Client counts, activity per 600-s window, and the Weibull shape check of the ServeGen folder."""
    data = load_servegen(servegen_folder(inp))
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


def servegen_length_mixture(inp: StandinInputs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The used clients' token PMFs over the 14 days, mixed with weights = expected requests
    (rate x 600 s of every active window, each window mapped to its bucket by ServeGen's rule):
    ``{"prompt_tokens": (values, probs), "output_tokens": (values, probs)}``."""
    data = load_servegen(servegen_folder(inp))
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
