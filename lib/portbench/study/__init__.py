"""Study: the experiment and its statistics (imports core, data and sim).

``campaign`` (schedulers x windows x regions x replicates: plan, shards, executors, results),
``stats`` (pure statistical functions), ``analysis`` (every table behind notebooks 04-07 and 10,
and ``summary.json``).
"""
