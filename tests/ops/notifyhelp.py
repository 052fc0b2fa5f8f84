"""A real webhook (http.server on 127.0.0.1 in a thread) and a real hook command for the
``[notify]`` tests."""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

#: The hook: its stdin to argv[1], the TSUP_NOTIFY_* env as JSON to argv[1] + ".env".
HOOK_SOURCE = """\
import json, os, sys, time
data = sys.stdin.buffer.read()
if len(sys.argv) > 2:  # a slow pager: the daemon must wait for it at exit
    time.sleep(float(sys.argv[2]))
env = {k: v for k, v in os.environ.items() if k.startswith("TSUP_NOTIFY_")}
with open(sys.argv[1] + ".env.tmp", "w") as f:
    json.dump(env, f)
os.replace(sys.argv[1] + ".env.tmp", sys.argv[1] + ".env")
with open(sys.argv[1] + ".tmp", "wb") as f:
    f.write(data)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def hook_command(tmp: Path, takes_s: float = 0.0) -> tuple[list[str], Path]:
    script = tmp / "hook.py"
    script.write_text(HOOK_SOURCE)
    out = tmp / "hook.out"
    return [sys.executable, str(script), str(out)] + ([str(takes_s)] if takes_s else []), out


class Webhook:
    """A local HTTP server that keeps every JSON body POSTed to it, with the time it came."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.received: list[tuple[float, str, dict[str, Any]]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n))
                hook.received.append((time.time(), self.path, body))
                self.send_response(hook.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/SECRETPATH"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self) -> list[dict[str, Any]]:
        return [b for _t, _p, b in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def dead_url() -> str:
    """A URL nobody listens on: a port bound then closed (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/hook/SECRETPATH"


def silent_url() -> Iterator[str]:
    """A URL whose server accepts the connection and never answers (a timeout)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}/hook/SECRETPATH"
    finally:
        s.close()
