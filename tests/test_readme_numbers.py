"""No number typed by hand in the README's prose (issue #39 item 8).

Every number in the README outside its generated blocks (``<!-- NAME:start -->`` … ``<!-- NAME:end -->``, written
from ``summary.json`` by ``portbench report --readme``), fenced code, inline code and link targets must be a number
that ``data/results/summary.json`` contains (at the precision written; a percentage as the share it is). Without
a summary, no number is allowed there at all. The one exception is the ``measured`` block (the pipeline's time on
the development machine): its numbers must stand on the benchmark page, where each measurement is dated and
described, so that the README cannot drift from it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?%)?")
BLOCK = re.compile(r"<!-- ([\w-]+):start -->(.*?)<!-- \1:end -->", re.S)


def prose(text: str) -> tuple[str, dict[str, str]]:
    """The README's hand-written text (blocks, code and link targets removed) and its blocks by name."""
    blocks = {m.group(1): m.group(2) for m in BLOCK.finditer(text)}
    text = BLOCK.sub(" ", text)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return text, blocks


def numbers(text: str) -> list[str]:
    return [m.group(0).replace(" ", "") for m in NUMBER.finditer(text)]


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        yield float(x)


def in_summary(token: str, values: list[float]) -> bool:
    """Whether the written number is a value of the summary at the precision written (``82%``: a share 0.82;
    ``1,147``: 1147; ``0.43``: 0.43 rounded to two decimals; a bare number may be a share in percent, as the
    bounds of ``82% [80, 83]`` are)."""
    pct = token.endswith("%")
    body = token.rstrip("%").replace(",", "")
    digits = len(body.split(".")[1]) if "." in body else 0
    want = f"{float(body):.{digits}f}"
    scales = (100,) if pct else (1, 100)
    return any(f"{k * v:.{digits}f}" == want for v in values for k in scales)


def stray_numbers(readme: str, summary: dict | None) -> list[str]:
    text, _ = prose(readme)
    values = list(_leaves(summary)) if summary else []
    return [n for n in numbers(text) if not in_summary(n, values)]


def test_readme_prose_has_no_number_the_summary_lacks():
    summary_file = ROOT / "data" / "results" / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    stray = stray_numbers((ROOT / "README.md").read_text(), summary)
    assert not stray, (f"numbers in the README's prose that {'summary.json does not hold' if summary else 'no summary backs'}"
                       f": {stray} -- put them in a generated block (present/report.py BLOCKS) or on a docs page")


def test_measured_numbers_stand_on_the_benchmark_page():
    _, blocks = prose((ROOT / "README.md").read_text())
    assert "measured" in blocks, "the README states the pipeline's time in its measured block"
    bench = (ROOT / "docs" / "benchmark.md").read_text()
    said = numbers(blocks["measured"])
    assert said, "the measured block states a time"
    missing = [n for n in re.findall(r"\d+ min(?: \d+ s)?", blocks["measured"]) if n not in bench]
    assert not missing, f"times in the README's measured block that the benchmark page does not state: {missing}"


def test_the_check_fails_on_a_hand_typed_number():
    summary = {"headline": {"concordance": {"across_sources": {"value": 0.8218, "n": 1147}}}, "reversals": 203}
    assert stray_numbers("Of them, 82% [82, 82] of 1,147 keep their order; 203 reversals.", summary) == []
    assert stray_numbers("Prose says 209 reversals and 94 of 792.", summary) == ["209", "94", "792"]
    assert stray_numbers("83% keep their order", summary) == ["83%"]
    assert stray_numbers("0.82 and 0.822", summary) == [], "a share at the precision written"
    # generated blocks, code and link targets are not prose
    text = "<!-- headline:start -->\n209\n<!-- headline:end -->\n`make -j 4` [x](docs/04.md)\n```\n1 2 3\n```\n"
    assert stray_numbers(text, summary) == []
    assert stray_numbers("209", None) == ["209"], "without a summary no number is allowed"
