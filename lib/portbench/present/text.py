"""Text the notebooks and the terminal show, written from computed values (never typed-in numbers).

Markdown for the notebooks (banners, method and result paragraphs) and plain-text reports for the
command line; the numbers come from the compute layers' tables and summaries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

import polars as pl

from ..core.provenance import label
from ..data import standins
from ..data.standins import StandinInputs
from ..data.standins import burstgpt as standin_burstgpt
from ..sim import metrics, profiles, schedulers
from ..study import honest
from ..study.campaign import tables as campaign_tables
from . import numbers, plots_sim


def banner(provenance_by_source: Mapping[str, str], skipped: Iterable[str] = (),
           names: Mapping[str, str] | None = None, origins: Mapping[str, str | None] | None = None) -> str:
    """Markdown banner opening every notebook: which sources are real in this run (``names``: display
    names, ``cfg.display_names``; ``origins``: ``official`` / ``user`` per real source, when known)."""
    names = names or {}
    origins = origins or {}

    def name(s: str) -> str:
        return names.get(s) or s

    def prov(s: str, p: str) -> str:
        o = origins.get(s)
        return f"**{p}**" + (f" ({o} file)" if p == "real" and o else "")

    rows = [f"| {name(s)} | {prov(s, p)} | {label(s, p, names)} |" for s, p in provenance_by_source.items()]
    rows += [f"| {name(s)} | skipped | no real file and no stand-in |" for s in skipped]
    real = [name(s) for s, p in provenance_by_source.items() if p == "real"]
    stand = [name(s) for s, p in provenance_by_source.items() if p == "standin"]
    head = f"**Data in this run.** Real: {', '.join(real) or 'none'}."
    user = [name(s) for s, p in provenance_by_source.items() if p == "real" and origins.get(s) == "user"]
    if user:
        head += f" Of these, the user's own file(s): {', '.join(user)} (recorded by SHA-256; not official files)."
    if stand:
        head += (f" Stand-in (synthetic, built from the real evidence available): {', '.join(stand)}."
                 " Results for stand-in sources describe the stand-in, not the official trace.")
    return head + "\n\n| source | provenance | shown as |\n|---|---|---|\n" + "\n".join(rows)


def format_report(report: Mapping) -> str:
    """A readable text table of an ingest report (one line per source, reasons for skipped ones)."""
    head = ("source", "provenance", "file", "format", "rows read", "valid", "excluded", "span", "rate", "sha256")
    rows, notes = [], []
    for source, r in (report.get("sources") or {}).items():
        if r.get("skipped"):
            rows.append((source, str(r.get("provenance")), str(r.get("file")), "-", "-", "-", "-", "-", "-", "-"))
            notes.append(f"  {source}: skipped - {r.get('reason')}")
            continue
        notes += [f"  {source}: warning - {w}" for w in r.get("warnings") or []]
        excluded = ", ".join(f"{k} {v:,}" for k, v in (r.get("excluded") or {}).items()) or "none"
        span = r.get("span_s")
        rate = r.get("rate_rps")
        sha = (r.get("sha256") or "")[:12] + (" (verified)" if r.get("sha256_verified") else
                                                 " (user file)" if r.get("origin") == "user" else "")
        fmt = f"{r.get('format')} (mapped)" if r.get("adapter") == "generic" else str(r.get("format"))
        rows.append((source, str(r.get("provenance", "")), str(r.get("file")), fmt,
                     f"{r['rows_read']:,}", f"{r['rows_valid']:,}", excluded,
                     _duration(span), f"{rate:.3g} req/s" if rate else "-", sha or "-"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(["-" * w for w in widths]), *map(line, rows)]
    return "\n".join(out + (["", "Skipped sources and warnings:", *notes] if notes else []))


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:,.0f} s"


# --------------------------------------------------------------------------- notebook 02: stand-ins


def evidence_markdown(inp: StandinInputs) -> str:
    """Notebook 02's text about the stand-ins, every number computed from
    :func:`portbench.data.standins.estimates` and :func:`~portbench.data.standins.evidence_tables`."""
    est, t = standins.estimates(inp), standins.evidence_tables(inp)
    bg, sg = est["burstgpt"], est["servegen"]
    bl_std, bg_std = inp.label("bailian"), inp.label("burstgpt")
    ks = {(r["compared_with"], r["metric"]): r["ks"] for r in t["burstgpt_ks"].iter_rows(named=True)}
    ks_pairs = max(v for (c, _), v in ks.items() if c == "real slices, valid rows")
    ks_gap = next(v for (_, m), v in ks.items() if m == "gap / mean gap")
    roll_desc = standin_burstgpt._rollup_desc(standins.burstgpt_evidence(inp))
    lb = {m: v for (c, m), v in ks.items() if c.startswith(roll_desc)}
    mix = t["burstgpt_mix"].filter(pl.col("evidence").str.starts_with(roll_desc) & (pl.col("category") == "API log"))
    roll_api = float(mix["share"][0]) if mix.height else float("nan")
    lengths = {(r["evidence"], r["metric"]): r for r in t["burstgpt_lengths"].iter_rows(named=True)}

    def p50(prefix: str, metric: str) -> float:
        return next(r["p50"] for (e, m), r in lengths.items() if e.startswith(prefix) and m == metric)

    w = t["burstgpt_windows"]
    std_cv = w.filter(pl.col("provenance") == "standin")["interarrival_cv"]
    rw = bg["real_window_cv"]
    shares = bg["log_type_shares"]
    excluded_rows = sum(c["excluded"] for c in bg["slices"].values())
    n_api = round(shares["slices"].get("API log", 0.0) * bg["pairs"])
    reweighted = [r for (e, m), r in lengths.items() if "reweighted" in e and m == "output_tokens"]
    text = [
        f"**{bg_std}.** (prompt, output) pairs are resampled from the {bg['pairs']} valid rows of "
        f"{len(bg['slices'])} real slices ({excluded_rows} failure rows excluded); tenant = model/log type. "
        f"Arrivals: Gamma renewal process with rate {bg['rate_rps_used']:.3g} req/s "
        f"({'the mean rate of ' + bg['rate_file'] if bg['rate_choice'] == 'full_file' else 'the slices'}) and "
        f"CV {bg['cv_used']:.2f} (the {bg['cv_choice']} estimate). The slices themselves run at "
        f"{bg['rate_rps'] * 3600:.1f} req/h (95% CI {bg['rate_ci'][0] * 3600:.1f}-{bg['rate_ci'][1] * 3600:.1f}), "
        f"{bg['slices_vs_full_file_rate_ratio']:.1%} of the full file's rate: they are the quiet first hours of "
        f"the files, so only their burst pattern is used. The raw pooled CV of their gaps is {bg['cv_pooled']:.2f} "
        f"(95% block-bootstrap CI {bg['cv_pooled_ci'][0]:.2f}-{bg['cv_pooled_ci'][1]:.2f}), inflated by the "
        f"night-to-morning rate ramp; net of rate changes slower than {bg['cv_window_span_gaps']} requests it is "
        f"{bg['cv_window']:.2f} (CI {bg['cv_window_ci'][0]:.2f}-{bg['cv_window_ci'][1]:.2f}). The slices' own "
        f"{rw['windows']} overlapping {rw['size']}-request windows have CVs {rw['min']:.2f}-{rw['max']:.2f} "
        f"(median {rw['median']:.2f}); the stand-in's windows {std_cv.min():.2f}-{std_cv.max():.2f} (median "
        f"{std_cv.median():.2f}). The Gamma family matches rate and CV, not the shape of the gap distribution "
        f"(KS {ks_gap:.2f} on gaps over their window mean: it puts more gaps near zero). The 1-s timestamp "
        f"resolution changes the CV by {abs(bg['resolution_cv_relative_effect']):.1e} (relative).",
        f"Lengths reproduce the slices (KS at most {ks_pairs:.3f}). Against the aggregate of {roll_desc} "
        f"({roll_api:.0%} API log) they are long: median prompt {p50(bg_std, 'prompt_tokens'):.0f} vs "
        f"{p50(roll_desc, 'prompt_tokens'):.0f} tokens, median output {p50(bg_std, 'output_tokens'):.0f} vs "
        f"{p50(roll_desc, 'output_tokens'):.0f} (KS at least {lb.get('prompt_tokens', float('nan')):.2f} and "
        f"{lb.get('output_tokens', float('nan')):.2f}). The slices are "
        f"{shares['slices'].get('Conversation log', 0.0):.1%} Conversation log, while API logs dominate the full "
        f"files ({shares['full_file_id']}: {shares['full_file'].get('API log', 0.0):.1%} API log); the aggregate's "
        f"shorter lengths suggest that API requests are shorter. "
        f"Log types are "
        + ("reweighted to the full file's shares." if bg["reweight_log_types"] else
           f"not reweighted: the slices hold {n_api} API rows, and weighting them up makes the stand-in a few "
           f"repeated pairs" + (f" (output p99 {reweighted[0]['p99']:.0f} = p90 {reweighted[0]['p90']:.0f})"
                                if reweighted else "")
           + ". The stand-in represents BurstGPT's Conversation-log traffic."),
        f"**{bl_std}.** ServeGen m-small has {sg['clients_with_trace']} clients with trace files and "
        f"{sg['clients_with_dataset']} with length data; {sg['n_excluded']} "
        f"(clients {', '.join(map(str, sg['excluded']))}) "
        f"have no dataset file here and are excluded; they carry {sg['excluded_share_of_requests']:.0%} of the "
        f"requests, so the stand-in reflects the other clients' mix. Each of the {sg['windows_per_client']} "
        f"600-s windows has {sg['active_per_window']['min']}-{sg['active_per_window']['max']} active used clients "
        f"(median {sg['active_per_window']['median']:.0f}; {sg['idle_windows']} idle windows); the stand-in windows "
        f"start with {sg['standin_active_at_start']['min']}-{sg['standin_active_at_start']['max']} active.",
    ]
    blk = {(r["kind"], r["metric"]): r["ks"] for r in t["bailian_ks"].iter_rows(named=True)}
    own = max(v for (k, _), v in blk.items() if "own evidence" in k)
    other = {m: v for (k, m), v in blk.items() if "different services" in k}
    bl = {(r["provenance"], r["evidence"][:4], r["metric"]): r for r in t["bailian_lengths"].iter_rows(named=True)}
    q = {m: r for (prov, e, m), r in bl.items() if e == "Qwen"}
    s_ = {m: r for (prov, e, m), r in bl.items() if prov == "standin"}
    text.append(
        f"Its lengths reproduce the request-weighted PMFs they are drawn from (KS at most {own:.3f}). Beside the "
        f"only real Qwen rows here they are far shorter: median prompt {s_['prompt_tokens']['p50']:.0f} vs "
        f"{q['prompt_tokens']['p50']:.0f} tokens, median output {s_['output_tokens']['p50']:.0f} vs "
        f"{q['output_tokens']['p50']:.0f} (KS {other['prompt_tokens']:.2f} and {other['output_tokens']:.2f}). That "
        f"comparison is weak: the Qwen rows are {q['prompt_tokens']['n']} thinned rows of traceA (to-C chat), the "
        f"default real file is traceB (to-B API), and ServeGen m-small is a different Bailian service.")
    return "\n\n".join(text)


def counterfactual_markdown(table: pl.DataFrame) -> str:
    """Notebook 02's sentence on what the burstiness counterfactual changed, from the table of
    :func:`counterfactual_demo` (first row the window, second the variant)."""
    base, cf = table.row(0, named=True), table.row(1, named=True)
    d = json.loads(cf["definition"])
    same_requests = (base["n"] == cf["n"] and base["prompt_mean"] == cf["prompt_mean"]
                     and base["output_mean"] == cf["output_mean"])
    same_rate = math.isclose(base["rate_rps"], cf["rate_rps"], rel_tol=1e-9)
    kept = (f"The same {base['n']} requests, in the same order and with the same lengths (mean prompt "
            f"{base['prompt_mean']:,.0f}, mean output {base['output_mean']:,.0f} tokens)," if same_requests else
            f"{cf['n']} requests (the window has {base['n']}),")
    rate = (f"over the same span of {base['span_s']:,.4g} s, so the mean rate is unchanged at "
            f"{base['rate_rps']:.3g} req/s" if same_rate else
            f"at {cf['rate_rps']:.3g} req/s (the window: {base['rate_rps']:.3g} req/s)")
    only = same_requests and same_rate
    return (f"**What changed.** {'Only the' if only else 'The'} gaps between arrivals: the inter-arrival CV "
            f"goes from {base['interarrival_cv']:.2f} in the window to {cf['interarrival_cv']:.2f} in the variant "
            f"(a {d['params']['family']} renewal process with target CV {d['params']['cv']:g}; a "
            f"{cf['n']}-request sample scatters around its target, and below it for heavy-tailed gaps). {kept} "
            f"arrive {rate}" + (": simulated on the two, schedulers would face the same work and load, "
                                "differing only in how bunched the arrivals are." if only else "."))


# --------------------------------------------------------------------------- notebook 03: the model


def _fit_cell(e: dict) -> str:
    return f"{e['r2']:.3f} / {e['median_abs_rel_err']:.1%} / {e['max_abs_rel_err']:.1%}"


def profiles_markdown() -> str:
    """A table of the registered profiles: hardware, KV capacity, coefficients, calibration."""
    head = ("| profile | GPU | model | max_model_len | KV tokens | KV blocks | c0 (ms) | c_prefill (µs/token) | "
            "c_decode (µs/seq) | c_kv (ns/token) | c_attn (ns/pair) | floor (ms) / knee (tokens) | "
            "decode-sized fit R² / median / max err | prefill-sized fit R² / median / max err | "
            "token budget / max seqs | budget iteration (ms) |")
    lines = ["Cost-model profiles: t = c0 + c_prefill·P + c_decode·B + c_kv·C + c_attn·A + floor·max(0, 1 − (P + B)/knee), "
             "P = prefill tokens, B = decode sequences, C = context tokens (decode attention: KV read, "
             "linear in the context), A = prefill attention token pairs (Σ over the iteration's prompt "
             "chunks of new × (cached + new), causal: quadratic in the chunk's context). The floor term makes the "
             "weight GEMMs cost the larger of their memory-bound (weight-read) line and their "
             "compute-bound line, max(a_d + s_d·N, a_p + c_prefill·N) with N = P + B; the knee is "
             "where the two measured lines cross. Fit errors are of that one formula against the "
             "measured rows: decode-sized batches N ≤ 256, prefill-sized 256 ≤ N ≤ min(max_model_len, 8192). "
             "Token budget and max seqs: vLLM's defaults on the GPU (V1 max_num_batched_tokens, "
             "max_num_seqs); the last column is a prefill-only iteration of that many tokens.",
             "", head, "|" + "---|" * (head.count("|") - 1)]
    for p in profiles.PROFILES.values():
        mf = p.provenance["model_fit"]
        b = p.max_batched_tokens
        chunk_ms = p.prefill_s(b) * 1e3
        lines.append(
            f"| {p.name} | {p.gpu} | {p.model} | {p.max_model_len:,} | {p.kv_capacity_tokens:,} | "
            f"{p.kv_capacity_blocks:,} | {p.c0_s * 1e3:.2f} | {p.c_prefill_s * 1e6:.2f} | {p.c_decode_s * 1e6:.2f} | "
            f"{p.c_kv_s * 1e9:.1f} | {p.c_attn_s * 1e9:.2f} | {p.floor_s * 1e3:.2f} / {p.floor_tokens:.0f} | "
            f"{_fit_cell(mf['decode'])} | {_fit_cell(mf['prefill'])} | {b:,} / {p.max_num_seqs:,} | {chunk_ms:.1f} |")
    lines.append("")
    for p in profiles.PROFILES.values():
        pv = p.provenance
        over = ", ".join(f"{k} tok {v:+.0%} (linear model without floor: "
                         f"{pv['prefill_only_overcharge_linear'][k]:+.0%})"
                         for k, v in pv["prefill_only_overcharge"].items())
        lin = pv["linear_model_fit"]["prefill"]
        lines.append(
            f"- {p.name}: {p.notes}. KV {pv['kv']['kv_bytes_per_token'] / 1024:.0f} KiB/token. "
            f"Token-linear basis: {pv['token_linear_basis']}. eta_mem "
            f"{pv['eta_mem']:.2f} (measured), eta_flop {pv['eta_flop']:.2f} (measured). Prefill-only "
            f"iteration charged vs measured: {over}; over all prefill-sized rows the linear model's "
            f"prefill-only line had {_fit_cell(lin)}. Prefill attention (roofline) adds "
            + ", ".join(f"{v:.0%} at {int(k):,}" for k, v in pv["attention"]["prefill_share_of_gemm"].items()
                        if int(k) <= p.max_model_len)
            + f" tokens to a whole prompt's GEMM time. Swap: {pv['swap']['pcie_gb_s']:.0f} GB/s PCIe, "
            f"{p.swap_s_per_block * 1e6:.0f} µs per block, {p.host_kv_blocks:,} host blocks. Isolated request "
            f"1,000+200 tokens: {p.isolated_service_s(1000, 200, p.max_batched_tokens):.2f} s.")
    tc = profiles.transfer_check()
    lines += ["", f"FLOP-ratio transfer check (A100 Llama-2-7B rows -> Llama-3-8B vs measured): "
              f"prefill regime median |err| {tc['prefill_median_abs_rel_err']:.1%}, integrated "
              f"{tc['prefill_integrated_rel_err']:+.1%}; decode regime median |err| "
              f"{tc['decode_median_abs_rel_err']:.1%}.",
              "Calibrated on the measured rows: the compute-bound line (c0's intercept, c_prefill, the "
              "GEMM part of c_decode) and the memory-bound line (floor, knee). Roofline (not measured): "
              "c_kv (decode attention: KV bytes at the measured streaming efficiency), c_attn (prefill "
              "attention FLOPs at the GEMMs' measured FLOP rate), LM head (read in c0, compute in "
              "c_decode), swap copies (PCIe); assumed: "
              f"engine overhead {profiles.ENGINE_OVERHEAD_S * 1e3:.1f} ms/iteration, non-torch reserve "
              f"{profiles.NON_TORCH_RESERVE_BYTES / 2**30:.1f} GiB, PCIe efficiency {profiles.PCIE_EFFICIENCY:.0%}, "
              f"host memory for swapped KV {profiles.HOST_SWAP_BYTES / 2**30:.0f} GiB; vLLM gpu_memory_utilization "
              f"{profiles.GPU_MEMORY_UTILIZATION}."]
    return "\n".join(lines)


def schedulers_markdown() -> str:
    """Markdown table of the registered schedulers: the main information each uses, everything its
    decisions read, which are in ``all`` (the 13), and the engine settings that depend on the policy."""
    head = ("| scheduler | information | uses | in `all` | preemptive | token budget (V1) | prefill under V0 | "
            "vLLM static priority | models |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for row in schedulers.table():
        name = row["name"]
        cls = schedulers.SCHEDULERS[name]
        used = " + ".join(schedulers.uses(name))
        in_all = "yes" if getattr(cls, "in_all", True) else "no (comparison)"
        budget = row.get("token_budget", "engine default")
        lines.append(f"| {name} | {row['information']} | {used} | {in_all} | "
                     f"{'yes' if row['preemptive'] else 'no (memory only)'} | "
                     f"{budget if isinstance(budget, str) else f'{budget:,}'} | {row['prefill']} | "
                     f"{'yes' if row['vllm_static_priority'] else 'no'} | {row['models']} |")
    lines += ["", "information: none | arrival (order only) | prompt (length) | predicted (the window's frozen "
              "prediction of a learned predictor trained outside the frozen windows) | oracle (true output "
              "length) | tenant | attained (tokens generated so far). Ties are broken by arrival everywhere; "
              "only *_oracle policies read a true output length. Preemption = pause (KV kept) while memory "
              "allows, recompute eviction when memory is short; see portbench.sim.schedulers."]
    return "\n".join(lines)


def metrics_markdown(slo: Mapping | None = None) -> str:
    """Markdown table of the metrics (with the SLO definitions ``slo``: name -> {ttft_s, tpot_s})."""
    out = ["| metric | better | unit | definition |", "|---|---|---|---|"]
    out += [f"| `{m.name}` | {m.direction} | {m.unit} | {m.description} |" for m in metrics.table(slo)]
    return "\n".join(out)


def preemption_markdown(runs, labels: Mapping | None = None) -> str | None:
    """Notebook 03's explanation of why the attained-service policies (las, mlfq, rr) preempt more than
    fcfs, with their mean preemptions per run at the heaviest region of ``runs``; None when the runs
    have none of them, no fcfs, or no preemption at that load."""

    names = set(runs["scheduler"])
    ranked = [p for p in campaign_tables.ATTAINED_RANKING if p in names]
    pre = campaign_tables.preemption_table(runs)
    heavy = pre.filter(pl.col("rho") == pre["rho"].max())
    if not ranked or "fcfs" not in names or not heavy["preemptions_per_run"].max() > 0:
        return None
    lab = plots_sim._labels_for(runs, labels)
    per_run = {(r["source"], r["scheduler"]): r["preemptions_per_run"] for r in heavy.iter_rows(named=True)}
    srcs = [s for s in lab if (s, "fcfs") in per_run]
    idle = [lab[s] for s in srcs if max(per_run[(s, p)] for p in [*ranked, "fcfs"]) < 1]
    one = len(ranked) == 1
    numbers = "; ".join(f"{lab[s]}: " + ", ".join(f"`{p}` {per_run[(s, p)]:.1f}" for p in ranked)
                        + f" vs `fcfs` {per_run[(s, 'fcfs')]:.1f}" for s in srcs)
    return (
        f"**Why {', '.join(f'`{p}`' for p in ranked)} preempt{'s' if one else ''} more than `fcfs` when memory is "
        f"short.** {'It ranks' if one else 'They rank'} requests by the service received so far "
        f"({'; '.join(campaign_tables.ATTAINED_RANKING[p] for p in ranked)}), so newly arrived requests, with zero attained service, "
        "rank above running requests that have already been served. When the KV cache is full, serving the newcomers "
        "means evicting running requests, and each evicted request must later recompute its prompt and every token "
        "it has generated so far (the campaign's engine preempts by recompute, as vLLM V1 does; swapping to host "
        "memory is the `engine.preemption: swap` sensitivity). `fcfs` never lets a newcomer overtake: it evicts (the latest arrival) only when the running "
        f"requests' own growth overflows the cache. Mean preemptions per run in region *{heavy['region'][0]}* "
        f"(ρ = {heavy['rho'][0]:g}): {numbers}."
        + (f" On {' and '.join(idle)} the cache almost never fills at this load (under one preemption per run for "
           "every policy shown), so the ranking costs almost no recomputation there." if idle else ""))


# --------------------------------------------------------------------------- notebooks 04-07, 10: the analysis


def fmt(stat: dict | None, digits: int = 2) -> str:
    """``"0.71 [0.65, 0.77] (n = 252)"`` from a summary stat dict."""
    if not stat or stat.get("value") is None:
        return "n/a"
    v, num = stat["value"], numbers.fixed(digits)
    n = stat.get("count")
    return numbers.with_ci(num(v) if isinstance(v, float) else f"{v}", stat.get("ci"),
                           stat.get("ci_conditions") if n is not None else None, num=num, count=n)


def pct(x, digits: int = 1) -> str:
    """``"12.3%"`` from a number or a summary stat dict (``"n/a"`` when missing)."""
    v = x.get("value") if isinstance(x, Mapping) else x
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.{digits}f}%"


def pct_ci(stat: Mapping | None, digits: int = 1) -> str:
    """``"12.9% [12.5%, 13.5%]"`` from a summary stat dict (``"n/a"`` when missing)."""
    if not stat or stat.get("value") is None:
        return "n/a"
    return numbers.with_ci(pct(stat, digits), stat.get("ci"), stat.get("ci_conditions"),
                           num=lambda v: pct(v, digits), conditions="words")


def tied_ranks_markdown(par: Mapping) -> str:
    """The notebooks' paragraph on how rankings are tied (from the ``parameters`` block of the summary)."""
    rule = par.get("ties", "significance")
    if rule in ("significance", "significance_practical"):
        corr = {"fdr_bh": "Benjamini–Hochberg", "holm": "Holm", "none": "no correction"}[par["tie_correction"]]
        return (
            f"**Statistical ties** (`analysis.ties` = {rule}). Two schedulers are *resolved* in a ranking when their "
            f"paired two-sided Wilcoxon signed-rank test over windows rejects at α = {par['alpha']} "
            f"({corr} over the {len(par['schedulers']) * (len(par['schedulers']) - 1) // 2} scheduler pairs of that "
            "ranking, so that among the orders one ranking claims the expected share of spurious ones is at most α), "
            "in the direction of the mean difference"
            + (f", and they differ by at least δ ({par['delta']:.0%} relative, or {100 * par['delta_absolute']:g} "
               "percentage points for proportions)" if rule == "significance_practical" else "")
            + "; otherwise they are tied. It is the same test the reversals use. Resolution is not transitive "
            "(a ~ b and b ~ c while a is resolved from c), so the **tie groups** are built as a proper partition: "
            "sort by mean, best first, and let a scheduler join the current group only if no member of the group is "
            "resolved from it, otherwise open a new group. Every group is a run of the mean order whose members are "
            "pairwise tied (no chaining: a chain of small steps never ties two resolved schedulers), and the scan "
            "gives the fewest such groups; the unresolved pairs that still end up in different groups are counted "
            "(`ties.conflicts`). Tied schedulers share their group's mean and its average rank. **Bootstrap CIs** keep "
            "the groups of the full data and re-order them by their resampled means (re-testing within a resample "
            "would count duplicated windows as independent evidence): they measure how stable the order of what the "
            "windows resolve is, not the uncertainty of which pairs are resolved, and are narrow where the groups "
            "are well separated (the groups are separated by significant tests). Aggregates also carry a second "
            "interval, *conditions resampled*: the conditions (region × metric × source pair, or source × region) "
            "drawn with replacement, which shows how much a mean depends on which conditions were studied. "
            "The old rule (means within "
            f"{100 * par['rank_tolerance']:g}% tied, single linkage) and exact ranks are reported as sensitivity rows.")
    if rule == "tolerance":
        tol = par["rank_tolerance"]
        return (f"**Practically tied ranks** (`analysis.ties` = tolerance, `analysis.rank_tolerance` = {tol:g}): a "
                f"scheduler whose mean is within {100 * tol:g}% of the next-better mean is tied with it (single "
                "linkage: a tie group can span more than the tolerance end to end). This is the old rule; it is "
                "unrelated to what the windows can resolve.")
    return "Only exactly equal means are tied (`analysis.ties` = exact); tied schedulers share the average rank."


def rankings_markdown(par: Mapping, data: Mapping, labels: Mapping) -> str:
    """How each ranking is made (schedulers, replicates, windows, direction, headline metrics, ties, bootstrap
    CIs, notes on the data): the method paragraph of notebooks 04, 05 and 07."""
    return f"""**Rankings.** For each source, region and metric, each of the {len(par['schedulers'])} schedulers'
values are averaged over replicates within a window ({data['replicates']} replicate(s) per window: the window is the unit)
and then over the source's windows ({', '.join(f"{labels[s]}: {n}" for s, n in data['n_windows'].items())}). Rank 1 = best, using
each metric's direction from the metric registry (↑ higher is better, ↓ lower is better).

{headline_metrics_markdown(par)}

{tied_ranks_markdown(par)}

**Confidence intervals** are 95% percentile-bootstrap intervals: {par['bootstrap']} resamples of the windows, drawn with
replacement independently within each source (seed {par['seed']}); one resample of a source's windows serves all its
schedulers, regions and metrics, so a scheduler pair stays paired on the same windows. Notes on the data:
{'; '.join(data['notes']) or 'none (every run present, every value finite)'}."""


def agreement_markdown(n_schedulers: int) -> str:
    """What tau-b, tau-b / tau-b,max and the discordance measure (the notebooks' method text); the example of
    how ties lower tau-b's ceiling is worked for ``n_schedulers``."""
    k = n_schedulers
    return ("**Agreement of two rankings.** *Kendall's τ-b* (scipy.stats.kendalltau): 1 = same order, 0 = unrelated, "
            f"−1 = reversed; ties lower its ceiling: one scheduler above {k - 1} tied ones, against a full order of {k}, "
            f"gives τ-b ≤ √({k - 1}/{k * (k - 1) // 2}) ≈ {math.sqrt(2 / k):.2f} however well the two agree. "
            "*τ-b / τ-b,max* divides by the largest τ-b the two "
            "observed tie structures allow (both rankings' tie groups keep their sizes and rank positions; the maximum "
            "is the comonotone arrangement, `stats.tau_b_max`): 1 exactly when no pair resolved in both rankings is "
            "ordered oppositely. The *discordance* is the share of scheduler pairs resolved in both rankings that the "
            "two order oppositely, pooled over conditions: the direct answer to \"when both sources can tell two "
            "schedulers apart, how often do they disagree?\". A condition where a ranking ties every scheduler has no "
            "τ-b; such conditions are counted (`conditions.all_tied`), never silently dropped.")


def headline_metrics_markdown(par: Mapping) -> str:
    """Which metrics the headline numbers use, and why (the notebooks' method text)."""
    hm = par.get("headline_metrics") or []
    return (f"**Headline metrics** (the analysis plan's `analysis.headline_metrics`, chosen after the first results had been seen): {', '.join(f'`{m}`' for m in hm)}. "
            "TTFT and TPOT are the two latencies a user of a streaming service perceives; the tails are taken at p90 "
            "because a window holds 200 requests, so its p99 is the 2nd–3rd worst request while its p90 rests on 20; "
            "`e2e_mean` is the quantity scheduling theory speaks to (SRPT minimises mean response time); `slo_medium` is "
            "the joint TTFT+TPOT attainment (goodput) under the middle SLO definition. Every headline number is over "
            "these; every other metric is secondary and has its own rows (`secondary`, `by_metric`, the p90/p95/p99 "
            "table).")


def panels_markdown(summary: Mapping) -> str:
    """Which panels of sources are compared, whether each is available and whether it is all real."""
    lines = []
    for name, p in summary.get("panels", {}).items():
        prov = ", ".join(f"{s}: {v or 'absent'}" for s, v in p["provenance"].items())
        head = " (headline)" if name == summary.get("headline_panel") else ""
        if not p["available"]:
            lines.append(f"* **{name}**{head}: {', '.join(p['sources'])} — {p['reason']}.")
        else:
            real = ("**all real**" if p["all_real"] else
                    "not all real: " + ", ".join(s for s, v in p["provenance"].items() if v != "real")
                    + " are stand-ins, so its numbers describe the stand-ins there")
            lines.append(f"* **{name}**{head}: {', '.join(p['sources'])} ({prov}) — {real}.")
    why = summary.get("headline_reason")
    return ("**Panels of sources** (`analysis.panels`): every cross-source number is computed within a panel; the "
            "headline is the first available panel whose sources are all real (else the first available one); a source "
            "of your own that is in no panel joins the sources of that panel in an implicit panel `user`, which is then "
            "the headline." + (f" Headline: **{summary.get('headline_panel')}**, because {why}." if why else "")
            + "\n\n" + "\n".join(lines))


def congestion_markdown(cong: Mapping | None, labels: Mapping) -> tuple[pl.DataFrame | None, str]:
    """The table of ``summary["congestion"]["by_source_region"]`` (one row per source x region) and a sentence on
    the mean queue of the reference policy at the lightest load. ``(None, "")`` when the block is absent; a runs
    table without queue columns (e.g. a user's ``analysis.runs_file``) gives the table and a sentence saying so."""
    rows = [{"source": s, "region": r, **v} for s, regs in ((cong or {}).get("by_source_region") or {}).items()
            for r, v in regs.items()]
    if not rows:
        return None, ""
    ct = pl.DataFrame(rows)
    if "queue_mean" not in ct.columns or "rho" not in ct.columns:
        return ct, ("The runs carry no queue column (`queue_mean`), so the load cannot be compared by its queue "
                    "here: only by ρ.")
    light = ct.filter(pl.col("rho") == ct["rho"].min())
    ref = (cong or {}).get("reference_policy", "fcfs")
    return ct, ("At the lightest load (ρ = " + f"{light['rho'][0]:g}" + f") the mean {ref.upper()} queue is "
                + ", ".join(f"{labels.get(r['source'], r['source'])} {r['queue_mean']:.2f}"
                            for r in light.iter_rows(named=True))
                + ": the same ρ is not the same state. `controls.matched_congestion` in `summary.json` (notebook 04) "
                "compares sources at matched mean queue instead.")


def least_agreeing_markdown(low: Mapping | None, labels: Mapping) -> str:
    """The least agreeing condition of a cross-source or cross-region section (``lowest``: the defined
    condition with the lowest upper CI bound of its tau-b), with its interval and how many scheduler pairs
    both rankings resolve."""
    if not low:
        return ""
    name = lambda s: labels.get(s, s)  # noqa: E731
    where = (f"**{low['metric']}** in **{low['region']}** between {name(low['source_1'])} and {name(low['source_2'])}"
             if "source_1" in low else
             f"**{low['metric']}** on {name(low['source'])} between **{low['region_1']}** and **{low['region_2']}**")
    ci = low.get("ci") or [None, None]
    ci_txt = numbers.with_ci("", ci, num=numbers.fixed(2)) or " (no CI: bootstrap off)"
    n = low.get("resolved_pairs")
    n_txt = (f"; {n:.0f} scheduler pairs resolved in both rankings, {low.get('discordant', 0):.0f} of them ordered "
             "oppositely" if n is not None else "")
    norm = low.get("tau_norm")
    return (f"The least agreeing condition — the defined one whose τ-b interval has the lowest upper bound, so that a "
            f"condition is not named on a point estimate its interval does not support — is {where}: τ-b = "
            f"{low['tau']:.2f}{ci_txt}" + (f", τ-b / τ-b,max {norm:.2f}" if norm is not None else "") + n_txt + ".")


def na_schedulers_markdown(block: Mapping | None, labels: Mapping) -> str:
    """Which schedulers an agreement section leaves out where (``na_schedulers``), and in how many of its
    headline conditions."""
    if not block or not block.get("dropped"):
        return ""
    srcs = ", ".join(labels.get(s, s) for s in block["sources"])
    dropped = ", ".join(f"`{k}`" for k in block["dropped"])
    return (f"{dropped} is n/a on {srcs} (no tenants in the trace: one tenant, so a tenant-fair policy has "
            f"nothing to equalise), so the {block['headline_conditions']} headline conditions involving "
            f"{'that source' if len(block['sources']) == 1 else 'those sources'} rank the other {block['n_items']} "
            f"schedulers, on both sides of each comparison.")


def tie_rule_markdown(rules: pl.DataFrame, par: Mapping, section: str = "cross_source") -> str:
    """What changed with the tie rule: the chosen rule's headline mean tau-b against the old tolerance rule
    and exact ranks (:func:`portbench.study.analysis.tie_rule_table`), for ``cross_source`` or
    ``cross_region`` (with the lightest-vs-heaviest-region number)."""
    if rules.height == 0:
        return "No tie-rule sensitivity rows in this analysis."
    r = {row["tie_rule"]: row for row in rules.iter_rows(named=True)}
    ch = r.get(par["ties"]) or next(row for row in r.values() if row["chosen"])
    f2 = lambda v: "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"  # noqa: E731
    ext = "tau_b_extreme" in rules.columns

    def one(row: Mapping) -> str:
        out = f"{f2(row['tau_b'])} over {row['defined']} of {row['total']} conditions"
        if ext:
            out += (f" (lightest vs heaviest region {f2(row['tau_b_extreme'])}, {row['defined_extreme']} of "
                    f"{row['total_extreme']})")
        return out

    msg = f"With the chosen rule (**{par['ties']}**) the headline mean τ-b is **{one(ch)}**."
    tol, ex, sp = r.get("tolerance"), r.get("exact"), r.get("significance_practical")
    if tol:
        msg += (f" The old rule (means within {100 * par['rank_tolerance']:g}% tied, chained) gives {one(tol)}, and "
                f"{f2(tol['tau_b_all_metrics'])} over every metric ({tol['defined_all_metrics']} of "
                f"{tol['total_all_metrics']} conditions, the old headline).")
    if ex:
        msg += f" Exact ranks give {one(ex)} ({f2(ex['tau_b_all_metrics'])} over every metric)."
    if sp and par["ties"] != "significance_practical":
        msg += f" Requiring the practical size δ as well: {one(sp)}."
    if tol and ch["tau_b"] is not None and tol["tau_b"] is not None:
        d = ch["tau_b"] - tol["tau_b"]
        msg += (f" The change of definition moves the headline by {d:+.2f} "
                + ("(the old tolerance ties differences the windows resolve and orders differences they do not)."
                   if abs(d) >= 0.005 else "(about the same number, from different tie groups)."))
    return msg


def power_markdown(power: Mapping) -> str:
    """Resolution warnings and the minimal detectable effects (notebook text)."""
    out = []
    for w in power.get("warnings", []):
        out.append(f"**⚠ Warning — too few windows for significance.** {w}.")
    for w in (power.get("resolution") or {}).get("notes", []):
        out.append(f"**Note on resolution.** {w}.")
    rows = []
    for m, d in (power.get("by_metric") or {}).items():
        f = (lambda v: "not reached" if v is None else (f"{v:.1%}" if d["scale"] == "ratio" else f"{100 * v:.1f} pp"))  # noqa: E731
        rows.append(f"| `{m}` | {d['unit']} | {f(d['mde'])} | {f(d['mde_family'])} | {d['null_pairs']} | "
                    f"{d['identical_pairs']} |")
    if rows:
        first = next(iter(power["by_metric"].values()))
        out.append(f"**Minimal detectable effect** at {first['windows']} windows per source, power "
                   f"{first['target_power']:g}: {power['definition']}.\n\n| metric | effect measured as | MDE at α | "
                   "MDE at α / m | null pairs | identical pairs (left out) |\n|---|---|---|---|---|---|\n" + "\n".join(rows))
    return "\n\n".join(out)


def reversal_method_markdown(rv: Mapping, par: Mapping) -> str:
    """The reversal notebook's method paragraph: family, correction, delta by scale, the study preset."""
    corr = {"fdr_bh": "Benjamini–Hochberg (false discovery rate)", "holm": "Holm (family-wise error)"}
    pre = rv.get("study_preset") or {}
    d = rv["delta"]
    text = (f"**Family and correction**: {corr[rv['correction']]}, {rv['family_definition']} "
            f"({rv['side_tests']['value']:,} side tests in the panel). A reversal count is a *rate* claim, so the "
            "false discovery rate within one metric is the error that matters; Holm and the all-metrics family are "
            f"in the sensitivity table below. **Practical size**: {d['definition']} — a "
            "relative δ on a proportion near 0 would call 0.050 vs 0.065 (3 requests of 200) a 26% effect.")
    if pre.get("available"):
        text += (f" **Study preset** (`analysis.study_preset`, the original study's design, reported beside the "
                 f"default so the numbers can be set against the published study): {pre['definition']}; regions "
                 f"{', '.join(pre['regions'])}; {pre['comparisons']:,} comparisons.")
    return text


# --------------------------------------------------------------------------- honest information (issue #12)


def _ci(v, ci, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    num = numbers.fixed(digits)
    return numbers.with_ci(num(v), ci, num=num)


def predictor_markdown(summary: pl.DataFrame, block: Mapping) -> str:
    """Per source: the home predictor's features, training data and accuracy (with 95% CIs), and the
    noisy oracle's tau it replaces -- from :func:`portbench.study.honest.accuracy` and the ``predictors``
    block."""
    lines = ["| source | features | trained on | train rows | Kendall τ | Spearman ρ | MAE log | ranker τ (ltr) | "
             "noisy oracle τ (former) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in summary.filter(pl.col("home")).iter_rows(named=True):
        b = block.get(r["target"], {})
        lines.append(
            f"| {r['target_label']} | {', '.join(b.get('features', []))} | {b.get('training', {}).get('label', '')} | "
            f"{b.get('train_rows', 0):,} | {_ci(r['tau'], (r['tau_ci_low'], r['tau_ci_high']))} | "
            f"{_ci(r['spearman'], (r['spearman_ci_low'], r['spearman_ci_high']))} | "
            f"{_ci(r['mae_log'], (r['mae_log_ci_low'], r['mae_log_ci_high']))} | "
            f"{_ci(r['ranker_tau'], (r['ranker_tau_ci_low'], r['ranker_tau_ci_high']))} | "
            f"{_ci(r['noisy_oracle_tau'], None)} |")
    lines += ["", "τ, ρ: per window between the frozen prediction and the true output length, mean over the 40 "
              "windows with a 95% bootstrap CI over windows; MAE log = mean |log predicted − log true| (natural "
              "log: 0.69 = a factor 2). The noisy oracle is the study's former predictor (true × exp(N(0, σ)))."]
    return "\n".join(lines)


def transfer_markdown(summary: pl.DataFrame) -> str:
    """Kendall τ of every (train -> target) predictor, as a train x target table (diagonal = home)."""
    srcs = summary["target"].unique(maintain_order=True).to_list()
    lab = dict(zip(summary["target"], summary["target_label"]))
    lines = ["| predictor trained on ↓ / used on → | " + " | ".join(lab[s] for s in srcs) + " |",
             "|---|" + "---|" * len(srcs)]
    for a in srcs:
        cells = []
        for b in srcs:
            r = summary.filter((pl.col("train") == a) & (pl.col("target") == b))
            if r.height:
                r = r.row(0, named=True)
                cells.append(("**" if a == b else "") + _ci(r["tau"], (r["tau_ci_low"], r["tau_ci_high"]))
                             + ("**" if a == b else ""))
            else:
                cells.append("")
        lines.append(f"| {lab[a]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ranks_markdown(ranks: pl.DataFrame) -> str:
    """Mean rank (among the ranked schedulers, over regions and metrics) of each prediction-based policy per
    source and variant."""
    if ranks.height == 0:
        return "(no transfer runs)"
    g = (ranks.group_by(["source", "policy", "variant"], maintain_order=True)
         .agg(pl.col("rank").mean().alias("mean_rank"), pl.len().alias("n")))
    variants = g["variant"].unique(maintain_order=True).to_list()
    order = ["home"] + sorted(v for v in variants if v.startswith("from ")) + ["oracle"]
    order = [v for v in order if v in variants]
    lines = ["| source | policy | " + " | ".join(order) + " |", "|---|---|" + "---|" * len(order)]
    for (src, pol), part in g.group_by(["source", "policy"], maintain_order=True):
        d = dict(zip(part["variant"], part["mean_rank"]))
        lines.append(f"| {src} | {pol} | " + " | ".join(f"{d[v]:.1f}" if v in d else "—" for v in order) + " |")
    lines += ["", f"Mean rank among the {honest.ranked_count(ranks)} (1 = best), over the transfer campaign's regions × headline metrics: "
              "**home** = the source's own learned predictor, **from X** = source X's predictor, **oracle** = "
              "the comparison variant that reads the true length (sjf_noisy_oracle, ltr_noisy_oracle, edf_oracle)."]
    return "\n".join(lines)


def variant_ranks_summary(ranks: pl.DataFrame, labels: Mapping[str, str], windows_per_source: int) -> str:
    """Per source, each prediction-based policy's mean rank with the home predictor, the oracle variant and the
    range over foreign predictors, then the mean and the largest loss of the learned predictor against the oracle
    variant it replaces (notebook 03, from :func:`portbench.study.honest.variant_ranks`)."""
    g = ranks.group_by(["source", "policy", "variant"]).agg(pl.col("rank").mean().alias("r"))

    def r_of(src, pol, var):
        x = g.filter((pl.col("source") == src) & (pl.col("policy") == pol) & (pl.col("variant") == var))["r"]
        return float(x[0]) if x.len() else float("nan")

    lines = []
    for src in ranks["source"].unique(maintain_order=True).to_list():
        parts = []
        for pol in ranks["policy"].unique(maintain_order=True).to_list():
            h, o = r_of(src, pol, "home"), r_of(src, pol, "oracle")
            foreign = [r_of(src, pol, v) for v in g.filter((pl.col("source") == src) & (pl.col("policy") == pol)
                                                           & pl.col("variant").str.starts_with("from "))["variant"].to_list()]
            s = f"`{pol}` {h:.1f} (oracle variant {o:.1f}"
            if foreign:
                s += f"; foreign predictors {min(foreign):.1f}–{max(foreign):.1f}"
            parts.append(s + ")")
        lines.append(f"* **{labels[src]}**: " + ", ".join(parts))
    gap = (g.filter(pl.col("variant") == "home").join(g.filter(pl.col("variant") == "oracle"), on=["source", "policy"])
           .with_columns((pl.col("r") - pl.col("r_right")).alias("d")))
    worst = gap.sort("d")
    return (f"**Mean rank of {honest.ranked_count(ranks)} with the home predictor** (and with the oracle variant / "
            "foreign predictors):\n\n" + "\n".join(lines) + "\n\n"
            f"Averaged over sources and policies, the learned predictor ranks {gap['d'].mean():+.1f} places from the "
            f"oracle variant it replaces (positive = worse); the largest loss is {worst['d'][-1]:+.1f} "
            f"(`{worst['policy'][-1]}` on {labels[worst['source'][-1]]}). Ranks come from {windows_per_source} "
            "windows per source; ranks tie means within `analysis.rank_tolerance`.")


def fairness_markdown(block: Mapping) -> str:
    """Per source: its tenants and the tenant metrics of vtc vs fcfs (n/a where the trace has none)."""
    lines = ["| source | tenants | region | vtc service gap | fcfs service gap | vtc Jain (tenants) | "
             "fcfs Jain (tenants) |", "|---|---|---|---|---|---|---|"]
    for s, d in block.get("sources", {}).items():
        by = d.get("by_region")
        if not by:
            lines.append(f"| {s} | {d.get('origin')} | — | {d.get('vtc', 'n/a')} | | | |")
            continue
        for reg, v in by.items():
            a, b = v.get("vtc", {}), v.get("fcfs", {})

            def f(x, k, digits=0):
                return "n/a" if x.get(k) is None else f"{x[k]:,.{digits}f}"
            lines.append(f"| {s} | {d.get('origin')} | {reg} | {f(a, 'tenant_service_gap')} | "
                         f"{f(b, 'tenant_service_gap')} | {f(a, 'tenant_jain', 3)} | {f(b, 'tenant_jain', 3)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- engine and load (issue #10)


def engine_markdown(sim, profile) -> str:
    """What engine every scheduler of this campaign ran on, with the numbers of its profile."""
    e = sim.engine
    sarathi = schedulers.get_scheduler("sarathi").prefill_token_budget
    batching = {
        "v1": (f"**vLLM V1 batching for every policy** (`engine.batching: v1`): each iteration carries every "
               f"running decode first (one token each), then the rest of a started prompt, then waiting requests' "
               f"prompt chunks in the policy's order, under a budget of {profile.max_batched_tokens:,} tokens "
               f"(vLLM's `max_num_batched_tokens` on the {profile.gpu}; `sarathi` keeps Sarathi-Serve's "
               f"{sarathi:,}); a waiting request is admitted only when the KV blocks of its whole current "
               "sequence fit the free blocks, and blocks are then allocated chunk by chunk; no request is "
               "admitted in an iteration in which one was preempted. Policies only order, admit, preempt and "
               "pick victims."),
        "v0": ("**vLLM V0 prefill-first batching** (`engine.batching: v0`): an iteration that admits requests "
               "prefills their whole prompts while the running decodes wait; only `sarathi` chunks."),
    }[e.batching]
    pre = {"recompute": "preemption by **recompute** (vLLM V1: a victim's KV is freed and its prompt + output "
                        "re-prefilled when it resumes)",
           "swap": (f"preemption by **swap** (a victim's KV is copied to host memory at {profile.pcie_gb_s:.0f} GB/s "
                    f"and back; {profile.host_kv_blocks:,} blocks of host memory; recompute when it is full)")}
    pc = ("automatic prefix caching on windows that carry prompt block hashes (only traces that record "
          "them, e.g. Mooncake's)" if e.prefix_caching == "auto" else "prefix caching off")
    return (f"{batching} Memory: {pre[e.preemption]}; {pc}. Context limit: `max_model_len` = "
            f"{profile.max_model_len:,} tokens ({profile.model}): a prompt of {profile.max_model_len:,} tokens or more is "
            f"refused at arrival and counted, outputs are clipped to `max_model_len − prompt`. Iteration cost: {profile.formula()}.")


def refusal_markdown(refusals: pl.DataFrame, labels: Mapping, max_model_len: int,
                     threshold: float = 0.01) -> str:
    """Refused (prompt too long) and clipped requests per source, with a warning above ``threshold``."""
    if refusals.height == 0:
        return "No refusal counts in this campaign's runs."
    per = refusals.group_by("source").agg(pl.col("refused").sum(), pl.col("clipped").sum(), pl.col("arrived").sum())
    parts, warn = [], []
    for r in per.sort("source").iter_rows(named=True):
        f, c = r["refused"] / r["arrived"], r["clipped"] / r["arrived"]
        parts.append(f"{labels.get(r['source'], r['source'])}: {f:.2%} refused, {c:.2%} with the output clipped")
        if f > threshold:
            warn.append(f"**Warning: {labels.get(r['source'], r['source'])} loses {f:.1%} of its requests to the "
                        "context limit; they are left out of every metric.**")
    return (f"Requests whose prompt has {max_model_len:,} tokens or more, over all runs (the same requests under "
            "every scheduler and region, since refusal depends on the prompt alone): " + "; ".join(parts) + ". "
            + (" ".join(warn) if warn else f"Every source stays below {threshold:.0%}."))


def prefix_cache_markdown(block: Mapping, labels: Mapping, prefix_caching: str = "auto") -> str:
    """Where prefix caching was active and its hit rate per source (``load.prefix_cache`` of summary.json,
    :func:`portbench.study.campaign.tables.prefix_cache_summary`); ``prefix_caching`` is the engine setting."""
    by = (block or {}).get("by_source") or {}
    if not by:
        return "No prefix-cache counters in this campaign's runs."
    name = lambda s: labels.get(s, s)  # noqa: E731
    on = [s for s, d in by.items() if d.get("hit_rate") is not None]
    off = [s for s in by if s not in on]
    if prefix_caching == "off":
        return "Prefix caching is off in this campaign (`engine.prefix_caching: off`): no source looks anything up."
    if not on:
        return ("Prefix caching is on (`engine.prefix_caching: auto`), but no window of this campaign carries prompt "
                f"block hashes ({', '.join(name(s) for s in off)}), so it is inactive everywhere.")
    ref = block.get("reference_policy") or "the reference policy"
    parts = []
    for s in on:
        d = by[s]
        ks = d.get("by_scheduler") or {}
        lo, hi = (min(ks, key=ks.get), max(ks, key=ks.get)) if ks else (None, None)
        regs = d.get("by_region") or {}
        line = (f"**{name(s)}**: {d['hit_rate']:.1%} of the tokens `{ref}` looks up are served from the cache "
                f"({d['hit_tokens']:,} of {d['looked_up_tokens']:,}); every policy pooled {d['hit_rate_all_policies']:.1%}")
        if lo:
            line += f", from {ks[lo]:.1%} (`{lo}`) to {ks[hi]:.1%} (`{hi}`)"
        if regs:
            r0, r1 = next(iter(regs)), list(regs)[-1]
            line += f"; `{ref}` from {regs[r0]:.1%} in *{r0}* to {regs[r1]:.1%} in *{r1}*"
        parts.append(line)
    out = ("Prefix caching is active on " + " and ".join(name(s) for s in on) + ", whose windows carry prompt block "
           "hashes: " + "; ".join(parts) + ".")
    if off:
        out += (f" {', '.join(name(s) for s in off)}: no prompt block hashes in the windows, so the cache is never "
                "looked up (n/a).")
    return out + (" A request looks up its whole current sequence each time it is admitted, so a request preempted "
                  "by recompute can hit its own blocks again: the preemptive policies' rates include such hits.")


def load_markdown(load: pl.DataFrame, capacity: pl.DataFrame, labels: Mapping, loads: Mapping[str, float],
                  near: str = "near_saturation", overload: str = "overload", tolerance: float = 0.1) -> str:
    """The load check: capacity (sustainable vs the earlier burst definition), achieved utilisation at
    near-saturation against its target, queues at overload, distinguishable schedulers."""
    out = []
    if capacity.height:
        out.append("Capacity (sustainable throughput, median over windows) per source: " + "; ".join(
            f"{labels.get(r['source'], r['source'])} {r['median_rps']:.3g} req/s (range {r['min_rps']:.3g}–"
            f"{r['max_rps']:.3g}), {r['ratio_median']:.2f}× the earlier burst definition (range "
            f"{r['ratio_min']:.2f}–{r['ratio_max']:.2f}×)" for r in capacity.iter_rows(named=True)) + ".")
    if load.height:
        for reg, what in ((near, "near-saturation"), (overload, "overload")):
            t = load.filter(pl.col("region") == reg)
            if not t.height:
                continue
            rho = loads.get(reg)
            cells = [f"{labels.get(r['source'], r['source'])} {r['utilisation']:.2f} (windows {r['utilisation_p10']:.2f}–"
                     f"{r['utilisation_p90']:.2f}), mean queue {r['queue_mean']:.1f}, p95 {r['queue_p95']:.1f}"
                     for r in t.iter_rows(named=True)]
            line = f"Achieved utilisation at {what} (target ρ = {rho:g}): " + "; ".join(cells) + "."
            if reg == near:
                off = [labels.get(r["source"], r["source"]) for r in t.iter_rows(named=True)
                       if abs(r["utilisation"] - rho) > tolerance]
                line += (f" Every source is within ±{tolerance} of its target." if not off else
                         f" Outside ±{tolerance} of the target: {', '.join(off)}.")
            else:
                noq = [labels.get(r["source"], r["source"]) for r in t.iter_rows(named=True) if not r["queue_mean"] > 0]
                line += (" Every source queues." if not noq else f" No queue on: {', '.join(noq)}.")
            out.append(line)
        tied = load.filter(pl.col("distinct_schedulers") == 1)
        out.append(f"Schedulers distinguishable on e2e_mean (distinct means at 1% resolution) per source × region: "
                   f"{int(load['distinct_schedulers'].min())}–{int(load['distinct_schedulers'].max())} of "
                   f"{int(load['n_schedulers'].max())}; every scheduler ties in {tied.height} of {load.height} "
                   "conditions (" + (", ".join(f"{labels.get(r['source'], r['source'])} {r['region']}"
                                             for r in tied.iter_rows(named=True)) or "none")
                   + "): there the ranking carries no information, and the agreement statistics leave it out "
                     "(τ-b undefined) and count it.")
    return "\n\n".join(out)


def sensitivity_markdown(table: pl.DataFrame) -> str:
    """One sentence per headline number that moves between the two batching modes."""
    if table.height == 0:
        return ""
    cols = table.columns
    a, b = cols[2], cols[3]
    moved = [r for r in table.iter_rows(named=True) if r[a] != r[b]]
    if not moved:
        return "No headline number moves between the two batching modes."
    return ("Numbers that move with the batching mode (" + f"{a} → {b}): " + "; ".join(
        f"{r['number']}: {r[a]} → {r[b]}" for r in moved) + ".")


def _of(cell) -> tuple[int, int] | None:
    """``"a of b"`` -> (a, b); None otherwise."""
    try:
        a, b = str(cell).split(" of ")
        return int(a), int(b)
    except (ValueError, TypeError):
        return None


def batching_comparison_markdown(table: pl.DataFrame) -> str:
    """Notebook 04: how the cross-source findings and ``sarathi``'s wins move between the two batching modes
    (the engine-sensitivity table of notebook 03, replicate 0 of each mode), in words from the values."""
    if table.height == 0:
        return "The engine-sensitivity table of notebook 03 is empty."
    this, other = table.columns[2], table.columns[3]
    row = {r["number"]: r for r in table.iter_rows(named=True)}

    def v(key, col):
        return row[key][col] if key in row and row[key][col] not in (None, "None") else "n/a"

    tpot, ttft = ("conditions where sarathi is (tied) best on a TPOT metric",
                  "conditions where sarathi is (tied) best on a TTFT metric")
    rev = "significant and practical reversals involving sarathi"
    kw = "cross-source Kendall's W"
    parts = [f"**Cross-source agreement and the engine** (headline panel, replicate 0 of each mode): τ-b "
             f"{v('cross-source τ-b', this)} ({this}) vs {v('cross-source τ-b', other)} ({other}), τ-b / τ-b,max "
             f"{v('cross-source τ-b/τ-b,max', this)} vs {v('cross-source τ-b/τ-b,max', other)}, discordance "
             f"{v('cross-source discordance', this)} vs {v('cross-source discordance', other)}, Kendall's W "
             f"{v(kw, this)} vs {v(kw, other)}."]
    t_this, t_other, r_this, r_other = _of(v(tpot, this)), _of(v(tpot, other)), _of(v(rev, this)), _of(v(rev, other))
    if t_this and t_other:
        parts.append(f"`sarathi` is (tied) best on a TPOT metric in {t_this[0]} of {t_this[1]} conditions under {this} "
                     f"and {t_other[0]} of {t_other[1]} under {other}; on a TTFT metric in {v(ttft, this)} vs "
                     f"{v(ttft, other)}.")
    if r_this and r_other:
        share = r_this[0] / r_this[1] if r_this[1] else 0.0
        parts.append(f"It is one of the two policies in {r_this[0]} of the {r_this[1]} significant and practical "
                     f"reversals under {this} ({share:.0%}) and {r_other[0]} of {r_other[1]} under {other}.")
    parts.append("Under V0 `sarathi` was the only policy whose decodes never stalled behind a whole prompt — an "
                 "advantage on the TPOT metrics that has nothing to do with its order; under V1 every policy gets that "
                 "batching, and what remains of `sarathi`'s difference is its smaller token budget.")
    if t_this and t_this[0] == t_this[1]:
        parts.append("That alone still makes it the (tied) best on every TPOT metric: its TPOT wins are findings "
                     "about the token budget (the stall a long prompt chunk inflicts on running decodes, against the "
                     "first-token latency it saves), not about FCFS order.")
    elif t_this:
        parts.append("Under V1 it no longer wins every TPOT metric.")
    if r_this and r_this[1] and r_this[0] / r_this[1] > 0.5:
        parts.append("Most of the significant and practical reversals still involve it, so they too rest on the "
                     "token budget.")
    elif r_this:
        parts.append("Most of the significant and practical reversals do not involve it: they are between policies "
                     "that share the engine's batching and budget.")
    return " ".join(parts) + " The full table is in notebook 03."


def _with_unit(value: float, unit: str) -> str:
    """``1.025 s``; a unitless value alone; a fraction as is (its unit says so)."""
    u = (unit or "").strip()
    bare = not u or u in ("-", "1") or u.startswith(("fraction", "index", "ratio"))
    return f"{value:.4g}" if bare else f"{value:.4g} {u}"


def most_dramatic_markdown(md: Mapping | None) -> str:
    """Notebook 06: the most dramatic significant-and-practical reversal, both sides with means (and their
    unit), effect, raw and adjusted p and windows."""
    if not md:
        return "There is no significant-and-practical reversal of a headline metric to show."
    unit = metrics.metric(md["metric"]).unit

    def eff(v):
        return f"{v:.0%}" if md["scale"] == "ratio" else f"{100 * v:.1f} percentage points"

    def side(k):
        return (f"mean {_with_unit(md['mean_a_' + k], unit)} ({md['a']}) vs {_with_unit(md['mean_b_' + k], unit)} "
                f"({md['b']}), effect {eff(md['effect_' + k])}, raw p = {md['p_' + k]:.2g}, adjusted p = "
                f"{md['p_adj_' + k]:.2g}, {md['n_' + k]} windows")

    better = {k: md["a"] if md[f"diff_{k}"] > 0 else md["b"] for k in ("1", "2")}
    return (f"**{md['a']} vs {md['b']}**, metric **{md['metric']}** ({md['direction']} is better), region "
            f"**{md['region']}**. On **{md['label_1']}**, {better['1']} is better: {side('1')}. On "
            f"**{md['label_2']}**, {better['2']} is better: {side('2')}.")
