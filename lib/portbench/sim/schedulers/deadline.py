"""Earliest deadline first on the SLO deadline."""

from __future__ import annotations

from collections.abc import Mapping

from ...core.errors import ParameterError
from .base import _StaticPolicy, register_scheduler

@register_scheduler
class EDF(_StaticPolicy):
    """Earliest deadline first (non-preemptive by default).

    Deadline = arrival + ttft_s + tpot_s × (output − 1): the latest finish time that meets the
    SLO (``simulation.slo[simulation.edf_slo]``, or option ``slo``) -- it uses the true output
    length (oracle information). Key: (deadline, arrival).
    Models: EDF for LLM SLOs (e.g. the deadline-aware schedulers compared in Andes, Liu et al.
    2024; SLOs-Serve), expressible as a vLLM static priority.
    """

    name = "edf"
    vllm_static = True
    information = "oracle"
    models = "earliest deadline first on the SLO deadline (arrival + TTFT + TPOT·(output−1))"
    OPTIONS = {"slo": None}

    def _check_option(self, key, value):
        if key == "slo" and value is not None:
            _check_slo(f"simulation.scheduler_options.{self.name}.slo", value)
        else:
            super()._check_option(key, value)

    def reset(self, ctx):
        slo = self.slo if self.slo is not None else ctx.slo
        if slo is None:
            raise ParameterError("simulation.edf_slo", None,
                                 "an SLO definition {ttft_s, tpot_s} for edf (simulate(..., slo=...) "
                                 "or option slo)")
        _check_slo("slo", slo)
        self._ttft, self._tpot = float(slo["ttft_s"]), float(slo["tpot_s"])

    def deadline(self, r) -> float:
        return r.arrival_s + self._ttft + self._tpot * (r.output_tokens - 1)

    def priority(self, r, now):
        return (self.deadline(r), r.arrival_s)


def _check_slo(param: str, slo) -> None:
    if not isinstance(slo, Mapping):
        raise ParameterError(param, slo, "a mapping {ttft_s: seconds, tpot_s: seconds}")
    for k in ("ttft_s", "tpot_s"):
        v = slo.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{param}.{k}", v, "a number of seconds > 0")
