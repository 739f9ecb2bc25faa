"""Learned output-length predictors: what ``sjf_predicted``, ``ltr`` and ``edf`` know about a request.

A serving system does not know a request's output length when it arrives; it can only *predict*
it from what it sees then. Per source this module trains two models on requests **outside every
frozen window** and freezes their predictions per window; the policies read only those.

**Features** (:func:`feature_spec`, only what a system has at arrival): ``log_prompt`` = log(1 +
prompt tokens), always; where the source has them: ``model`` and ``log_type`` (BurstGPT),
``turn`` and ``req_type`` (Bailian/Qwen JSONL), the stand-in's client (Bailian stand-in), and
``prefix_reuse`` (a trace with prompt block hashes, Mooncake: the share of the prompt's leading blocks
that an earlier request of the trace already carried -- what a prefix cache knows at arrival;
:func:`prefix_reuse`), ``time_of_day_h`` -- only when the source's time axis spans at least
``predictors.time_of_day_min_span_s`` (a day): on a shorter trace (Azure conv: 58 min) the clock is
only the position in the trace, which would let the model interpolate between training requests
just before and just after a window rather than learn anything a deployed system could use. A
seeded synthetic tenant (Azure) is never a feature: it carries no information by construction.
Categories are coded by the training data (the 250 most frequent; unseen values are missing).

**Training data** (:func:`training_data`):

* a *real* source: the canonical rows of its trace that lie outside every window's row range of the
  manifest (recorded: their count and the SHA-256 of their row numbers); windows are rebuilt from
  the same canonical table, so a window row can never be a training row (``tests/test_predictors``).
* the *BurstGPT stand-in* resamples a pool of 782 real rows, so any generator output repeats the
  windows' pairs: a model trained on it would *memorise* (prompt, tenant) -> output. Training
  requests are drawn by the generator's own rule with a seed disjoint from every window's, and
  **cross-fitted**: the requests are split into ``predictors.cross_fit_folds`` folds by a hash of
  their (prompt tokens, model/log type) -- arrival-time features only -- and a window request is
  predicted by the model trained without its fold, i.e. without any request having its
  (prompt, tenant). Its accuracy is therefore that of a model on *unseen* real rows.
* the *Bailian stand-in* draws lengths independently per client from ServeGen's PMFs: training
  requests come from the same generator at seeded start times (seeds disjoint from the windows'),
  rejecting any draw whose time span overlaps a frozen window's.
  Both stand-in training sets are labelled "stand-in generator output" wherever they are shown.

**Models.** ``sjf_predicted`` and ``edf``: scikit-learn's ``HistGradientBoostingRegressor`` on
log(output tokens) (squared error, no early stopping, fixed seed); the prediction is exp(fit), a
geometric-mean estimate. ``ltr``: LightGBM's ``LGBMRanker`` with the LambdaRank objective, as the
learning-to-rank scheduler (Fu et al., NeurIPS'24) trains a ranker rather than a regressor: the
training requests form queries of ``predictors.ranker_group_size`` consecutive requests (one
window's worth); relevance = ``ranker_levels`` quantile grades of the output length within the
query, shortest = most relevant; linear gains and no truncation, because a scheduler needs the
whole order, not a top-k. Its score is negated so that lower = predicted shorter. LightGBM runs
with ``deterministic=True``; both models run single-threaded (OpenMP limited to one thread: deterministic
results, and no oversubscription next to the campaign's workers) and are seeded by ``predictors.seed``.

**Transfer** ("does a predictor port?"): the predictor of source P used on source T's windows. Only
features both sources have can transfer (category values such as models or clients are
source-specific), so the P -> T models are trained on P's training data with the numeric features
common to both (in the study: the prompt length). The diagonal (P = T) is the home predictor.

**Frozen predictions** (:func:`load_predictions`): one parquet file per (target, train) pair,
``{paths.windows_dir}/predictions/<target>__from-<train>__<key>.parquet``: ``window_id,
window_sha256, row, predicted_output, ltr_score``. ``key`` = the first 16 hex digits of the
SHA-256 of the predictor's *fingerprint* (manifest checksum -- which fixes every window's hash and
the source files --, the predictor parameters, the canonical table version, this module's code and
the library versions); the fingerprint and a checksum of the content are in the file's metadata.
Loading checks the fingerprint, every window's SHA-256 against the manifest and the content
checksum: a mismatch is an :class:`~portbench.core.errors.IntegrityError`; a changed parameter gives
another key, and the predictions are recomputed (announced on stderr), never silently reused.
The frozen window tables are never touched: :func:`attach` adds the predictions as extra columns of
the table a run is given (``predicted_output``, ``ltr_score``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import multiprocessing as mp
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from threadpoolctl import threadpool_limits

from . import standins, synth, traces, windows
from ..core import io, procs, progress
from ..core.config import DataSettings, PathsConfig, PredictorsConfig, StandinsConfig
from ..core.errors import DataError, IntegrityError, ParameterError
from ..core.provenance import label
from .registry import store
from .standins.bailian import _bailian_window, load_servegen
from .standins.burstgpt import _burstgpt_pool, _row_weights
from .window_table import columns_of, window_sha256

VERSION = "portbench-predictors-v1"
PREDICTION_COLUMNS = ("predicted_output", "ltr_score")
NUMERIC = ("log_prompt", "time_of_day_h", "turn")
CATEGORICAL = ("model", "log_type", "client", "req_type")
MAX_CATEGORIES = 250
BAILIAN_TRAIN_CHUNK = 500        # requests per generated Bailian training window
DAY_S = 86400.0
FILE_SCHEMA = {"window_id": pl.String, "window_sha256": pl.String, "row": pl.Int64,
               "predicted_output": pl.Float64, "ltr_score": pl.Float64}


def _note(msg: str) -> None:
    progress.note(f"predictors: {msg}")


# --------------------------------------------------------------------------- sources and features


def source_kind(manifest: Mapping, source: str) -> str:
    """``real``, ``burstgpt-standin`` or ``bailian-standin`` (from the manifest's windows)."""
    entries = [e for e in manifest["windows"] if e["source"] == source]
    if not entries:
        raise ParameterError("source", source, "a source with windows in the manifest")
    e = entries[0]
    if e["provenance"] == "real":
        return "real"
    name = (e.get("generator") or {}).get("name")
    if name == standins.BURSTGPT_GENERATOR:
        return "burstgpt-standin"
    if name == standins.BAILIAN_GENERATOR:
        return "bailian-standin"
    raise DataError(e.get("file") or source, f"no predictor for stand-in generator {name!r}")


@dataclass(frozen=True)
class FeatureSpec:
    """The arrival-time features of one source's predictor, and why the others are not used."""

    source: str
    kind: str
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    notes: dict = field(default_factory=dict, compare=False)   # feature -> why (not) used

    @property
    def columns(self) -> tuple[str, ...]:
        return self.numeric + self.categorical

    def transfer_to(self, other: "FeatureSpec") -> "FeatureSpec":
        """The features a predictor of this source can carry to ``other``: the common numeric ones."""
        num = tuple(f for f in self.numeric if f in other.numeric)
        return FeatureSpec(self.source, self.kind, num, (),
                           {"transfer": f"numeric features both {self.source} and {other.source} have; "
                                        "category values (models, clients, ...) are source-specific"})


def prefix_reuse(canonical: pl.DataFrame) -> np.ndarray:
    """Per canonical row (in the table's order): the share of its prompt blocks (``block_hashes``) in the leading run
    that earlier requests of the trace already carried -- a prefix cache's hit share at arrival (blocks match as a
    prefix: the run stops at the first block not seen before). "Earlier" is (arrival_s, row) order, so the
    feature uses only the past. NaN where a row has no hashes."""
    if "block_hashes" not in canonical.columns or canonical.height == 0:
        return np.full(canonical.height, np.nan)
    order = np.lexsort((canonical["row"].to_numpy(), canonical["arrival_s"].to_numpy()))
    hashes = canonical["block_hashes"].to_list()
    seen: set = set()
    out = np.full(canonical.height, np.nan)
    for i in order:
        h = hashes[i]
        if not h:
            continue
        k = 0
        while k < len(h) and h[k] in seen:
            k += 1
        out[i] = k / len(h)
        seen.update(h)
    return out


def with_history(canonical: pl.DataFrame) -> pl.DataFrame:
    """``canonical`` with the features that need the trace's past (``prefix_reuse`` where it has block hashes);
    unchanged when they are there already or the trace has no hashes."""
    if "prefix_reuse" in canonical.columns or not _present(canonical, "block_hashes"):
        return canonical
    return canonical.with_columns(pl.Series("prefix_reuse", prefix_reuse(canonical), dtype=pl.Float64))


def _present(df: pl.DataFrame, col: str) -> bool:
    return col in df.columns and df[col].null_count() < df.height


def feature_spec(P: PredictorsConfig, manifest: Mapping, source: str,
                 canonical: pl.DataFrame | None = None) -> FeatureSpec:
    """The features of ``source``'s predictor (module docstring); ``canonical`` for a real source."""
    kind = source_kind(manifest, source)
    notes: dict[str, str] = {"log_prompt": "log(1 + prompt tokens): known at arrival"}
    if kind == "burstgpt-standin":
        notes.update({"model": "model of the resampled real row", "log_type": "log type of the resampled real row",
                      "time_of_day_h": "not used: the stand-in is a stationary renewal process (no clock)"})
        return FeatureSpec(source, kind, ("log_prompt",), ("model", "log_type"), notes)
    if kind == "bailian-standin":
        notes.update({"client": "ServeGen client (the stand-in's tenant): its own length PMFs",
                      "time_of_day_h": "time of day on the 14-day ServeGen clock (the PMFs change per 6-h bucket)",
                      "note": "the generator draws prompt and output independently per client: the prompt length "
                              "carries no information beyond the client"})
        return FeatureSpec(source, kind, ("log_prompt", "time_of_day_h"), ("client",), notes)
    if canonical is None:
        raise ValueError("a real source's feature spec needs its canonical table")
    numeric, cat = ["log_prompt"], []
    span = float(canonical["arrival_s"].max() - canonical["arrival_s"].min()) if canonical.height else 0.0
    if span >= P.time_of_day_min_span_s:
        numeric.append("time_of_day_h")
        notes["time_of_day_h"] = ("time of day (arrival seconds from the trace's first request, mod 24 h; "
                                  f"the trace spans {span / 3600:.0f} h)")
    else:
        notes["time_of_day_h"] = (f"not used: the trace spans {span / 3600:.1f} h < "
                                  f"{P.time_of_day_min_span_s / 3600:.0f} h, so the clock is only the position "
                                  "in the trace (it would interpolate between training rows around a window)")
    if _present(canonical, "block_hashes"):
        numeric.append("prefix_reuse")
        notes["prefix_reuse"] = ("share of the prompt's leading blocks (block_hashes) already carried by an earlier "
                                 "request of the trace: a prefix cache's hit share at arrival (a continued "
                                 "conversation or a shared template)")
    else:
        notes["prefix_reuse"] = "not used: the trace has no prompt block hashes"
    if _present(canonical, "turn"):
        numeric.append("turn")
        notes["turn"] = "conversation turn (1 = first request of a conversation; > 1 has a parent request)"
    for col, why in (("model", "model requested"), ("log_type", "log type (conversation / API)"),
                     ("req_type", "request type")):
        if _present(canonical, col):
            cat.append(col)
            notes[col] = why
    rule = (manifest.get("sources", {}).get(source, {}).get("tenants") or {}).get("rule")
    if rule == "seeded":
        notes["tenant"] = "not used: the windows' tenants are a seeded synthetic assignment, not a trace field"
    if "session_id" in canonical.columns:
        notes["session_id"] = "not used: a conversation identifier (its turn is used)"
    return FeatureSpec(source, kind, tuple(numeric), tuple(cat), notes)


def _raw_frame(prompt, output, *, t_s=None, model=None, log_type=None, client=None, turn=None,
               req_type=None, prefix_reuse=None) -> pl.DataFrame:
    """The raw feature frame every feature is computed from (missing columns are null)."""
    n = len(prompt)

    def col(v, dtype):
        return pl.Series(v, dtype=dtype) if v is not None else pl.Series([None] * n, dtype=dtype)

    return pl.DataFrame({"prompt_tokens": col(prompt, pl.Int64), "output_tokens": col(output, pl.Int64),
                         "t_s": col(t_s, pl.Float64), "model": col(model, pl.String),
                         "log_type": col(log_type, pl.String), "client": col(client, pl.String),
                         "turn": col(turn, pl.Float64), "req_type": col(req_type, pl.String),
                         "prefix_reuse": col(prefix_reuse, pl.Float64)})


def _canonical_frame(rows: pl.DataFrame) -> pl.DataFrame:
    def get(c, dtype=None):
        if c not in rows.columns:
            return None
        s = rows[c]
        return s.cast(dtype) if dtype is not None else s
    return _raw_frame(rows["prompt_tokens"], rows["output_tokens"], t_s=rows["arrival_s"],
                      model=get("model", pl.String), log_type=get("log_type", pl.String),
                      turn=get("turn", pl.Float64), req_type=get("req_type", pl.String),
                      prefix_reuse=get("prefix_reuse", pl.Float64))


@dataclass
class Encoder:
    """Turns a raw feature frame into the model matrix of a :class:`FeatureSpec`."""

    spec: FeatureSpec
    categories: dict[str, list[str]]

    @classmethod
    def fit(cls, spec: FeatureSpec, frame: pl.DataFrame) -> "Encoder":
        cats = {}
        for c in spec.categorical:
            counts = frame[c].drop_nulls().value_counts(sort=False)
            top = counts.sort(["count", c], descending=[True, False]).head(MAX_CATEGORIES)[c].to_list()
            cats[c] = sorted(top)
        return cls(spec, cats)

    def matrix(self, frame: pl.DataFrame) -> np.ndarray:
        cols = []
        for f in self.spec.numeric:
            if f == "log_prompt":
                cols.append(np.log1p(frame["prompt_tokens"].to_numpy().astype(float)))
            elif f == "time_of_day_h":
                t = frame["t_s"].cast(pl.Float64).to_numpy()
                cols.append(np.mod(t, DAY_S) / 3600.0)
            elif f in ("turn", "prefix_reuse"):
                cols.append(frame[f].cast(pl.Float64).fill_null(np.nan).to_numpy())
        for c in self.spec.categorical:
            code = {v: float(i) for i, v in enumerate(self.categories[c])}
            vals = frame[c].to_list()
            cols.append(np.array([code.get(v, np.nan) if v is not None else np.nan for v in vals], dtype=float))
        return np.column_stack(cols) if cols else np.zeros((frame.height, 0))

    @property
    def categorical_mask(self) -> np.ndarray:
        return np.array([False] * len(self.spec.numeric) + [True] * len(self.spec.categorical))


# --------------------------------------------------------------------------- training data


@dataclass
class TrainingData:
    """One source's training requests (raw feature frame with ``output_tokens``, in arrival order),
    the cross-fit fold of each (None: no cross-fitting), and what they are."""

    source: str
    frame: pl.DataFrame
    folds: np.ndarray | None
    record: dict
    rows: np.ndarray | None = None      # canonical row numbers (real sources)


def window_row_ranges(manifest: Mapping, source: str) -> list[tuple[int, int]]:
    """``(row_start, row_end)`` of every frozen window of a real source (file rows, inclusive)."""
    return [(int(e["row_start"]), int(e["row_end"])) for e in manifest["windows"]
            if e["source"] == source and e["provenance"] == "real"]


def _fold_of(prompt: np.ndarray, group: Sequence[str], k: int) -> np.ndarray:
    """Cross-fit fold of each request from a hash of (prompt tokens, group): arrival-time features only."""
    return np.array([synth.name_key(f"{int(p)}|{g}") % k for p, g in zip(prompt, group)], dtype=np.int64)


def _standin_inputs(paths: PathsConfig, manifest: Mapping, source: str) -> tuple[dict, Any]:
    """The first window's generator params of a stand-in source, after verifying its evidence."""
    entry = next(e for e in manifest["windows"] if e["source"] == source)
    st = store(paths)
    params = entry["generator"]["params"]
    standins.verify_evidence(st, params["evidence"])
    return params, standins.mirror_of(st)


def training_data(P: PredictorsConfig, paths: PathsConfig, standins_cfg: StandinsConfig, manifest: Mapping,
                  source: str, canonical: pl.DataFrame | None = None) -> TrainingData:
    """The requests ``source``'s predictor is trained on (module docstring): a real source's from its
    ``canonical`` table (:func:`portbench.data.traces.load_canonical`), a stand-in's drawn from its evidence
    (``paths``, seeded by ``standins_cfg.seed``, the ``standins`` section, and ``predictors.seed``)."""
    kind = source_kind(manifest, source)
    if kind == "real":
        if canonical is None:
            raise ValueError(f"training data of the real source {source} needs its canonical table")
        canonical = with_history(canonical)
        ranges = window_row_ranges(manifest, source)
        rows = canonical["row"].to_numpy()
        inside = np.zeros(rows.size, dtype=bool)
        for a, b in ranges:
            inside |= (rows >= a) & (rows <= b)
        train = canonical.filter(pl.Series(~inside)).sort("row")
        trows = train["row"].to_numpy().astype(np.int64)
        rec = {"kind": "trace rows outside every frozen window", "label": "real trace rows",
               "file": canonical["file"][0] if canonical.height else None,
               "requests": int(train.height), "excluded_window_rows": int(inside.sum()),
               "windows": len(ranges), "rows_sha256": hashlib.sha256(trows.tobytes()).hexdigest()}
        return TrainingData(source, _canonical_frame(train), None, rec, rows=trows)
    n = int(P.standin_train_requests)
    params, root = _standin_inputs(paths, manifest, source)
    seed = synth.derive_seed(standins_cfg.seed, source, "predictor-train", P.seed)
    window_seeds = {int(e["generator"]["seed"]) for e in manifest["windows"] if e["source"] == source}
    if kind == "burstgpt-standin":
        pool, _, _ = _burstgpt_pool(root, params["slices"])
        if pool.height != params["pairs"]["n"]:
            raise IntegrityError(f"BurstGPT stand-in: {pool.height} valid pairs in the slices, the generator "
                                 f"recorded {params['pairs']['n']}")
        if seed in window_seeds:
            raise IntegrityError("predictor training seed collides with a window seed")
        idx = synth.resample_pairs(pool.height, n, synth.rng_from(seed),
                                   _row_weights(pool, params["pairs"]["log_type_weights"]))
        rows = pool[idx]
        frame = _raw_frame(rows["prompt_tokens"], rows["output_tokens"], model=rows["model"].fill_null("unknown"),
                           log_type=rows["log_type"].fill_null("unknown"))
        folds = _fold_of(rows["prompt_tokens"].to_numpy(), rows["tenant"].to_list(), P.cross_fit_folds)
        rec = {"kind": "stand-in generator output (seed disjoint from the windows')",
               "label": "BurstGPT stand-in generator output (pairs resampled from the 782 real slice rows)",
               "generator": standins.BURSTGPT_GENERATOR, "requests": n, "pool_rows": int(pool.height),
               "distinct_pool_pairs_drawn": int(np.unique(idx).size), "seed": int(seed),
               "cross_fit": {"folds": int(P.cross_fit_folds), "group": "(prompt tokens, model/log type)",
                             "rule": "a window request is predicted by the model trained without its fold"}}
        return TrainingData(source, frame, folds, rec)
    # bailian-standin
    data = load_servegen(root / params["servegen_dir"])
    spans = [(float(e["t_start"]), float(e["t_start"]) + float(e["duration_s"]))
             for e in manifest["windows"] if e["source"] == source]
    total = float(data.n_windows * data.window_s)
    chunks, frames, rejected, k = -(-n // BAILIAN_TRAIN_CHUNK), list[pl.DataFrame](), 0, 0
    while len(frames) < chunks:
        s_k = synth.derive_seed(seed, k)
        k += 1
        if s_k in window_seeds:
            continue
        start = float(synth.rng_from(s_k, "placement").random() * total)
        try:
            df, info = _bailian_window(data, {**params, "start_s": start, "size": BAILIAN_TRAIN_CHUNK}, s_k)
        except DataError:          # too close to the end of the trace
            rejected += 1
            continue
        t0 = float(info["t_first_s"])
        t1 = t0 + float(df["arrival_s"][-1])
        if any(t0 <= b and a <= t1 for a, b in spans):
            rejected += 1
            continue
        frames.append(_raw_frame(df["prompt_tokens"], df["output_tokens"], t_s=df["arrival_s"] + t0,
                                 client=df["tenant"]))
        if k > 20 * chunks + 100:
            raise DataError(params["servegen_dir"], "cannot place Bailian training windows outside the frozen ones")
    frame = pl.concat(frames).head(n)
    rec = {"kind": "stand-in generator output (seed disjoint from the windows')",
           "label": "Bailian stand-in generator output (ServeGen m-small clients)",
           "generator": standins.BAILIAN_GENERATOR, "requests": int(frame.height),
           "training_windows": len(frames), "window_size": BAILIAN_TRAIN_CHUNK,
           "rejected_placements": rejected, "seed": int(seed),
           "rule": "start times uniform over the 14-day trace; a draw overlapping a frozen window's span is rejected"}
    return TrainingData(source, frame, None, rec)


# --------------------------------------------------------------------------- models


def _ranker_labels(output: np.ndarray, group: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Query sizes (consecutive rows, the last short query merged into the previous one) and relevance
    grades: ``levels`` quantile grades of the output length within each query, shortest = highest."""
    n = output.size
    sizes = [group] * (n // group)
    rest = n - group * len(sizes)
    if rest:
        if sizes and rest < 2:
            sizes[-1] += rest
        else:
            sizes.append(rest)
    from scipy.stats import rankdata   # scipy, scikit-learn and lightgbm only where a predictor is trained or scored

    labels = np.empty(n, dtype=np.int64)
    pos = 0
    for s in sizes:
        o = output[pos:pos + s]
        r = rankdata(o, method="min") - 1            # 0 = shortest; ties share a grade
        labels[pos:pos + s] = (levels - 1) - np.minimum((levels * r) // s, levels - 1)
        pos += s
    return np.asarray(sizes, dtype=np.int64), labels


@dataclass
class Model:
    """A fitted pair (regressor, ranker) with its encoder."""

    encoder: Encoder
    regressor: Any
    ranker: Any

    def predict(self, frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """``(predicted_output, ltr_score)``: tokens (>= 1) and a score (lower = predicted shorter)."""
        X = self.encoder.matrix(frame)
        with threadpool_limits(1):
            pred = np.maximum(np.exp(self.regressor.predict(X)), 1.0)
        score = -np.asarray(self.ranker.predict(X, num_threads=1), dtype=float)
        return pred, score


def fit_model(P: PredictorsConfig, spec: FeatureSpec, frame: pl.DataFrame) -> Model:
    """Fit the regressor (log length) and the LambdaRank ranker on ``frame`` (rows in arrival order)."""
    from lightgbm import LGBMRanker
    from sklearn.ensemble import HistGradientBoostingRegressor

    enc = Encoder.fit(spec, frame)
    X = enc.matrix(frame)
    y = frame["output_tokens"].to_numpy().astype(float)
    mask = enc.categorical_mask
    reg = HistGradientBoostingRegressor(loss="squared_error", early_stopping=False, random_state=P.seed,
                                        categorical_features=mask if mask.any() else None, **P.regressor)
    with threadpool_limits(1):   # one thread: deterministic, and no OpenMP oversubscription on a busy machine
        reg.fit(X, np.log(y))
    sizes, labels = _ranker_labels(y, P.ranker_group_size, P.ranker_levels)
    rk = LGBMRanker(objective="lambdarank", label_gain=list(range(P.ranker_levels)),
                    lambdarank_truncation_level=int(sizes.max()), random_state=P.seed, deterministic=True,
                    force_row_wise=True, n_jobs=1, verbose=-1, **P.ranker)
    cat_idx = [int(i) for i in np.nonzero(mask)[0]]
    rk.fit(X, labels, group=sizes, categorical_feature=cat_idx if cat_idx else "auto")
    return Model(enc, reg, rk)


@dataclass
class Predictor:
    """One source's fitted predictor: the home model (or one per cross-fit fold) and its record."""

    source: str
    spec: FeatureSpec
    models: list[Model]          # one model, or one per fold (cross-fitted)
    training: TrainingData
    fit_s: float

    def predict(self, frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        if len(self.models) == 1:
            return self.models[0].predict(frame)
        k = len(self.models)
        group = [f"{m}/{lt}" for m, lt in zip(frame["model"].fill_null("unknown").to_list(),
                                             frame["log_type"].fill_null("unknown").to_list())]
        folds = _fold_of(frame["prompt_tokens"].to_numpy(), group, k)
        pred = np.empty(frame.height)
        score = np.empty(frame.height)
        for f in range(k):
            sel = folds == f
            if sel.any():
                pred[sel], score[sel] = self.models[f].predict(frame.filter(pl.Series(sel)))
        return pred, score

    def info(self) -> dict:
        return {"source": self.source, "kind": self.spec.kind, "features": list(self.spec.columns),
                "numeric": list(self.spec.numeric), "categorical": list(self.spec.categorical),
                "notes": dict(self.spec.notes), "train_rows": int(self.training.frame.height),
                "training": dict(self.training.record), "models": len(self.models), "fit_s": round(self.fit_s, 2),
                "regressor": "sklearn HistGradientBoostingRegressor on log(output tokens)",
                "ranker": "LightGBM LGBMRanker, objective lambdarank"}


def fit_predictor(P: PredictorsConfig, spec: FeatureSpec, training: TrainingData) -> Predictor:
    """Fit ``training`` with ``spec``: one model, or one per cross-fit fold when ``training.folds`` is set."""
    t0 = time.perf_counter()
    if training.folds is None:
        models = [fit_model(P, spec, training.frame)]
    else:
        models = [fit_model(P, spec, training.frame.filter(pl.Series(training.folds != f)))
                  for f in range(int(training.folds.max()) + 1)]
    return Predictor(training.source, spec, models, training, time.perf_counter() - t0)


# --------------------------------------------------------------------------- window features


def window_frames(manifest: Mapping, source: str, tables: Mapping[str, pl.DataFrame],
                  canonical: pl.DataFrame | None = None) -> dict[str, pl.DataFrame]:
    """Raw feature frames of the source's windows, in window row order (real windows: the canonical
    rows, checked against the window table)."""
    kind = source_kind(manifest, source)
    out = {}
    for e in manifest["windows"]:
        if e["source"] != source:
            continue
        wid = e["id"]
        df = tables[wid]
        if kind == "real":
            canonical = with_history(canonical)
            rows = (canonical.filter(pl.col("row").is_between(e["row_start"], e["row_end"]))
                    .sort(["arrival_s", "row"], maintain_order=True))
            frame = _canonical_frame(rows)
            if not (np.array_equal(frame["prompt_tokens"].to_numpy(), df["prompt_tokens"].to_numpy())
                    and np.array_equal(frame["output_tokens"].to_numpy(), df["output_tokens"].to_numpy())):
                raise IntegrityError(f"window {wid}: canonical rows {e['row_start']}..{e['row_end']} do not match "
                                     "the frozen window table")
        elif kind == "burstgpt-standin":
            parts = [t.split("/", 1) if "/" in t else [t, "unknown"] for t in df["tenant"].to_list()]
            frame = _raw_frame(df["prompt_tokens"], df["output_tokens"], model=[p[0] for p in parts],
                               log_type=[p[1] for p in parts])
        else:
            frame = _raw_frame(df["prompt_tokens"], df["output_tokens"],
                               t_s=df["arrival_s"] + float(e["t_start"]), client=df["tenant"])
        out[wid] = frame
    return out


# --------------------------------------------------------------------------- fingerprints and files


def _code_sha() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def fingerprint(P: PredictorsConfig, standins_cfg: StandinsConfig, manifest: Mapping, train: str, target: str) -> dict:
    """Everything the (train -> target) predictions depend on (module docstring): the ``predictors`` section
    ``P``, the stand-ins' seed (``standins_cfg``), the manifest's checksum, this module's code ..."""
    return {"version": VERSION, "train": train, "target": target, "manifest": manifest["checksum"],
            "params": {"seed": P.seed, "standin_train_requests": P.standin_train_requests,
                       "cross_fit_folds": P.cross_fit_folds, "time_of_day_min_span_s": P.time_of_day_min_span_s,
                       "ranker_group_size": P.ranker_group_size, "ranker_levels": P.ranker_levels,
                       "regressor": dict(P.regressor), "ranker": dict(P.ranker)},
            "standins_seed": standins_cfg.seed, "canonical_version": traces.CANONICAL_VERSION,
            "code": _code_sha(),
            "libraries": {"scikit-learn": _version("scikit-learn"), "lightgbm": _version("lightgbm"),
                          "numpy": np.__version__}}


def _version(dist: str) -> str:
    """The installed version of distribution ``dist`` (its metadata: the same string as the package's
    ``__version__``, without importing it -- a campaign reads the fingerprint of predictions it does not train)."""
    return importlib.metadata.version(dist)


def fingerprint_key(fp: Mapping) -> str:
    return io.sha256_hex(fp)[:16]


def predictions_dir(paths: PathsConfig) -> Path:
    return Path(paths.windows_dir) / "predictions"


def predictions_path(paths: PathsConfig, train: str, target: str, key: str) -> Path:
    return predictions_dir(paths) / f"{target}__from-{train}__{key}.parquet"


def _content_sha(df: pl.DataFrame) -> str:
    h = hashlib.sha256()
    for c in FILE_SCHEMA:
        col = df[c]
        h.update(c.encode() + b"\0")
        h.update("\n".join(col.to_list()).encode() if col.dtype == pl.String else col.to_numpy().tobytes())
    return h.hexdigest()


def _read_file(path: Path, fp: Mapping, manifest: Mapping, target: str) -> tuple[pl.DataFrame, dict]:
    meta = io.read_meta(path) or {}
    if meta.get("fingerprint") != io.plain(fp):
        raise IntegrityError(f"{path}: its recorded predictor fingerprint differs from the one its name claims; "
                             "delete it to recompute")
    df = pl.read_parquet(path)
    if df.columns != list(FILE_SCHEMA) or _content_sha(df) != meta.get("content_sha256"):
        raise IntegrityError(f"{path}: content does not match its recorded checksum; delete it to recompute")
    want = {e["id"]: e["sha256"] for e in manifest["windows"] if e["source"] == target}
    got = dict(df.select("window_id", "window_sha256").unique().iter_rows())
    if got != want:
        bad = sorted(w for w in set(want) | set(got) if want.get(w) != got.get(w))
        raise IntegrityError(f"{path}: window hashes differ from the manifest's for {bad[:3]}; delete it to recompute")
    return df, meta


@dataclass
class Frozen:
    """The frozen predictions of one (train -> target) pair and their record."""

    train: str
    target: str
    table: pl.DataFrame          # FILE_SCHEMA columns
    info: dict                   # predictor info (features, train rows, ...) + fingerprint key
    path: Path

    def window(self, wid: str) -> pl.DataFrame:
        return self.table.filter(pl.col("window_id") == wid).sort("row")


def _compute(data: DataSettings, P: PredictorsConfig, manifest: Mapping, train: str, targets: Sequence[str],
             tables: Mapping[str, pl.DataFrame]) -> dict[str, Frozen]:
    """Train ``train``'s predictor (home and transfer models as needed) and freeze its predictions."""
    canon = {s: with_history(traces.load_canonical(data, s)) for s in {train, *targets}
             if source_kind(manifest, s) == "real"}
    specs = {s: feature_spec(P, manifest, s, canon.get(s)) for s in {train, *targets}}
    training = training_data(P, data.paths, data.standins, manifest, train, canon.get(train))
    out = {}
    home = None
    transfer: dict = {}       # one model per feature set: targets sharing the common features share the model
    for target in targets:
        t0 = time.perf_counter()
        if target == train:
            home = home or fit_predictor(P, specs[train], training)
            pred = home
        else:
            spec = specs[train].transfer_to(specs[target])
            spec_key = (spec.numeric, spec.categorical)
            if spec_key not in transfer:
                transfer[spec_key] = fit_model(P, spec, training.frame)
            pred = Predictor(train, spec, [transfer[spec_key]], training, 0.0)
            pred.fit_s = time.perf_counter() - t0
        frames = window_frames(manifest, target, tables, canon.get(target))
        parts = []
        for wid, frame in frames.items():
            p, s = pred.predict(frame)
            parts.append(pl.DataFrame({"window_id": [wid] * frame.height,
                                       "window_sha256": [window_sha256(tables[wid])] * frame.height,
                                       "row": np.arange(frame.height, dtype=np.int64),
                                       "predicted_output": p, "ltr_score": s}, schema=FILE_SCHEMA))
        df = pl.concat(parts)
        fp = fingerprint(P, data.standins, manifest, train, target)
        key = fingerprint_key(fp)
        info = {**pred.info(), "train_source": train, "target": target, "key": key,
                "train_label": label(train, manifest["sources"][train]["provenance"]),
                "target_label": label(target, manifest["sources"][target]["provenance"])}
        path = predictions_path(data.paths, train, target, key)
        io.write_parquet_atomic(df, path, {"fingerprint": fp, "key": key, "content_sha256": _content_sha(df),
                                           "info": info})
        out[target] = Frozen(train, target, df, info, path)
    return out


def sources_of(manifest: Mapping) -> list[str]:
    """Sources with windows, in manifest order."""
    seen: list[str] = []
    for e in manifest["windows"]:
        if e["source"] not in seen:
            seen.append(e["source"])
    return seen


def load_predictions(data: DataSettings, P: PredictorsConfig, pairs: Iterable[tuple[str, str]] | None = None, *,
                     manifest: Mapping, workers: int = 1) -> dict[tuple[str, str], Frozen]:
    """Frozen predictions ``{(train, target): Frozen}`` (default pairs: every source's home predictor),
    read and verified, or computed and written when missing (module docstring; ``data``: where the tables are and
    how they are read, ``P``: the ``predictors`` section, ``workers``: processes that may train at once)."""
    srcs = sources_of(manifest)
    pairs = [(s, s) for s in srcs] if pairs is None else list(pairs)
    for tr, tg in pairs:
        for s, what in ((tr, "train"), (tg, "target")):
            if s not in srcs:
                raise ParameterError(f"predictor {what} source", s, "a source with windows: " + ", ".join(srcs))
    out: dict[tuple[str, str], Frozen] = {}
    todo: dict[str, list[str]] = {}
    for tr, tg in pairs:
        fp = fingerprint(P, data.standins, manifest, tr, tg)
        path = predictions_path(data.paths, tr, tg, fingerprint_key(fp))
        if path.is_file():
            df, meta = _read_file(path, fp, manifest, tg)
            out[(tr, tg)] = Frozen(tr, tg, df, meta.get("info", {}), path)
        else:
            todo.setdefault(tr, []).append(tg)
    if todo:
        tables = windows.load_windows(data, manifest=manifest)
        for tr, targets in todo.items():
            _note(f"training the {tr} predictor for {', '.join(targets)} (no frozen predictions with this "
                  f"fingerprint under {predictions_dir(data.paths)})")
        workers = min(int(workers), len(todo))
        bar = progress.bar(sum(len(t) for t in todo.values()),
                           f"predictors: {len(todo)} source(s) on {max(workers, 1)} process(es)", "predictor")
        try:
            for tr, got in _train_all(data, P, manifest, todo, tables, workers, bar):
                for tg, fr in got.items():
                    out[(tr, tg)] = fr
                bar.set_postfix_str(f"{tr} done", refresh=False)
                bar.update(len(got))
        finally:
            bar.close()
    return {p: out[p] for p in pairs}


def _train_all(data: DataSettings, P: PredictorsConfig, manifest: Mapping, todo: Mapping[str, list], tables: Mapping,
               workers: int, bar=None):
    """``(train source, {target: Frozen})`` for every train source of ``todo``: in this process, or (``workers``
    > 1) on a spawn-context process pool, the longest trainings first (``bar``, a progress bar, is redrawn while
    they run). Each model trains on one thread with a fixed seed, so the predictions are the same however they
    are spread over processes."""
    if workers <= 1:
        for tr, targets in todo.items():
            if bar is not None:
                bar.set_postfix_str(f"training {tr}")
            yield tr, _compute(data, P, manifest, tr, targets, tables)
        return
    order = sorted(todo, key=lambda tr: (source_kind(manifest, tr) != "standin", tr))   # stand-ins train longest
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=procs.die_with_parent) as pool:
        futures = {pool.submit(_compute, data, P, manifest, tr, todo[tr], tables): tr for tr in order}
        for f in (progress.completed(futures, bar) if bar is not None else as_completed(futures)):
            yield futures[f], f.result()


def all_pairs(manifest: Mapping) -> list[tuple[str, str]]:
    """Every ordered (train, target) pair of the manifest's sources, home pairs included."""
    s = sources_of(manifest)
    return [(a, b) for a in s for b in s]


def attach(data: DataSettings, P: PredictorsConfig, tables: Mapping[str, pl.DataFrame], *, manifest: Mapping,
           train: str | None = None, workers: int = 1) -> dict[str, pl.DataFrame]:
    """``tables`` (window id -> frozen window table) with the frozen predictions added as columns
    ``predicted_output`` and ``ltr_score`` (home predictor, or source ``train``'s; :func:`load_predictions`). The
    input tables are not modified; a window whose hash differs from the predictions' is an IntegrityError."""
    by_id = {e["id"]: e for e in manifest["windows"]}
    missing = [w for w in tables if w not in by_id]
    if missing:
        raise DataError(windows.manifest_path(data.paths), f"windows {missing[:3]} are not in the manifest")
    pairs = sorted({(train or by_id[w]["source"], by_id[w]["source"]) for w in tables})
    frozen = load_predictions(data, P, pairs, manifest=manifest, workers=workers)
    out = {}
    for wid, df in tables.items():
        src = by_id[wid]["source"]
        fr = frozen[(train or src, src)].window(wid)
        got = window_sha256(df.select(columns_of(df)))
        if fr.height != df.height or (fr.height and fr["window_sha256"][0] != got):
            raise IntegrityError(f"window {wid}: the frozen predictions belong to a window with sha256 "
                                 f"{fr['window_sha256'][0] if fr.height else None}, this table hashes to {got}")
        out[wid] = df.with_columns(fr["predicted_output"].alias("predicted_output"), fr["ltr_score"].alias("ltr_score"))
    return out


def predictor_info(data: DataSettings, P: PredictorsConfig, *, manifest: Mapping) -> dict[str, dict]:
    """``{source: info}`` of every home predictor (features, notes, train rows, training record, key)."""
    return {tr: fr.info for (tr, _), fr in load_predictions(data, P, manifest=manifest).items()}


# --------------------------------------------------------------------------- accuracy


def _nan_stat(fn, a, b) -> float:
    if np.unique(a).size < 2 or np.unique(b).size < 2:
        return float("nan")
    return float(fn(a, b)[0])


def window_accuracy(pred: np.ndarray, score: np.ndarray, true: np.ndarray) -> dict:
    """Kendall tau-b and Spearman rho of the prediction and of the ranker score with the true lengths,
    and the MAE of log lengths (natural log)."""
    from scipy import stats as sstats

    t = np.asarray(true, dtype=float)
    return {"tau": _nan_stat(sstats.kendalltau, pred, t), "spearman": _nan_stat(sstats.spearmanr, pred, t),
            "mae_log": float(np.mean(np.abs(np.log(pred) - np.log(t)))),
            "ranker_tau": _nan_stat(sstats.kendalltau, score, t),
            "ranker_spearman": _nan_stat(sstats.spearmanr, score, t)}


ACCURACY_SCHEMA = {"train": pl.String, "target": pl.String, "window_id": pl.String, "n": pl.Int64,
                   "tau": pl.Float64, "spearman": pl.Float64, "mae_log": pl.Float64, "ranker_tau": pl.Float64,
                   "ranker_spearman": pl.Float64, "noisy_oracle_tau": pl.Float64}


def accuracy_table(data: DataSettings, P: PredictorsConfig, sigma: float,
                   pairs: Iterable[tuple[str, str]] | None = None, *, manifest: Mapping,
                   workers: int = 1) -> pl.DataFrame:
    """One row per (train, target, window): the accuracy of the frozen predictions on that window
    (:func:`window_accuracy`); home pairs also carry the noisy oracle's tau (true x exp(N(0, sigma)),
    ``sigma`` = ``simulation.predictor_sigma``, seeded per window) for comparison."""
    from scipy import stats as sstats

    pairs = all_pairs(manifest) if pairs is None else list(pairs)
    frozen = load_predictions(data, P, pairs, manifest=manifest, workers=workers)
    tables = windows.load_windows(data, manifest=manifest)
    sigma = float(sigma)
    rows = []
    for (tr, tg), fr in frozen.items():
        for e in manifest["windows"]:
            if e["source"] != tg:
                continue
            wid = e["id"]
            true = tables[wid]["output_tokens"].to_numpy()
            w = fr.window(wid)
            acc = window_accuracy(w["predicted_output"].to_numpy(), w["ltr_score"].to_numpy(), true)
            noisy = float("nan")
            if tr == tg:
                z = synth.rng_from(P.seed, wid, "noisy-oracle").standard_normal(true.size)
                noisy = _nan_stat(sstats.kendalltau, true * np.exp(sigma * z), true)
            rows.append({"train": tr, "target": tg, "window_id": wid, "n": int(true.size), **acc,
                         "noisy_oracle_tau": noisy})
    return pl.DataFrame(rows, schema=ACCURACY_SCHEMA)


def _boot_ci(x: np.ndarray, B: int, rng: np.random.Generator) -> list[float | None]:
    x = x[np.isfinite(x)]
    if B <= 0 or x.size < 2:
        return [None, None]
    idx = rng.integers(0, x.size, size=(B, x.size))
    m = x[idx].mean(axis=1)
    return [float(v) for v in np.percentile(m, [2.5, 97.5])]


ACCURACY_STATS = ("tau", "spearman", "mae_log", "ranker_tau", "ranker_spearman", "noisy_oracle_tau")


def accuracy_summary(acc: pl.DataFrame, bootstrap: int, seed: int) -> dict[tuple[str, str], dict]:
    """Per (train, target): the mean over windows of each accuracy statistic with a 95% percentile
    bootstrap CI (windows resampled with replacement; ``bootstrap`` resamples, seeded per pair)."""
    out = {}
    for (tr, tg), part in acc.group_by(["train", "target"], maintain_order=True):
        rng = synth.rng_from(seed, tr, tg, "accuracy-bootstrap")
        d: dict[str, Any] = {"windows": part.height}
        for s in ACCURACY_STATS:
            x = part[s].to_numpy().astype(float)
            if not np.isfinite(x).any():
                continue
            d[s] = float(np.nanmean(x))
            d[f"{s}_ci"] = _boot_ci(x, bootstrap, rng)
            d[f"{s}_windows"] = int(np.isfinite(x).sum())
        out[(tr, tg)] = d
    return out


def repeat_share(data: DataSettings, P: PredictorsConfig, source: str, *, manifest: Mapping) -> dict:
    """How much of a source's window requests a predictor could have seen *exactly*: the share whose
    (prompt, output) pair also occurs among the training requests of the model that predicts them
    (for a cross-fitted stand-in: the other folds), and the share whose prompt length occurs there.
    Repeats are a property of the trace (templated requests), not a leak -- but they explain a high tau."""
    kind = source_kind(manifest, source)
    canon = with_history(traces.load_canonical(data, source)) if kind == "real" else None
    td = training_data(P, data.paths, data.standins, manifest, source, canon)
    tables = windows.load_windows(data, sources=[source], manifest=manifest)
    k = int(td.folds.max()) + 1 if td.folds is not None else 1
    tp, to = td.frame["prompt_tokens"].to_numpy(), td.frame["output_tokens"].to_numpy()
    folds = td.folds if td.folds is not None else np.zeros(tp.size, dtype=np.int64)
    pairs = [set(zip(tp[folds != f].tolist(), to[folds != f].tolist())) if k > 1 else set(zip(tp.tolist(), to.tolist()))
             for f in range(k)]
    prompts = [set(tp[folds != f].tolist()) if k > 1 else set(tp.tolist()) for f in range(k)]
    n = same_pair = same_prompt = 0
    for df in tables.values():
        p, o = df["prompt_tokens"].to_list(), df["output_tokens"].to_list()
        wf = _fold_of(np.asarray(p), df["tenant"].to_list(), k) if k > 1 else np.zeros(len(p), dtype=np.int64)
        for pi, oi, f in zip(p, o, wf.tolist()):
            n += 1
            same_pair += (pi, oi) in pairs[f]
            same_prompt += pi in prompts[f]
    return {"requests": n, "same_pair_share": same_pair / n if n else None,
            "same_prompt_share": same_prompt / n if n else None}


def past_only_check(data: DataSettings, P: PredictorsConfig, source: str, *, manifest: Mapping,
                    workers: int = 1) -> dict | None:
    """A causal variant of a real source's predictor: trained only on out-of-window rows *before* the
    second half of the windows begins, evaluated on that second half, beside the home predictor
    (trained on rows before and after every window) on the same windows. A large drop would mean the
    home predictor profits from rows after a window (drift it could not know in deployment).
    None for stand-ins (no time order between the generator's training output and the windows)."""
    if source_kind(manifest, source) != "real":
        return None
    canon = with_history(traces.load_canonical(data, source))
    td = training_data(P, data.paths, data.standins, manifest, source, canon)
    entries = [e for e in manifest["windows"] if e["source"] == source]
    late = entries[len(entries) // 2:]
    cut = int(late[0]["row_start"])
    sel = td.rows < cut
    spec = feature_spec(P, manifest, source, canon)
    model = fit_model(P, spec, td.frame.filter(pl.Series(sel)))
    tables = windows.load_windows(data, sources=[source], manifest=manifest)
    frames = window_frames(manifest, source, tables, canon)
    home = load_predictions(data, P, [(source, source)], manifest=manifest, workers=workers)[(source, source)]
    tau_past, tau_home = [], []
    for e in late:
        true = tables[e["id"]]["output_tokens"].to_numpy()
        p, _ = model.predict(frames[e["id"]])
        tau_past.append(window_accuracy(p, -p, true)["tau"])
        h = home.window(e["id"])["predicted_output"].to_numpy()
        tau_home.append(window_accuracy(h, -h, true)["tau"])
    return {"train_rows": int(sel.sum()), "windows": len(late), "first_row_evaluated": cut,
            "tau_past_only": float(np.nanmean(tau_past)), "tau_home": float(np.nanmean(tau_home))}
