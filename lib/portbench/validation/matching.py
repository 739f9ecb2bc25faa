"""Does the engine run the campaign's configuration? Settings side by side, refusals per source.

The engine runs a scaled copy of the campaign: token counts x ``token_scale`` on both sides, so a
setting counted in tokens (context limit, KV cache, token budget, prefix-cache block) is compared in
*real-token equivalents* (the engine's value / ``token_scale``). :func:`campaign_settings` reads the
campaign's (the simulation profile, ``engine.prefix_caching``, Sarathi-Serve's budget);
:func:`engine_settings` the engine's (from :class:`.resim.EngineSettings`, i.e. what the engine itself
reported, or from the configured spec before it starts); :func:`settings_match` compares them and counts,
per source over its windows, the requests each side loses to a limit -- refused (prompt >= context
limit) or never fitting the whole KV cache -- and the share the engine loses that the campaign does not
(the target: at most :data:`MAX_EXTRA_REFUSED` per source).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import polars as pl

from ..sim.profiles import Profile
from ..sim.profiles.hardware import SARATHI_TOKEN_BUDGET

MAX_EXTRA_REFUSED = 0.01   # no source may lose more than 1 % of its requests to a limit the campaign does not have
RELATIVE_TOLERANCE = 0.02  # a token-counted setting "matches" within 2 % (one engine block of rounding)


def campaign_settings(profile: Profile, prefix_caching: str) -> dict:
    """The campaign's settings in real tokens (profile + ``engine.prefix_caching``)."""
    return {"max_model_len": int(profile.max_model_len), "kv_cache_tokens": int(profile.kv_capacity_blocks) * int(profile.block_size),
            "block_size": int(profile.block_size), "max_num_batched_tokens": int(profile.max_batched_tokens),
            "sarathi_token_budget": int(SARATHI_TOKEN_BUDGET), "max_num_seqs": int(profile.max_num_seqs),
            "prefix_caching": str(prefix_caching)}


def engine_settings(*, num_blocks: int, block_size: int, max_num_batched_tokens: int, max_num_seqs: int,
                    max_model_len: int, token_scale: float, prefix_caching: bool,
                    sarathi_token_budget: int | None) -> dict:
    """The engine's settings in real-token equivalents (engine value / ``token_scale``; usable blocks =
    ``num_blocks - 1``, vLLM's null block)."""
    s = float(token_scale)
    return {"max_model_len": int(round(max_model_len / s)), "kv_cache_tokens": int(round((num_blocks - 1) * block_size / s)),
            "block_size": int(round(block_size / s)), "max_num_batched_tokens": int(round(max_num_batched_tokens / s)),
            "sarathi_token_budget": None if sarathi_token_budget is None else int(round(sarathi_token_budget / s)),
            "max_num_seqs": int(max_num_seqs), "prefix_caching": "auto" if prefix_caching else "off",
            "token_scale": s}


def lost_requests(df: pl.DataFrame, max_model_len: float, kv_tokens: float, scale: float = 1.0) -> dict:
    """Requests of ``df`` a side loses at its limits, its token counts x ``scale`` (ceil, >= 1) as the
    engine's side sees them: ``refused`` (prompt >= context limit), ``never_fit`` (admitted, but prompt +
    output clipped to the context limit needs more than the whole KV cache)."""
    p = df["prompt_tokens"].to_numpy().astype(float)
    o = df["output_tokens"].to_numpy().astype(float)
    if scale != 1.0:
        p, o = np.maximum(np.ceil(p * scale), 1), np.maximum(np.ceil(o * scale), 1)
    refused = p >= max_model_len
    total = p + np.minimum(o, np.maximum(max_model_len - p, 0))
    never = ~refused & (total > kv_tokens)
    return {"requests": int(p.size), "refused": int(refused.sum()), "never_fit": int(never.sum()),
            "lost_share": float((refused | never).mean()) if p.size else math.nan,
            "lost_mask": refused | never}


def settings_match(campaign: Mapping, engine: Mapping, raw: Mapping, windows_by_source: Mapping[str, pl.DataFrame],
                   *, hash_block_tokens: Mapping[str, int | None] | None = None) -> dict:
    """Per setting: campaign vs engine (real-token equivalents) and whether they match; per source the
    requests lost on each side and the share only the engine loses (``ok``: <= :data:`MAX_EXTRA_REFUSED`).

    ``raw``: the engine's own values (engine tokens: ``max_model_len``, ``usable_kv_tokens``, ``block_size``);
    ``windows_by_source``: the campaign's windows of each source, pooled; ``hash_block_tokens``: the
    source's tokens per prefix-cache hash block (None: no hashes), for prefix caching per source."""
    scale = float(engine["token_scale"])
    rows = {}
    for k in ("max_model_len", "kv_cache_tokens", "max_num_batched_tokens", "sarathi_token_budget", "max_num_seqs",
              "block_size"):
        c, e = campaign.get(k), engine.get(k)
        ok = (c is not None and e is not None and abs(e - c) <= RELATIVE_TOLERANCE * max(abs(c), 1))
        rows[k] = {"campaign": c, "engine": e, "match": bool(ok)}
    rows["block_size"]["note"] = ("memory granularity: the CPU attention needs blocks of 32 engine tokens, i.e. "
                                  f"{rows['block_size']['engine']} real tokens vs the campaign's {campaign['block_size']}")
    sources = {}
    for s, df in sorted(windows_by_source.items()):
        cam = lost_requests(df, campaign["max_model_len"], campaign["kv_cache_tokens"])
        eng = lost_requests(df, raw["max_model_len"], raw["usable_kv_tokens"], scale)
        extra = float((eng["lost_mask"] & ~cam["lost_mask"]).mean()) if df.height else math.nan
        hb = (hash_block_tokens or {}).get(s)
        pc_campaign = bool(hb) and campaign["prefix_caching"] != "off"
        pc_engine_ok = bool(hb) and engine["prefix_caching"] != "off" and (hb * scale) % raw["block_size"] == 0
        sources[s] = {"requests": cam["requests"],
                      "campaign": {k: cam[k] for k in ("refused", "never_fit", "lost_share")},
                      "engine": {k: eng[k] for k in ("refused", "never_fit", "lost_share")},
                      "extra_lost_share": extra, "ok": bool(extra <= MAX_EXTRA_REFUSED),
                      "prefix_caching": {"campaign": pc_campaign, "engine": pc_engine_ok,
                                         "match": pc_campaign == pc_engine_ok,
                                         "hash_block_tokens": hb}}
    return {"settings": rows, "sources": sources, "max_extra_lost_share": MAX_EXTRA_REFUSED,
            "all_sources_ok": bool(all(v["ok"] for v in sources.values())),
            "token_scale": scale}
