"""The metric registry and the one function that computes every metric from per-request records.

The simulator and the vLLM replay both produce a records table (one row per request):
``req_id, arrival_s, first_token_s (NaN: no token yet), finish_s (NaN: unfinished), prompt_tokens,
output_tokens, generated_tokens, preemptions, rejected, tenant, service_s``; :func:`compute` turns it
into ``{metric: value}`` for an observation horizon ``horizon_s`` (seconds from the window start).

Definitions (all requests arriving after the horizon are outside the observation and ignored):

* **rejected** requests (never fit in the KV cache) are excluded from every metric below; the
  campaign counts them separately. "Admitted" = not rejected.
* a request is **completed** when ``finish_s <= horizon_s``; a first token counts when
  ``first_token_s <= horizon_s``.
* **Censoring.** Latency metrics are over *all admitted* requests, so that a scheduler cannot look
  better by finishing fewer requests: an unfinished request's E2E is censored at the horizon
  (``horizon − arrival``, a lower bound of its true E2E), and so is its TTFT when it has no first
  token within the horizon. Slowdown and normalised latency use the censored E2E (lower bounds).
* **TPOT** = (finish − first token) / (output − 1), over *completed* requests with output > 1 only
  (an unfinished request has no defined per-token time; censoring it would mix units).
* **SLO attainment** ``slo_<name>`` = fraction of admitted requests that completed within the
  horizon with TTFT <= ttft_s AND TPOT <= tpot_s (requests with one output token: TTFT only).
* **Throughput** counts output tokens generated within the horizon, finished or not (partial
  progress of unfinished requests counts: ``generated_tokens`` must be the count at the horizon;
  a record that finished after the horizon — a replay that drained — is truncated by linear
  interpolation between its first token and its finish), divided by ``horizon_s``.
* **Fairness**: Jain's index over x_i = 1 / slowdown_i = service_s / E2E_i (the share of
  isolated speed a request received; in (0, 1] in the simulator). Jain's index is defined for
  allocations where more is better, so it takes x = 1/slowdown: 1 = every request slowed down
  by the same factor, 1/n = one request got everything. Requests with zero observed time are left
  out (their x is undefined).
* Percentiles use numpy's default (linear interpolation). Empty sets give NaN.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable, Mapping, NamedTuple

import numpy as np

from ..core import config
from ..core.errors import DataError, ParameterError, check_choices


class Metric(NamedTuple):
    """A registered metric: name, "higher"/"lower" is better, unit, what it measures."""

    name: str
    direction: str
    unit: str
    description: str


RECORD_COLUMNS = ("req_id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                  "generated_tokens", "preemptions", "rejected", "tenant", "service_s")
_NEEDED = ("arrival_s", "first_token_s", "finish_s", "output_tokens", "generated_tokens", "rejected",
           "service_s")
SLO_PREFIX = "slo_"

# Built-in metrics in their canonical order; slo_<name> entries are inserted after throughput.
_BUILTIN: tuple[Metric, ...] = (
    Metric("completed", "higher", "requests", "requests that finished within the observation horizon"),
    Metric("throughput_tok_s", "higher", "tokens/s",
           "output tokens generated within the horizon (unfinished requests' progress included) / horizon"),
    Metric("ttft_p50", "lower", "s", "median time to first token; censored at the horizon"),
    Metric("ttft_p99", "lower", "s", "99th-percentile time to first token; censored at the horizon"),
    Metric("tpot_mean", "lower", "s/token", "mean time per output token after the first (completed requests)"),
    Metric("tpot_p99", "lower", "s/token", "99th-percentile time per output token (completed requests)"),
    Metric("e2e_mean", "lower", "s", "mean end-to-end latency; unfinished requests censored at the horizon"),
    Metric("e2e_p99", "lower", "s", "99th-percentile end-to-end latency; censored at the horizon"),
    Metric("norm_latency_mean", "lower", "s/token", "mean of E2E / output tokens (censored E2E)"),
    Metric("jain_fairness", "higher", "index in (0, 1]",
           "Jain's index over 1/slowdown (slowdown = E2E / isolated service time)"),
    Metric("max_slowdown", "lower", "x", "largest E2E / isolated service time (censored E2E)"),
)
METRICS: dict[str, Metric] = {m.name: m for m in _BUILTIN}


def slo_metric(name: str, spec: Mapping | None = None) -> Metric:
    """The Metric of SLO definition ``name`` (``simulation.slo.<name>``)."""
    what = (f"TTFT <= {spec['ttft_s']:g} s and TPOT <= {spec['tpot_s']:g} s" if spec
            else "TTFT and TPOT within the SLO's targets")
    return Metric(SLO_PREFIX + name, "higher", "fraction of requests",
                  f"fraction of admitted requests completed within the horizon with {what}")


# ---------------------------------------------------------------- custom metrics


class RequestView(NamedTuple):
    """Derived per-request arrays over the *admitted, observed* requests (what custom metrics see)."""

    done: np.ndarray        # bool: completed within the horizon
    ttft: np.ndarray        # s, censored at the horizon
    e2e: np.ndarray         # s, censored at the horizon
    tpot: np.ndarray        # s/token, completed requests with output > 1 only (shorter array)
    tokens: np.ndarray      # output tokens generated within the horizon
    output_tokens: np.ndarray
    slowdown: np.ndarray    # e2e / service_s
    horizon_s: float


_CUSTOM: dict[str, Callable[[RequestView], float]] = {}


def register_metric(metric: Metric, fn: Callable[[RequestView], float]) -> Metric:
    """Add a metric computed by ``fn(view) -> float``; it joins metric_names and compute()."""
    if metric.direction not in ("higher", "lower"):
        raise ParameterError(f"metric {metric.name}.direction", metric.direction, "higher or lower")
    if metric.name in METRICS or metric.name.startswith(SLO_PREFIX):
        raise ParameterError("metric", metric.name, "a name not already registered and not slo_*")
    METRICS[metric.name] = metric
    _CUSTOM[metric.name] = fn
    return metric


def unregister_metric(name: str) -> None:
    """Remove a metric added by :func:`register_metric` (built-ins stay)."""
    if name in _CUSTOM:
        del _CUSTOM[name], METRICS[name]


# ---------------------------------------------------------------- names and directions


def _slo_names(slo) -> list[str]:
    """SLO names of ``slo`` (a mapping name -> definition, or names); None: default.yaml's."""
    if slo is None:
        slo = config.load().simulation.slo
    return [str(k) for k in slo]


def metric_names(slo: Mapping | Iterable[str] | None = None) -> list[str]:
    """Every metric name, in canonical order, with ``slo_<name>`` for each SLO definition in ``slo``
    (``simulation.slo``; None -> default.yaml's)."""
    slos = [SLO_PREFIX + s for s in _slo_names(slo)]
    fixed = [m.name for m in _BUILTIN]
    return fixed[:2] + slos + fixed[2:] + list(_CUSTOM)


def selected_metrics(spec, slo: Mapping | Iterable[str] | None = None) -> list[str]:
    """``analysis.metrics`` (``spec``: "all" or a list) checked against :func:`metric_names`."""
    return check_choices("analysis.metrics", spec, metric_names(slo))


def metric(name: str) -> Metric:
    """The registered Metric (``slo_*`` names resolve to the SLO template)."""
    if name in METRICS:
        return METRICS[name]
    if name.startswith(SLO_PREFIX) and len(name) > len(SLO_PREFIX):
        return slo_metric(name[len(SLO_PREFIX):])
    raise ParameterError("metric", name, "one of " + ", ".join(METRICS) + ", or slo_<name>")


def direction(name: str) -> str:
    """"higher" or "lower" (which is better)."""
    return metric(name).direction


def table(slo: Mapping | None = None) -> list[Metric]:
    """The metrics in canonical order, SLO metrics with their definitions (``slo``: name -> {ttft_s,
    tpot_s}; None -> default.yaml's)."""
    if slo is None:
        slo = config.load().simulation.slo_dicts
    return ([m for m in _BUILTIN[:2]] + [slo_metric(n, s.as_dict() if hasattr(s, "as_dict") else dict(s)) for n, s in slo.items()] + list(_BUILTIN[2:])
            + [METRICS[n] for n in _CUSTOM])


def check_slo_defs(slo_defs: Mapping, param: str = "simulation.slo") -> None:
    """Each SLO needs positive numbers ``ttft_s`` and ``tpot_s``."""
    if not isinstance(slo_defs, Mapping):
        raise ParameterError(param, slo_defs, "a mapping name -> {ttft_s, tpot_s}")
    for name, spec in slo_defs.items():
        if not isinstance(spec, Mapping) or set(spec) != {"ttft_s", "tpot_s"}:
            raise ParameterError(f"{param}.{name}", spec, "a mapping with exactly ttft_s and tpot_s")
        for k in ("ttft_s", "tpot_s"):
            v = spec[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ParameterError(f"{param}.{name}.{k}", v, "a positive number of seconds")


# ---------------------------------------------------------------- computation


def _arrays(records) -> dict[str, np.ndarray]:
    """Needed columns as numpy arrays (polars DataFrame, or any mapping of array-likes)."""
    cols = getattr(records, "columns", None)
    names = list(cols) if cols is not None else list(records)
    missing = [c for c in _NEEDED if c not in names]
    if missing:
        raise DataError("records", f"missing columns {missing}; expected {list(RECORD_COLUMNS)}")
    out = {}
    for c in _NEEDED:
        col = records[c]
        to_numpy = getattr(col, "to_numpy", None)
        if c == "rejected":
            if getattr(col, "null_count", lambda: 0)():
                col = col.fill_null(False)
                to_numpy = col.to_numpy
            out[c] = np.asarray(to_numpy() if to_numpy else col, dtype=bool)
        else:
            out[c] = np.asarray(to_numpy() if to_numpy else col, dtype=float)
    return out


def _pct(x: np.ndarray, q) -> np.ndarray:
    return np.percentile(x, q) if x.size else np.full(np.shape(q), np.nan)


def compute(records, horizon_s: float, slo_defs: Mapping[str, Mapping]) -> dict[str, float]:
    """Every metric of one run, keyed by :func:`metric_names` order (definitions: module docstring).

    ``records``: polars DataFrame (or mapping of arrays) with the records columns; ``horizon_s``:
    end of the observation window; ``slo_defs``: ``{name: {"ttft_s": …, "tpot_s": …}}``.
    """
    h = float(horizon_s)
    if not h > 0:
        raise ParameterError("horizon_s", horizon_s, "a positive number of seconds")
    a = _arrays(records)
    arr, ft, fin, out = a["arrival_s"], a["first_token_s"], a["finish_s"], a["output_tokens"]
    adm = ~a["rejected"] & (arr <= h)
    if not adm.all():
        arr, ft, fin, out = arr[adm], ft[adm], fin[adm], out[adm]
        gen, svc = a["generated_tokens"][adm], a["service_s"][adm]
    else:
        gen, svc = a["generated_tokens"], a["service_s"]
    n = arr.size
    with np.errstate(invalid="ignore", divide="ignore"):
        done = fin <= h                       # NaN -> False
        has_tok = ft <= h
        ttft = np.where(has_tok, ft, h) - arr
        e2e = np.where(done, fin, h) - arr
        # tokens within the horizon: finished -> all; drained past the horizon -> interpolated;
        # unfinished -> generated_tokens (as counted at the horizon)
        late = ~done & (fin > h) & has_tok
        tokens = np.where(done, out, np.minimum(gen, out))
        if late.any():
            frac = (h - ft[late]) / (fin[late] - ft[late])
            tokens[late] = np.minimum(1.0 + (out[late] - 1.0) * frac, out[late])
        multi = done & (out > 1)
        tpot_all = (fin - ft) / (out - 1.0)
        tpot = tpot_all[multi]
        slowdown = e2e / svc
        pos = e2e > 0
        x = svc[pos] / e2e[pos]

    res: dict[str, float] = {"completed": float(done.sum()), "throughput_tok_s": float(tokens.sum() / h)}
    for name, spec in slo_defs.items():
        ok = done & (ttft <= spec["ttft_s"]) & (~(out > 1) | (tpot_all <= spec["tpot_s"]))
        res[SLO_PREFIX + name] = float(ok.sum() / n) if n else float("nan")
    ttft_q = _pct(ttft, [50, 99])
    res["ttft_p50"], res["ttft_p99"] = float(ttft_q[0]), float(ttft_q[1])
    res["tpot_mean"] = float(tpot.mean()) if tpot.size else float("nan")
    res["tpot_p99"] = float(_pct(tpot, 99))
    res["e2e_mean"] = float(e2e.mean()) if n else float("nan")
    res["e2e_p99"] = float(_pct(e2e, 99))
    res["norm_latency_mean"] = float((e2e / out).mean()) if n else float("nan")
    sx = x.sum()
    res["jain_fairness"] = float(sx * sx / (x.size * np.dot(x, x))) if x.size else float("nan")
    res["max_slowdown"] = float(slowdown.max()) if n else float("nan")
    if _CUSTOM:
        view = RequestView(done, ttft, e2e, tpot, tokens, out, slowdown, h)
        for name, fn in _CUSTOM.items():
            res[name] = float(fn(view))
    return res
