"""The control socket with real sockets, real threads and a real second uid."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import pytest

from supervisor.ops import control, controlclient
from supervisor.ops.control import (ControlError, ControlServer, DaemonNotRunning, SocketInUse,
                                    parse_request, peer_allowed, socket_path)
from supervisor.ops.controlclient import request
from tests.util import wait_for


class Handler:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, verb: str, args: Mapping[str, Any]) -> Any:
        with self.lock:
            self.calls.append((verb, dict(args)))
        if verb == "status":
            return {"state": "running", "attempt": 2}
        if verb == "checkpoint-now":
            raise ControlError("no_job", "no job is running; nothing to checkpoint")
        if verb == "reload":
            raise RuntimeError("boom")
        return {"message": f"{verb} accepted"}


@pytest.fixture
def server(tmp_path: Path):
    h = Handler()
    s = ControlServer(tmp_path, h, read_timeout_s=0.5)
    s.start()
    yield s, h, tmp_path
    s.close()


def raw(path: Path, data: bytes, shut: bool = True) -> dict[str, Any]:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(5)
    c.connect(str(path))
    try:
        c.sendall(data)
        if shut:
            c.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := c.recv(65536):
            buf += chunk
    finally:
        c.close()
    return json.loads(buf)


def test_socket_mode_0600_and_status_roundtrip(server):
    s, h, d = server
    assert stat.S_IMODE(os.stat(socket_path(d)).st_mode) == 0o600
    assert request(d, "status") == {"state": "running", "attempt": 2}
    assert request(d, "restart", {"reason": "lr change", "rollback": True}) == {"message": "restart accepted"}
    assert h.calls[-1] == ("restart", {"reason": "lr change", "rollback": True})


def test_error_replies_have_one_shape(server):
    s, h, d = server
    with pytest.raises(ControlError) as e:
        request(d, "checkpoint-now")
    assert e.value.code == "no_job" and "nothing to checkpoint" in e.value.message
    with pytest.raises(ControlError) as e:
        request(d, "reload")  # a handler bug: internal error, the server lives on
    assert e.value.code == "internal"
    assert request(d, "status")["state"] == "running"


@pytest.mark.parametrize("data, code", [
    (b"not json\n", "bad_request"),
    (b"[1, 2]\n", "bad_request"),
    (b'{"args": {}}\n', "bad_request"),
    (b'{"verb": "format-disk"}\n', "unknown_verb"),
    (b'{"verb": "restart", "args": {"reason": 5}}\n', "bad_request"),
    (b'{"verb": "restart", "args": {"rollback": "yes"}}\n', "bad_request"),
    (b'{"verb": "restart", "args": {"bogus": true}}\n', "bad_request"),
    (b'{"verb": "status", "args": []}\n', "bad_request"),
    (b'{"verb": "stop", "wait": true}\n', "bad_request"),  # an argument outside "args": no plain stop
    (b"\xff\xfe\n", "bad_request"),
    (b"\n", "bad_request"),
    (b"", "bad_request"),
])
def test_garbage_requests(server, data, code):
    s, h, d = server
    reply = raw(socket_path(d), data)
    assert reply["ok"] is False and reply["error"]["code"] == code and reply["error"]["message"]
    assert h.calls == []
    assert request(d, "status")["state"] == "running"


def test_oversized_request(server):
    s, h, d = server
    reply = raw(socket_path(d), b'{"verb": "status", "pad": "' + b"x" * 100_000 + b'"}\n')
    assert reply == {"ok": False, "error": {"code": "too_large", "message": "request larger than 65536 bytes"}}
    assert h.calls == []


def test_slow_client_is_dropped_and_others_are_served(server):
    s, h, d = server
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.settimeout(5)
    slow.connect(str(socket_path(d)))
    slow.sendall(b'{"verb": "sta')  # ...and nothing more
    t0 = time.monotonic()
    assert request(d, "status")["attempt"] == 2  # served while the slow one waits
    reply = json.loads(slow.recv(65536))
    slow.close()
    assert reply["error"]["code"] == "timeout"
    assert time.monotonic() - t0 < 3


def test_concurrent_clients(server):
    s, h, d = server
    results: list[Any] = []
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            results.append(request(d, "restart", {"reason": f"r{i}"}))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert len(results) == 12
    assert sorted(a["reason"] for _, a in h.calls) == sorted(f"r{i}" for i in range(12))


FOREIGN_UID = 65534 if os.geteuid() != 65534 else 65533


def test_peer_uid_check_itself():
    """The rule, without root: the daemon's own uid and root are served, any other uid is not."""
    assert peer_allowed(1000, 1000)
    assert peer_allowed(0, 1000)  # root may control anyone's daemon
    assert not peer_allowed(FOREIGN_UID, 1000)
    assert not peer_allowed(1001, 1000)
    assert not peer_allowed(1000, 0)  # a root daemon serves root only
    assert peer_allowed(0, 0)


def test_foreign_peer_uid_is_refused_by_the_server(server, monkeypatch):
    """The server path with a foreign uid, without root: SO_PEERCRED's answer is replaced by
    another user's uid, so the refusal (reply, log, handler never called) runs as it would."""
    s, h, d = server
    seen: list[int] = []
    real = control._peer_uid

    def foreign(conn: socket.socket) -> int:
        seen.append(real(conn))
        return FOREIGN_UID

    monkeypatch.setattr(control, "_peer_uid", foreign)
    reply = raw(socket_path(d), b'{"verb": "stop"}\n')
    assert seen == [os.geteuid()]  # the real credentials were read, then overridden
    assert reply["ok"] is False and reply["error"]["code"] == "forbidden"
    assert str(FOREIGN_UID) in reply["error"]["message"] and str(os.geteuid()) in reply["error"]["message"]
    assert h.calls == []
    monkeypatch.undo()
    assert raw(socket_path(d), b'{"verb": "status"}\n')["ok"] is True  # our own uid is served


def test_other_uid_is_refused():
    """The same with a real second uid (needs root; the two tests above cover the check without)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to setuid to nobody")
    d = Path(tempfile.mkdtemp(prefix="tsup-ctl-"))  # pytest's tmp dirs are 0700: nobody cannot enter
    os.chmod(d, 0o755)
    h = Handler()
    s = ControlServer(d, h)
    s.start()
    os.chmod(socket_path(d), 0o666)  # let nobody reach it at all, so SO_PEERCRED is what refuses
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody, then talk to the daemon
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            reply = raw(socket_path(d), b'{"verb": "stop"}\n')
            os.write(w, json.dumps(reply).encode())
        except BaseException as e:  # shown by the parent's assertion
            os.write(w, repr(e).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    s.close()
    shutil.rmtree(d)
    assert status == 0, f"child exited with wait status {status}"
    reply = json.loads(data)
    assert reply["ok"] is False and reply["error"]["code"] == "forbidden"
    assert "65534" in reply["error"]["message"]
    assert h.calls == []


def test_no_daemon_clear_error(tmp_path: Path):
    with pytest.raises(DaemonNotRunning, match=r"no daemon is running for state dir .* \(no control socket"):
        request(tmp_path, "status")


def test_stale_socket_replaced_live_one_refused(tmp_path: Path):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path(tmp_path)))
    stale.close()  # the file stays, nobody listens: a dead daemon's leftover
    with pytest.raises(DaemonNotRunning, match="stale"):
        request(tmp_path, "status")
    s = ControlServer(tmp_path, Handler())
    s.start()
    try:
        assert request(tmp_path, "status")["state"] == "running"
        with pytest.raises(SocketInUse, match="another daemon is already running"):
            ControlServer(tmp_path, Handler()).start()
        assert request(tmp_path, "status")["state"] == "running"  # the live one is untouched
    finally:
        s.close()
    assert not socket_path(tmp_path).exists()


def test_long_state_dir_path(tmp_path: Path):
    d = tmp_path / ("d" * 60) / ("e" * 60)
    d.mkdir(parents=True)
    assert len(str(socket_path(d))) > 108
    s = ControlServer(d, Handler())
    s.start()
    try:
        assert request(d, "status")["attempt"] == 2
    finally:
        s.close()


def test_no_fd_leak(server):
    s, h, d = server
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        request(d, "status")
        raw(socket_path(d), b"junk\n")
    wait_for(lambda: len(os.listdir("/proc/self/fd")) <= before, 5, what="connection fds closed")


def test_parse_request_drops_null_args():
    assert parse_request(b'{"verb": "restart", "args": {"from": null, "reason": "x"}}') == ("restart", {"reason": "x"})


def test_requests_being_answered_keep_their_slots_and_the_next_gets_busy(tmp_path: Path, monkeypatch):
    # Two complete requests whose handler is still running hold both slots: they never give way,
    # so a third connection is refused busy; once they are answered the slots come back.
    monkeypatch.setattr(controlclient, "BUSY_RETRY_S", 0.3)  # the client retries busy this long, then says so
    release = threading.Event()

    def handler(verb: str, args: Mapping[str, Any]) -> Any:
        if verb == "stop":
            release.wait(20)
        return {"state": "running"}

    s = ControlServer(tmp_path, handler, read_timeout_s=2.0, max_connections=2)
    s.start()
    waiting = [threading.Thread(target=request, args=(tmp_path, "stop")) for _ in range(2)]
    try:
        for t in waiting:
            t.start()
        # Being answered, not merely connected: a connection still reading its request gives way.
        wait_for(lambda: s.slots.answering() == 2, 10, what="two stops being answered")
        with pytest.raises(ControlError) as e:
            request(tmp_path, "status")
        assert e.value.code == "busy"
        release.set()
        assert wait_for(lambda: _try_status(tmp_path), 10, what="a free slot")["state"] == "running"
    finally:
        release.set()
        for t in waiting:
            t.join(10)
        s.close()


def test_silent_connections_give_way_to_a_new_request(tmp_path: Path):
    # Two clients that connect and say nothing hold both slots; a status request takes the
    # place of the oldest (its reply: busy), long before the read deadline would drop it.
    s = ControlServer(tmp_path, Handler(), read_timeout_s=60.0, max_connections=2)
    s.start()
    hogs = []
    try:
        for _ in range(2):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.settimeout(10)
            c.connect(str(socket_path(tmp_path)))
            hogs.append(c)
        wait_for(lambda: sum(s.slots.live().values()) == 2, 10, what="both hogs admitted")
        assert request(tmp_path, "status", timeout=10)["state"] == "running"
        assert json.loads(hogs[0].recv(65536))["error"]["code"] == "busy"  # the oldest gave way
        assert s.slots.evictions == 1
    finally:
        for c in hogs:
            c.close()
        s.close()


def _try_status(d: Path) -> Any:
    try:
        return request(d, "status")
    except ControlError:
        return None


def test_a_slow_handler_does_not_block_other_clients(tmp_path: Path):
    release = threading.Event()

    def handler(verb: str, args: Mapping[str, Any]) -> Any:
        if verb == "stop":
            release.wait(10)
            return {"message": "stopped"}
        return {"state": "stopping"}

    s = ControlServer(tmp_path, handler)
    s.start()
    try:
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(request(tmp_path, "stop")))
        t.start()
        assert request(tmp_path, "status") == {"state": "stopping"}  # answered while stop waits
        release.set()
        t.join(10)
        assert out == [{"message": "stopped"}]
    finally:
        release.set()
        s.close()


def test_huge_integer_is_a_bad_request_not_a_thread_traceback(server, capsys):
    s, h, d = server
    reply = raw(socket_path(d), b'{"verb": "restart", "args": {"rollback": ' + b"9" * 5000 + b"}}\n")
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request"
    assert "digit" in reply["error"]["message"]
    assert h.calls == []
    assert "Traceback" not in capsys.readouterr().err
    assert request(d, "status")["state"] == "running"


def test_full_listen_backlog_is_retried_then_reported_clearly(tmp_path: Path, monkeypatch):
    # A "daemon" that listens but never accepts: once its backlog is full, connect() on a unix
    # socket fails with EAGAIN at once; the client retries for a while, then says so.
    monkeypatch.setattr(controlclient, "CONNECT_RETRY_S", 0.3)
    path = socket_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    fillers: list[socket.socket] = []
    try:
        while True:  # fill the backlog
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            fillers.append(c)
            try:
                c.connect(str(path))
            except BlockingIOError:
                break
            assert len(fillers) < 1000, "backlog never filled"
        with pytest.raises(ControlError) as ei:
            request(tmp_path, "status", timeout=5.0)
        assert ei.value.code == "busy" and "try again" in ei.value.message
        # Room again (the daemon accepts one): the retrying client gets through.
        conn, _ = listener.accept()
        conn.close()
        got: list[BaseException | None] = []

        def client() -> None:
            try:
                request(tmp_path, "status", timeout=0.5)
                got.append(None)
            except BaseException as e:  # recorded for the assertion below
                got.append(e)
        t = threading.Thread(target=client)
        t.start()
        t.join(10)
        assert got and isinstance(got[0], ControlError) and got[0].code == "timeout"  # connected; nobody answers
    finally:
        for c in fillers:
            c.close()
        listener.close()


def test_seventeen_trickling_clients_cannot_hold_off_status(tmp_path: Path):
    # 17 clients (more than the 16 slots) each send a byte now and then and never a newline: the
    # whole-request deadline drops each one, and status (retrying "busy") gets through meanwhile.
    s = ControlServer(tmp_path, Handler(), read_timeout_s=1.0)
    s.start()
    stop = threading.Event()
    tricklers: list[socket.socket] = []

    def trickle() -> None:
        while not stop.is_set():
            for c in list(tricklers):
                try:
                    c.send(b" ")
                except OSError:
                    pass  # dropped by the server: what we want
            stop.wait(0.1)
    try:
        for _ in range(17):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(socket_path(tmp_path)))
            c.send(b'{"verb": ')
            tricklers.append(c)
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        t0 = time.monotonic()
        assert request(tmp_path, "status", timeout=20)["state"] == "running"
        # Bound: the 1 s request deadline plus retry back-off, with a wide margin for a loaded machine.
        assert time.monotonic() - t0 < 10
    finally:
        stop.set()
        for c in tricklers:
            c.close()
        s.close()


def test_seventeen_reconnecting_tricklers_of_our_uid_cannot_hold_off_status_or_stop(tmp_path: Path):
    # Issue 24: 17 clients of the daemon's own uid trickle a byte every 0.1 s and reconnect as
    # soon as they are dropped. The read deadline is far away (60 s), so only the slot rule can
    # let status and stop through: a new connection pushes out the oldest incomplete request.
    h = Handler()
    s = ControlServer(tmp_path, h, read_timeout_s=60.0)
    s.start()
    stop = threading.Event()
    tricklers: list[socket.socket] = []

    def connect() -> socket.socket:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(5)
        c.connect(str(socket_path(tmp_path)))
        c.send(b'{"verb": ')
        return c

    def trickle() -> None:
        while not stop.is_set():
            for i, c in enumerate(list(tricklers)):
                try:
                    c.send(b" ")
                except OSError:  # dropped by the server: come back at once
                    c.close()
                    try:
                        tricklers[i] = connect()
                    except OSError:
                        pass  # the server is closing (end of test)
            stop.wait(0.1)
    try:
        for _ in range(17):
            tricklers.append(connect())
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        wait_for(lambda: s.slots.evictions >= 1, 10, what="the 17th trickler pushing one out")
        for _ in range(3):
            assert request(tmp_path, "status", timeout=20)["state"] == "running"
        assert request(tmp_path, "stop", {"reason": "x"}, timeout=20) == {"message": "stop accepted"}
        assert ("stop", {"reason": "x"}) in h.calls
        assert sum(s.slots.live().values()) <= control.MAX_CONNECTIONS
    finally:
        stop.set()
        for c in tricklers:
            c.close()
        s.close()


def test_a_half_open_connection_is_closed_at_its_deadline_and_frees_its_slot(tmp_path: Path):
    # A client sends part of a line and then neither sends nor closes: the server replies
    # "timeout" after its read deadline, closes its end (the client reads EOF while its own end
    # is still open) and the slot is free again; the handler never sees it.
    h = Handler()
    s = ControlServer(tmp_path, h, read_timeout_s=0.3, max_connections=1)
    s.start()
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        c.settimeout(10)
        c.connect(str(socket_path(tmp_path)))
        c.sendall(b'{"verb": "sta')
        wait_for(lambda: s.slots.live() != {}, 10, what="the half-open connection admitted")
        buf = b""
        while chunk := c.recv(65536):  # ends with EOF: the server closed its side
            buf += chunk
        assert json.loads(buf)["error"]["code"] == "timeout"
        assert wait_for(lambda: s.slots.live() == {}, 10, what="its slot freed")
        assert s.slots.evictions == 0  # freed by its deadline, not pushed out
        assert request(tmp_path, "status")["state"] == "running"
        assert h.calls == [("status", {})]
    finally:
        c.close()
        s.close()


def test_a_request_with_a_key_twice_is_refused_not_read_as_its_last(server):
    # {"verb":"status","verb":"stop"} was read as stop (json keeps the last key): which was meant?
    s, h, d = server
    for line in (b'{"verb": "status", "verb": "stop"}\n',
                 b'{"verb": "restart", "args": {"reason": "a", "reason": "b"}}\n'):
        reply = raw(socket_path(d), line)
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
        assert "twice" in reply["error"]["message"] and "nothing was done" in reply["error"]["message"]
    assert h.calls == []
    assert request(d, "status")["state"] == "running"
    with pytest.raises(ControlError, match="'verb' twice"):
        parse_request(b'{"verb": "status", "verb": "stop"}')
