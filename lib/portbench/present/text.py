"""Text the notebooks and the terminal show, written from computed values (never typed-in numbers).

Markdown for the notebooks (banners, method and result paragraphs) and plain-text reports for the
command line; the numbers come from the compute layers' tables and summaries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

import polars as pl

from ..core.provenance import DISPLAY, label
from ..data import standins
from ..data.standins import StandinInputs
from ..data.standins import burstgpt as standin_burstgpt
from ..sim import metrics, profiles, schedulers
from ..study.campaign import tables as campaign_tables
from . import plots_sim


def banner(provenance_by_source: Mapping[str, str], skipped: Iterable[str] = ()) -> str:
    """Markdown banner opening every notebook: which sources are real in this run."""
    rows = [f"| {DISPLAY.get(s, s)} | **{p}** | {label(s, p)} |" for s, p in provenance_by_source.items()]
    rows += [f"| {DISPLAY.get(s, s)} | skipped | no official file and no stand-in |" for s in skipped]
    real = [DISPLAY[s] for s, p in provenance_by_source.items() if p == "real"]
    stand = [DISPLAY[s] for s, p in provenance_by_source.items() if p == "standin"]
    head = f"**Data in this run.** Real: {', '.join(real) or 'none'}."
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
        excluded = ", ".join(f"{k} {v:,}" for k, v in (r.get("excluded") or {}).items()) or "none"
        span = r.get("span_s")
        rate = r.get("rate_rps")
        sha = (r.get("sha256") or "")[:12] + (" (verified)" if r.get("sha256_verified") else "")
        rows.append((source, str(r.get("provenance", "")), str(r.get("file")), str(r.get("format")),
                     f"{r['rows_read']:,}", f"{r['rows_valid']:,}", excluded,
                     _duration(span), f"{rate:.3g} req/s" if rate else "-", sha or "-"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(["-" * w for w in widths]), *map(line, rows)]
    return "\n".join(out + (["", "Skipped sources:", *notes] if notes else []))


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
    bl_std, bg_std = label("bailian", "standin"), label("burstgpt", "standin")
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
    head = ("| profile | GPU | model | KV tokens | KV blocks | c0 (ms) | c_prefill (µs/token) | "
            "c_decode (µs/seq) | c_kv (ns/token) | floor (ms) / knee (tokens) | "
            "decode-sized fit R² / median / max err | prefill-sized fit R² / median / max err | "
            "chunk iteration (ms) |")
    lines = ["Cost-model profiles: t = c0 + c_prefill·P + c_decode·B + c_kv·C + floor·max(0, 1 − (P + B)/knee), "
             "P = prefill tokens, B = decode sequences, C = context tokens. The floor term makes the "
             "weight GEMMs cost the larger of their memory-bound (weight-read) line and their "
             "compute-bound line, max(a_d + s_d·N, a_p + c_prefill·N) with N = P + B; the knee is "
             "where the two measured lines cross. Fit errors are of that one formula against the "
             "measured rows: decode-sized batches N ≤ max_num_seqs, prefill-sized N ≥ 256.",
             "", head, "|" + "---|" * (head.count("|") - 1)]
    for p in profiles.PROFILES.values():
        mf = p.provenance["model_fit"]
        chunk_ms = p.iteration_time(p.max_batched_tokens, 0, p.max_batched_tokens) * 1e3
        lines.append(
            f"| {p.name} | {p.gpu} | {p.model} | {p.kv_capacity_tokens:,} | {p.kv_capacity_blocks:,} | "
            f"{p.c0_s * 1e3:.2f} | {p.c_prefill_s * 1e6:.2f} | {p.c_decode_s * 1e6:.2f} | "
            f"{p.c_kv_s * 1e9:.1f} | {p.floor_s * 1e3:.2f} / {p.floor_tokens:.0f} | "
            f"{_fit_cell(mf['decode'])} | {_fit_cell(mf['prefill'])} | {chunk_ms:.1f} |")
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
            f"prefill-only line had {_fit_cell(lin)}. Prefill attention FLOPs left out: "
            f"{pv['prefill_attention_flop_share']:.0%} of a {pv['model_spec']['max_model_len']:,}-token "
            f"prefill. Isolated request 1,000+200 tokens: "
            f"{p.isolated_service_s(1000, 200):.2f} s.")
    tc = profiles.transfer_check()
    lines += ["", f"FLOP-ratio transfer check (A100 Llama-2-7B rows -> Llama-3-8B vs measured): "
              f"prefill regime median |err| {tc['prefill_median_abs_rel_err']:.1%}, integrated "
              f"{tc['prefill_integrated_rel_err']:+.1%}; decode regime median |err| "
              f"{tc['decode_median_abs_rel_err']:.1%}.",
              "Calibrated on the measured rows: the compute-bound line (c0's intercept, c_prefill, the "
              "GEMM part of c_decode) and the memory-bound line (floor, knee). Roofline (not measured): "
              "c_kv, LM head (read in c0, compute in c_decode), prefill attention (ignored); assumed: "
              f"engine overhead {profiles.ENGINE_OVERHEAD_S * 1e3:.1f} ms/iteration, non-torch reserve "
              f"{profiles.NON_TORCH_RESERVE_BYTES / 2**30:.1f} GiB; vLLM gpu_memory_utilization {profiles.GPU_MEMORY_UTILIZATION}."]
    return "\n".join(lines)


def schedulers_markdown() -> str:
    """Markdown table of the registered schedulers and the information each uses."""
    head = "| scheduler | information used | preemptive | prefill | vLLM static priority | models |"
    lines = [head, "|---|---|---|---|---|---|"]
    for row in schedulers.table():
        info = row["information"] + (" + attained service" if row["attained"] else "")
        lines.append(f"| {row['name']} | {info} | {'yes' if row['preemptive'] else 'no (memory only)'} | "
                     f"{row['prefill']} | {'yes' if row['vllm_static_priority'] else 'no'} | {row['models']} |")
    lines += ["", "information: none | arrival (order only) | prompt (length) | predicted (noisy output "
              "length) | oracle (true output length) | tenant. Preemption = pause (KV kept) while memory "
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
    srcs = sorted((s for s in lab if (s, "fcfs") in per_run), key=campaign_tables._source_rank)
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
        "it has generated so far (KV swapping to CPU memory is not modelled, so recompute is the only way to free "
        "memory). `fcfs` never lets a newcomer overtake: it evicts (the latest arrival) only when the running "
        f"requests' own growth overflows the cache. Mean preemptions per run in region *{heavy['region'][0]}* "
        f"(ρ = {heavy['rho'][0]:g}): {numbers}."
        + (f" On {' and '.join(idle)} the cache almost never fills at this load (under one preemption per run for "
           "every policy shown), so the ranking costs almost no recomputation there." if idle else ""))


# --------------------------------------------------------------------------- notebooks 04-07, 09: the analysis


def fmt(stat: dict | None, digits: int = 2) -> str:
    """``"0.71 [0.65, 0.77] (n = 252)"`` from a summary stat dict."""
    if not stat or stat.get("value") is None:
        return "n/a"
    v = stat["value"]
    s = f"{v:.{digits}f}" if isinstance(v, float) else f"{v}"
    ci = stat.get("ci")
    if ci and ci[0] is not None:
        s += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    if stat.get("count") is not None:
        s += f" (n = {stat['count']})"
    return s


def tied_ranks_markdown(tol: float) -> str:
    """One paragraph for the notebooks' method text: how scheduler means are tied (from the parameter)."""
    if not tol:
        return ("Only exactly equal means are tied (`analysis.rank_tolerance` = 0, exact ranks); tied schedulers share "
                "the average rank.")
    return (f"**Practically tied ranks** (`analysis.rank_tolerance` = {tol:g}): sorted best first, a scheduler whose "
            f"mean is within {100 * tol:g}% of the next-better mean (relative gap |x − y| / ((|x| + |y|) / 2) below "
            f"{tol:g}) is tied with it, and tied schedulers share the average rank; so differences of a few parts per "
            "million (e.g. microseconds of simulator noise at light load) do not count as an order. Ties chain "
            f"(single linkage), so a tie group can span more than {100 * tol:g}% end to end. Every ranking-based "
            "number (τ-b, W, top-1, bump charts, winners) uses these ranks, in the bootstrap too; the reversal "
            "tests and Friedman/Nemenyi work on per-window values instead.")
