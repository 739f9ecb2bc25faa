"""Does a scheduler read what it declares? A permuted-truth check of its decisions.

A policy that does not declare ``oracle`` information must decide the same whatever the requests' *true* output
lengths are: :func:`reads_true_output` drives the policy through a fixed sequence of states of a window (every
request waiting; the priorities, the admission order; a fixed batch admitted and served; the priorities, the
admission order, the victim and the next decision again), once with the window's output lengths and once with
them permuted, and compares the decisions. The built-ins are held to this in ``tests/test_predictors.py``; the
campaign holds every plug-in to it before it runs (``portbench.study.campaign.check_plugins``).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..core.config import SimulationConfig
from . import schedulers
from .request import RUNNING, WAITING, requests_from_window

MIN_OUTPUT = 5      # outputs are raised to this before permuting, so the fixed batch's 2 tokens finish none


def decisions(name: str, window_df: pl.DataFrame, sim: SimulationConfig, profile) -> list:
    """What scheduler ``name`` decides on a fixed sequence of states of ``window_df``."""
    sched = schedulers.scheduler_for(sim, name)
    reqs, ctx = requests_from_window(window_df, profile, np.random.default_rng(3), sim.edf_slo_dict)
    sched.reset(ctx)
    now = float(max(r.arrival_s for r in reqs))
    for r in reqs:
        r.state = WAITING
        sched.on_arrival(r, r.arrival_s)
    out = [[sched.priority(r, now) for r in reqs], [r.id for r in sched.admission_order(list(reqs), now)]]
    batch = [r for r in reqs if r.id % 3 == 0]
    for r in batch:
        sched.on_admit(r, now)
        r.state = RUNNING
        r.blocks = 1
    for r in batch:
        r.generated = 2
    sched.on_tokens(batch, 2, lambda i: now + 0.01 * i)
    later = now + 0.02
    waiting = [r for r in reqs if r.state == WAITING]
    out += [[sched.priority(r, later) for r in reqs], [r.id for r in sched.admission_order(waiting, later)],
            [sched.victim(batch, later).id if batch else None], list(sched.next_decision(batch, waiting, later))]
    return out


def reads_true_output(name: str, window_df: pl.DataFrame, sim: SimulationConfig, profile, seed: int = 0) -> bool:
    """True when ``name``'s decisions change when only the true output lengths of ``window_df`` are permuted."""
    df = window_df.with_columns(pl.col("output_tokens").clip(lower_bound=MIN_OUTPUT))
    out = df["output_tokens"].to_numpy()
    perm = np.random.default_rng(seed).permutation(out)
    if np.array_equal(perm, out):
        perm = np.roll(out, 1)
    if np.array_equal(perm, out):          # every output the same length: nothing to permute
        return False
    permuted = df.with_columns(pl.Series("output_tokens", perm, dtype=df["output_tokens"].dtype))
    return decisions(name, df, sim, profile) != decisions(name, permuted, sim, profile)
