"""portbench — the LLM-Serving Scheduler Portability Benchmark.

The package is the pipeline, in layers that import only downward (``tests/test_layers.py`` checks it):

    core/        errors, typed parameters (config), file I/O and checksums, provenance labels, the figure index
    data/        official trace files (registry), adapters (traces), synthetic generators (synth),
                 labelled stand-ins (standins/), frozen windows and the manifest (windows, window_table)
    sim/         the simulated serving replica: requests, the engine (engine/), the 13 schedulers
                 (schedulers/), the cost model (profiles/), operating regions, metrics
    study/       the campaign (campaign/), statistics (stats), the portability analysis (analysis/)
    present/     the figure helper, figures and generated text of every notebook, the README report
    validation/  replay through a real vLLM engine (imports sim/ and study/, never the reverse)

and on top: ``params`` (parameter files -> a validated Config), ``cli``, ``notebooks`` (papermill
runner, sweeps) and ``bench``. No compute layer (core, data, sim, study) imports a plotting library.
"""

__version__ = "0.1.0"
