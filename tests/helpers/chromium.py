"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL bytes on fds 3 and 4, as Puppeteer does), so a test reads the live
DOM of a page that keeps running, and takes screenshots, with no Python dependency and no port.

``chromium()`` installs the Debian package when it is missing (``tests/helpers/apt.py``) and
returns None or why it cannot (the caller skips saying so)."""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.helpers.apt import apt_install


def chromium_path() -> tuple[str | None, str]:
    """The browser's path, or None and why not."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path, ""
    why = apt_install(["chromium"])
    path = shutil.which("chromium")
    return (path, "") if path else (None, why or "the chromium package installed no chromium command")


class Browser:
    """One headless Chromium with one page; ``close()`` ends it (its whole process group)."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_r, to_w = os.pipe()  # we write commands, the browser reads them on its fd 3
        from_r, from_w = os.pipe()  # the browser writes replies on its fd 4, we read them
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows", "--disable-dev-shm-usage", "--mute-audio",
                f"--user-data-dir={profile}", "--window-size=1200,1000", "--remote-debugging-pipe", "about:blank"]
        # bash, not sh: dash takes one-digit fd numbers only
        script = f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-'
        self.log = open(profile.parent / "chromium.log", "wb")
        self.proc = subprocess.Popen(["bash", "-c", script, exe, *args], pass_fds=(to_r, from_w),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self._w, self._r = to_w, from_r
        self._buf = b""
        self._id = 0
        self.session: str | None = None

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True,
             timeout: float = 30.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return dict(reply.get("result", {}))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to {method} within {timeout} s")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium went away (see {self.log.name})")
                self._buf += chunk

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": url}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self.log.close()
