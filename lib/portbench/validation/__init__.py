"""Real-engine validation: does an order the simulator predicts hold under a real engine's clock (vLLM's CPU build
here, a CUDA GPU where there is one)? One module per question:

* :mod:`.plan` -- the pre-registration ``papermill_params/validation_plan.yaml``: cases chosen by the analysis'
  strength, sigma_r and the design it sizes, code version, change log, seal (``python -m portbench.validation plan
  freeze|check|show``);
* :mod:`.engine` (with :mod:`.stages`, :mod:`.replay`, :mod:`.steps`, :mod:`.capacity`, :mod:`.predict`,
  :mod:`.planted`) -- the wall-clock engine: every policy as its ``portbench.vllm`` class, the step table, the
  engine-scale prediction, the replays;
* :mod:`.design` -- the paired design (k windows x r pairs, seeded ABBA, 25 % A/A) and its power;
* :mod:`.verdict` -- the order verdicts (sign-flip test per side, Holm, TOST against the prediction, the A/A check,
  the planted reversal) and summary.json's key contract;
* :mod:`.fidelity` (with :mod:`.repeat`) -- absolute latency, a separate report without a pass mark;
* :mod:`.family` -- conformance at the campaign's settings (virtual engine: an agreement rate, not a verdict);
  :mod:`.conformance` -- vLLM's scheduler against the simulator step by step;
* :mod:`.pipeline` -- the run (:func:`run`, :func:`analyze`), :mod:`.gpu` -- ``make gpu-validate``;
  :mod:`.results` -- what notebook 08 reads back (:func:`read_results`); its prose and figures are
  :mod:`portbench.present.validation_report` and :mod:`portbench.present.plots_validation` (this package imports
  nothing of ``present/``).
"""

from __future__ import annotations

from . import capacity, design, fidelity, matching, policies, predict, replay, resim, steps, verdict
from .common import LABEL_CPU, LABEL_GPU, engine_spec, how_to_enable, out_dir, summary_path, validate
from .design import choose_windows
from .pipeline import analyze, run
from .results import read_results

__all__ = [
    "capacity", "matching", "policies", "predict", "replay", "resim", "steps", "verdict", "design", "fidelity",
    "analyze", "LABEL_CPU", "LABEL_GPU", "engine_spec", "how_to_enable", "out_dir", "summary_path",
    "validate", "read_results", "run", "choose_windows",
]
