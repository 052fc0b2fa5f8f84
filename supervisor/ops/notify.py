"""sd_notify(3) by hand: readiness, status, watchdog, stopping, reloading.

Why no library: the protocol is one datagram of ``KEY=value`` lines to the AF_UNIX socket named
by ``$NOTIFY_SOCKET`` (a leading ``@`` means the abstract namespace). The Python bindings
(systemd-python, sdnotify) add a C build or an unmaintained package for ~30 lines of code.

Everything is a no-op when ``NOTIFY_SOCKET`` is unset (a shell, ``wrap``, tests), so callers never
branch on "am I under systemd". Sending never raises: a lost notification must not take down the
daemon (systemd will notice through the watchdog if the daemon really is gone).

Wiring (the runner): ``ready()`` once the config is loaded and the first launch is under way;
``status(line)`` every few seconds; ``watchdog()`` from the main loop every tick while the loop
and its monitors report in (it rate-limits itself to ``watchdog_interval_s()``); ``stopping()``
when a stop begins; ``extend_timeout(s)`` while the stop waits for the checkpoint flush;
``reloading()`` on SIGHUP, then ``ready()`` when the new config is applied.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

import structlog

log = structlog.get_logger("supervisor.ops")


def _socket_address(value: str) -> str | bytes | None:
    if value.startswith("@"):
        return b"\0" + value[1:].encode()  # abstract namespace: no file, leading NUL byte
    if value.startswith("/"):
        return value
    return None  # vsock (vsock:CID:PORT) and other forms: not used on a training node


class Notifier:
    """Talks to systemd through ``$NOTIFY_SOCKET``; every method is a no-op outside systemd.

    ``env`` defaults to ``os.environ`` (read once at construction); ``clock`` is the monotonic
    clock used to rate-limit watchdog pings (injectable for tests).
    """

    def __init__(self, env: Mapping[str, str] | None = None, *, enabled: bool = True,
                 watchdog_enabled: bool = True, clock: Callable[[], float] | None = None,
                 extend_min_s: float = 0.0) -> None:
        env = os.environ if env is None else env
        self.extend_min_s = extend_min_s  # systemd.stop_extend_s: the least one extension asks for
        self._address = _socket_address(env.get("NOTIFY_SOCKET", "")) if enabled else None
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._warned = False
        self._last_ping: float | None = None
        self._watchdog_usec = self._parse_watchdog(env) if (enabled and watchdog_enabled) else None

    @staticmethod
    def _parse_watchdog(env: Mapping[str, str]) -> int | None:
        usec = env.get("WATCHDOG_USEC", "")
        if not usec.isdigit() or int(usec) == 0:
            return None
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process systemd expects pings from; a child that inherited
        # the environment (the job, a helper) must not ping on our behalf.
        if pid and (not pid.isdigit() or int(pid) != os.getpid()):
            return None
        return int(usec)

    @property
    def enabled(self) -> bool:
        """True when a notification socket is configured (we run under Type=notify)."""
        return self._address is not None

    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half of WatchdogSec (systemd's recommendation); None: no watchdog."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 2e6

    # -- messages ---------------------------------------------------------------------------

    def ready(self, status: str | None = None) -> bool:
        return self._send("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def status(self, text: str) -> bool:
        return self._send(f"STATUS={_one_line(text)}")

    def watchdog(self, *, force: bool = False) -> bool:
        """Ping the watchdog if due (at most every ``watchdog_interval_s() / 2``; cheap to call
        every tick). Call it only while the main loop and its monitors are healthy: a daemon
        that stops calling it is killed and restarted by systemd."""
        if self._watchdog_usec is None:
            return False
        now = self._clock()
        # Ping at a quarter of WatchdogSec: one late tick must not cost a restart.
        if not force and self._last_ping is not None and now - self._last_ping < self._watchdog_usec / 4e6:
            return False
        self._last_ping = now
        return self._send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self._send("STOPPING=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def reloading(self) -> bool:
        # systemd >= 253 (Type=notify-reload) wants MONOTONIC_USEC to pair RELOADING with READY;
        # older ones ignore it.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self._send(f"RELOADING=1\nMONOTONIC_USEC={usec}")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for ``seconds`` more (at least ``extend_min_s``) before systemd's start/stop timeout
        fires (a save is running)."""
        return self._send(f"EXTEND_TIMEOUT_USEC={max(0, int(max(seconds, self.extend_min_s) * 1e6))}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    # -- transport --------------------------------------------------------------------------

    def _send(self, payload: str) -> bool:
        if self._address is None:
            return False
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(payload.encode(), self._address)
                return True
            except OSError as e:
                if not self._warned:  # once: a dead socket would otherwise log every tick
                    self._warned = True
                    log.warning("sd_notify_failed", error=str(e), payload=payload.split("\n", 1)[0],
                                next="continuing without systemd notifications until one succeeds")
                return False


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]
