"""Real-engine validation: does an order the simulator predicts for a real engine hold under that engine's clock?

Entry points: :func:`run` (``portbench validate`` / ``make validate``; a "skipped" summary where vLLM is missing),
:func:`analyze` (the verdicts again from a run's raw files, a GPU run's too), :func:`validate` (parameter checks,
called by ``params.load``), :func:`read_results` (notebook 08). One module per question:

* :mod:`.plan` -- the pre-registration (``papermill_params/validation_plan.yaml``): which cases, frozen and checked;
* :mod:`.engine` -- the wall-clock engine: replay specs on vLLM, one policy per engine instance (the project's
  scheduler classes, :mod:`portbench.vllm`), the per-replay table; :mod:`.replay` its client, :mod:`.steps` its
  step table, :mod:`.planted` the planted reversal's class;
* :mod:`.predict` -- the simulator's prediction at the engine's scale (the virtual engine, :mod:`.virtual`, with the
  engine's step table and settings) and the fidelity report (absolute latency, no pass mark);
* :mod:`.design` -- the paired ABBA design with A/A pairs and its power;
* :mod:`.verdict` -- holds / reverses / undetermined / not testable, the A/A check, the planted reversal;
* :mod:`.pipeline` (with :mod:`.stages`; :mod:`.gpu` for a CUDA GPU) -- the run, stage by stage;
* :mod:`.family` -- conformance at the campaign's settings (the virtual engine against the simulator: an agreement
  rate, never a confirmation); :mod:`.conformance` -- the step-by-step check of the scheduler.
"""

from __future__ import annotations

from . import capacity, design, engine, fidelity, policies, predict, replay, resim, stages, steps, verdict
from .common import LABEL_CPU, LABEL_GPU, engine_spec, how_to_enable, out_dir, summary_path, validate
from .pipeline import analyze, choose_windows, run
from .results import read_results

__all__ = [
    "capacity", "engine", "stages", "policies", "predict", "replay", "resim", "steps", "verdict", "design", "fidelity",
    "analyze", "LABEL_CPU", "LABEL_GPU", "engine_spec", "how_to_enable", "out_dir", "summary_path",
    "validate", "read_results", "run", "choose_windows",
]
