"""Build notebooks/03_simulate.ipynb (committed without outputs): `.venv/bin/python notebooks/builders/03_simulate.py`."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

OUT = Path(__file__).resolve().parents[1] / "03_simulate.ipynb"


def md(text):
    return new_markdown_cell(text.strip("\n"))


def code(text, **meta):
    cell = new_code_cell(text.strip("\n"))
    cell.metadata.update(meta)
    return cell


cells = [
    md("""
# 03 — The simulation campaign

**Question.** How does each scheduling policy perform on each frozen workload window, at each
operating load? This notebook runs the campaign — every scheduler × window × operating region ×
replicate of the parameters — through the simulator, and checks that the simulated system behaves
like a serving engine (light load is easy, overload is not; no request is ever lost) before
notebooks 04–07 compare the rankings it produces.

**Method.** For each window, its service capacity is measured once under a reference policy; its
arrival times are then rescaled to each region's offered load ρ (× capacity), keeping the window's
own burst pattern; each scheduler runs on the rescaled window with a seed derived from (window,
scheduler, region, replicate); each run is scored on every metric over an observation horizon
proportional to the rescaled window's span. Results are written as resumable shards (one per
window × region) and consolidated into one table, one row per run.
"""),
    code("""
params_file = "papermill_params/default.yaml"
overrides = {}
""", tags=["parameters"]),
    code("""
import polars as pl
from IPython.display import Markdown, display

import portbench
from portbench import campaign, figures, metrics, params, profiles, schedulers, sources, windows

P = portbench.params.load(params_file, overrides)
figures_dir = P["paths"]["figures_dir"]
manifest = windows.load_manifest(P)
prov = sources.provenance_from_manifest(manifest)
labels = sources.labels(prov)
display(Markdown(sources.banner(prov, windows.skipped_sources(manifest))))
"""),
    md("""
## What is simulated, and what is not

**Simulated.** One serving replica of an iteration-level, continuously batched engine in the style
of vLLM. Each request carries its arrival time, prompt and output lengths (from the window), the
prompt tokens prefilled so far, the tokens generated, the KV-cache blocks it holds, its first-token
and finish times and its preemption count. The KV cache is paged; when it runs out, the policy
evicts a victim by *recompute* (its KV blocks are freed and its prompt plus the tokens generated
so far are prefilled again when it resumes); preemptive policies may also *pause* a running
request while memory allows (its KV is kept). The preemption counts below are recompute evictions. A request that could never fit in the cache is rejected at arrival and counted, so that
arrived = completed + unfinished at the horizon + rejected holds in every run (checked by the
simulator and again below). In each iteration the scheduler chooses the running batch and the
prefill tokens of each request (whole prompts, or chunks under a token budget for chunked-prefill
policies); the hardware profile's linear cost model gives the iteration's duration. Between
decision points (an arrival, a completion, a quantum expiry, a chunk boundary, a memory limit)
the batch is fixed, so runs of decode iterations are advanced in closed form. Output lengths are
the trace's: a request stops after exactly its recorded number of output tokens.

**Not simulated.** Several replicas and request routing; tensor or pipeline parallelism; prefix
caching and KV swapping to CPU memory; speculative decoding; tokenisation, networking and
streaming; the sampled text itself (output lengths are given, not generated); run-to-run
variability of iteration times (the cost model is deterministic, so replicates differ only through
the policies' own randomness — predictor noise, random tie-breaks, the random policy); and any
cost that the linear model does not capture (for example prefill attention's quadratic term).
"""),
    md("""
## The hardware profile

The duration of one iteration is a function of the prefill tokens, the decode sequences and the
context (KV) tokens of the batch, with coefficients derived from public hardware specifications
and calibrated against measured GPU operator times (`portbench profiles`; the table below lists
every registered profile and says which part of each rests on measurements and which on the
roofline).
"""),
    code("""
prof = profiles.get_profile(P["simulation"]["profile"])
example_prompt, example_output = 1000, 200
display(Markdown(
    f"**Profile of this campaign: `{prof.name}`** ({prof.gpu}, {prof.model}). KV cache: "
    f"{prof.kv_capacity_tokens:,} tokens ({prof.kv_capacity_blocks:,} blocks of {prof.block_size}); at most "
    f"{prof.max_num_seqs} running sequences and {prof.max_batched_tokens:,} prefill tokens per chunked iteration. "
    f"Iteration time = {prof.formula()}. "
    f"A request of {example_prompt:,} prompt and {example_output:,} output tokens alone on the replica takes "
    f"{prof.isolated_service_s(example_prompt, example_output):.2f} s."))
display(Markdown(profiles.describe()))
"""),
    code("""
if hasattr(profiles, "plot_calibration"):
    calibration = profiles.plot_calibration(figures_dir, name="03_simulate/profile_calibration")
    display(Markdown("Measured against modelled token-linear time per iteration for each profile "
                     f"(saved as `{calibration['png']}`)."))
"""),
    md("""
## The schedulers

Each policy decides admission order, the preemption victim and prefill chunking, and declares the
information it uses (arrival order only, prompt length, a *predicted* output length, the *true*
output length — an oracle no real system has — or the tenant).
"""),
    code("""
display(Markdown(schedulers.describe()))
s = P["simulation"]
display(Markdown(
    f"This campaign runs {len(campaign.scheduler_names(P))} of them: "
    + ", ".join(f"`{n}`" for n in campaign.scheduler_names(P))
    + f". Predicted output lengths carry a seeded log-normal error with σ = {s['predictor_sigma']}; "
    f"`edf` derives deadlines from the `{s['edf_slo']}` SLO; per-scheduler options: "
    f"{s['scheduler_options'] or 'none (defaults)'}."))
"""),
    md("""
## The metrics

Every run is scored on every registered metric over the observation horizon; the direction says
whether higher or lower is better (the analysis notebooks rank by it).
"""),
    code("""
display(Markdown(metrics.describe(P)))
"""),
    md("""
## Operating regions

A window's **capacity** is its saturation throughput (requests/s) measured under the reference
policy; it is measured once per window and profile and reused by every run of that window. Each
region rescales the window's arrival times so that the offered load is ρ × capacity, keeping the
relative inter-arrival pattern; ρ < 1 is below saturation, ρ > 1 overloads the replica. The
observation horizon is a multiple of the rescaled window's span, so under overload some requests
are still unfinished when observation stops and completion counts differ between schedulers.
"""),
    code("""
display(campaign.regions_table(P))
display(Markdown(
    f"Capacity policy: `{s['capacity_policy']}`. Horizon: {s['horizon_factor']} × the rescaled window span. "
    f"Replicates per (scheduler, window, region): {s['replicates']}; base seed {s['seed']}."))
"""),
    md("""
## Running the campaign

Shards already computed for exactly these parameters are reused (a shard's file name hashes every
parameter that changes its results: the window's SHA-256, the profile's coefficients, the
simulation code, load, horizon, seeds, SLOs, scheduler options and the metric list); the rest are
computed on the configured executor and written atomically, so an interrupted campaign resumes.
"""),
    code("""
result = campaign.run_campaign(P)
runs = result.runs
plan = result.plan
display(Markdown(
    f"**{runs.height:,} runs** = {len(plan.windows)} windows × {len(plan.regions)} regions × "
    f"{len(plan.schedulers)} schedulers × {len(plan.replicates)} replicate(s), in {len(plan.shards)} shards: "
    f"{result.computed_shards} computed now, {result.reused_shards} reused from an earlier run of the same "
    f"parameters; {result.computed_capacities} window capacities measured now. Wall time "
    f"{result.wall_s:.1f} s on {result.workers} `{result.executor}` worker(s). Table: `{campaign.runs_path(P)}` "
    f"({len(runs.columns)} columns: run keys, counters and {len(plan.metrics)} metrics)."))
runs.head(5)
"""),
    md("""
## Sanity check 1: no request is lost

Every run must account for every request of its window: completed within the horizon, still
unfinished at the horizon, or rejected at arrival because it could never fit in the KV cache.
"""),
    code("""
cons = campaign.conservation_summary(runs)
display(cons)
tot = cons.filter(pl.col("source") == "all").row(0, named=True)
display(Markdown(
    f"Over all {tot['runs']:,} runs, {tot['arrived']:,} request arrivals: {tot['completed_n']:,} completed within "
    f"the horizon ({tot['completed_n'] / tot['arrived']:.1%}), {tot['unfinished']:,} unfinished at the horizon "
    f"({tot['unfinished'] / tot['arrived']:.1%}) and {tot['rejected']:,} rejected ({tot['rejected'] / tot['arrived']:.2%}); "
    f"{tot['preemptions']:,} preemptions in total. arrived = completed + unfinished + rejected holds in "
    f"**{tot['runs'] - tot['violations']:,} of {tot['runs']:,} runs**."))
assert tot["violations"] == 0, "request conservation violated"
"""),
    md("""
## Sanity check 2: capacity per window

Capacity differs between windows because their request sizes differ (long prompts and outputs
take longer to serve); the load of every region is relative to each window's own capacity.
"""),
    code("""
fig = campaign.plot_capacity(runs, labels)
figures.save(fig, "03_simulate/capacity_by_window", figures_dir)
cap = campaign.capacity_summary(runs)
display(Markdown("Measured capacity (requests/s) per source: " + "; ".join(
    f"{labels[r['source']]}: median {r['median']:.3g} over {r['windows']} windows (range {r['min']:.3g}–{r['max']:.3g})"
    for r in cap.iter_rows(named=True)) + "."))
"""),
    md("""
## Sanity check 3: latency and completions against load

For a few schedulers: tail end-to-end latency, median time to first token and the fraction of
arrived requests completed within the horizon, against the offered load. Below capacity (ρ < 1)
every policy should keep up and latencies should be low; past it, queues build, latencies climb
and completions within the horizon fall — and the policies start to differ. Lines are medians over
windows and replicates, bands the inter-quartile range; the dotted vertical line marks ρ = 1
(the window's measured capacity); latency axes are logarithmic.
"""),
    code("""
curve_scheds = campaign.curve_schedulers(runs)
fig = campaign.plot_load_curves(runs, labels, schedulers=curve_scheds)
figures.save(fig, "03_simulate/load_curves", figures_dir)
story = campaign.load_story(runs, curve_scheds)
display(Markdown("\\n".join(
    f"* **{labels[r['source']]}**: in region *{r['region_light']}* (ρ = {r['rho_light']:g}) the median run completes "
    f"{r['completed_light']:.0%} of its requests within the horizon"
    + (f" with a tail E2E latency (p99) of {r['e2e_p99_light']:.3g} s" if 'e2e_p99_light' in r else "")
    + f"; in region *{r['region_heavy']}* (ρ = {r['rho_heavy']:g}) {r['completed_heavy']:.0%}"
    + (f", p99 {r['e2e_p99_heavy']:.3g} s ({r['e2e_p99_heavy'] / r['e2e_p99_light']:.1f}× the light-load value)"
       if 'e2e_p99_light' in r else "") + "."
    for r in story)))
"""),
    md("""
## Sanity check 4: preemptions by region

Preemptions (recompute) happen when the KV cache fills, so they should be rare at light load and
grow with load; policies that admit aggressively or reorder running requests preempt more.
"""),
    code("""
fig = campaign.plot_preemptions(runs, labels)
figures.save(fig, "03_simulate/preemptions_by_region", figures_dir)
pre = campaign.preemption_table(runs)
heavy = pre.filter(pl.col("rho") == pre["rho"].max())
by_region = runs.group_by(["region", "rho"]).agg((pl.col("preemptions") > 0).mean().alias("share")).sort("rho")
top = heavy.group_by("scheduler").agg(pl.col("preemptions_per_run").mean()).sort("preemptions_per_run",
                                                                                   descending=True).row(0, named=True)
display(Markdown(
    "Share of runs with at least one preemption, by region: "
    + ", ".join(f"{r['region']} {r['share']:.0%}" for r in by_region.iter_rows(named=True))
    + (f". At the heaviest load the most preempting policy is `{top['scheduler']}` "
       f"({top['preemptions_per_run']:.1f} preemptions per run on average over sources)."
       if top["preemptions_per_run"] > 0 else
       f". No run preempted: the KV cache of `{prof.name}` never binds on these windows at these loads.")))
"""),
    md("""
## Per-request records

Per-request records (arrival, first token, finish, tokens, preemptions, tenant, isolated service
time) are kept for a subset of runs (`campaign.request_records`), for the distribution plots of
later notebooks and for checking the metrics by hand.
"""),
    code("""
req = campaign.load_requests(P)
if req.height:
    display(Markdown(
        f"{req.height:,} request records from {req.select(['window_id', 'region', 'scheduler', 'replicate']).n_unique():,} "
        f"runs ({req['window_id'].n_unique()} windows; regions {', '.join(sorted(req['region'].unique().to_list()))}); "
        f"file folder `{campaign.results_dir(P) / 'requests'}`."))
    display(req.head(5))
else:
    display(Markdown("No per-request records were requested (`campaign.request_records`)."))
"""),
    md("""
**Next.** Notebooks 04–07 read this campaign's table with `portbench.campaign.load_runs(P)` (which
refuses results of other parameters) and compare scheduler rankings across sources, regions and
metrics.
"""),
]

nb = new_notebook(cells=cells, metadata={
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"}})
nbformat.validate(nb)
nbformat.write(nb, OUT)
print(f"wrote {OUT}")
