"""The policies vLLM can run through ``scheduling_policy="priority"``, and their static priorities."""

from __future__ import annotations

import numpy as np

from ...core.errors import check_choice
from ..request import requests_from_window
from .base import get_scheduler

# The policies vLLM can run through scheduling_policy="priority" (fcfs runs natively).
VLLM_STATIC_PRIORITY = ("sjf_prompt", "sjf_oracle", "sjf_predicted", "edf", "ltr", "random")  # classes with vllm_static


def static_priority(name: str, window_df, seed: int, *, profile=None, slo=None, max_model_len: int | None = None,
                    **options) -> np.ndarray:
    """vLLM priorities (int64, lower = served first; one per window row) that reproduce the
    simulator's admission order of ``name`` for the same ``seed``: the dense rank of the
    scheduler's static key (ties by row = arrival order). ``ltr`` exports its score (vLLM has no
    starvation protection); ``edf`` needs ``slo`` (or option ``slo``). The requests are built as the
    simulator builds them, outputs clipped to ``max_model_len`` (None: the profile's; sjf_oracle ranks the
    clipped output, as the simulator does).
    """
    check_choice("name", name, VLLM_STATIC_PRIORITY)
    sched = get_scheduler(name, **options)
    mml = int(max_model_len if max_model_len is not None else (getattr(profile, "max_model_len", 0) or 0))
    reqs, ctx = requests_from_window(window_df, profile, np.random.default_rng(seed), slo, max_model_len=mml)
    sched.reset(ctx)
    keys = [(sched.static_key(r), r.id) for r in reqs]
    order = sorted(range(len(reqs)), key=lambda i: keys[i])
    ranks = np.empty(len(reqs), dtype=np.int64)
    for rank, i in enumerate(order):
        ranks[reqs[i].id] = rank
    return ranks
