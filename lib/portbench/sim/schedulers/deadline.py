"""Earliest deadline first on the SLO deadline: predicted (``edf``), oracle (``edf_oracle``) or noisy oracle
(``edf_noisy_oracle``, the equal-information control's variant of ``edf``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...core.errors import ParameterError
from .base import _StaticPolicy, register_scheduler
from .length import frozen_predictions

class _Deadline(_StaticPolicy):
    """Earliest deadline first on an SLO deadline (non-preemptive by default); key (deadline, arrival).
    The SLO is ``simulation.slo[simulation.edf_slo]`` (or option ``slo``)."""

    vllm_static = True
    OPTIONS = {"slo": None}

    def _check_option(self, key, value):
        if key == "slo" and value is not None:
            _check_slo(f"simulation.scheduler_options.{self.name}.slo", value)
        else:
            super()._check_option(key, value)

    def _lengths(self, ctx) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def reset(self, ctx):
        slo = self.slo if self.slo is not None else ctx.slo
        if slo is None:
            raise ParameterError("simulation.edf_slo", None,
                                 f"an SLO definition {{ttft_s, tpot_s}} for {self.name} (simulate(..., slo=...) "
                                 "or option slo)")
        _check_slo("slo", slo)
        self._ttft, self._tpot = float(slo["ttft_s"]), float(slo["tpot_s"])
        n = np.maximum(np.asarray(self._lengths(ctx), dtype=float) - 1.0, 0.0)
        self._deadline = (np.asarray(ctx.arrival_s, dtype=float) + self._ttft + self._tpot * n).tolist()

    def deadline(self, r) -> float:
        return self._deadline[r.id]

    def priority(self, r, now):
        return (self._deadline[r.id], r.arrival_s)


@register_scheduler
class EDF(_Deadline):
    """Earliest deadline first on a *predicted* SLO deadline (non-preemptive by default).

    Deadline = arrival + ttft_s + tpot_s × (predicted output − 1): the latest finish time that meets
    the SLO if the request is as long as the source's learned regressor predicts
    (``RunContext.predicted_output``, the same frozen predictions ``sjf_predicted`` uses).
    Models: EDF for LLM SLOs (e.g. the deadline-aware schedulers compared in Andes, Liu et al.
    2024; SLOs-Serve), expressible as a vLLM static priority.
    """

    name = "edf"
    information = "predicted"
    uses = ("arrival", "predicted")
    models = "earliest deadline first on the SLO deadline (arrival + TTFT + TPOT·(predicted output−1))"

    def _lengths(self, ctx):
        return frozen_predictions(ctx, self.name)


@register_scheduler
class EDFOracle(_Deadline):
    """EDF on the *true* output length's deadline (arrival + ttft_s + tpot_s × (output − 1)): the
    oracle variant, for comparison only (not in ``all``)."""

    name = "edf_oracle"
    in_all = False
    information = "oracle"
    uses = ("arrival", "oracle")
    models = "EDF on the oracle SLO deadline (arrival + TTFT + TPOT·(true output−1))"

    def _lengths(self, ctx):
        return ctx.output_tokens


@register_scheduler
class EDFNoisyOracle(_Deadline):
    """EDF on the deadline of a *noisy oracle* length: true output × exp(N(0, sigma)) (seeded, one draw per
    request; the same noise as ``sjf_noisy_oracle`` and ``ltr_noisy_oracle``). ``edf``'s variant in the
    equal-information control: a length estimate of the same quality on every source, instead of a predictor
    whose accuracy differs from trace to trace. For comparison only (not in ``all``)."""

    name = "edf_noisy_oracle"
    in_all = False
    information = "oracle"
    uses = ("arrival", "oracle")
    models = "EDF on a noisy oracle SLO deadline (arrival + TTFT + TPOT·(true output × lognormal noise − 1))"
    OPTIONS = {"slo": None, "sigma": 0.5}

    def _lengths(self, ctx):
        noise = ctx.rng.standard_normal(ctx.n)
        return np.asarray(ctx.output_tokens, dtype=float) * np.exp(self.sigma * noise)


def _check_slo(param: str, slo) -> None:
    if not isinstance(slo, Mapping):
        raise ParameterError(param, slo, "a mapping {ttft_s: seconds, tpot_s: seconds}")
    for k in ("ttft_s", "tpot_s"):
        v = slo.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{param}.{k}", v, "a number of seconds > 0")
