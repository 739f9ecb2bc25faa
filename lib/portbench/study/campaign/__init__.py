"""The campaign: schedulers x windows x operating regions x replicates, sharded and resumable.

**Grid.** Every frozen window of the manifest (``campaign.windows_per_source`` limits it to the first
N per source), every region of ``simulation.regions`` (load ``rho`` from ``simulation.region_loads``),
every scheduler of ``simulation.schedulers`` and replicates ``0 .. simulation.replicates-1``.

**Seeds.** One seed per run, :func:`run_seed`: the first 8 bytes of the SHA-256 of the canonical
JSON of ``["portbench-run-seed-v1", simulation.seed, window_id, scheduler, region, replicate]``
(63 bits). It never uses Python's ``hash()``, so it is the same in every process and on every
machine, and it does not depend on which worker runs the run or in which order.

**Capacity.** A window's capacity (req/s) is measured once per (window, profile) by
``regions.capacity(window_df, profile, policy=simulation.capacity_policy)`` and cached as
``{results_dir}/capacity/<window_id>__<key>.json``; every run of that window, in every region, uses it.

**Shards.** One task = one shard = one (window, region): all schedulers x replicates of it (13 x 3 = 39
runs in the full study), so process and serialisation overhead is paid once per 39 runs and the
rescaled window is built once. Shard files are ``{results_dir}/runs/<window_id>__<region>__<key>.parquet``,
``<key>`` = the first 16 hex digits of the SHA-256 of the shard's *fingerprint*: the window's SHA-256,
source and provenance, region and rho, the scheduler list with each scheduler's options, the
replicates, and everything common to every run that changes results (the model fingerprint: profile
coefficients and a hash of the simulation code, see :meth:`SimEngine.fingerprint`; capacity policy,
horizon factor, base seed, predictor sigma, SLO definitions, edf SLO, the metric list and this
module's result format version). Changing any of them gives new file names, so stale shards are
never read (they stay on disk, and come back into use if the parameter is changed back). The
fingerprint is also stored in each shard's parquet metadata (key ``portbench``).

Per-request records of the chosen subset (``campaign.request_records``: the first N windows per
source, the listed regions and replicates) go to ``{results_dir}/requests/<same prefix>__<key>.parquet``
(records columns + run keys); a shard counts as finished only when its records file exists too.

**Atomicity and resume.** Workers compute; the main process alone writes, each file to a temporary
name in the same folder and then ``os.replace`` (atomic on POSIX). A killed campaign leaves only
complete shards; rerunning it computes exactly the missing shards. ``runs.parquet`` is the sorted
concatenation of the plan's shards, tagged with the plan's hash, so :func:`load_runs` never returns
rows of other parameters.

**Executors.** ``campaign.executor: process`` (default): a spawn-context process pool of
``campaign.workers`` processes (1 = in this process); ``dask``: a ``distributed`` cluster at
``campaign.dask_address``, or a ``LocalCluster`` of ``campaign.workers`` single-threaded worker
processes. The worker context (the engine, the parameters and the verified windows) is sent to each
worker once (pool initializer / Dask broadcast scatter). Rows are sorted by (source, window_id, rho,
region, scheduler, replicate), so every executor and worker count gives identical tables.

**Engine.** What a run *is* is an injectable :class:`Engine` (capacity, rescale + horizon, one run ->
counters, metrics, records). :class:`SimEngine` is the real one (profiles, regions, schedulers,
simulator, metrics); tests inject deterministic fakes to check the orchestration alone.

The package: :mod:`.plan` (grid, seeds, fingerprints), :mod:`.engines` (what a run is),
:mod:`.executors` (workers, process pool, Dask), :mod:`.files` (shard files), :mod:`.run` (running and
reading back: :func:`run`, :func:`load_runs`), :mod:`.tables` (notebook 03's tables).
"""

from .engines import MODEL_MODULES, Engine, RunResult, SimEngine, scheduler_options
from .executors import (COUNTER_COLUMNS, EXECUTORS, KEY_COLUMNS, RUN_COLUMNS, SORT_COLUMNS, RunFailed, WorkerContext,
                        compute_capacity, compute_shard)
from .files import capacity_path, records_path, runs_path, shard_done, shard_path
from .plan import FORMAT_VERSION, SEED_TAG, Plan, ShardSpec, WindowRef, make_plan, replicates, run_seed, window_refs
from .run import CampaignResult, consolidate_runs, load_capacities, load_requests, load_runs, run
from .tables import (ATTAINED_RANKING, CURVE_SCHEDULERS, capacity_by_window, capacity_summary, conservation_summary,
                     curve_schedulers, load_curves, load_story, preemption_table, regions_table)


__all__ = ["ATTAINED_RANKING", "COUNTER_COLUMNS", "CURVE_SCHEDULERS", "EXECUTORS", "FORMAT_VERSION", "KEY_COLUMNS",
           "MODEL_MODULES", "RUN_COLUMNS", "SEED_TAG", "SORT_COLUMNS", "CampaignResult", "Engine", "Plan", "RunFailed",
           "RunResult", "ShardSpec", "SimEngine", "WindowRef", "WorkerContext", "capacity_by_window", "capacity_path",
           "capacity_summary", "compute_capacity", "compute_shard", "conservation_summary", "consolidate_runs",
           "curve_schedulers", "load_capacities", "load_curves", "load_requests", "load_runs", "load_story",
           "make_plan", "preemption_table", "records_path", "regions_table", "replicates", "run",
           "run_seed", "runs_path", "scheduler_options", "shard_done", "shard_path", "window_refs"]
