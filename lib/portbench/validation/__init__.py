"""Real-engine validation: the simulator against a real vLLM engine (CUDA GPU, or vLLM's CPU build).

The package's entry points, re-exported here: :func:`validate` (parameter checks, called by ``params.load``),
:func:`plan` (what would run and whether it can run here -- never starts an engine), :func:`run` (``portbench
validate`` / ``make validate``; a "skipped" report where vLLM or a GPU is missing), :func:`analyze` (the analysis
of a run's raw files) and :func:`read_results` (notebook 08 reads what the run wrote). By job:

* :mod:`.common` -- constants (labels, error targets, the time budget's reserves), output paths, the engine's
  specification from the settings, small shared helpers;
* :mod:`.plan` -- the pre-registration (validation_plan.yaml: cases by strength, sigma_r, design, code version);
* :mod:`.design` -- the paired replay design (ABBA, A/A pairs) and its power; :mod:`.verdict` -- the order verdicts;
* :mod:`.planning` -- what a run would do here: windows, the engine's time budget;
* :mod:`.pipeline` -- the run: step grid, pre-registration, the family on the virtual engine, the wall-clock
  replays sized to the time budget (its docstring describes the pipeline and its outputs);
* :mod:`.wallclock` -- the wall-clock engine's part of the run, step by step: the step grid, the inputs, the
  engine's start, warm-up, saturation runs and calibration, the replays, their raw files;
* :mod:`.analysis` -- re-simulation, fidelity, verdicts and the summary's sections, from the raw files;
* :mod:`.results` -- what notebook 08 reads back (:func:`read_results`). Its prose, tables and figures are the
  presentation's (:mod:`portbench.present.validation_report`, :mod:`portbench.present.plots_validation`): this
  package imports nothing of ``present/``.

The steps' own modules (:mod:`.cases`, :mod:`.prereg`, :mod:`.confirm`, :mod:`.replay`, :mod:`.resim`,
:mod:`.verdict`, :mod:`.predict`, :mod:`.steps` ...) say more.
"""

from __future__ import annotations

from . import (capacity, cases, confirm, design, engine, fidelity, planning, policies, predict, prereg, replay, resim,
               stages, steps, verdict)
from .common import LABEL_CPU, LABEL_GPU, TARGETS, engine_spec, how_to_enable, out_dir, summary_path, validate
from .pipeline import analyze, run
from .planning import Plan, choose_windows
from .results import read_results

__all__ = [
    "capacity", "cases", "confirm", "engine", "stages", "policies", "predict", "prereg", "replay", "resim", "steps", "verdict", "design", "fidelity",
    "analyze", "LABEL_CPU", "LABEL_GPU", "TARGETS", "engine_spec", "how_to_enable", "out_dir", "summary_path",
    "validate", "read_results", "run", "Plan", "choose_windows", "planning",
]
