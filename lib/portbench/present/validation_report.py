"""Notebook 08's prose and tables: the engine's status and the run's headline as markdown, the confirmatory family
in plain words, the whole-run prediction and its error budget, and the tables of ``summary.json``'s sections (what
:func:`portbench.validation.read_results` returns; the presentation of the validation, which writes no prose)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import polars as pl

from ..sim import schedulers
from ..validation import confirm, policies
from ..validation.common import TARGETS, how_to_enable
from ..validation.planning import Plan


def policy_table(names=None) -> pl.DataFrame:
    """How each scheduler runs in the engine (mode and how), for every registered scheduler."""
    if names is None:
        names = list(schedulers.SCHEDULERS)
    rows = [dataclasses.asdict(policies.engine_policy(n)) for n in names]
    return pl.DataFrame(rows).rename({"name": "scheduler", "mode": "engine_mode", "note": "how / why not"})


def status_markdown(the_plan: Plan, res: dict | None = None) -> str:
    """One paragraph: can the replay run in *this* environment, and if not, exactly why (and,
    when ``res`` (:func:`portbench.validation.read_results`) holds a run, that this is what is reported)."""
    st = the_plan.status
    if not st.ok and res and (res.get("summary") or {}).get("ran"):
        s = res["summary"]
        return (f"This environment has no vLLM ({st.reason}); it reports the **{s['run']}** validation that ran in "
                f"`.venv-vllm` on {s['engine']} ({s['device']}; `make validate` / `make all`).")
    if st.ok and the_plan.runnable:
        where = f"GPU **{st.gpu_name}**" if st.device == "cuda" else "vLLM's **CPU build** (a tiny model)"
        return (f"**The replay can run here**: {st.distribution} {st.version} (the tested version is {st.expected}) "
                f"on {where}.")
    if not st.ok:
        return (f"**No vLLM in this environment: {st.reason}.** {how_to_enable()}")
    return ("**Nothing to replay** — " + ("; ".join(the_plan.messages) or "no case") + ".")


def _pct(x) -> str:
    return "n/a" if x is None or not isinstance(x, (int, float)) or not math.isfinite(x) else f"{100 * x:.1f}%"


def results_markdown(res: dict) -> str:
    """The headline of a validation run (what notebook 08 prints), from :func:`portbench.validation.read_results`."""
    s = res.get("summary")
    if not s:
        return ("**No validation results yet.** " + how_to_enable())
    if not s.get("ran"):
        return f"**The validation did not run**: {s.get('skipped_because')}. {s.get('how_to_enable', how_to_enable())}"
    m, mc = s["mape"], s.get("mape_speed_corrected", {})
    es = s["engine_settings"]
    counts = s.get("verdict_counts") or confirm.verdict_counts(s["verdicts"])
    sm = s.get("settings_match") or {}
    b = s.get("budget") or {}
    lines = [f"**{s['label']}.**",
             f"* Engine: {s['engine']} ({s['device']}), model `{s['model']['config']}` "
             f"({s['model']['architecture']}, {s['model']['layers']} layers, hidden {s['model']['hidden']}, dummy weights); "
             f"{es['num_blocks']} KV blocks x {es['block_size']} tokens, token budget {es['max_num_batched_tokens']}, "
             f"max_model_len {es['max_model_len']}; token counts x {es['token_scale']:g} on both sides. "
             f"Run: **{s['run']}**, {s['windows_replayed']} windows ({s['replays']} replays, windows drawn with seed "
             f"{s['window_seed']}), {s['wall_s']['total']:.0f} s wall from the process start (budget "
             f"{s['budget_s']:.0f} s); saturation backlog {b.get('saturation_backlog', '?')} requests per source; machine load "
             f"average {s['machine']['loadavg_start'][0]:.1f} at the start, {s['machine']['loadavg_end'][0]:.1f} at the "
             f"end on {s['machine']['cpus']} CPUs (the engine got {_pct(s['machine']['engine_cpu_share'])} of a core "
             "while stepping).",
             f"* Simulator error below saturation (per request, prediction from the calibration profile): TTFT "
             f"{_pct(m['ttft'])}, TPOT {_pct(m['tpot'])}, E2E {_pct(m['e2e'])} MAPE (targets: E2E <= "
             f"{_pct(TARGETS['e2e_mape'])}, TTFT <= {_pct(TARGETS['ttft_mape'])}: "
             f"{'met' if s['targets']['e2e_met'] and s['targets']['ttft_met'] else 'not met'}); with each replay's "
             f"measured machine speed and vLLM's ingestion delay given to the simulator: TTFT {_pct(mc.get('ttft'))}, "
             f"TPOT {_pct(mc.get('tpot'))}, E2E {_pct(mc.get('e2e'))}.",
             f"* Cost model fitted to {s['profile']['calibration']['fit']['steps']} calibration steps: R² "
             f"{s['profile_fit_r2']:.2f} ({s['profile']['calibration']['formula']}).",
             f"* Verdicts: {confirm.verdict_line(counts)} (the confirmatory family was pre-registered and is "
             "tested with Holm; the exploratory cases carry effect sizes and intervals only)." + _cannot_confirm(s),
             _family_line(s.get("virtual_family") or {}),
             f"* Settings: the engine matches the campaign on "
             f"{sum(v['match'] for v in sm.get('settings', {}).values())} of {len(sm.get('settings', {}))} settings "
             f"(real-token equivalents); every source loses at most {_pct(sm.get('max_extra_lost_share'))} more requests "
             f"than the campaign: {'yes' if sm.get('all_sources_ok') else 'no'}."]
    for st in res.get("stale", []):
        lines.append(f"* **Warning: {st}** — rerun `make validate` (or `make all`).")
    return "\n".join(lines)


def _cannot_confirm(s: dict) -> str:
    """A clause for the verdicts' bullet when the run's windows cannot confirm any case (:func:`confirmability`)."""
    c = confirmability(s)
    if not c or c["can_confirm"]:
        return ""
    return (f" **With {c['windows']} windows per source no case can be confirmed** (smallest Holm-adjusted p "
            f"{c['min_p_holm']:.3g}, α = {c['alpha']:g}; {c['min_windows']} needed)"
            + (": a smoke run; `make validate` is the confirmatory run." if s.get("run") == "reduced" else "."))


def _family_line(f: dict) -> str:
    """One bullet: the family's runs on the virtual engine at the campaign's settings (``virtual_family``)."""
    if not f.get("runs"):
        return f"* Confirmatory family on the virtual vLLM engine: not available ({f.get('why', 'not run')})."
    m = f.get("resim_matches_campaign") or {}
    return (f"* Confirmatory family decided on the virtual vLLM engine at the campaign's own settings: {f['runs']} runs "
            f"on vLLM's scheduler and the same on the simulator in {f['wall_s']:.0f} s; the simulator's runs equal the "
            f"campaign's replicate-0 runs in {m.get('identical', 0)} of {m.get('compared', 0)}.")


def error_sources_markdown(s: dict) -> str:
    """Where the simulator's error comes from (computed from the run's numbers)."""
    if not s or not s.get("ran"):
        return ""
    es = s.get("error_sources", {})
    m, mc = s["mape"]["e2e"], s.get("mape_speed_corrected", {}).get("e2e")
    cm, cmc = es.get("e2e_mape_cost_model_only"), es.get("e2e_mape_cost_model_only_speed_corrected")
    sf = s.get("speed_factor", {})
    ing = s.get("ingest_delay_s", {})
    return (f"* **Step times.** Had the simulator reproduced the engine's schedule exactly, predicting only the step "
            f"times from the cost model would already give an E2E MAPE of {_pct(cm)} ({_pct(cmc)} with each replay's "
            f"speed factor), against {_pct(m)} ({_pct(mc)}) for the simulator itself: the remaining "
            f"{_pct((m - cm) if isinstance(m, float) and isinstance(cm, float) else None)} "
            f"({_pct((mc - cmc) if isinstance(mc, float) and isinstance(cmc, float) else None)}) is the scheduling "
            "model's share (batching, admission, preemption as the simulator models them).\n"
            f"* **Machine load.** The engine's steps ran {sf.get('min', float('nan')):.2f}x to "
            f"{sf.get('max', float('nan')):.2f}x the calibration's speed from replay to replay (median "
            f"{sf.get('median', float('nan')):.2f}x): the CPU is shared, and a step's wall time is its compute divided "
            "by the share of a core the process gets. The cost model fits the calibration steps with R² "
            f"{s['profile_fit_r2']:.2f} (a sample with every batch size represented, fidelity.calibration_sample); "
            "the variance it leaves is mostly this noise, so sums over many steps — E2E — are predicted better "
            "than single steps — TTFT, TPOT.\n"
            f"* **Frontend.** vLLM's scheduler sees a request {1e3 * ing.get('median', float('nan')):.1f} ms "
            f"(median; p90 {1e3 * ing.get('p90', float('nan')):.1f} ms) after the client sent it (input processing and "
            "the hand-off to the engine process); the simulator has no such delay, which weighs on TTFTs of a few "
            "steps.")


def fidelity_table(s: dict) -> pl.DataFrame:
    """Per re-simulation variant and latency: MAPE, median absolute error, correlation, requests."""
    rows = []
    for variant, f in (s.get("fidelity") or {}).items():
        for scope in ("below_saturation", "all_loads"):
            for x, v in f[scope].items():
                rows.append({"resimulation": variant, "loads": scope, "latency": x.upper(), "requests": v["n"],
                             "MAPE": v["mape"], "median_abs_err_ms": 1e3 * v["median_abs_err_s"],
                             "pearson_r": v["pearson_r"], "spearman_r": v["spearman_r"], "bias": v["bias"]})
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def _fmt_eff(e: dict) -> str:
    m, lo, hi = e.get("mean"), e.get("lo"), e.get("hi")
    if m is None or not isinstance(m, (int, float)) or not math.isfinite(m):
        return "n/a"
    ci = f" [{lo:+.3f}, {hi:+.3f}]" if isinstance(lo, (int, float)) and math.isfinite(lo) else ""
    return f"{m:+.3f}{ci}"


def confirmability(s: dict) -> dict | None:
    """``summary.json``'s ``confirmability`` (:func:`portbench.validation.confirm.confirmability`: can the family
    confirm a case at all with the run's windows); for a summary written before that field, the same computed from
    its pre-registration and verdicts. None without a pre-registered family."""
    if not s or not s.get("ran") or "preregistration" not in s:
        return None
    if s.get("confirmability"):
        return s["confirmability"]
    pr = s["preregistration"]
    n = confirm.tested_windows(s.get("verdicts") or [])
    return confirm.confirmability(pr["windows_per_source"] if n is None else n, pr["n_cases"], pr["alpha"],
                                  preregistered=pr["windows_per_source"])


def confirmability_markdown(s: dict) -> str:
    """One paragraph, only when the run cannot confirm any case whatever the engine measures (too few windows for
    the exact tests and Holm): a reduced run is a smoke run, ``make validate`` the confirmatory one; a full run
    names the windows it would need. Empty otherwise."""
    c = confirmability(s)
    if not c or c["can_confirm"]:
        return ""
    why = c["reason"][:1].upper() + c["reason"][1:]
    if s.get("run") == "reduced":
        return (f"**This run is a smoke run: it cannot confirm any case; `make validate` is the confirmatory run.** "
                f"{why}.")
    return (f"**This run cannot confirm any case.** {why}: raise `validation.windows_per_source` and "
            f"`validation.confirmatory.min_windows` to at least {c['min_windows']}.")


def confirmatory_markdown(s: dict, names: dict | None = None) -> str:
    """Notebook 08's lead: the pre-registered family and its outcome, in plain words (from ``summary.json``)."""
    if not s or not s.get("ran") or "preregistration" not in s:
        return ""
    pr, rows = s["preregistration"], [r for r in s["verdicts"] if r["role"] == "confirmatory"]
    nm = lambda x: (names or {}).get(x, x)  # noqa: E731
    n_run = pr.get("windows_per_source_run")
    noise = pr.get("noise_cv")
    noise_txt = (f", engine noise CV {noise:.3f} ({pr.get('noise_cv_source')})"
                 if isinstance(noise, (int, float)) and math.isfinite(noise) else "")
    cut_txt = ("" if n_run in (None, pr["windows_per_source"]) else
               f"; the wall-clock engine replayed {n_run} per source: the time budget cut the rest")
    lines = [f"**Pre-registered after the step grid (fixed shapes; no case's window) and before the family's runs and "
             f"every replay** (`{Path(pr['path']).name}`, SHA-256 `{pr['sha256'][:16]}…`, "
             f"verified when the verdicts were computed): {pr['n_cases']} cases, {pr['windows_per_source']} windows per "
             f"source from the power calculation{noise_txt} (target power "
             f"{'reached' if pr.get('target_reached') else 'not reached'}{cut_txt}), "
             f"α = {pr['alpha']:g}, {pr['correction'].capitalize()} over the family. A case is confirmed when both "
             f"one-sided tests in the simulated direction reject and its Holm-adjusted p is below α. "
             f"**{sum(bool(r['confirmatory']['confirmed']) for r in rows)} of {len(rows)} confirmed.**", ""]
    if smoke := confirmability_markdown(s):
        lines[:0] = [smoke, ""]
    dec = pr.get("decided_by") or {}
    if dec:
        lines[-2:-1] = [lines[-2] + f" The pre-registration names the engine that decides: the **{dec.get('engine')}** "
                        f"engine ({dec.get('what')}); the others' verdicts are reported beside it."]
    for r in rows:
        sides = r["engine_vs_resim"]["sides"]
        sim = "; ".join(f"{nm(src)}: {r['a'] if sg > 0 else r['b']} better" for src, sg in r["campaign_sign"].items())
        surv = r["survives_settings"]
        c = r["confirmatory"]
        who = r.get("decided_by", "wall_clock")
        ps = ", ".join(f"{x['p_one_sided']:.3g}" for x in c["sides"])
        eng = "; ".join(f"{nm(sd['source'])} {_fmt_eff(sd['engine_effect'])} (re-simulation "
                        f"{_fmt_eff(sd['resim_effect'])}, {sd['windows']} windows)" for sd in sides)
        beside = "; ".join(f"{e.replace('_', '-')} engine: {v['verdict']}" for e, v in (r.get("by_engine") or {}).items()
                           if e != who)
        lines.append(
            f"* **{r['kind']}: {r['a']} vs {r['b']}**, {r['metric']} at {r['region']} — the campaign: {sim}. "
            + f"Decided on the **{who.replace('_', '-')}** engine"
            + ("" if r.get("decided_as_preregistered", True) else " (not the pre-registered one: it had no runs)") + ". "
            + (("Under its settings the re-simulation keeps the order (the control's question: does the order "
                "hold). " if r["kind"] == "control" else "Under its settings the re-simulation keeps the finding. ")
               if surv["survives"] else
               ("Under its settings the re-simulation **no longer shows the order: not testable on this engine**"
                if r["kind"] == "control" else
                "Under its settings the re-simulation **no longer shows the finding: not testable on this engine**")
               + ({True: " (the campaign's own runs of the same windows do show it: the engine's configuration "
                         "removes it). ",
                   False: " (nor do the campaign's own runs of the same windows). "}.get(
                       (r.get("campaign_on_windows") or {}).get("survives"), ". ")))
            + f"Effects (+: {r['a']} better) on the engine with 90 % intervals: {eng}. "
            + f"One-sided p per source {ps}; intersection-union "
              f"p {c['p_iut']:.3g}, Holm {c['p_holm']:.3g}: **{confirm.outcome_words(r)}**. "
            + f"Engine vs re-simulation: **{r['engine_vs_resim']['verdict']}**; verdict: **{r['verdict']}**"
            + (f" (beside it, {beside})." if beside else "."))
    ec = s["verdict_counts"].get("exploratory", {})
    if ec.get("cases"):
        lines += ["", f"Exploratory ({ec['cases']} further cases, no significance claimed): "
                  + ", ".join(f"{ec[v]} {v}" for v in confirm.VERDICTS if ec.get(v)) + "."]
    return "\n".join(lines)


def whole_run_markdown(s: dict) -> str:
    """The whole-run prediction (virtual vLLM engine + the measured step table) against the wall-clock replays,
    below saturation and saturated, before and after, and its E2E error budget by cause, in words (from
    ``summary.json`` ``whole_run_prediction``)."""
    w = (s or {}).get("whole_run_prediction") or {}
    if not w.get("available"):
        return f"No whole-run prediction: {w.get('why', 'the validation has not run')}."
    m = w["mape"]
    if "error_budget_by_source" not in w:     # a summary written before the per-cause budget
        return (f"**Whole-run prediction** ({w['engine']}, {w['profile']} profile) below saturation: E2E MAPE "
                f"{_pct(m.get('e2e'))} (target <= {_pct(w['target_e2e_mape'])}). Rerun the analysis for the error "
                "budget by cause.")
    b = w["error_budget"]
    per = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in w["mape_by_source"].items())
    sat = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in (w.get("mape_saturated_by_source") or {}).items())
    bef = w["before"]["below_saturation"]
    bef_src = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in bef["by_source"].items())
    r, ms = w["replays"], w["machine_speed"]
    return (f"**Whole-run prediction** ({w['engine']}, {w['profile']} profile, the arrivals as the replay's client sent "
            f"them) against the wall-clock replays. **Below saturation** ({r['below_saturation']} replays, "
            f"{w['requests']} requests): E2E MAPE **{_pct(m['e2e'])}** (per source: {per}), TTFT {_pct(m['ttft'])}, TPOT "
            f"{_pct(m['tpot'])}; target E2E <= {_pct(w['target_e2e_mape'])}: **{'met' if w['e2e_met'] else 'not met'}**. "
            f"Before (the trace's arrival order): E2E {_pct(bef['overall']['e2e'])} ({bef_src}). **Saturated** "
            f"({r['saturated']} replays, {r['nominal_below_but_queue_grew']} of them nominally below saturation whose "
            f"queue grew): E2E {_pct(w['mape_saturated'].get('e2e'))} ({sat or 'none'}); all replays "
            f"{_pct(w['mape_all'].get('e2e'))}. {w['saturation_rule'].capitalize()}.\n\n"
            f"**Error budget of the E2E MAPE below saturation** (measured counterfactuals on the same requests): "
            f"the order in which simultaneous arrivals reached the engine {_pct(b['arrival_order'])} (trace order "
            f"{_pct(b['e2e_mape_trace_order'])} -> the client's send order {_pct(b['e2e_mape_prediction'])}); the "
            f"machine's speed during each replay vs during the step grid {_pct(b['machine_speed'])} (speeds "
            f"{ms['min']:.2f}x-{ms['max']:.2f}x, median {ms['median']:.2f}x; with it: {_pct(b['e2e_mape_with_machine_speed'])}); "
            f"of that rest, the step table's per-shape error on the engine's own schedule {_pct(b['step_table_shapes'])} "
            f"and the virtual schedule's divergence from the engine's {_pct(b['schedule_divergence'])}; the frontend's "
            f"hand-off delay changes it by {_pct(b['frontend'])} (added: {_pct(b['e2e_mape_with_frontend'])}). "
            f"vLLM's scheduler vs the simulator on the same step table: {_pct(w['virtual_vs_simulator_same_profile']['e2e'])}.")


def resolution_markdown(s: dict) -> str:
    """What this machine lets a step-time prediction reach, in words (``summary.json`` ``whole_run_prediction``:
    ``machine_speed.within_replay``, ``sensitivity``, ``speed_band``): how much the machine's speed moved during the
    replays, what a uniform 5 % step-time error alone costs in whole-run E2E MAPE, and how many requests the step
    grid's speed band holds. Empty when the summary predates these keys."""
    w = (s or {}).get("whole_run_prediction") or {}
    within = (w.get("machine_speed") or {}).get("within_replay") or {}
    sens = {k: v for k, v in (w.get("sensitivity") or {}).items() if isinstance(v, dict)}
    band = w.get("speed_band") or {}
    if not w.get("available") or not (within.get("pieces") or sens):
        return ""
    parts = []
    if within.get("pieces"):
        parts.append(f"**The machine's speed during the replays** (measured / tabled step time per "
                     f"{within['bin_s']:g} s of a replay's steps, {within['pieces']} pieces of {within['replays']} "
                     f"replays below saturation): 10-90 % range {within['q10']:.2f}x-{within['q90']:.2f}x, median "
                     f"{within['median']:.2f}x; within one replay it moves with a relative SD of "
                     f"{_pct(within['relative_sd_median'])} (median over the replays).")
    if sens:
        one = "; ".join(f"x{v['factor']:g}: E2E {_pct(v['e2e'])} ("
                        + ", ".join(f"{src} {_pct(x['e2e'])}" for src, x in v.get("by_source", {}).items()) + ")"
                        for v in sens.values())
        parts.append(f"**What a step-time error is worth**: the prediction rerun with every step time of the table "
                     f"scaled, against itself on the same requests -- {one}. A *uniform* 5 % error of every step "
                     f"alone moves the whole-run E2E by about that much: queueing in the bursts amplifies it.")
    cov = band.get("coverage") or {}
    if cov.get("requests"):
        by = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in cov.get("by_source", {}).items())
        parts.append(f"**The step grid's speed band** (the prediction at the grid's 10 % and 90 % visit speeds, "
                     f"{band['lo']:.2f}x and {band['hi']:.2f}x, measured before any replay) holds the engine's E2E of "
                     f"{_pct(cov['e2e'])} of the {cov['requests']} requests ({by}); {_pct(cov['e2e_above'])} were "
                     f"slower than its slow end (TTFT inside: {_pct(cov['ttft'])}, TPOT: {_pct(cov['tpot'])}).")
    return "\n\n".join(parts)


def whole_run_table(s: dict) -> pl.DataFrame:
    """Per source and scope (below saturation, saturated, all): the whole-run prediction's E2E MAPE after (the
    client's send order) and before (the trace order), with the error budget's causes below saturation."""
    w = (s or {}).get("whole_run_prediction") or {}
    if not w.get("available") or "error_budget_by_source" not in w:
        return pl.DataFrame()
    rows = []
    bud = {**w["error_budget_by_source"], "all sources": w["error_budget"]}
    for src in [*w["error_budget_by_source"], "all sources"]:
        after_b = w["mape"] if src == "all sources" else w["mape_by_source"].get(src, {})
        before_b = (w["before"]["below_saturation"]["overall"] if src == "all sources"
                    else w["before"]["below_saturation"]["by_source"].get(src, {}))
        sat = w["mape_saturated"] if src == "all sources" else w["mape_saturated_by_source"].get(src, {})
        al = w["mape_all"] if src == "all sources" else w["mape_all_by_source"].get(src, {})
        b = bud[src]
        rows.append({"source": src, "replays_below": b.get("replays"), "e2e_mape_below_after": after_b.get("e2e"),
                     "e2e_mape_below_before": before_b.get("e2e"), "e2e_mape_saturated": sat.get("e2e"),
                     "e2e_mape_all": al.get("e2e"), "arrival_order": b["arrival_order"],
                     "machine_speed": b["machine_speed"], "step_table_shapes": b["step_table_shapes"],
                     "schedule_divergence": b["schedule_divergence"], "frontend": b["frontend"],
                     "with_machine_speed": b["e2e_mape_with_machine_speed"]})
    return pl.DataFrame(rows)


def step_shapes_table(s: dict) -> pl.DataFrame:
    """``whole_run_prediction.step_table_on_replays``: the step table on the shapes the replays visited."""
    rows = ((s or {}).get("whole_run_prediction") or {}).get("step_table_on_replays") or []
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def settings_table(s: dict) -> pl.DataFrame:
    """``settings_match`` as a table: one row per setting (real-token equivalents), then per source the
    requests each side loses to its limits."""
    sm = (s or {}).get("settings_match") or {}
    rows = [{"what": k, "campaign": str(v["campaign"]), "engine": str(v["engine"]), "match": v["match"]}
            for k, v in sm.get("settings", {}).items()]
    rows += [{"what": f"lost requests: {src}", "campaign": f"{v['campaign']['lost_share']:.2%}",
              "engine": f"{v['engine']['lost_share']:.2%}", "match": v["ok"]} for src, v in sm.get("sources", {}).items()]
    rows += [{"what": f"prefix caching: {src}", "campaign": str(v["prefix_caching"]["campaign"]),
              "engine": str(v["prefix_caching"]["engine"]), "match": v["prefix_caching"]["match"]}
             for src, v in sm.get("sources", {}).items()]
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def step_fit_table(s: dict) -> pl.DataFrame:
    """``step_fit``'s per-shape rows."""
    rows = ((s or {}).get("step_fit") or {}).get("per_shape") or []
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def repeatability_markdown(s: dict) -> str:
    """The wall-clock engine's run-to-run floor (two replays of the same input back to back) beside the whole-run
    prediction on the same requests and the E2E target, in words (``summary.json``
    ``whole_run_prediction.repeatability``, ``targets.e2e_floor``)."""
    r = ((s or {}).get("whole_run_prediction") or {}).get("repeatability") or {}
    if not r.get("available"):
        return f"No repeat replay: {r.get('why', 'this summary was written before the repeat replays existed')}."
    f = ((s or {}).get("targets") or {}).get("e2e_floor") or {}
    m, p = r["mape"], r["prediction_same_requests"]["mape"]
    per = "; ".join(f"{src} {_pct(v['e2e'])} ({v['requests']} requests)" for src, v in r["mape_by_source"].items())
    per_p = "; ".join(f"{src} {_pct(v['e2e'])}" for src, v in r["prediction_same_requests"]["mape_by_source"].items())
    bias = "; ".join(f"{src} {_pct(v['e2e_bias'])}" for src, v in r["mape_by_source"].items())
    sp = [(x.get("speed_first"), x.get("speed_repeat")) for x in r["per_replay"]]
    speeds = "; ".join(f"{a:.2f}x -> {b:.2f}x" for a, b in sp
                       if isinstance(a, float) and isinstance(b, float) and math.isfinite(a) and math.isfinite(b))
    return (f"**How well the engine reproduces itself.** {r['replays']} fidelity replays were run a second time right "
            f"after the first, same engine, same input. On the {r['requests']} requests completed in both, the repeat "
            f"differs from the first replay by E2E MAPE **{_pct(m['e2e'])}** (per source: {per}), TTFT "
            f"{_pct(m['ttft'])}, TPOT {_pct(m['tpot'])}; mean repeat / first E2E - 1: {_pct(m['e2e_bias'])} (per source: "
            f"{bias}). "
            f"Machine speed against the step table, first -> repeat: {speeds or 'n/a'}. The whole-run prediction on "
            f"the same requests, against the first replay: E2E MAPE **{_pct(p['e2e'])}** ({per_p}). "
            f"{_input_words(r)}Approximate floor of a deterministic prediction (repeat MAPE / sqrt 2 over the windows "
            f"whose two replays got the same input): {_pct(r['floor_e2e_approx'])}: "
            f"{f.get('phrase', 'n/a')}.\n\n{r['what']}")


def _input_words(r: dict) -> str:
    """Which repeated windows got the same input twice (the client's send order), in a sentence."""
    rows = [x for x in r.get("per_replay") or [] if "same_input" in x]
    if not rows:
        return ""
    other = [f"{x['source']} ({_pct(x['send_order_changed'])} of its requests sent in another order: simultaneous "
             "arrivals)" for x in rows if not x["same_input"]]
    same = [x["source"] for x in rows if x["same_input"]]
    return (f"The client sent the same requests in the same order twice on {', '.join(same) or 'no source'}"
            + (f"; not on {', '.join(other)}, which the floor leaves out. " if other else ". "))


def repeatability_table(s: dict) -> pl.DataFrame:
    """Per repeated replay: requests completed in both replays, the repeat's MAPE against the first replay, its E2E
    bias, the prediction's E2E MAPE on the same requests, both replays' machine speeds and wall seconds."""
    r = ((s or {}).get("whole_run_prediction") or {}).get("repeatability") or {}
    rows = r.get("per_replay") or []
    return pl.DataFrame(rows) if rows else pl.DataFrame()
