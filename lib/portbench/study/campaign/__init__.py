"""The campaign: schedulers x windows x operating regions x replicates, sharded and resumable.

**Grid.** Every frozen window of the manifest (``campaign.windows_per_source`` limits it to the first
N per source), every region of ``simulation.regions`` (load ``rho`` from ``simulation.region_loads``),
every scheduler of ``simulation.schedulers`` and replicates ``0 .. simulation.replicates-1``.

**Seeds.** One seed per run, :func:`run_seed`: the first 8 bytes of the SHA-256 of the canonical
JSON of ``["portbench-run-seed-v1", simulation.seed, window_id, scheduler, region, replicate]``
(63 bits). It never uses Python's ``hash()``, so it is the same in every process and on every
machine, and it does not depend on which worker runs the run or in which order.

**Capacity.** A window's capacity is the sustainable throughput of its request mix, measured once per
(window, model, engine) by the saturation experiment of :func:`portbench.sim.regions.saturation` (the
window's requests repeated into a backlog of at least 4,000 at t = 0 under ``simulation.capacity_policy``
on the campaign's engine; completions per second in the steady part) and cached as
``{results_dir}/capacity/<window_id>__<key>.json`` (requests/s, the steady interval,
the method in a sentence, and ``burst_rps``, the earlier completed-over-makespan definition, for
comparison); every run of that window, in every region, is rescaled to ρ × that capacity. Each run
also reports its achieved utilisation (:func:`portbench.sim.regions.utilisation`) and its
time-weighted queue length (``queue_mean``, ``queue_p95``).
**Context limits.** Requests refused because their prompt exceeds the profile's ``max_model_len``
are counted per run (``refused``, also in ``rejected``); :func:`run` prints a warning for every source
where they exceed 1 % of its requests.

**Shards.** One task = one shard = one (window, region): all schedulers x replicates of it (13 x 3 = 39
runs in the full study), so process and serialisation overhead is paid once per 39 runs and the
rescaled window is built once. Shard files are ``{results_dir}/runs/<window_id>__<region>__<key>.parquet``,
``<key>`` = the first 16 hex digits of the SHA-256 of the shard's *fingerprint*: the window's SHA-256,
source and provenance, region and rho, the scheduler list with each scheduler's options, the
replicates, what each run is given besides the frozen window table (the fingerprint key of the
source's frozen predictions when a scheduler reads them, and how its tenants are read:
:func:`run_inputs`), and everything common to every run that changes results (the model
fingerprint: profile coefficients and a hash of the simulation code, see
:meth:`SimEngine.fingerprint`; capacity policy, horizon factor, base seed, predictor sigma, SLO
definitions, edf SLO, tenant model, the metric list and this module's result format version).

**Run inputs.** Each run is given the verified frozen window table plus, when one of the
schedulers reads them, the window's frozen predictions as extra columns (``predicted_output``,
``ltr_score``; :func:`portbench.data.predictors.attach`) -- the window's own table and hash never
change. On a source without tenants (``simulation.tenant_model: trace``) every request's tenant is
``metrics.NO_TENANT``: the tenant metrics are n/a and vtc has a single counter (:func:`run_tables`). Changing any of them gives new file names, so stale shards are
never read (they stay on disk, and come back into use if the parameter is changed back). The
fingerprint is also stored in each shard's parquet metadata (key ``portbench``).

Per-request records of the chosen subset (``campaign.request_records``: the first N windows per
source, the listed regions and replicates) go to ``{results_dir}/requests/<same prefix>__<key>.parquet``
(records columns + run keys); a shard counts as finished only when its records file exists too.

**Atomicity and resume.** Workers compute; the main process alone writes, each file to a temporary
name in the same folder and then ``os.replace`` (atomic on POSIX). A killed campaign leaves only
complete shards; rerunning it computes exactly the missing shards. ``runs.parquet`` is the sorted
concatenation of the plan's shards, tagged with the plan's hash, so :func:`load_runs` never returns
rows of other parameters; the shards computed in this run are concatenated as the workers returned them
(the very tables just written), only reused shards are read back.

**Executors.** ``campaign.executor: process`` (default): a spawn-context process pool of
``campaign.workers`` processes (1 = in this process); ``dask``: a ``distributed`` cluster at
``campaign.dask_address``, or a ``LocalCluster`` of ``campaign.workers`` single-threaded worker
processes. The worker context (the engine, the parameters and the verified windows) is sent to each
worker once (pool initializer / Dask broadcast scatter); a task carries only its shard's spec. Within a shard,
:class:`SimEngine` computes the scaled window's utilisation marks and the schedulers' options once, not per run. Rows are sorted by (source, window_id, rho,
region, scheduler, replicate), so every executor and worker count gives identical tables.

**Engine.** What a run *is* is an injectable :class:`Engine` (capacity, rescale + horizon, one run ->
counters, metrics, records). :class:`SimEngine` is the real one (profiles, regions, schedulers,
simulator, metrics); tests inject deterministic fakes to check the orchestration alone.

The package: :mod:`.plan` (grid, seeds, fingerprints), :mod:`.engines` (what a run is),
:mod:`.executors` (workers, process pool, Dask), :mod:`.files` (shard files), :mod:`.run` (running and
reading back: :func:`run`, :func:`load_runs`), :mod:`.tables` (notebook 03's tables).
"""

from .engines import MODEL_MODULES, Engine, RunResult, SimEngine, scheduler_options
from .executors import (COUNTER_COLUMNS, EXECUTORS, KEY_COLUMNS, LOAD_COLUMNS, RUN_COLUMNS, SORT_COLUMNS, RunFailed,
                        WorkerContext, compute_capacity, compute_shard, load_worker_code)
from .files import capacity_path, records_path, runs_path, shard_done, shard_path
from .plan import (CAPACITY_METHOD, FORMAT_VERSION, SEED_TAG, Plan, ShardSpec, WindowRef, make_plan, needs_predictions, plan_common,
                   replicates, run_inputs, run_seed, window_refs)
from .run import (REFUSAL_WARN_FRACTION, CampaignResult, check_plugins, consolidate_runs, load_capacities, load_requests,
                  load_runs, refusal_warnings, reuse_capacities, run, run_tables)
from .tables import (ATTAINED_RANKING, CURVE_SCHEDULERS, DISTINCT_METRIC, DISTINCT_TOLERANCE, capacity_by_window,
                     capacity_comparison, capacity_summary, conservation_summary, curve_schedulers, distinct_means,
                     engine_summary, load_curves, load_story, load_summary, load_table, preemption_table, refusal_table,
                     regions_table)


__all__ = ["capacity_comparison", "check_plugins", "DISTINCT_METRIC", "DISTINCT_TOLERANCE", "distinct_means", "engine_summary", "load_summary", "load_table",
           "refusal_table", "CAPACITY_METHOD", "LOAD_COLUMNS", "REFUSAL_WARN_FRACTION",
           "refusal_warnings", "ATTAINED_RANKING", "COUNTER_COLUMNS", "CURVE_SCHEDULERS", "EXECUTORS", "FORMAT_VERSION", "KEY_COLUMNS",
           "MODEL_MODULES", "RUN_COLUMNS", "SEED_TAG", "SORT_COLUMNS", "CampaignResult", "Engine", "Plan", "RunFailed",
           "RunResult", "ShardSpec", "SimEngine", "WindowRef", "WorkerContext", "capacity_by_window", "capacity_path",
           "capacity_summary", "compute_capacity", "compute_shard", "conservation_summary", "consolidate_runs",
           "curve_schedulers", "load_capacities", "load_curves", "load_worker_code", "load_requests", "load_runs",
           "load_story", "make_plan", "needs_predictions", "plan_common", "preemption_table", "reuse_capacities", "run_inputs", "run_tables", "records_path",
           "regions_table", "replicates", "run",
           "run_seed", "runs_path", "scheduler_options", "shard_done", "shard_path", "window_refs"]
