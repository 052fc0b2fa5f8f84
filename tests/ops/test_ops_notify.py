"""sd_notify datagrams received on a real AF_UNIX datagram socket set as NOTIFY_SOCKET."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from supervisor.ops.notify import Notifier


@pytest.fixture
def listener(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


def recv(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n") if line)


def nothing_pending(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.recv(4096)
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(2.0)
    return False


def test_ready_status_stopping_extend(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("running, attempt 0")
    assert recv(sock) == {"READY": "1", "STATUS": "running, attempt 0"}
    assert n.status("running\nattempt 1   step 5")
    assert recv(sock) == {"STATUS": "running attempt 1 step 5"}  # one line, always
    assert n.extend_timeout(60)
    assert recv(sock) == {"EXTEND_TIMEOUT_USEC": "60000000"}
    assert n.stopping()
    assert recv(sock) == {"STOPPING": "1"}
    n.close()


def test_an_extension_asks_at_least_stop_extend_s(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path}, extend_min_s=60.0)
    assert n.extend_timeout(5)
    assert recv(sock) == {"EXTEND_TIMEOUT_USEC": "60000000"}
    assert n.extend_timeout(90)
    assert recv(sock) == {"EXTEND_TIMEOUT_USEC": "90000000"}
    n.close()


def test_the_status_line_goes_out_at_most_every_status_interval(listener, tmp_path) -> None:
    from supervisor.daemon.concerns import OpsPlugin
    from supervisor.daemon.plugin import Tick
    from tests.daemon.test_plugins import view

    path, sock = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    ops = OpsPlugin(notifier, status_interval_s=5.0)
    states = iter(["starting", "running", "running", "stopping"])
    ops.refresh = lambda: {"state": next(states)}  # the status as the loop builds it (set at the start)
    run = view(tmp_path)
    assert ops.tick(Tick(100.0), run) == ()
    first = recv(sock)["STATUS"]
    ops.tick(Tick(101.0), run)  # changed, but within the interval: held
    assert nothing_pending(sock)
    ops.tick(Tick(106.0), run)  # the interval passed: the changed line goes out
    second = recv(sock)["STATUS"]
    assert first != second
    notifier.close()


def test_reloading_carries_monotonic_usec(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    n.reloading()
    msg = recv(sock)
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert msg["RELOADING"] == "1"
    assert before <= int(msg["MONOTONIC_USEC"]) <= after


def test_abstract_namespace_socket():
    name = f"tsup-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2.0)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert recv(sock) == {"READY": "1"}
    finally:
        sock.close()


def test_watchdog_rate_limited_and_interval(listener):
    path, sock = listener
    now = [100.0]
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())},
                 clock=lambda: now[0])
    assert n.watchdog_interval_s() == 2.0
    assert n.watchdog()
    assert recv(sock) == {"WATCHDOG": "1"}
    now[0] += 0.5
    assert not n.watchdog()  # too soon: a quarter of WatchdogSec has not passed
    assert nothing_pending(sock)
    now[0] += 0.6
    assert n.watchdog()
    assert recv(sock) == {"WATCHDOG": "1"}


def test_watchdog_not_for_another_pid(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval_s() is None
    assert not n.watchdog()
    assert nothing_pending(sock)


def test_watchdog_without_pid_and_disabled_by_config(listener):
    path, sock = listener
    assert Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}).watchdog()
    assert recv(sock) == {"WATCHDOG": "1"}
    off = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}, watchdog_enabled=False)
    assert off.watchdog_interval_s() is None and not off.watchdog()
    assert nothing_pending(sock)


def test_noop_without_notify_socket():
    n = Notifier({})
    assert not n.enabled
    assert n.watchdog_interval_s() is None
    assert not n.ready() and not n.status("x") and not n.watchdog() and not n.stopping()
    assert not n.reloading() and not n.extend_timeout(5)


def test_dead_socket_never_raises(tmp_path: Path):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert n.enabled
    assert not n.ready()
    assert not n.status("still fine")
