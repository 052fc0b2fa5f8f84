"""The live page's HTTP listener (``[web] listen``): ``GET /`` the page (``ops/web/live.html``, one
file, no framework, nothing fetched from outside the node), ``GET /live.json`` the document it
polls every second (``ops/livedata.py``). Read-only: GET and HEAD, nothing else.

Its own listener, not the Prometheus one: a page is read by people, a scrape by Prometheus, and
neither may hold the other off. Bounded like the metrics listener (``ops/metricserver.py``), by
the accepting thread, with no thread of its own:

- ``MAX_CONNECTIONS`` at once (a thread each; never more than twice that many threads). A new one
  past the cap makes the oldest connection still sending its request give way: a browser sends
  its request at once, so a crowd of slow clients never holds off the page. When every one is
  being answered, the new one is closed;
- ``MAX_REQUEST_BYTES`` of request (line and headers together): past it ``431`` and closed;
- ``DEADLINE_S`` per connection from its accept, reading and answering together (a client that
  does not read its reply is cut there too); every reply closes its connection;
- the reply: the page (a few KiB) or the document (``livedata.MAX_BYTES`` at most).

Bound to a loopback address unless ``[web] allow_remote`` (config). On loopback a request whose
``Host`` names another host is refused (421): a web page elsewhere that rebinds its DNS name to
127.0.0.1 cannot read this one through the operator's browser. The page's script and style are
allowed by their hashes only (Content-Security-Policy): no other script runs in it.
"""
from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import structlog

from .httpslots import DeadlineSlots, SlotWords

log = structlog.get_logger("supervisor.ops")

MAX_CONNECTIONS = 8
MAX_REQUEST_BYTES = 8192
DEADLINE_S = 5.0
SAID_EVERY_S = 60.0  # the least time between two web_connections_capped warnings
PAGE_FILE = Path(__file__).parent / "web" / "live.html"

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            421: "Misdirected Request", 431: "Request Header Fields Too Large", 500: "Internal Server Error"}
_COMMON = (b"Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n"
           b"X-Frame-Options: DENY\r\nConnection: close\r\n")


def _csp(html: str) -> str:
    """Only the page's own inline script and style, by hash; fetches to this listener only."""
    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
        return " ".join("'sha256-" + base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() + "'"
                        for b in bodies)
    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _local_host(host: str) -> bool:
    """Whether a Host header's host names this node's loopback (any port: ssh -L maps ports)."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


_WORDS = SlotWords("web_connections_capped", "the live page's listener", "the page goes on")


class LivePage:
    """The listener: ``start()`` binds and serves on a thread, ``close()`` ends it."""

    max_connections = MAX_CONNECTIONS
    deadline_s = DEADLINE_S

    def __init__(self, listen: str, document: Callable[[], bytes], *, loopback: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.listen = listen
        self.document = document
        self.loopback = loopback  # check Host (see the module doc)
        self.clock = clock
        html = PAGE_FILE.read_text(encoding="utf-8")
        self.page = html.encode()
        self.csp = _csp(html).encode()
        self.address: tuple[str, int] | None = None
        self.served = 0
        self.slots = DeadlineSlots(self.max_connections, self.deadline_s, _WORDS, clock=clock,
                                   said_every_s=SAID_EVERY_S)
        self._sock: socket.socket | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        host = host.strip("[]")
        family, _, _, _, addr = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)  # a burst of connects waits in the backlog, not a SYN retry (1 s) each
            sock.settimeout(0.5)  # the accept loop's tick: deadlines are reaped then
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.address = sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, daemon=True, name="web-listener")
        self._thread.start()
        return self.address

    # -- the accepting thread -------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                self.slots.reap()
                continue
            except OSError as e:
                if self._closing.is_set():
                    return
                # Out of file descriptors (EMFILE), say: the listener waits and tries again rather
                # than end for good while the run goes on.
                log.warning("web_request_failed", error=repr(e), next="accepting again in 0.5 s")
                self._closing.wait(0.5)
                continue
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        if not self.slots.admit(conn):
            conn.close()
            return
        threading.Thread(target=self._serve, args=(conn,), daemon=True, name="web-connection").start()

    @property
    def closed_early(self) -> int:
        return self.slots.closed_early

    def connections(self) -> int:
        return self.slots.connections()

    # -- a connection's thread ------------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        try:
            head = self._read_head(conn)
            self.slots.request_read(conn)
            if head is not None:
                conn.sendall(self._answer(head))
                self.served += 1
        except OSError:
            pass  # the client went away, or a bound ended the connection
        except Exception as e:  # a bug here must not end the listener, nor the run
            log.warning("web_request_failed", error=repr(e))
            try:
                conn.sendall(self._reply(500, b"text/plain; charset=utf-8", b"internal error\n"))
            except OSError:
                pass
        finally:
            try:
                conn.close()
            except OSError:
                pass
            self.slots.release(conn)

    def _read_head(self, conn: socket.socket) -> bytes | None:
        """The request line and headers; None (and the reply sent) when too large or cut off."""
        buf = b""
        while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
            if len(buf) > MAX_REQUEST_BYTES:
                conn.sendall(self._reply(431, b"text/plain; charset=utf-8",
                                         f"request over {MAX_REQUEST_BYTES} bytes\n".encode()))
                return None
            chunk = conn.recv(4096)
            if not chunk:
                return None
            buf += chunk
        head = buf.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0]
        if len(head) > MAX_REQUEST_BYTES:
            conn.sendall(self._reply(431, b"text/plain; charset=utf-8",
                                     f"request over {MAX_REQUEST_BYTES} bytes\n".encode()))
            return None
        return head

    def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\n")
        parts = lines[0].split(" ")
        text = b"text/plain; charset=utf-8"
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return self._reply(400, text, b"expected an HTTP/1.x request line\n")
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return self._reply(405, text, b"read-only: GET and HEAD only\n", extra=b"Allow: GET, HEAD\r\n")
        host = next((v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:]) if k.strip().lower() == "host"), None)
        if self.loopback and host is not None and not _local_host(host):
            return self._reply(421, text, b"this page answers only to a loopback host name\n")
        path = target.split("?", 1)[0]
        if path == "/":
            reply = self._reply(200, b"text/html; charset=utf-8", self.page, extra=b"Content-Security-Policy: " + self.csp + b"\r\n")
        elif path == "/live.json":
            reply = self._reply(200, b"application/json", self.document())
        else:
            reply = self._reply(404, text, b"not found: this listener serves / and /live.json\n")
        return reply.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n" if method == "HEAD" else reply

    @staticmethod
    def _reply(code: int, ctype: bytes, body: bytes, extra: bytes = b"") -> bytes:
        return (f"HTTP/1.1 {code} {_REASONS[code]}\r\n".encode() + b"Content-Type: " + ctype + b"\r\n"
                + f"Content-Length: {len(body)}\r\n".encode() + _COMMON + extra + b"\r\n" + body)

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            self._sock.close()
        self.slots.end_all()
        if self._thread is not None:
            self._thread.join(2)
