"""portbench — the LLM-Serving Scheduler Portability Benchmark.

The pipeline, in the order the notebooks run it:

    registry   official trace files (size, SHA-256, download location) and the data mirror
    traces     one adapter per official format -> the canonical request table
    synth      seeded arrival-process and length-model generators
    standins   labelled stand-ins for sources whose official file is absent; counterfactual variants
    windows    stride-sampled frozen windows, the committed manifest, hash verification
    profiles   hardware x model cost model of one serving iteration
    schedulers the 13 scheduling policies behind one protocol, and the registry
    simulator  SimPy model of one continuously-batched, paged-KV serving replica
    regions    operating regions: per-window capacity and load rescaling
    metrics    the metric registry (one shared function for simulator and vLLM records)
    campaign   schedulers x windows x regions x replicates, sharded, resumable, local or Dask
    stats      ranking, Kendall tau-b / W, reversals, cross-metric agreement, Friedman/Nemenyi
    analysis   the tables and summary.json behind notebooks 04-07 and 09
    validation vLLM replay of the key reversal and a stable control (notebook 08)

Shared helpers: params (parameter files), sources (names and provenance labels),
figures (the one figure helper), errors (the error types).
"""

__version__ = "0.1.0"
