"""The control socket: how ``transformer-supervisor status|restart|stop|checkpoint-now`` and
``systemctl reload`` talk to the running daemon. This module: the protocol, its errors and the
server; the client's end (:func:`~.controlclient.request`) is :mod:`.controlclient`.

Protocol: a Unix stream socket ``<state dir>/control.sock`` (mode 0600). One request per
connection: one line of JSON ``{"verb": "status", "args": {...}}`` terminated by ``\\n``, at most
:data:`MAX_REQUEST` bytes, sent within :data:`READ_TIMEOUT_S`. One reply line, always one shape::

    {"ok": true, "result": ...}
    {"ok": false, "error": {"code": "bad_request", "message": "..."}}

Only a peer with the daemon's uid (or root) is served (SO_PEERCRED). Malformed, oversized, slow
or forbidden requests get an error reply (or are dropped when the peer is gone); each connection
has its own thread, so none of this reaches the daemon's main loop.

At most :data:`MAX_CONNECTIONS` connections at once, :data:`MAX_PER_UID` per peer uid; over a
bound the oldest connection still reading its request gives way (a ``busy`` reply), never one
being answered, so tricklers cannot hold off ``status``/``stop`` (:mod:`.controlslots`: the rule).

The server calls ``handler(verb, args)`` on the connection's thread; the runner implements it by
posting the request to its main loop and waiting for the answer (the main loop owns all
decisions). A handler raises a :class:`~supervisor.errors.SupervisorError` (such as
:class:`ControlError`) for an error reply with its code; any other exception is a bug: it becomes
an ``internal`` error reply and is logged with its traceback.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog

from ..errors import SupervisorError
from .. import strictjson
from ..redact import redact_data, redact_text
from .controlslots import ConnectionSlots, Slot
from .repeats import Repeats

log = structlog.get_logger("supervisor.ops")

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16
MAX_PER_UID = 8  # one user's flood leaves room for root's CLI (and the other way round)
FINISH_S = 0.2  # the whole polite close (drain after the reply), per connection
#: A refused peer uid is logged once per episode; the episode ends after this long without a refusal.
REFUSED_QUIET_S = 10.0

# The verbs and the arguments each accepts (name -> type). Checked here so the handler only sees
# well-formed requests.
VERBS: Mapping[str, Mapping[str, type]] = {
    "status": {},
    "restart": {"reason": str, "from": str, "rollback": bool, "force": bool},
    "stop": {"reason": str},
    "checkpoint-now": {},
    "reload": {},
}

Handler = Callable[[str, Mapping[str, Any]], Any]


class ControlError(SupervisorError):
    """An error reply with any ``code`` (a stable short name such as ``busy`` or
    ``no_checkpoint``): raised by the server for a malformed request, by a handler to refuse one,
    and by :func:`~.controlclient.request` when the daemon replied with an error. The message says what happened
    and what to do. (Handlers may raise any :class:`~supervisor.errors.SupervisorError`: its
    ``code`` becomes the reply's.)"""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class DaemonNotRunning(ControlError):
    """Raised by :func:`~.controlclient.request` when no daemon listens on the state dir's control socket."""

    def __init__(self, message: str) -> None:
        super().__init__("not_running", message)


class SocketInUse(SupervisorError):
    """Raised by :class:`ControlServer` when another live daemon already serves this state dir:
    two daemons on one state dir would run two copies of the job. Stop the other one first."""

    code = "in_use"


def socket_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / SOCKET_NAME


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """A bindable/connectable address for ``path``, valid inside the ``with``: sun_path holds at
    most 107 bytes, so a long state dir is reached through /proc/self/fd/N of a descriptor of the
    directory, held open until the block ends."""
    if len(os.fsencode(path)) < 108:
        yield str(path)
        return
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dfd}/{path.name}"
    finally:
        os.close(dfd)


def _reply_ok(result: Any) -> bytes:
    # The redaction gate: a reply (status, a verb's result) may be pasted anywhere.
    return (strictjson.dumps({"ok": True, "result": redact_data(result)}, default=str) + "\n").encode()


def _reply_error(code: str, message: str) -> bytes:
    return (strictjson.dumps({"ok": False, "error": {"code": code, "message": redact_text(message)}}) + "\n").encode()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice (json keeps the last silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            # {"verb":"status","verb":"stop"} would be read as stop (json keeps the last): which was meant?
            raise ControlError("bad_request", f"request has the key {k[:64]!r} twice; send each key once "
                                              "(nothing was done)")
        out[k] = v
    return out


def parse_request(data: bytes) -> tuple[str, dict[str, Any]]:
    """Validate one request line; raises ControlError(bad_request|unknown_verb)."""
    try:
        req = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ControlError("bad_request", f"request is not JSON: {e}") from None
    except RecursionError:
        raise ControlError("bad_request", "request JSON is nested too deeply") from None
    except ValueError as e:  # an integer beyond Python's int-digits limit (4300): a bad request, not a crash
        raise ControlError("bad_request", f"request has an unreadable value: {e}"[:300]) from None
    if not isinstance(req, dict):
        raise ControlError("bad_request", 'request must be a JSON object {"verb": ..., "args": {...}}')
    # An unknown top-level key is refused, not ignored: {"verb": "stop", "wait": true} (the
    # argument outside "args") ran as a plain stop, not the one asked for.
    unknown = sorted(set(req) - {"verb", "args"})
    if unknown:
        raise ControlError("bad_request", f"request has unknown key(s) {', '.join(map(repr, unknown))[:200]}; "
                           'a request is {"verb": ..., "args": {...}} (nothing was done)')
    verb = req.get("verb")
    if not isinstance(verb, str):
        raise ControlError("bad_request", 'request has no "verb" string')
    if verb not in VERBS:
        raise ControlError("unknown_verb", f"unknown verb {verb!r}; known: {', '.join(VERBS)}")
    args = req.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ControlError("bad_request", '"args" must be a JSON object')
    allowed = VERBS[verb]
    for key, value in args.items():
        if key not in allowed:
            raise ControlError("bad_request", f"{verb}: unknown argument {key!r}"
                               + (f"; known: {', '.join(allowed)}" if allowed else "; it takes none"))
        want = allowed[key]
        if value is not None and not (isinstance(value, want) and not (want is not bool and isinstance(value, bool))):
            raise ControlError("bad_request", f"{verb}: argument {key!r} must be a {want.__name__}")
    return verb, {k: v for k, v in args.items() if v is not None}


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def peer_allowed(peer_uid: int, daemon_uid: int) -> bool:
    """Whether a peer (its uid from SO_PEERCRED) may control a daemon running as ``daemon_uid``:
    the daemon's own user, or root; nobody else."""
    return peer_uid == daemon_uid or peer_uid == 0


class ControlServer:
    """Serves the control socket on its own threads until :meth:`close`.

    ``start()`` binds (replacing a stale socket file, refusing a live one with
    :class:`SocketInUse`), sets mode 0600 before listening, and starts the accept thread.
    """

    def __init__(self, state_dir: str | os.PathLike[str], handler: Handler, *,
                 max_request: int = MAX_REQUEST, read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, max_per_uid: int = MAX_PER_UID) -> None:
        self.path = socket_path(state_dir)
        self.handler = handler
        self.max_request = max_request
        self.read_timeout_s = read_timeout_s
        self.slots = ConnectionSlots(max_connections, max_per_uid)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._uid = os.geteuid()
        self._inode: int | None = None
        self._refused = Repeats(REFUSED_QUIET_S, self._refused_episode_ended)

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        # The umask makes the file 0600 from the start (umask is process-wide, so it is held for
        # the bind only); the chmod below is what guarantees it. Clients cannot connect before
        # listen(), so the mode is final before anyone can talk to us.
        with unix_address(self.path) as addr:
            old = os.umask(0o177)
            try:
                sock.bind(addr)
            except OSError:
                sock.close()
                raise
            finally:
                os.umask(old)
        os.chmod(self.path, 0o600)
        self._inode = os.stat(self.path).st_ino
        sock.listen(32)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="control-accept", daemon=True)
        self._thread.start()
        log.info("control_socket_listening", path=str(self.path),
                 next="status/restart/stop/checkpoint-now/reload accepted from this uid or root")

    def _remove_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketInUse(f"{self.path} exists and is not a socket; remove it if it is not needed")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        probe.settimeout(1.0)
        with unix_address(self.path) as addr:
            try:
                probe.connect(addr)
            except OSError as e:
                if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                    raise
                os.unlink(self.path)  # left behind by a daemon that died: ours now
                log.info("control_socket_stale_removed", path=str(self.path))
                return
            finally:
                probe.close()
        raise SocketInUse(f"another daemon is already running for state dir {self.path.parent} "
                          f"(its control socket {self.path} answers); stop it first or use another state dir")

    def _refused_episode_ended(self, uid: object, suppressed: int, seconds: float) -> None:
        log.warning("control_peer_refused_suppressed", uid=uid, daemon_uid=self._uid, suppressed=suppressed,
                    seconds=round(seconds, 1),
                    message=f"{suppressed} more connection(s) of uid {uid} were refused over {seconds:.1f} s "
                            "and not logged one by one",
                    next="each was refused with a forbidden reply; the next refusal of this uid is logged again")

    def close(self) -> None:
        """Stop accepting, remove the socket file (only if it is still ours)."""
        self._closing.set()
        self._refused.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            try:
                if os.stat(self.path).st_ino == self._inode:  # someone may have replaced it by hand
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._closing.is_set():
                    return
                time.sleep(0.05)  # EMFILE and friends: do not spin
                continue
            try:
                uid = _peer_uid(conn)
            except OSError:
                conn.close()  # the peer is gone already
                continue
            slot = self.slots.admit(uid, kick=functools.partial(conn.shutdown, socket.SHUT_RD))
            if slot is None:
                self._refuse(conn, "busy", "every control connection is busy with a request; try again")
                continue
            threading.Thread(target=self._serve, args=(conn, slot), name="control-conn", daemon=True).start()

    def _refuse(self, conn: socket.socket, code: str, message: str) -> None:
        try:
            conn.settimeout(1.0)
            conn.sendall(_reply_error(code, message))
            self._finish(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def _serve(self, conn: socket.socket, slot: Slot) -> None:
        try:
            with conn:
                try:
                    self._answer(conn, slot)
                finally:
                    self.slots.release(slot)  # before the close: a kick never meets a closed fd
        except OSError:
            pass  # the peer went away; nothing to tell it

    def _answer(self, conn: socket.socket, slot: Slot) -> None:
        conn.settimeout(self.read_timeout_s)
        uid = slot.uid
        if not peer_allowed(uid, self._uid):
            if self._refused.note(uid):  # a flooding peer must not flood the journal too
                log.warning("control_peer_refused", uid=uid, daemon_uid=self._uid,
                            next="request ignored; run the CLI as the daemon's user or root (further "
                                 f"refusals of this uid are counted until {REFUSED_QUIET_S:g} s pass without one)")
            reply = _reply_error("forbidden", f"uid {uid} may not control this daemon "
                                 f"(only uid {self._uid} or root)")
        else:
            try:
                verb, args = parse_request(self._read_line(conn, slot))
                reply = self._dispatch(verb, args)
            except SupervisorError as e:
                reply = _reply_error(e.code, e.message)
            except (TimeoutError, socket.timeout):
                reply = _reply_error("timeout", f"no complete request within {self.read_timeout_s:g} s")
        conn.sendall(reply)
        self._finish(conn)

    @staticmethod
    def _finish(conn: socket.socket) -> None:
        """Close politely: closing with unread request bytes makes the kernel send a reset, and
        the client would lose the error reply it is about to read. Drain a little, briefly: within
        one deadline for the whole drain, since a client that trickles a byte at a time would
        otherwise hold this thread (the accept thread, for a refused one) as long as it likes."""
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + FINISH_S
        drained = 0
        try:
            while drained < 1 << 20 and (remaining := deadline - time.monotonic()) > 0:
                conn.settimeout(remaining)
                if not (chunk := conn.recv(65536)):
                    break
                drained += len(chunk)
        except OSError:
            pass

    def _read_line(self, conn: socket.socket, slot: Slot) -> bytes:
        buf = bytearray()
        deadline = time.monotonic() + self.read_timeout_s  # the whole request, not per recv
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            conn.settimeout(remaining)
            chunk = conn.recv(65536)
            if not chunk or slot.evicted:
                break
            buf += chunk
            if len(buf) > self.max_request + 1:
                raise ControlError("too_large", f"request larger than {self.max_request} bytes")
        if not self.slots.request_read(slot):
            raise ControlError("busy", "this request was still incomplete when a newer connection needed "
                               "its slot (every one taken); send the whole request line at once, then retry")
        line, _, _ = bytes(buf).partition(b"\n")
        if len(line) > self.max_request:
            raise ControlError("too_large", f"request larger than {self.max_request} bytes")
        if not line.strip():
            raise ControlError("bad_request", "empty request")
        return line

    def _dispatch(self, verb: str, args: Mapping[str, Any]) -> bytes:
        try:
            return _reply_ok(self.handler(verb, args))
        except SupervisorError as e:
            return _reply_error(e.code, e.message)
        except Exception as e:  # the daemon survives a handler bug; the operator sees it
            log.exception("control_handler_failed", verb=verb, error=str(e),
                          next="replied with an internal error; the daemon keeps running")
            return _reply_error("internal", f"{verb} failed inside the daemon: {e}")


class ControlSocket:
    """The daemon's one control socket as a value the wiring hands to the two plug-ins that need
    it: the ops plug-in binds it at the daemon's start, the state-lock plug-in binds it again in a
    re-created state dir (the old file went with the old dir). Neither holds the other."""

    def __init__(self) -> None:
        self.server: ControlServer | None = None

    def bind(self, state_dir: str | os.PathLike[str], handler: Handler) -> None:
        self.server = ControlServer(state_dir, handler)
        self.server.start()

    def rebind(self) -> None:
        """Bind again at the same path (nothing bound yet: nothing to do)."""
        old = self.server
        if old is None:
            return
        self.server = ControlServer(old.path.parent, old.handler)
        old.close()  # unlinks only its own file: the new dir has none yet
        self.server.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
