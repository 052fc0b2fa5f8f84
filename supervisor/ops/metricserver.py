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
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from .httpslots import DeadlineSlots, SlotWords

#: Connections served at once; each holds a thread and at most a request line and 100 headers.
MAX_CONNECTIONS = 8
#: Seconds a connection may last from its accept, reading, answering and all.
DEADLINE_S = 10.0
#: The least time between two ``metrics_connections_capped`` warnings.
SAID_EVERY_S = 60.0


_WORDS = SlotWords("metrics_connections_capped", "the metrics listener", "scrapes go on")


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
    """A thread per connection, at most ``MAX_CONNECTIONS`` of them, none past ``DEADLINE_S``
    (the rule in :mod:`.httpslots`, shared with the live page's listener)."""

    daemon_threads = True
    # socketserver's listen backlog is 5: a burst of connects past it waits out a SYN retry (1 s)
    # each, and a scrape in the burst with them.
    request_queue_size = 128
    deadline_s = DEADLINE_S
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, clock: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        self.slots = DeadlineSlots(self.max_connections, self.deadline_s, _WORDS, clock=clock,
                                   said_every_s=SAID_EVERY_S)
        super().__init__(*args, **kwargs)

    @property
    def closed_early(self) -> int:
        return self.slots.closed_early

    # -- the accepting thread -------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.admit(request):
            self.shutdown_request(request)
            return
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
            self.slots.release(request)

    def service_actions(self) -> None:
        """Every poll of serve_forever (0.5 s): connections past their deadline are ended."""
        self.slots.reap()

    def request_read(self, sock: socket.socket) -> None:
        self.slots.request_read(sock)

    def connections(self) -> int:
        return self.slots.connections()


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
