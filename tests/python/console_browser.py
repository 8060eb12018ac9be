#!/usr/bin/env python3
"""Drives tiergate's /console in a real headless Chromium over the Chrome DevTools Protocol.

  python3 tests/python/console_browser.py ADMIN_URL SCREENSHOT.png

Loads the page, waits for live data, moves the θ_base control and applies it (PATCH with If-Match from the
page), waits for the page to show the new policy version, then submits an invalid change and reads the
server's error from the page, reads the answer cache card, and saves a screenshot. Prints one JSON line with what it saw."""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Cdp:
    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=30)
        self.n = 0

    def call(self, method, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, what, timeout=20):
        # Until the page has loaded, its elements are missing and the expression throws: that is "not yet",
        # not a failure (Page.navigate returns before the document exists).
        t = time.time()
        last = None
        while time.time() - t < timeout:
            try:
                v = self.eval(expr)
            except RuntimeError as e:
                v, last = None, e
            if v:
                return v
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what} (last error: {last})")


def main():
    admin, shot = sys.argv[1], sys.argv[2]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        sys.exit("no chromium (Debian package `chromium`)")
    port = free_port()
    profile = tempfile.mkdtemp()
    proc = subprocess.Popen(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--remote-debugging-port={port}", f"--remote-allow-origins=http://127.0.0.1:{port}",
         f"--user-data-dir={profile}", "--window-size=1200,900",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t = time.time()
        while True:
            try:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2))
                page = next(x for x in targets if x["type"] == "page")
                break
            except Exception:
                if time.time() - t > 30:
                    raise
                time.sleep(0.2)
        cdp = Cdp(page["webSocketDebuggerUrl"])
        cdp.call("Page.enable")
        cdp.call("Page.navigate", url=admin + "/console")
        # Live data arrived: the version card shows a number.
        v0 = int(cdp.wait("(() => { const t = document.getElementById('version').textContent; "
                          "return /^[0-9]+$/.test(t) ? t : null })()", "live data"))
        theta_before = cdp.eval("document.getElementById('theta').textContent")
        # Move the θ_base control and apply it.
        cdp.eval("(() => { const e = document.getElementById('theta_base'); e.focus(); e.value = '0.33';"
                 " e.dispatchEvent(new Event('input', {bubbles: true})); return true })()")
        cdp.eval("document.getElementById('apply').click()")
        ok = cdp.wait("document.getElementById('ok').textContent || "
                      "(document.getElementById('error').textContent ? 'ERROR ' + document.getElementById('error').textContent : '')",
                      "the change to be applied")
        if ok.startswith("ERROR"):
            raise RuntimeError(f"the page's change was refused: {ok}")
        v1 = int(cdp.wait(f"(() => {{ const t = document.getElementById('version').textContent; "
                          f"return Number(t) > {v0} ? t : null }})()", "the new version on the page"))
        theta_after = cdp.wait(f"(() => {{ const t = document.getElementById('theta').textContent; "
                               f"return t !== {json.dumps(theta_before)} ? t : null }})()", "θ to change")
        # A refused change shows the server's error.
        cdp.eval("(() => { const e = document.getElementById('k'); e.focus(); e.value = '5';"
                 " e.dispatchEvent(new Event('input', {bubbles: true})); return true })()")
        cdp.eval("document.getElementById('apply').click()")
        error = cdp.wait("document.getElementById('error').textContent", "the server's error")
        cache = cdp.wait("(() => { const t = document.getElementById('cache').textContent; "
                         "return / hits /.test(t) ? t : null })()", "the answer cache card")
        rows = cdp.eval("document.querySelectorAll('#decisions tr').length")
        points = cdp.eval("Number(document.getElementById('series').dataset.points)")
        png = cdp.call("Page.captureScreenshot", format="png")["data"]
        with open(shot, "wb") as f:
            f.write(base64.b64decode(png))
        print(json.dumps({"v0": v0, "v1": v1, "ok": ok, "theta_before": theta_before,
                          "theta_after": theta_after, "error": error, "decision_rows": rows,
                          "series_points": points, "cache": cache}))
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
