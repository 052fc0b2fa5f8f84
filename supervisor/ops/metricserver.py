"""The Prometheus listener's HTTP server, bounded (issue 34 part 3).

prometheus_client's own server (``start_http_server``) starts a thread per connection and waits
on each as long as its client likes: a client that connects and trickles its request, or a
thousand that connect and send nothing, hold a thread and its buffers each, for ever. This one is
the same WSGI server with two bounds, checked by the accepting thread (no thread of its own):

- at most ``MAX_CONNECTIONS`` connections at once. A new one past that makes the oldest
  connection still reading its request give way (it is closed): a scrape sends its request at
  once, so a crowd of slow clients never holds off Prometheus. When every connection is past its
  request (being answered), the new one is closed instead, and so it is while the threads of
  those that gave way, woken to end, are not gone yet: never more than twice ``MAX_CONNECTIONS``
  threads;
- each connection ends ``DEADLINE_S`` after it was accepted, whatever it is doing (its socket is
  shut down, which wakes the thread serving it); a scrape of this registry takes milliseconds.

What was closed early is said at most once a ``SAID_EVERY_S`` (``metrics_connections_capped``),
with the count since the last time.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

log = structlog.get_logger("supervisor.ops")

#: Connections served at once; each holds a thread and at most a request line and 100 headers.
MAX_CONNECTIONS = 8
#: Seconds a connection may last from its accept, reading, answering and all.
DEADLINE_S = 10.0
#: The least time between two ``metrics_connections_capped`` warnings.
SAID_EVERY_S = 60.0


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    accepted: float
    reading: bool = True  # until its request line and headers are read


class _Handler(WSGIRequestHandler):
    """wsgiref's handler, quiet (no line on stderr per request), telling the server when the
    request is read: from then on the connection is being answered and no longer gives way."""

    server: "BoundedWSGIServer"

    def parse_request(self) -> bool:
        ok = bool(super().parse_request())
        self.server.request_read(self.connection)
        return ok

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's name
        return None


class BoundedWSGIServer(WSGIServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` of them, none past ``deadline_s``."""

    daemon_threads = True
    # socketserver's listen backlog is 5: a burst of connects past it waits out a SYN retry (1 s)
    # each, and a scrape in the burst with them.
    request_queue_size = 128
    deadline_s = DEADLINE_S
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, clock: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        self._conns: dict[socket.socket, _Conn] = {}
        self._threads = 0  # serving threads alive, those given way included until they end
        self._lock = threading.Lock()
        self._clock = clock
        self.closed_early = 0  # connections closed by a bound, since the start (tests, status)
        self._unsaid = 0
        self._said_at: float | None = None
        super().__init__(*args, **kwargs)

    # -- the accepting thread -------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        now = self._clock()
        with self._lock:
            self._reap(now)
            if len(self._conns) >= self.max_connections:
                reading = [c for c in self._conns.values() if c.reading]
                if not reading:  # every slot answering a request: this one waits for nothing
                    self._closed_early(now)
                    self.shutdown_request(request)
                    return
                self._end(min(reading, key=lambda c: c.accepted))
                self._closed_early(now)
            if self._threads >= 2 * self.max_connections:  # those that gave way have not ended yet
                self._closed_early(now)
                self.shutdown_request(request)
                return
            self._conns[request] = _Conn(request, str(client_address[0]), now)
            self._threads += 1
        request.settimeout(self.deadline_s)  # no single read or write outlasts the whole deadline
        threading.Thread(target=self._serve, args=(request, client_address), daemon=True,
                         name="metrics-connection").start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the client went away, or a bound ended the connection: nothing to answer
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._conns.pop(request, None)
                self._threads -= 1

    def service_actions(self) -> None:
        """Every poll of serve_forever (0.5 s): connections past their deadline are ended."""
        now = self._clock()
        with self._lock:
            self._reap(now)

    def request_read(self, sock: socket.socket) -> None:
        with self._lock:
            conn = self._conns.get(sock)
            if conn is not None:
                conn.reading = False

    # -- under the lock ------------------------------------------------------------------------------
    def _reap(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if now - c.accepted >= self.deadline_s]:
            self._end(conn)
            self._closed_early(now)

    def _end(self, conn: _Conn) -> None:
        """Shut the socket down (its thread wakes, finds the end and closes it) and forget it."""
        self._conns.pop(conn.sock, None)
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by its own thread

    def _closed_early(self, now: float) -> None:
        self.closed_early += 1
        self._unsaid += 1
        if self._said_at is None or now - self._said_at >= SAID_EVERY_S:
            log.warning("metrics_connections_capped", closed=self._unsaid, max_connections=self.max_connections,
                        deadline_s=self.deadline_s,
                        message=f"the metrics listener closed {self._unsaid} connection(s) early: more than "
                                f"{self.max_connections} at once (the oldest still sending its request gives way) "
                                f"or one lasting over {self.deadline_s:g} s; scrapes go on, and this is said at "
                                f"most once every {SAID_EVERY_S:g} s")
            self._said_at, self._unsaid = now, 0

    def connections(self) -> int:
        with self._lock:
            return len(self._conns)


def start_bounded_server(port: int, addr: str, registry: CollectorRegistry) -> tuple[BoundedWSGIServer, threading.Thread]:
    """As ``prometheus_client.start_http_server`` (the address family from ``addr``), bounded."""
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(BoundedWSGIServer):
        address_family = family[0]

    httpd = make_server(str(family[4][0]), port, make_wsgi_app(registry), Server, handler_class=_Handler)
    assert isinstance(httpd, BoundedWSGIServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True, name="metrics-listener")
    thread.start()
    return httpd, thread
