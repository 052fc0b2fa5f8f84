"""The control socket's client: :func:`request`, one request to the daemon of a state dir (the
CLI's verbs, the tests' and the benches' status polls), with the caller's retries (a full listen
backlog, a ``busy`` reply). Apart from the server (:mod:`.control`: the protocol, its errors, the
socket's address): the asking side waits and retries in its own way and shares none of the
server's threads or bounds.
"""
from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import strictjson
from .control import READ_TIMEOUT_S, ControlError, DaemonNotRunning, unix_address, socket_path

# How long a client keeps retrying while the daemon's listen backlog is full (EAGAIN on connect)
# before it says so; many clients at once is normal, a daemon that accepts nothing is not.
CONNECT_RETRY_S = 5.0
#: The largest reply read: a status is a few KiB (tens with many checkpoints); whatever answers
#: on the socket, the CLI never holds more than this of it.
MAX_REPLY = 16 << 20


def _connect(sock: socket.socket, addr: str, deadline: float) -> None:
    """Connect, retrying a full listen backlog (a unix socket's connect then fails with EAGAIN
    instead of waiting) with a short back-off until ``deadline``; then a clear ControlError."""
    pause = 0.01
    while True:
        try:
            sock.connect(addr)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise ControlError("busy", "the daemon's control socket is not accepting connections "
                                   "(its queue is full); try again shortly") from None
            time.sleep(pause)  # back-off between connect attempts, not a wait for a condition
            pause = min(pause * 2, 0.2)


# How long a client retries a "busy" reply (every connection slot taken). Each slot is freed
# within the server's whole-request deadline (READ_TIMEOUT_S), so clients that trickle or stall
# hold status/stop off for at most about that long, not for as long as they like.
BUSY_RETRY_S = 2 * READ_TIMEOUT_S


def request(state_dir: str | os.PathLike[str], verb: str, args: Mapping[str, Any] | None = None,
            timeout: float = 30.0) -> Any:
    """Send one request to the daemon of ``state_dir`` and return its result.

    Raises :class:`DaemonNotRunning` when nothing listens there, :class:`ControlError` for an
    error reply (its ``code`` and ``message`` come from the daemon). A ``busy`` reply is retried
    with a short back-off for up to BUSY_RETRY_S (within ``timeout``) before it is raised."""
    deadline = time.monotonic() + min(timeout, BUSY_RETRY_S)
    pause = 0.05
    while True:
        try:
            return _request_once(state_dir, verb, args, timeout)
        except ControlError as e:
            if e.code != "busy" or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # back-off between attempts, not a wait for a condition
        pause = min(pause * 2, 0.5)


def _request_once(state_dir: str | os.PathLike[str], verb: str, args: Mapping[str, Any] | None,
                  timeout: float) -> Any:
    path = socket_path(state_dir)
    if not path.exists():
        raise DaemonNotRunning(f"no daemon is running for state dir {Path(state_dir)} (no control socket {path})")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    with unix_address(path) as addr:
        try:
            try:
                _connect(sock, addr, deadline=time.monotonic() + min(timeout, CONNECT_RETRY_S))
            except (ConnectionRefusedError, FileNotFoundError):
                raise DaemonNotRunning(f"no daemon is running for state dir {Path(state_dir)} "
                                       f"(stale control socket {path})") from None
            except PermissionError:
                raise ControlError("forbidden", f"permission denied on {path}: run as the daemon's user or root") from None
            sock.sendall((strictjson.dumps({"verb": verb, "args": dict(args or {})}) + "\n").encode())
            buf = bytearray()
            while True:
                try:
                    chunk = sock.recv(65536)
                except (TimeoutError, socket.timeout):
                    raise ControlError("timeout", f"the daemon did not answer {verb!r} within {timeout:g} s") from None
                if not chunk:
                    break
                buf += chunk
                if len(buf) > MAX_REPLY:
                    raise ControlError("bad_reply", f"the reply to {verb!r} is larger than {MAX_REPLY} bytes; "
                                       "not read further (is it the daemon that answers on this socket?)")
        finally:
            sock.close()
    try:
        reply = json.loads(bytes(buf).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ControlError("bad_reply", f"the daemon sent an unreadable reply to {verb!r}: {bytes(buf)[:200]!r}") from None
    if not isinstance(reply, dict) or "ok" not in reply:
        raise ControlError("bad_reply", f"unexpected reply shape: {reply!r:.200}")
    if reply["ok"]:
        return reply.get("result")
    err = reply.get("error") or {}
    raise ControlError(str(err.get("code", "error")), str(err.get("message", "the daemon refused the request")))
