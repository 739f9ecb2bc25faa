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
* **Per-request slowdown fairness** ``slowdown_jain``: Jain's index over x_i = 1 / slowdown_i =
  service_s / E2E_i (the share of isolated speed a request received; in (0, 1] in the simulator).
  Jain's index is defined for allocations where more is better, so it takes x = 1/slowdown: 1 =
  every request slowed down by the same factor, 1/n = one request got everything. Requests with
  zero observed time are left out (their x is undefined). It says nothing about tenants.
* **Per-tenant fairness as VTC defines it** (Sheng et al., OSDI'24). A tenant's *service* is VTC's
  counter: weighted tokens served, ``w_prompt`` (1) per prompt token, charged when the request's
  prefill completes (its first token), plus ``w_output`` (2) per generated token; a request's
  tokens are spread linearly between its first token and its finish (or the horizon, for an
  unfinished one: up to its ``generated_tokens``), the only timing the records carry. A tenant is
  *backlogged* while one of its requests has arrived and not yet received its first token (it
  waits for service). ``tenant_service_gap``: the largest difference in service received by two
  tenants over an interval during which both were continuously backlogged — max over tenant pairs
  and over their common backlogged stretches of (max − min) of S_f − S_g, exact for the piecewise
  linear service curves (VTC bounds exactly this quantity). ``tenant_jain``: Jain's index over
  tenants of each tenant's service *rate while backlogged* (service received while backlogged /
  time backlogged; what VTC equalises). Both are NaN ("n/a") when the run has fewer than two
  tenants — in particular for sources without a tenant field run with ``simulation.tenant_model:
  trace`` (every request is tenant ``NO_TENANT``).
* Percentiles use numpy's default (linear interpolation). Empty sets give NaN.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Callable, Mapping, NamedTuple

import numpy as np

from ..core import config
from ..core.errors import DataError, ParameterError, check_choices
from .loops import LazyLoop


SCALES = ("ratio", "proportion", "count")


class Metric(NamedTuple):
    """A registered metric: name, "higher"/"lower" is better, unit, what it measures, and its scale.

    ``scale`` says how a difference between two schedulers is sized (the practical threshold of the
    analysis): ``"ratio"`` (latencies, throughput, slowdowns: positive quantities compared by their
    relative difference), ``"proportion"`` (SLO attainment, fairness indices: values in [0, 1]
    compared in absolute percentage points) or ``"count"`` (a number of the window's requests,
    compared in percentage points of the window's size)."""

    name: str
    direction: str
    unit: str
    description: str
    scale: str = "ratio"


NO_TENANT = "n/a"          # the tenant of every request of a run without tenants
TENANT_WEIGHTS = (1.0, 2.0)  # VTC's (w_prompt, w_output): service = prompt tokens + 2 x output tokens
TENANT_METRICS = ("tenant_service_gap", "tenant_jain")
RECORD_COLUMNS = ("req_id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                  "generated_tokens", "preemptions", "rejected", "tenant", "service_s")
_NEEDED = ("arrival_s", "first_token_s", "finish_s", "output_tokens", "generated_tokens", "rejected",
           "service_s")
SLO_PREFIX = "slo_"

# Built-in metrics in their canonical order; slo_<name> entries are inserted after throughput.
_BUILTIN: tuple[Metric, ...] = (
    Metric("completed", "higher", "requests", "requests that finished within the observation horizon", "count"),
    Metric("throughput_tok_s", "higher", "tokens/s",
           "output tokens generated within the horizon (unfinished requests' progress included) / horizon"),
    Metric("ttft_p50", "lower", "s", "median time to first token; censored at the horizon"),
    Metric("ttft_p90", "lower", "s", "90th-percentile time to first token; censored at the horizon"),
    Metric("ttft_p95", "lower", "s", "95th-percentile time to first token; censored at the horizon"),
    Metric("ttft_p99", "lower", "s", "99th-percentile time to first token; censored at the horizon"),
    Metric("tpot_mean", "lower", "s/token", "mean time per output token after the first (completed requests)"),
    Metric("tpot_p90", "lower", "s/token", "90th-percentile time per output token (completed requests)"),
    Metric("tpot_p95", "lower", "s/token", "95th-percentile time per output token (completed requests)"),
    Metric("tpot_p99", "lower", "s/token", "99th-percentile time per output token (completed requests)"),
    Metric("e2e_mean", "lower", "s", "mean end-to-end latency; unfinished requests censored at the horizon"),
    Metric("e2e_p90", "lower", "s", "90th-percentile end-to-end latency; censored at the horizon"),
    Metric("e2e_p95", "lower", "s", "95th-percentile end-to-end latency; censored at the horizon"),
    Metric("e2e_p99", "lower", "s", "99th-percentile end-to-end latency; censored at the horizon"),
    Metric("norm_latency_mean", "lower", "s/token", "mean of E2E / output tokens (censored E2E)"),
    Metric("slowdown_jain", "higher", "index in (0, 1]",
           "per-request fairness: Jain's index over 1/slowdown (slowdown = E2E / isolated service time)",
           "proportion"),
    Metric("tenant_service_gap", "lower", "weighted tokens",
           "VTC fairness: largest service difference between two tenants over an interval both were backlogged "
           "(service = prompt + 2 x output tokens served); n/a without tenants"),
    Metric("tenant_jain", "higher", "index in (0, 1]",
           "VTC fairness: Jain's index over tenants of the service rate each received while backlogged; "
           "n/a without tenants", "proportion"),
    Metric("max_slowdown", "lower", "x", "largest E2E / isolated service time (censored E2E)"),
)
METRICS: dict[str, Metric] = {m.name: m for m in _BUILTIN}


def slo_metric(name: str, spec: Mapping | None = None) -> Metric:
    """The Metric of SLO definition ``name`` (``simulation.slo.<name>``)."""
    what = (f"TTFT <= {spec['ttft_s']:g} s and TPOT <= {spec['tpot_s']:g} s" if spec
            else "TTFT and TPOT within the SLO's targets")
    return Metric(SLO_PREFIX + name, "higher", "fraction of requests",
                  f"fraction of admitted requests completed within the horizon with {what}", "proportion")


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
    if metric.scale not in SCALES:
        raise ParameterError(f"metric {metric.name}.scale", metric.scale, " | ".join(SCALES))
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


def scale(name: str) -> str:
    """"ratio", "proportion" or "count" (how a difference is sized; see :class:`Metric`)."""
    return metric(name).scale


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
    if "prompt_tokens" in names:
        col = records["prompt_tokens"]
        out["prompt_tokens"] = np.asarray(col.to_numpy() if hasattr(col, "to_numpy") else col, dtype=float)
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
    if not x.size:
        return np.full(np.shape(q), np.nan)
    if x.dtype != np.float64 or x.ndim != 1 or np.isnan(x).any():
        return np.percentile(x, q)
    return _percentile_linear(x, q)


def _percentile_linear(x: np.ndarray, q) -> np.ndarray:
    """``numpy.percentile(x, q)`` (method ``linear``) of a non-empty 1-D float64 array without NaN, by the same
    operations in the same order as numpy's own (``_quantile``: virtual index ``(n - 1) * q / 100``, its
    neighbours, clipped at the last element, gamma, ``_lerp``) without its generic layers: the same floats,
    a fraction of the time (``tests/test_metrics.py`` holds the two equal)."""
    s = np.sort(x)
    n = s.shape[0]
    vi = (n - 1) * np.true_divide(q, 100)
    prev = np.floor(vi)
    nxt = prev + 1
    above = vi >= n - 1
    prev[above] = -1
    nxt[above] = -1
    pi = prev.astype(np.intp)
    a, b = s[pi], s[nxt.astype(np.intp)]
    t = np.asarray(vi - pi, dtype=vi.dtype)
    diff_b_a = b - a
    out = np.add(a, diff_b_a * t)
    np.subtract(b, diff_b_a * (1 - t), out=out, where=t >= 0.5, casting="unsafe", dtype=type(out.dtype))
    return out


def compute(records, horizon_s: float, slo_defs: Mapping[str, Mapping], *, tenant_index=None) -> dict[str, float]:
    """Every metric of one run, keyed by :func:`metric_names` order (definitions: module docstring).

    ``records``: polars DataFrame (or mapping of arrays) with the records columns; ``horizon_s``:
    end of the observation window; ``slo_defs``: ``{name: {"ttft_s": …, "tpot_s": …}}``;
    ``tenant_index``: ``numpy.unique(tenant as strings, return_inverse=True)`` of the records' ``tenant``
    column when the caller has it (the runs of one window share it; None: computed here).
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
    tails = (90, 95, 99)
    ttft_q = _pct(ttft, [50, *tails])
    res["ttft_p50"] = float(ttft_q[0])
    res.update({f"ttft_p{q}": float(v) for q, v in zip(tails, ttft_q[1:])})
    res["tpot_mean"] = float(tpot.mean()) if tpot.size else float("nan")
    res.update({f"tpot_p{q}": float(v) for q, v in zip(tails, _pct(tpot, list(tails)))})
    res["e2e_mean"] = float(e2e.mean()) if n else float("nan")
    res.update({f"e2e_p{q}": float(v) for q, v in zip(tails, _pct(e2e, list(tails)))})
    res["norm_latency_mean"] = float((e2e / out).mean()) if n else float("nan")
    sx = x.sum()
    res["slowdown_jain"] = float(sx * sx / (x.size * np.dot(x, x))) if x.size else float("nan")
    if tenant_index is None:
        tenant = _tenants(records, adm)
        index = None
    else:
        tenant, index = _tenants_indexed(tenant_index, adm)
    gap, jain = tenant_fairness(tenant, arr, ft, fin, a["prompt_tokens"][adm] if "prompt_tokens" in a else None,
                                out, gen, h, index=index) if tenant is not None else (float("nan"), float("nan"))
    res["tenant_service_gap"], res["tenant_jain"] = gap, jain
    res["max_slowdown"] = float(slowdown.max()) if n else float("nan")
    if _CUSTOM:
        view = RequestView(done, ttft, e2e, tpot, tokens, out, slowdown, h)
        for name, fn in _CUSTOM.items():
            res[name] = float(fn(view))
    return res


# ---------------------------------------------------------------- per-tenant (VTC) fairness


def _tenants(records, keep: np.ndarray) -> np.ndarray | None:
    """Tenant labels of the kept rows; None when there is no tenant column or fewer than two tenants."""
    cols = getattr(records, "columns", None)
    names = list(cols) if cols is not None else list(records)
    if "tenant" not in names:
        return None
    col = records["tenant"]
    if hasattr(col, "n_unique"):
        if col.n_unique() < 2:        # the common case of a run without tenants: no conversion
            return None
        vals = col.cast(str).to_numpy()
    else:
        vals = np.asarray(list(col), dtype=object).astype(str)
    vals = vals[keep]
    return vals if np.unique(vals).size >= 2 else None


def _tenants_indexed(tenant_index, keep: np.ndarray):
    """:func:`_tenants` and ``numpy.unique(..., return_inverse=True)`` of the kept rows, from the index of all
    rows (``(names, inverse)``): the same labels and indices. ``(None, None)`` with fewer than two tenants kept."""
    names, inv = tenant_index
    inv = np.asarray(inv).reshape(-1)
    if not keep.all():
        inv = inv[keep]
    present = np.unique(inv)
    if present.size < 2:
        return None, None
    idx = np.searchsorted(present, inv)
    return idx, (names[present], idx)


def service_curves(tenant: np.ndarray, arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray,
                   prompt: np.ndarray | None, output: np.ndarray, generated: np.ndarray, horizon_s: float,
                   weights: tuple[float, float] = TENANT_WEIGHTS, tenant_index=None):
    """VTC service per tenant at every event time (see the module docstring).

    Returns ``(tenants, times, S, backlogged)``: ``S[t, e]`` = weighted tokens served to tenant t up to
    ``times[e]`` (right-continuous), ``backlogged[t, e]`` = tenant t was waiting throughout
    ``(times[e], times[e+1])`` (shape ``(T, E-1)``). ``tenant_index``: ``np.unique(tenant,
    return_inverse=True)`` when the caller has it.
    """
    h = float(horizon_s)
    wp, wo = weights
    ft = np.where(np.isfinite(first_token) & (first_token <= h), first_token, np.inf)
    has_tok = np.isfinite(ft)
    done = np.isfinite(finish) & (finish <= h)
    # end of the token stream inside the observation and the tokens reached there
    end = np.where(done, finish, np.where(np.isfinite(finish), finish, h))
    n_end = np.where(done | np.isfinite(finish), output, np.minimum(generated, output)).astype(float)
    n_end = np.maximum(n_end, 1.0)
    times = np.unique(np.concatenate([arrival[arrival <= h], ft[has_tok], np.minimum(end[has_tok], h), [0.0, h]]))
    times = times[(times >= 0) & (times <= h)]
    names, idx = np.unique(tenant, return_inverse=True) if tenant_index is None else tenant_index
    T = names.size
    p = prompt if prompt is not None else np.zeros_like(output, dtype=float)
    # each started request: a step of w_p * prompt + w_o * 1 token at ft, then a ramp of w_o per token
    # to n_end at end (slope +s from ft, -s from end); S_k(tau) = sum over knots x <= tau of
    # step + slope * (tau - x), evaluated with per-tenant cumulative sums over the sorted knots
    tk = np.flatnonzero(has_tok)
    ramp = np.where(end[tk] > ft[tk], wo * (n_end[tk] - 1.0) / np.maximum(end[tk] - ft[tk], 1e-300), 0.0)
    jump = wp * p[tk] + wo * np.where(end[tk] > ft[tk], 1.0, n_end[tk])
    x = np.concatenate([ft[tk], end[tk]])
    who = np.concatenate([idx[tk], idx[tk]])
    step = np.concatenate([jump, np.zeros(tk.size)])
    slope = np.concatenate([ramp, -ramp])
    S = _knot_sums(T, who, x, [step, slope, slope * x], times, lambda c, t: c[0] + c[1] * t - c[2])
    # waiting requests per tenant: +1 at arrival, -1 at the first token; evaluated mid-segment
    mid = (times[:-1] + times[1:]) / 2.0
    xw = np.concatenate([arrival, ft[tk]])
    ww = np.concatenate([idx, idx[tk]])
    dw = np.concatenate([np.ones(arrival.size), -np.ones(tk.size)])
    B = _knot_sums(T, ww, xw, [dw], mid, lambda c, t: c[0]) > 0.5
    return names, times, S, B


def _knot_sums(T: int, who: np.ndarray, x: np.ndarray, values: list[np.ndarray], at: np.ndarray, combine
               ) -> np.ndarray:
    """``combine(cums, t)`` for every tenant and time in ``at``, where ``cums[i][k]`` = the sum of
    ``values[i]`` over tenant k's knots at positions ``x <= t`` -> array (T, len(at)). (All values in one
    array: each row's running sum is the same sequence of additions as on its own.)"""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], who[order]
    pos = np.searchsorted(xs, at, side="right")          # knots at or before each time
    m = np.zeros((len(values), T, xs.size + 1))
    m[:, ws, np.arange(1, xs.size + 1)] = np.stack(values)[:, order]
    out_c = np.cumsum(m, axis=2)[:, :, pos]
    return combine(out_c, at[None, :])


def _curves(T, idx, arrival, first_token, finish, prompt, output, generated, h, wp, wo):
    """:func:`service_curves`' ``(times, S, B)`` by the same floating-point operations in the same order, as
    loops (compiled by numba: :data:`CURVES_LOOP`): the knots' running sums are the rows of the (tenant x
    knot) matrix that :func:`_knot_sums` sums, added in the same sequence."""
    n = arrival.shape[0]
    inf = np.inf
    ft = np.empty(n)
    end = np.empty(n)
    n_end = np.empty(n)
    n_tok = 0
    n_arr = 0
    for i in range(n):
        f = first_token[i]
        ft[i] = f if (np.isfinite(f) and f <= h) else inf
        fin = finish[i]
        fin_ok = np.isfinite(fin)
        done = fin_ok and fin <= h
        end[i] = fin if done else (fin if fin_ok else h)
        v = output[i] if (done or fin_ok) else (generated[i] if generated[i] < output[i] or np.isnan(generated[i])
                                                 else output[i])
        n_end[i] = v if (v >= 1.0 or np.isnan(v)) else 1.0
        if np.isfinite(ft[i]):
            n_tok += 1
        if arrival[i] <= h:
            n_arr += 1
    tk = np.empty(n_tok, np.int64)
    cand = np.empty(n_arr + 2 * n_tok + 2)
    j = 0
    c = 0
    for i in range(n):
        if arrival[i] <= h:
            cand[c] = arrival[i]
            c += 1
    for i in range(n):
        if np.isfinite(ft[i]):
            tk[j] = i
            j += 1
    for a in range(n_tok):
        cand[c] = ft[tk[a]]
        c += 1
    for a in range(n_tok):
        e = end[tk[a]]
        cand[c] = e if (e <= h or np.isnan(e)) else h
        c += 1
    cand[c] = 0.0
    cand[c + 1] = h
    u = np.unique(cand)
    m = 0
    for v in u:
        if v >= 0 and v <= h:
            m += 1
    times = np.empty(m)
    m = 0
    for v in u:
        if v >= 0 and v <= h:
            times[m] = v
            m += 1
    # the service knots: a step and a ramp at each first token, the ramp's end at the stream's end
    K = 2 * n_tok
    x = np.empty(K)
    who = np.empty(K, np.int64)
    vals = np.zeros((3, K))
    for a in range(n_tok):
        i = tk[a]
        longer = end[i] > ft[i]
        r = wo * (n_end[i] - 1.0) / max(end[i] - ft[i], 1e-300) if longer else 0.0
        x[a] = ft[i]
        x[n_tok + a] = end[i]
        who[a] = who[n_tok + a] = idx[i]
        vals[0, a] = wp * prompt[i] + wo * (1.0 if longer else n_end[i])
        vals[1, a] = r
        vals[1, n_tok + a] = -r
    for k in range(K):
        vals[2, k] = vals[1, k] * x[k]
    cs = _running(T, who, x, vals)
    pos = np.searchsorted(np.sort(x), times, side="right") if K else np.zeros(m, np.int64)
    S = np.empty((m, T))        # returned transposed: Fortran order, as numpy's fancy indexing leaves it (the
    for t in range(T):          # order numpy's sums over it follow)
        for e in range(m):
            p = pos[e]
            S[e, t] = cs[0, t, p] + cs[1, t, p] * times[e] - cs[2, t, p]
    # the waiting requests: +1 at each arrival, -1 at each first token, at the segments' midpoints
    mid = np.empty(max(m - 1, 0))
    for e in range(m - 1):
        mid[e] = (times[e] + times[e + 1]) / 2.0
    xw = np.empty(n + n_tok)
    ww = np.empty(n + n_tok, np.int64)
    dw = np.empty((1, n + n_tok))
    for i in range(n):
        xw[i] = arrival[i]
        ww[i] = idx[i]
        dw[0, i] = 1.0
    for a in range(n_tok):
        xw[n + a] = ft[tk[a]]
        ww[n + a] = idx[tk[a]]
        dw[0, n + a] = -1.0
    cw = _running(T, ww, xw, dw)
    posw = np.searchsorted(np.sort(xw), mid, side="right")
    B = np.empty((m - 1 if m else 0, T), np.bool_)
    for t in range(T):
        for e in range(m - 1):
            B[e, t] = cw[0, t, posw[e]] > 0.5
    return times, S.T, B.T


def _running(T, who, x, vals):
    """``cs[v, t, j]`` = the running sum of ``vals[v]`` over tenant t's knots among the first j of ``x``'s stable
    order: the cumulative sums of :func:`_knot_sums`' (tenant x knot) matrix, the same additions (+0.0 for
    another tenant's knot)."""
    order = np.argsort(x, kind="mergesort")
    K = x.shape[0]
    V = vals.shape[0]
    cs = np.zeros((V, T, K + 1))
    for v in range(V):
        for t in range(T):
            acc = 0.0
            for j in range(K):
                o = order[j]
                acc = acc + (vals[v, o] if who[o] == t else 0.0)
                cs[v, t, j + 1] = acc
    return cs


CURVES_LOOP = LazyLoop(_curves, helpers=("_running",))    # :func:`_curves` compiled by numba, or None (loops)


def warm_compiled() -> None:
    """Compile the tenant metrics' loops in this process, or load them from numba's disk cache (a campaign calls
    it before its worker processes start, as :func:`portbench.sim.engine.simulate.warm_compiled`)."""
    CURVES_LOOP(may_import=True)
    z = np.zeros(2)
    tenant_fairness(np.array(["a", "b"]), z, np.array([0.5, 1.0]), np.array([1.0, 2.0]), z + 1, z + 3, z + 3, 4.0)


@functools.lru_cache(maxsize=64)
def _pairs(T: int) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.triu_indices(T, 1)``, kept (read-only) for the next run with T tenants."""
    fi, gi = np.triu_indices(T, 1)
    fi.flags.writeable = gi.flags.writeable = False
    return fi, gi


def tenant_fairness(tenant: np.ndarray, arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray,
                    prompt: np.ndarray | None, output: np.ndarray, generated: np.ndarray, horizon_s: float,
                    weights: tuple[float, float] = TENANT_WEIGHTS, index=None) -> tuple[float, float]:
    """``(tenant_service_gap, tenant_jain)`` of one run's admitted requests (module docstring);
    ``(nan, nan)`` with fewer than two tenants. ``index``: ``numpy.unique(tenant, return_inverse=True)`` when
    the caller has it."""
    nan = float("nan")
    if tenant.size == 0:
        return nan, nan
    if index is None:
        index = np.unique(tenant, return_inverse=True)
    if index[0].size < 2 or (index[0] == NO_TENANT).all():
        return nan, nan
    core = CURVES_LOOP()    # None where numba is not loaded (loops.NUMBA_LOADED): then numpy
    if core is None:
        names, times, S, B = service_curves(tenant, arrival, first_token, finish, prompt, output, generated,
                                            horizon_s, weights, tenant_index=index)
    else:                  # the same curves, compiled (tests/test_metrics.py holds the two equal, bit for bit)
        names, idx = index
        f8 = np.ascontiguousarray
        times, S, B = core(names.size, f8(np.asarray(idx).reshape(-1), np.int64), f8(arrival, float),
                           f8(first_token, float), f8(finish, float),
                           np.zeros(np.shape(output)[0]) if prompt is None else f8(prompt, float),
                           f8(output, float), f8(generated, float), float(horizon_s),
                           float(weights[0]), float(weights[1]))
    if times.size < 2:
        return nan, nan
    # Jain over tenants of the service rate while backlogged
    dt = np.diff(times)
    dS = np.diff(S, axis=1)
    busy = (B * dt[None, :]).sum(axis=1)
    got = (B * dS).sum(axis=1)
    sel = busy > 0
    if sel.sum() >= 2:
        x = got[sel] / busy[sel]
        jain = float(x.sum() ** 2 / (x.size * np.dot(x, x))) if np.dot(x, x) > 0 else 1.0
    else:
        jain = nan
    # service gap over common backlogged stretches, all tenant pairs at once
    T = names.size
    fi, gi = _pairs(T)
    ever = B.any(axis=1)
    keep = ever[fi] & ever[gi]
    fi, gi = fi[keep], gi[keep]
    if fi.size == 0:
        return nan, jain
    D = S[fi] - S[gi]                         # (pairs, E) service differences at the event times
    M = B[fi] & B[gi]                         # (pairs, E-1) both backlogged on the segment
    if not M.any():
        return nan, jain
    # max - min of D over each maximal run of common-backlog segments (a run's points: its segments'
    # end points), every pair at once: compress the flagged segments, reduce per run
    seg_max = np.maximum(D[:, :-1], D[:, 1:]).ravel()
    seg_min = np.minimum(D[:, :-1], D[:, 1:]).ravel()
    prev = np.zeros_like(M)
    prev[:, 1:] = M[:, :-1]
    flat = np.flatnonzero(M.ravel())
    starts = np.flatnonzero((M & ~prev).ravel()[flat])
    hi = np.maximum.reduceat(seg_max[flat], starts)
    lo = np.minimum.reduceat(seg_min[flat], starts)
    return float((hi - lo).max()), jain
