"""The live page's listener and document under hostile input (issue 37 part 9; docs/reliability.md,
"Input budgets"), real HTTP on 127.0.0.1: a huge request line, a crowd of slow clients, a client that
trickles its request or never reads its reply, paths outside the page, methods other than GET, a
Host naming another site; the document bounded and masked; a non-loopback address refused by the
config unless allowed."""
from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator

import pytest
from structlog.testing import capture_logs

from supervisor.config.model import ConfigError, config_from_table
from supervisor.ledger.store import Ledger
from supervisor.ops import livedata
from supervisor.ops.livedata import Curve, LiveData
from supervisor.ops.livepage import MAX_CONNECTIONS, MAX_REQUEST_BYTES, LivePage
from tests.util import wait_for

DOC = b'{"status": {"state": "running"}}'


@pytest.fixture
def page() -> Iterator[LivePage]:
    p = LivePage("127.0.0.1:0", lambda: DOC)
    p.start()
    try:
        yield p
    finally:
        p.close()


def raw(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``data``, read the whole reply: status, headers, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body


def get(port: int, path: str = "/", host: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    return raw(port, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())


def threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "web-connection")


def test_the_page_and_its_document_are_served_with_a_strict_policy(page: LivePage):
    port = page.address[1]  # type: ignore[index]
    code, headers, body = get(port, "/")
    assert code == 200 and headers["content-type"].startswith("text/html") and b'id="curve"' in body
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "connect-src 'self'" in csp
    assert "http" not in csp and b"src=\"http" not in body and b"//cdn" not in body  # nothing from outside the node
    assert headers["cache-control"] == "no-store" and headers["x-frame-options"] == "DENY"
    code, headers, body = get(port, "/live.json?t=1", host="localhost:8080")  # ssh -L maps another port: allowed
    assert code == 200 and headers["content-type"] == "application/json" and body == DOC


def test_a_huge_request_line_is_refused_at_the_bound_and_the_page_goes_on(page: LivePage):
    port = page.address[1]  # type: ignore[index]
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        sent = 0
        try:
            for _ in range(100 * MAX_REQUEST_BYTES // 65536 + 1):  # 100x the bound, never a newline
                s.sendall(b"GET /" + b"a" * 65536)
                sent += 65541
        except OSError:
            pass  # the listener answered and closed while we were still sending: that is the point
        reply = b""
        try:
            while chunk := s.recv(65536):
                reply += chunk
        except OSError:
            pass
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
    assert time.monotonic() - t < 5.0
    assert get(port)[0] == 200


def test_paths_outside_the_page_and_methods_other_than_get_are_refused(page: LivePage):
    port = page.address[1]  # type: ignore[index]
    for path in ("/../../etc/passwd", "/etc/passwd", "//evil.example/x", "http://evil.example/", "/live.json/..",
                 "/%2e%2e/ledger.sqlite", "/ledger.sqlite", "/index.html"):
        code, _, body = get(port, path)
        assert code == 404 and b"serves / and /live.json" in body, path
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"):
        code, headers, body = raw(port, f"{method} / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\n\r\nstop".encode())
        assert code == 405 and headers["allow"] == "GET, HEAD", method
    code, headers, body = raw(port, b"HEAD /live.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert code == 200 and body == b"" and headers["content-length"] == str(len(DOC))
    assert raw(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")[0] == 400  # a TLS hello, say
    # DNS rebinding: a page of another site whose name now points at 127.0.0.1 cannot read this one.
    code, _, body = get(port, "/live.json", host="evil.example:%d" % port)
    assert code == 421 and DOC not in body


def test_100x_max_connections_slow_clients_hold_bounded_threads_and_a_page_load_goes_through(page: LivePage):
    port = page.address[1]  # type: ignore[index]
    clients = 100 * MAX_CONNECTIONS
    with ExitStack() as stack, capture_logs() as logs:
        for i in range(clients):  # each sends part of a request, then nothing for as long as it can
            s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            s.sendall(b"GET /live.js" if i % 2 else b"")
            if i % MAX_CONNECTIONS == 0:
                assert threads() <= 2 * MAX_CONNECTIONS, threads()
        wait_for(lambda: page.closed_early >= clients - MAX_CONNECTIONS, 60, 0.05, "the crowd accepted")
        assert page.connections() <= MAX_CONNECTIONS and threads() <= 2 * MAX_CONNECTIONS
        t = time.monotonic()
        code, _, body = get(port, "/live.json")  # the oldest slow client gives way to it
        assert code == 200 and body == DOC and time.monotonic() - t < 5.0
    capped = [e for e in logs if e["event"] == "web_connections_capped"]
    assert len(capped) == 1 and "the page goes on" in capped[0]["message"], capped  # once a minute at most


def test_a_trickling_client_and_one_that_never_reads_are_cut_at_the_deadline(page: LivePage, monkeypatch):
    monkeypatch.setattr(page.slots, "deadline_s", 1.0)
    big = b'{"pad": "' + b"x" * (livedata.MAX_BYTES - 20) + b'"}'
    page.document = lambda: big
    port = page.address[1]  # type: ignore[index]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as trickle, \
            socket.create_connection(("127.0.0.1", port), timeout=10) as deaf:
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deaf.sendall(b"GET /live.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # and never reads the megabyte
        t = time.monotonic()
        for ch in b"GET / HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.2 s: 5 s for this much
            try:
                trickle.sendall(bytes([ch]))
            except OSError:
                break
            if page.closed_early >= 1 and page.connections() == 0:
                break
            time.sleep(0.2)  # the trickle itself, not a wait for a result
        # the trickler is cut by the deadline (counted); the deaf one's send times out at the same
        # deadline and its own thread ends it
        wait_for(lambda: page.closed_early >= 1 and page.connections() == 0, 10, 0.05, "both connections cut")
        assert time.monotonic() - t < 4.0
    wait_for(lambda: threads() == 0, 10, 0.05, "their threads ended")
    page.document = lambda: DOC
    assert get(port)[0] == 200


def test_the_document_passes_the_redaction_gate_and_stays_under_its_bound(tmp_path: Path, monkeypatch):
    status = {"state": "running", "run_id": "r1", "attempt": 2, "restarts_by_cause": {"crash": 2},
              "last_anomaly": {"line": "db=postgres://u:hunter2pass@db/x HF_TOKEN=hf_abcdefghijklmnopqrstu"},
              "env": {"WANDB_API_KEY": "0123456789abcdef"}}
    led = Ledger(tmp_path)  # a real ledger with a run: events and metric rows
    rid, _ = led.open_run("job", {"job": {"command": ["python"]}})
    led.metrics_batch(rid, 0, [(1000.0 + i, i, 2.0 - i / 10_000, None, None, None) for i in range(5000)])
    led.event(rid, 0, "job_started", "info", "attempt 0 started " + "z" * 5000)
    led.close()
    data = LiveData(lambda: {**status, "run_id": rid}, tmp_path)
    d = json.loads(data.payload())
    assert "ledger_error" not in d and d["status"]["last_anomaly"]["line"].startswith("db=postgres://u:")
    for secret in ("hunter2pass", "hf_abcdefghijklmnopqrstu", "0123456789abcdef"):
        assert secret not in json.dumps(d), secret
    data.close()
    huge = LiveData(lambda: {**status, "run_id": rid, "huge": "y" * (3 << 20)}, tmp_path)
    doc = huge.payload()
    assert len(doc) <= livedata.MAX_BYTES
    d = json.loads(doc)
    assert d["status"]["attempt"] == 2 and "cut" in d  # the 3 MB status field made it cut parts
    huge.close()
    small = LiveData(lambda: {"state": "running", "run_id": rid, "attempt": 0}, tmp_path)
    d = json.loads(small.payload())
    assert d["curve"]["rows_read"] == 5000 and len(d["curve"]["points"]) <= livedata.MAX_POINTS + 1
    assert d["events"][0]["event"] == "job_started" and len(d["events"][0]["message"]) < 400
    small.close()


def test_the_curve_keeps_an_even_sample_and_each_attempt_s_last_point():
    c = Curve(max_points=100)
    for i in range(10_000):
        c.add(float(i), i, 1.0, 0 if i < 7_777 else 1)
    s = c.series()
    assert len(c.points) <= 100 and c.stride == 128
    assert (7776.0, 7776, 1.0, 0) in s and s[-1] == (9999.0, 9999, 1.0, 1)
    gaps = {b[1] - a[1] for a, b in zip(c.points, c.points[1:])}
    assert gaps == {c.stride}  # evenly spread over the whole run


def test_the_config_refuses_a_page_reachable_from_the_network_unless_allowed():
    base: dict[str, Any] = {"job": {"command": ["python", "train.py"]}}
    for ok in ("127.0.0.1:9465", "localhost:0", "[::1]:9465", "127.0.0.2:80"):
        assert config_from_table({**base, "web": {"listen": ok}}).web.listen == ok
    for remote in ("0.0.0.0:9465", "10.1.2.3:80", "[::]:9465", "node-3.example:9465"):
        with pytest.raises(ConfigError) as e:
            config_from_table({**base, "web": {"listen": remote}})
        assert "web.listen" in str(e.value) and "allow_remote" in str(e.value)
        assert config_from_table({**base, "web": {"listen": remote, "allow_remote": True}}).web.allow_remote
    with pytest.raises(ConfigError):
        config_from_table({**base, "web": {"listen": "9465"}})


def test_the_checkpoint_table_is_the_report_s_read_on_a_thread_of_its_own(tmp_path: Path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "step_100.pt").write_bytes(b"PK\x03\x04 cut short")  # a zip save cut short: not ready, and why
    led = Ledger(tmp_path / "sd")
    rid, _ = led.open_run("job", {"job": {"command": ["python"]}, "checkpoints": {"dir": str(ck)}})
    led.close()
    data = LiveData(lambda: {"state": "running", "run_id": rid, "attempt": 0}, tmp_path / "sd")
    try:
        d = wait_for(lambda: (v := json.loads(data.payload()))["checkpoints"]["as_of"] and v, 30, 0.05,
                     "the checkpoint table read")
    finally:
        data.close()
    rows = d["checkpoints"]["rows"]
    assert [(Path(r["path"]).name, r["ready"]) for r in rows] == [("step_100.pt", False)], rows
    assert rows[0]["reasons"] and d["checkpoints"]["error"] is None


def test_the_page_says_a_load_test_as_the_checkpoints_verb_does():
    """A test that could not run (no torch in the job's Python) is not a failed checkpoint, and a
    refused checkpoint whose weights loaded is not a pass (it read "failed" / "passed" before)."""
    from supervisor.ops.livedata import load_test_word

    assert load_test_word(None) is None and load_test_word({}) is None
    assert load_test_word({"passed": False, "untested": "no module named torch"}) == "not tested"
    assert load_test_word({"passed": False, "loaded": True, "refused": "pickle names os.system"}) == "refused"
    assert load_test_word({"passed": True}) == "passed"
    assert load_test_word({"passed": False, "error": "truncated"}) == "failed"
