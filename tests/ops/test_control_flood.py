"""A peer that floods the control socket (issue 34 part 3): 7,600 ``control_peer_refused`` lines in
20 s came from one such peer. Each refusal is still answered ``forbidden``; the warning is said
once per episode and the count of the rest when the episode ends (or at close)."""
from __future__ import annotations

import socket
import threading
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.ops import control
from supervisor.ops.control import ControlServer, socket_path
from supervisor.ops.repeats import Repeats
from tests.util import wait_for

FOREIGN_UID = 65534


def _ask(path: Path) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(b'{"verb": "stop"}\n')
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data


def test_a_refused_peer_flooding_the_socket_is_logged_once_with_the_count_at_the_end(tmp_path: Path, monkeypatch):
    """500 refused connections (the bound is one line an episode: 500x past it) give one
    control_peer_refused and one control_peer_refused_suppressed saying 499; every one of them
    was answered forbidden. SO_PEERCRED's answer is replaced by a foreign uid (no root needed)."""
    monkeypatch.setattr(control, "_peer_uid", lambda conn: FOREIGN_UID)
    calls: list[str] = []
    server = ControlServer(tmp_path, lambda verb, args: calls.append(verb))
    server.start()
    try:
        with capture_logs() as logs:
            replies = [_ask(socket_path(tmp_path)) for _ in range(500)]
            server.close()  # the episode is still open (10 s quiet): close says its count
    finally:
        server.close()
    assert all(b'"forbidden"' in r for r in replies) and calls == []
    refused = [e for e in logs if e["event"] == "control_peer_refused"]
    summary = [e for e in logs if e["event"] == "control_peer_refused_suppressed"]
    assert len(refused) == 1 and refused[0]["uid"] == FOREIGN_UID, [e["event"] for e in logs][:20]
    assert len(summary) == 1 and summary[0]["suppressed"] == 499 and summary[0]["uid"] == FOREIGN_UID


def test_an_episode_ends_after_its_quiet_window_and_the_next_refusal_is_said_again():
    ended: list[tuple[object, int]] = []
    done = threading.Event()

    def said(key: object, n: int, _seconds: float) -> None:
        ended.append((key, n))
        done.set()

    r = Repeats(0.2, said)
    try:
        assert r.note("a") is True
        assert [r.note("a") for _ in range(3)] == [False, False, False]
        assert r.note("b") is True  # another key: an episode of its own
        wait_for(done.is_set, timeout=10, what="the episode's end")
        assert ended == [("a", 3)]  # "b" had no repeat: nothing more to say of it
        assert r.note("a") is True  # its episode ended: a new one, said at once
    finally:
        r.close()


def test_the_cli_reads_at_most_max_reply_of_an_endless_answer(tmp_path: Path, monkeypatch):
    """Whatever answers on control.sock (here a thread that streams 100x the bound, patched to
    64 KiB so the test stays light), the client stops at MAX_REPLY with a bad_reply error."""
    import tracemalloc

    import pytest

    from supervisor.ops import controlclient
    from supervisor.ops.control import ControlError

    monkeypatch.setattr(controlclient, "MAX_REPLY", 64 << 10)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path(tmp_path)))
    listener.listen(1)

    def flood() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            try:
                for _ in range(100):
                    conn.sendall(b"x" * (64 << 10))
            except OSError:
                pass  # the client stopped reading and closed: what the test wants

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    tracemalloc.start()
    try:
        with pytest.raises(ControlError) as e:
            controlclient.request(tmp_path, "status", timeout=30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        listener.close()
    t.join(10)
    assert e.value.code == "bad_reply" and "larger than 65536 bytes" in e.value.message
    assert peak < 8 * (64 << 10), peak
