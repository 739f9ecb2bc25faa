"""The aggregations notebook 03 used to do inline, now library functions: the swap campaign's per-scheduler means
(:func:`portbench.study.engine_sensitivity.swap_means`) and the summary of the transfer campaign's ranks
(:func:`portbench.present.text.variant_ranks_summary`), checked on small hand-made tables."""

import math

import polars as pl

from portbench.present import text
from portbench.study import engine_sensitivity as sens


def _ranks() -> pl.DataFrame:
    rows = []
    for src, off in (("azure", 0.0), ("mooncake", 2.0)):
        for pol, base in (("sjf_predicted", 3.0), ("ltr", 5.0)):
            gap = (2.0 if pol == "ltr" else 1.0) + off / 4          # home − oracle: 1, 2 (azure); 1.5, 2.5 (mooncake)
            for var, d in (("home", 0.0), ("oracle", -gap), ("from azure", 0.5), ("from mooncake", 1.5)):
                if var == f"from {src}":
                    continue
                for region, e in (("light", 0.0), ("overload", 1.0)):
                    rows.append({"source": src, "policy": pol, "variant": var, "region": region,
                                 "rank": base + off + d + e, "n_ranked": 13})
    return pl.DataFrame(rows)


def test_variant_ranks_summary_states_each_mean_rank_and_the_largest_loss():
    md = text.variant_ranks_summary(_ranks(), {"azure": "Azure", "mooncake": "Mooncake"}, 3)
    # azure sjf_predicted: home = mean over regions of 3 and 4 = 3.5; oracle 1 lower; the one foreign predictor 5.0
    assert "* **Azure**: `sjf_predicted` 3.5 (oracle variant 2.5; foreign predictors 5.0–5.0)" in md
    assert "* **Mooncake**: `sjf_predicted` 5.5 (oracle variant 4.0; foreign predictors 6.0–6.0), `ltr` 7.5 " \
           "(oracle variant 5.0; foreign predictors 8.0–8.0)" in md
    assert "Mean rank of 13 with the home predictor" in md
    assert "ranks +1.8 places from the oracle variant" in md     # mean of 1, 2, 1.5, 2.5
    assert "the largest loss is +2.5 (`ltr` on Mooncake)" in md and "Ranks come from 3 windows per source" in md


def test_swap_means_average_every_column_per_scheduler():
    swap = pl.DataFrame({"scheduler": ["las", "las", "fcfs"], "preemptions_recompute": [2.0, 4.0, 0.0],
                         "swaps_swap": [1.0, 3.0, 0.0], "completed_recompute": [10.0, 20.0, 30.0],
                         "completed_swap": [12.0, 22.0, 30.0], "e2e_mean_recompute": [1.0, 3.0, 2.0],
                         "e2e_mean_swap": [0.5, 1.5, 2.0]})
    out = sens.swap_means(swap)
    assert out["scheduler"].to_list() == ["fcfs", "las"]
    las = out.row(1, named=True)
    assert (las["preemptions_recompute"], las["swaps_swap"], las["completed_swap"]) == (3.0, 2.0, 17.0)
    assert math.isclose(las["e2e_mean_swap"], 1.0)
