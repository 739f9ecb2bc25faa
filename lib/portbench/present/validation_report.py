"""Notebook 08's text from the real-engine validation's ``summary.json`` (:func:`portbench.validation.read_results`).

It leads with what a real engine showed -- "on a real engine (vLLM CPU build, tiny model), the order ..." -- as the
order under that engine's cost structure (the A100 claim stays the simulator's), and keeps apart what the virtual
engine measures at the campaign's settings (an agreement rate: conformance, never a confirmation) and absolute
latency (a separate fidelity report without a pass mark)."""

from __future__ import annotations

import math
from typing import Mapping

import polars as pl

from ..validation.common import how_to_enable

ENGINE_WORDS = {"cpu": "on a real engine (vLLM CPU build, tiny model)", "cuda": "on a real engine (vLLM on a CUDA GPU)"}
COST_WORDS = {"cpu": "This is the order under the CPU engine's cost structure; the A100 claim stays the simulator's.",
              "cuda": "This is the order under that GPU's cost structure."}


def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def _pct(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * x:.1f} %"


def _order_words(c: Mapping, src: str) -> str:
    e = (c.get("effect") or {}).get(src)
    if e is None or not math.isfinite(float(e)):
        return f"{src}: no data"
    a, b = c["pair"]
    lo, hi = (c.get("ci") or {}).get(src, [math.nan, math.nan])
    who = a if e > 0 else b
    return f"{src}: {who} better by {_f(abs(e))} (log; 95 % CI {_f(lo)} to {_f(hi)})"


def case_sentence(c: Mapping, device: str = "cpu") -> str:
    """One sentence per case, leading with the engine."""
    a, b = c["pair"]
    v = c["verdict"]
    what = {"holds": "holds: the order the simulator predicts for this engine",
            "reverses": "reverses: the engine shows the opposite of the order the simulator predicts for it",
            "undetermined": "is undetermined",
            "not testable": "is not testable"}[v]
    tail = f" ({c['reason']})" if c.get("reason") else ""
    sides = "; ".join(_order_words(c, s) for s in c["sources"]) if v != "not testable" else ""
    return (f"{ENGINE_WORDS.get(device, ENGINE_WORDS['cpu'])[0].upper()}{ENGINE_WORDS.get(device, ENGINE_WORDS['cpu'])[1:]}, "
            f"the order of {a} vs {b} on {c['metric']} at {c['region']} ({', '.join(c['sources'])}; "
            f"{c.get('id', '')}) {what}{tail}" + (f" -- {sides}." if sides else "."))


def lead_markdown(s: Mapping) -> str:
    """The section's opening: every case's verdict in one sentence each, then what it is the order of."""
    if not s or not s.get("ran"):
        why = (s or {}).get("skipped_because") or "no run has written data/results/validation/summary.json"
        return (f"**The real-engine validation did not run** ({why}). {how_to_enable()} Nothing below is a verdict "
                "about a real engine.")
    device = (s.get("engine") or {}).get("device", "cpu")
    lines = [f"- {case_sentence(c, device)}" for c in s.get("cases", [])]
    return "\n".join(lines + ["", COST_WORDS.get(device, COST_WORDS["cpu"])])


def cases_table(s: Mapping) -> pl.DataFrame:
    """One row per case and side: selection strength, engine-scale prediction, k, r, the engine's effect and CI,
    the TOST against the prediction, tau, the verdict and its reason."""
    rows = []
    for c in s.get("cases", []):
        sides = {sd["source"]: sd for sd in c.get("sides", [])}
        for src in c["sources"]:
            pr = (c.get("prediction") or {}).get(src) or {}
            sd = sides.get(src, {})
            ci = (c.get("ci") or {}).get(src, [None, None])
            rows.append({"case": c.get("id"), "pair": " vs ".join(c["pair"]), "metric": c["metric"],
                         "region": c["region"], "source": src,
                         "strength": (c.get("selection") or {}).get("strength"),
                         "prediction": pr.get("effect"), "k": c.get("k"), "r": c.get("r"),
                         "effect": (c.get("effect") or {}).get(src), "ci_low": ci[0], "ci_high": ci[1],
                         "tost_vs_prediction": (sd.get("tost") or {}).get("verdict"), "tau": sd.get("tau"),
                         "p_holm": c.get("p_holm"), "verdict": c["verdict"], "reason": c.get("reason") or ""})
    schema = {"case": pl.Utf8, "pair": pl.Utf8, "metric": pl.Utf8, "region": pl.Utf8, "source": pl.Utf8,
              "strength": pl.Float64, "prediction": pl.Float64, "k": pl.Int64, "r": pl.Int64, "effect": pl.Float64,
              "ci_low": pl.Float64, "ci_high": pl.Float64, "tost_vs_prediction": pl.Utf8, "tau": pl.Float64,
              "p_holm": pl.Float64, "verdict": pl.Utf8, "reason": pl.Utf8}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def checks_markdown(s: Mapping) -> str:
    """The procedure checked on itself: the A/A pairs and the planted reversal."""
    aa, pl_ = s.get("aa") or {}, s.get("planted") or {}
    oe = aa.get("order_effect") or {}
    det = pl_.get("detected")
    return (f"**A/A pairs** ({aa.get('pairs', 0)} pairs, one policy against itself): replay-to-replay noise "
            f"sigma_r = {_f(aa.get('sigma_r'))} (SD of the window-level log metric between two replays); the test "
            f"declared an order on {_pct(aa.get('false_reversal_rate'))} of {aa.get('sides_tested', 0)} A/A sides "
            f"(the false-reversal rate; alpha = 5 %); order effect (first vs second replay) {_f(oe.get('mean'))} "
            f"(95 % CI {_f((oe.get('ci') or [None])[0])} to {_f((oe.get('ci') or [None, None])[1])}).\n\n"
            f"**Planted reversal** ({' vs '.join(pl_.get('pair') or ['fcfs', 'delay_shortest'])}, known order: fcfs "
            "better): " + ("detected." if det else "NOT detected -- the run could not see a known order, so its "
                           "undetermined verdicts say little." if det is False else
                           f"not run ({pl_.get('reason', 'no planted case')})."))


def preregistration_markdown(s: Mapping) -> str:
    pre = s.get("preregistration") or {}
    cv = pre.get("code_version") or {}
    return (f"Pre-registered in `papermill_params/validation_plan.yaml` (seal {str(pre.get('sha256'))[:12]}..., "
            f"code {str(cv.get('source_sha256'))[:12]}..., frozen at commit {str(cv.get('git_commit_at_freeze'))[:10]}): "
            "the cases, their selection rules and the design were fixed before any replay; the run refuses a changed "
            "file or changed code.")


def design_table(doc: Mapping) -> pl.DataFrame:
    """The frozen plan's cases with their selection strength (and the first draw candidates)."""
    rows = []
    cands = [x[0] for x in (doc.get("draw_candidates") or {}).values() if x]
    for c in [*(doc.get("cases") or []), *cands, *([doc["planted"]] if doc.get("planted") else [])]:
        rows.append({"case": c["id"], "pair": f"{c['a']} vs {c['b']}", "metric": c["metric"], "region": c["region"],
                     "sources": " vs ".join(c["sources"]), "strength": (c.get("selection") or {}).get("strength"),
                     "rule": (c.get("selection") or {}).get("rule", "")})
    return pl.DataFrame(rows, schema={"case": pl.Utf8, "pair": pl.Utf8, "metric": pl.Utf8, "region": pl.Utf8,
                                      "sources": pl.Utf8, "strength": pl.Float64, "rule": pl.Utf8}, orient="row")


def power_markdown(doc: Mapping) -> str:
    d, sr = doc.get("design") or {}, doc.get("sigma_r") or {}
    return (f"Design: k = {d.get('k')} windows x r = {d.get('r')} pairs per side ({d.get('replays_per_side')} replays), "
            f"sized for a 25 % effect (log {d.get('effect_log')}) with power {d.get('power')} at Holm's strictest "
            f"level over {d.get('cases')} cases, with sigma_r = {sr.get('value')} "
            f"({'measured' if sr.get('measured') else 'assumed'}, {sr.get('date')}: {sr.get('source')}); it resolves "
            f"a paired effect of {d.get('resolvable_effect_log')} (log) with 80 % power.")


def conformance_markdown(s: Mapping) -> str:
    """The virtual engine at the campaign's settings: an agreement rate, not a confirmation."""
    c = s.get("conformance_at_campaign_settings") or {}
    if not c.get("ran"):
        return (f"**Conformance at the campaign's settings** (virtual vLLM engine): not run here "
                f"({c.get('reason', 'no data')}).")
    return (f"**Conformance at the campaign's settings** (vLLM's scheduler stepped with the simulator's own step "
            f"times): the two policies come out in the simulator's order on {_pct(c.get('agreement_rate'))} of "
            f"{c.get('sides')} case sides ({_pct(c.get('window_agreement_rate'))} of {c.get('windows')} windows). "
            "This is an agreement rate between two implementations given one cost model; it cannot confirm or "
            "refute an order under real timing.")


def fidelity_markdown(s: Mapping) -> str:
    """Absolute latency (``fidelity_report``): a separate report, without a pass mark on a shared machine."""
    f = s.get("fidelity_report") or {}
    whole = (f.get("whole_run") or {}).get("all") or {}
    floor = f.get("repeat_floor") or {}
    if not whole and not floor:
        return ("**Absolute latency** (how close the simulator's latencies are on this machine) is a separate "
                "report; this run left no time for it.")
    parts = []
    if whole:
        parts.append("the whole-run prediction (the virtual engine + the engine's step table, each replay from its "
                     f"own input) is off by {_pct(whole.get('e2e', {}).get('mape'))} E2E MAPE, "
                     f"{_pct(whole.get('ttft', {}).get('mape'))} TTFT MAPE over {whole.get('e2e', {}).get('n')} "
                     f"requests of {f.get('replays_predicted')} replays")
    if floor:
        parts.append(f"two replays of one input (the {floor.get('pairs')} A/A pairs) disagree by "
                     f"{_pct(floor.get('replay_vs_replay', {}).get('e2e', {}).get('mape'))} E2E MAPE, so no "
                     f"prediction can get much below ~{_pct(floor.get('floor_e2e_mape'))} on this machine")
    return ("**Absolute latency** (a separate report, no pass mark; orders are the verdicts' question): "
            + "; ".join(parts) + ".")


def results_markdown(res: Mapping) -> str:
    """The whole section as Markdown (notebook 08 shows its parts with the tables between)."""
    s = res.get("summary") or {}
    parts = [lead_markdown(s)]
    if s.get("ran"):
        parts += [checks_markdown(s), preregistration_markdown(s), conformance_markdown(s), fidelity_markdown(s)]
    if res.get("stale"):
        parts.append("**Stale:** " + "; ".join(res["stale"]))
    if res.get("plan_error"):
        parts.append(f"**The pre-registration does not check:** {res['plan_error']}")
    return "\n\n".join(parts)
