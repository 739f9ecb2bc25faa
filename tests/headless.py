"""A page opened in headless Chromium through the DevTools protocol: console errors, failed loads, images that
did not resolve, and a screenshot. Needs Debian's ``chromium`` (``make browser`` installs it) and
``websocket-client``."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import websocket

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# Every <img> of the page: its src and whether it decoded to a picture (complete and a natural width).
_IMAGES_JS = ("JSON.stringify(Array.from(document.images).map(i => ({src: i.currentSrc || i.src, "
              "ok: i.complete && i.naturalWidth > 0})))")


def browser() -> str | None:
    """The Chromium executable on PATH, or None."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


@dataclass
class PageReport:
    url: str
    errors: list[str] = field(default_factory=list)     # console errors, exceptions, failed loads
    images: list[dict] = field(default_factory=list)    # [{src, ok}]
    title: str = ""
    value: object = None                                # what the ``evaluate`` expression returned (JSON)

    @property
    def broken_images(self) -> list[str]:
        return [i["src"] for i in self.images if not i["ok"]]


class _Session:
    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.events:
                if e.get("method") == method:
                    return e
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(f"no {method} within {timeout_s} s")


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append(f"exception: {d.get('text')} {(d.get('exception') or {}).get('description', '')}")
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
        elif m == "Network.loadingFailed":
            out.append(f"load failed: {p.get('errorText')} ({p.get('requestId')})")
    return out


def open_page(page: Path, screenshot: Path | None = None, width: int = 1280, height: int = 900,
              max_height: int = 3000, evaluate: str | None = None) -> PageReport:
    """Load ``page`` (a file) in a fresh headless Chromium; report what went wrong; save a PNG of the page
    (its first ``max_height`` pixels); ``evaluate``: a JavaScript expression whose value (made into JSON in the page)
    is returned as ``value``."""
    exe = browser()
    if exe is None:
        raise RuntimeError("no Chromium on PATH: `make browser` installs Debian's chromium")
    url = Path(page).resolve().as_uri()
    # Chromium's helper processes may still write to the profile after the browser has exited: a cleanup that finds
    # the folder not yet empty is not the page's failure (it failed test_site once on a busy machine)
    with tempfile.TemporaryDirectory(prefix="portbench-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 "--no-default-browser-check", "--remote-debugging-port=0", "--remote-allow-origins=*",
                                 f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file, deadline = Path(profile) / "DevToolsActivePort", time.monotonic() + 60
            while not port_file.is_file() or len(port_file.read_text().splitlines()) < 2:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{exe} did not start its DevTools endpoint")
                time.sleep(0.1)
            port = int(port_file.read_text().splitlines()[0])
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
            ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            s = _Session(ws_url)
            for domain in ("Page", "Runtime", "Log", "Network"):
                s.call(f"{domain}.enable")
            # the viewport exactly width x height (the window's own size leaves less to the page)
            s.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            s.call("Page.navigate", url=url)
            s.wait_for("Page.loadEventFired")
            report = PageReport(url=url)
            report.images = json.loads(s.call("Runtime.evaluate", expression=_IMAGES_JS)["result"]["value"])
            report.title = s.call("Runtime.evaluate", expression="document.title")["result"]["value"]
            if evaluate is not None:
                got = s.call("Runtime.evaluate", expression=f"JSON.stringify({evaluate})")["result"]
                report.value = json.loads(got["value"]) if "value" in got else None
            if screenshot is not None:
                size = s.call("Page.getLayoutMetrics")["cssContentSize"]
                clip = {"x": 0, "y": 0, "width": width, "height": min(float(size["height"]), max_height), "scale": 1}
                shot = s.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            report.errors = _errors(s.events)
            s.ws.close()
            return report
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
