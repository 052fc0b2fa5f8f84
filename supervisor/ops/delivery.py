"""One try of one notice: the ``[notify]`` hook command run, or the webhook POSTed, under one
total deadline, and cut short from another thread when the daemon exits.

Why a total deadline: urllib's ``timeout`` bounds each socket operation, so a webhook that
trickles a byte a second held its sender for the whole run, and every later notice (the give-up
one too) waited behind it. Here a :class:`Try` has one deadline for connect, send and reply
together; when it passes, the try's socket is shut down (its blocked read returns at once) or the
hook is killed with everything it started (ops/hooktree.py). The sink's exit uses the same cut for a
try still running then.

Looking up the webhook's host name is within the deadline too: the system resolver blocks
outside any socket, for as long as its own timeouts and retries say (30 s and more when a DNS
server does not answer), and nothing could cut it. It runs on a thread of its own that the try
waits for at most its time left (and no longer once cut); a lookup that hangs on past its try ends
the try, and at most ``MAX_LOOKUPS`` such threads exist at once: past that a try fails at once,
saying that earlier lookups still hang.

Credentials in the URL (``https://user:pw@host/x``) are taken out of it and sent as an
``Authorization: Basic`` header: left in, urllib sent none and passed ``user:pw@host`` to the
resolver as the host name (the password to the DNS server, and the lookup failed).

Redirects are refused, not followed: urllib turns a POST answered 301/302/303 into an empty GET
to wherever ``Location`` points (another host, maybe) and counts it as sent. A redirect is a
:class:`Redirected` error naming the status; the notice was not delivered.
"""
from __future__ import annotations

import base64
import http.client
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

import structlog

from .. import childio
from ..errors import SupervisorError
from .hooktree import HookTree

log = structlog.get_logger("supervisor.ops")

#: The bytes of a webhook's reply body that are read (the reply is not used: the status is).
REPLY_BYTES = 4096
#: The bytes of the hook command's stderr kept for the failure message (the rest is counted).
HOOK_STDERR_BYTES = 4096
#: Host name lookups in flight at once (each on a thread; one that hangs outlives its try).
MAX_LOOKUPS = 4
_lookups = threading.BoundedSemaphore(MAX_LOOKUPS)


class PermanentError(SupervisorError):
    """A failure another try would repeat (a 4xx answer, a hook command that does not exist)."""

    code = "alert_undeliverable"


class Redirected(PermanentError):
    """The webhook answered a redirect: refused, since following it would not deliver the POST."""

    def __init__(self, status: int, to_host: str) -> None:
        super().__init__(f"the webhook answered HTTP {status} (a redirect{' to ' + to_host if to_host else ''}); "
                         "redirects are not followed, since they turn the POST into an empty GET")
        self.status = status
        self.to_host = to_host


_TRYING = "connect, send and reply together"


def deadline_passed(t: "Try") -> str:
    return f"the webhook did not answer in full within {t.timeout_s:.3g} s ({t.doing})"


class Try:
    """One try's deadline, and the way another thread cuts it short (``cut``): the try registers
    what undoes it (``on_cut``: shut its socket, kill its hook) while it runs."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.cut_reason: str | None = None
        self.doing = _TRYING  # what the try waits on now, for the deadline's message
        self._undo: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def on_cut(self, undo: Callable[[], None] | None) -> None:
        """Call ``undo`` when the try is cut (at once if it was cut already); None: nothing to undo
        now. ``undo`` runs under the lock, so once ``on_cut(None)`` returns it never runs again
        (what it would shut may be closed then, and its descriptor number reused)."""
        with self._lock:
            self._undo = undo
            if undo is not None and self.cut_reason is not None:
                undo()

    def cut(self, reason: str) -> None:
        with self._lock:
            if self.cut_reason is not None:
                return
            self.cut_reason = reason
            if self._undo is not None:
                self._undo()


def run_hook(command: tuple[str, ...], body: bytes, env: dict[str, str], t: Try) -> None:
    """Exec the hook (never a shell: no quoting of event text can run anything) in a session of
    its own, the event JSON on its stdin; its stdout is discarded and its stderr read to a
    bounded tail. Past the try's deadline, or cut, it is killed with whatever it started; once it
    exits, what it left running is killed too (:class:`~supervisor.ops.hooktree.HookTree`)."""
    tree = HookTree()
    try:
        proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=tree.env(env), close_fds=True, start_new_session=True,
                                **tree.popen_kw())
    except OSError as e:  # not found, not executable: another try would fail the same way
        tree.end_unstarted()
        raise PermanentError(f"cannot run {command[0]}: {e.strerror or e}") from e
    tree.started()

    def cut() -> None:
        tree.end(proc)
    t.on_cut(cut)
    try:
        res = childio.drain(proc, timeout_s=t.left(), stdin=body, keep=HOOK_STDERR_BYTES)
    finally:
        t.on_cut(None)
        # Whatever the outcome, nothing the hook started outlives its try (hooktree.py says why).
        left = tree.end(proc)
    if res.timed_out or t.cut_reason is not None:
        raise TimeoutError(t.cut_reason or f"the hook command ran past {t.timeout_s:.3g} s and was killed "
                           "with everything it started")
    if left:
        log.warning("notify_hook_leftovers", pids=left[:20],
                    message=f"the hook command exited and left {len(left)} process(es) running (background or "
                            "detached); they were killed: a hook's work ends when it exits",
                    next="send in the foreground of the hook command if the notice needs them")
    if res.returncode != 0:
        tail = res.stderr_tail()
        raise RuntimeError(f"the hook command exited {res.returncode}" + (f": {tail}" if tail else ""))


def post_webhook(url: str, body: bytes, t: Try) -> None:
    """POST the JSON with the stdlib's urllib (one small POST does not justify requests/httpx in
    the daemon, and it honours the usual ``*_proxy`` variables), redirects refused, all of it
    (connect, TLS, proxy tunnel, send, reply) within the try's deadline."""
    timer = threading.Timer(t.left(), lambda: t.cut(deadline_passed(t)))
    timer.daemon = True
    timer.start()
    url, authorization = split_userinfo(url)
    headers = {"Content-Type": "application/json", "User-Agent": "transformer-supervisor"}
    if authorization:
        headers["Authorization"] = authorization
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    handles: list[socket.socket] = []
    opener = urllib.request.build_opener(_NoRedirect(), _Http(t, handles), _Https(t, handles))
    try:
        with opener.open(req, timeout=max(t.left(), 0.001)) as resp:
            resp.read(REPLY_BYTES)
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            raise Redirected(e.code, urllib.parse.urlsplit(e.headers.get("Location") or "").hostname or "") from None
        # 4xx (a revoked hook, a bad URL) would fail again; 408/429 and 5xx may pass later.
        if 400 <= e.code < 500 and e.code not in (408, 429):
            raise PermanentError(f"the webhook answered HTTP {e.code} {e.reason}") from None
        raise RuntimeError(f"the webhook answered HTTP {e.code} {e.reason}") from None
    except (OSError, http.client.HTTPException) as e:
        if t.cut_reason is not None:
            raise TimeoutError(t.cut_reason) from None
        reason = e.reason if isinstance(e, urllib.error.URLError) else f"{type(e).__name__}: {e}"
        raise ConnectionError(f"cannot reach the webhook: {reason}") from None
    finally:
        timer.cancel()
        t.on_cut(None)
        for h in handles:
            h.close()


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``http://user:pw@host/x`` -> (``http://host/x``, ``Basic <base64 of user:pw>``). urllib keeps
    the userinfo in the request's host: it never sent it as credentials, and handed it (the password
    too) to the system resolver as part of the host name. The URL's percent-escapes are undone in
    the credentials, as a browser does; a URL without userinfo is returned as it is, with None."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    creds = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return parts._replace(netloc=hostport).geturl(), "Basic " + base64.b64encode(creds).decode("ascii")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: Any, **_kw: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError: refused above


def _guarded(t: Try, handles: list[socket.socket]) -> Callable[..., socket.socket]:
    """``socket.create_connection`` for http.client, bounded by the try and registered for its cut:
    a dup of the socket (closed by the caller once the try is over) is shut down, which ends a
    blocked read on the original, TLS-wrapped or not."""

    def create(address: Any, timeout: Any = None, source_address: Any = None, **kw: Any) -> socket.socket:
        host, port = address
        error: OSError | None = None
        for *_, sockaddr in resolve(host, port, t):  # each address as create_connection would, in turn
            try:
                sock = socket.create_connection(sockaddr[:2], max(t.left(), 0.001), source_address, **kw)
                break
            except OSError as e:
                error = e
        else:
            raise error or OSError(f"no address for {host}")
        handle = sock.dup()
        handles.append(handle)

        def shut() -> None:
            try:
                handle.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        t.on_cut(shut)
        return sock

    return create


def resolve(host: str, port: int, t: Try) -> list[Any]:
    """``socket.getaddrinfo`` for a TCP connection, within the try's time left (see the module's
    docstring). Raises OSError as the resolver does; TimeoutError when the try ends first."""
    if not _lookups.acquire(blocking=False):
        raise OSError(f"looking up {host}: {MAX_LOOKUPS} earlier lookups still hang (the system resolver does "
                      "not answer); this try fails now and a later one looks again")
    done = threading.Event()
    box: list[Any] = []

    def lookup() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except OSError as e:
            box.append(e)
        finally:
            _lookups.release()
            done.set()

    threading.Thread(target=lookup, daemon=True, name="webhook-lookup").start()
    t.doing = f"looking up its host {host} took all of it: the system resolver does not answer"
    t.on_cut(done.set)  # the daemon's exit stops the wait at once
    try:
        done.wait(t.left())
    finally:
        t.on_cut(None)
    if not box:
        t.cut(deadline_passed(t))  # unless the deadline's timer or the daemon's exit did already
        raise TimeoutError(t.cut_reason)
    t.doing = _TRYING
    if isinstance(box[0], OSError):
        raise box[0]
    return list(box[0])


class _Http(urllib.request.HTTPHandler):
    def __init__(self, t: Try, handles: list[socket.socket]) -> None:
        super().__init__()
        self.t = t
        self.handles = handles

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._conn, req)

    def _conn(self, host: str, **kw: Any) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(host, **kw)
        conn._create_connection = _guarded(self.t, self.handles)  # type: ignore[attr-defined]  # its socket factory
        return conn


class _Https(urllib.request.HTTPSHandler):
    def __init__(self, t: Try, handles: list[socket.socket]) -> None:
        super().__init__()
        self.t = t
        self.handles = handles

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._conn, req, context=self._context)  # type: ignore[attr-defined]

    def _conn(self, host: str, **kw: Any) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection(host, **kw)
        conn._create_connection = _guarded(self.t, self.handles)  # type: ignore[attr-defined]
        return conn
