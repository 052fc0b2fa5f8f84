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
