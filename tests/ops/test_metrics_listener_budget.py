"""The Prometheus listener is bounded (issue 34 part 3, ops/metricserver.py): 100x
``MAX_CONNECTIONS`` slow clients on 127.0.0.1 hold at most ``MAX_CONNECTIONS`` threads, a scrape
among them is answered at once (at most twice that many threads, those given way ending), and a client that trickles its request is cut at ``deadline_s``.
prometheus_client's own server started a thread per connection and kept it while its client
liked: 800 silent clients were 800 threads."""
from __future__ import annotations

import socket
import threading
import time
import urllib.request
from contextlib import ExitStack

import pytest
from structlog.testing import capture_logs

from supervisor.ops.config import MetricsConfig
from supervisor.ops.metrics import Metrics
from supervisor.ops.metricserver import MAX_CONNECTIONS, BoundedWSGIServer
from tests.util import wait_for


@pytest.fixture
def listener():
    m = Metrics(MetricsConfig(listen="127.0.0.1:0"))
    m.start()
    m.update({"state": "running", "run_id": "r1", "attempt": 1})
    try:
        yield m
    finally:
        m.close()


def scrape(port: int, timeout: float = 10.0) -> tuple[int, bytes, float]:
    t = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.status, r.read(), time.monotonic() - t


def listener_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "metrics-connection")


def test_100x_max_connections_slow_clients_hold_a_bounded_number_of_threads_and_a_scrape_goes_through(listener):
    server = listener._server
    assert isinstance(server, BoundedWSGIServer)
    port = listener.address[1]
    clients = 100 * MAX_CONNECTIONS
    t0 = time.monotonic()
    with ExitStack() as stack, capture_logs() as logs:
        for i in range(clients):  # each sends part of a request line and then nothing, for as long as it can
            s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            s.sendall(b"GET /metr" if i % 2 else b"")
            if i % MAX_CONNECTIONS == 0:
                assert listener_threads() <= 2 * MAX_CONNECTIONS, listener_threads()
        wait_for(lambda: server.closed_early >= clients - MAX_CONNECTIONS, 60, 0.05, "the crowd accepted")
        assert server.connections() <= MAX_CONNECTIONS and listener_threads() <= 2 * MAX_CONNECTIONS
        status, body, took = scrape(port)  # the oldest slow client gives way to it
        assert status == 200 and b"tsup_build_info" in body
        assert took < 5.0, took  # measured: 0.02 s
    capped = [e for e in logs if e["event"] == "metrics_connections_capped"]
    said_at_most = 1 + int((time.monotonic() - t0) // 60)  # once a minute at most (one, unless the machine crawls)
    assert 1 <= len(capped) <= said_at_most and "scrapes go on" in capped[0]["message"], capped


def test_a_client_trickling_its_request_is_cut_at_the_deadline(listener, monkeypatch):
    monkeypatch.setattr(listener._server.slots, "deadline_s", 1.0)
    port = listener.address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        t = time.monotonic()
        ended = None
        for ch in b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 100:  # one byte every 0.2 s: 25 s for this much
            try:
                s.sendall(bytes([ch]))
                s.settimeout(0.2)
                if s.recv(1) == b"":
                    ended = time.monotonic() - t
                    break
            except TimeoutError:
                continue  # still open: the next byte
            except OSError:
                ended = time.monotonic() - t
                break
        assert ended is not None, "the trickling client was never cut"
        assert 0.9 <= ended < 8.0, ended  # the deadline, seen within the accept loop's 0.5 s poll (measured: 1.3 s)
    status, body, _ = scrape(port)
    assert status == 200 and b"tsup_state" in body
    wait_for(lambda: listener._server.connections() == 0, 10, 0.02, "the scrape's connection ended")
