"""etcd's streaming watch over the JSON gateway (``POST /v3/watch``): one long-lived HTTP
response, a JSON message per line; :func:`open_watch` opens one on an :class:`EtcdClient`
(its endpoints, TLS and auth token), :class:`Watch` reads it. What follows the keys with it:
:mod:`supervisor.cluster.mirror`."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import BinaryIO

from .etcd import EtcdClient
from .etcdtypes import EtcdAuthError, EtcdError, EtcdRequestError, EtcdUnavailable, KeyRange, KeyValue, _kv


class WatchIdle(EtcdUnavailable):
    """Raised by a watch that was silent for its ``idle_s``: the caller re-opens it (one request,
    which proves the connection and this client's credentials still hold)."""

    code = "etcd_watch_idle"


class WatchCompacted(EtcdError):
    """Raised by a watch whose start revision etcd has compacted away: read everything once and
    watch again from the read's revision + 1."""

    code = "etcd_compacted"


@dataclass(frozen=True)
class WatchEvent:
    kv: KeyValue  # a deleted key's has only the key and the deletion's mod_revision
    deleted: bool


def open_watch(client: EtcdClient, keys: KeyRange | str, start_revision: int, idle_s: float | None = None) -> "Watch":
    """A stream of the changes in ``keys`` (a range, or every key under a prefix) from ``start_revision`` on, on one connection
    to the first endpoint that answers. Raises :class:`WatchCompacted` when that revision is
    compacted, :class:`EtcdUnavailable` (or its auth/TLS subclasses) when no endpoint opens it,
    :class:`EtcdRequestError` when etcd refuses the watch itself. A read silent for ``idle_s``
    raises :class:`WatchIdle`."""
    r = KeyRange.under(keys) if isinstance(keys, str) else keys
    conn, resp, endpoint = client.stream("/v3/watch", {"create_request": {
        **r.body(), "start_revision": str(start_revision)}}, idle_s)
    watch = Watch(conn, resp, endpoint)
    try:
        watch.next_message()  # etcd's "created" (or why not) comes first
    except EtcdError:
        watch.close()
        raise
    return watch


class Watch:
    """One open watch stream (:func:`open_watch`). :meth:`next_message` blocks for etcd's
    next message; :meth:`close` (from any thread) ends a blocked read."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, endpoint: str) -> None:
        self._conn = conn
        self._resp = resp
        self.endpoint = endpoint
        self._lines: _ChunkedLines | http.client.HTTPResponse = (_ChunkedLines(resp.fp) if resp.chunked and resp.fp
                                                                 else resp)

    def next_message(self) -> tuple[int, list[WatchEvent]]:
        """(the header's revision, the events in it; none for etcd's created and progress
        messages). Raises :class:`WatchCompacted`, :class:`EtcdUnavailable` when the stream ends
        (etcd restarted, the connection dropped, :meth:`close`; :class:`WatchIdle` when silent for
        the ``idle_s`` it was opened with), :class:`EtcdRequestError` when
        etcd cancels the watch for another reason (permission revoked)."""
        try:
            line = self._lines.readline()
        except TimeoutError:
            raise WatchIdle(f"the watch on {self.endpoint} was silent for its idle time") from None
        except (OSError, ValueError, AttributeError, http.client.HTTPException) as e:  # AttributeError: closed
            raise EtcdUnavailable(f"the watch on {self.endpoint} dropped: {e}") from None  # under the read
        if not line:
            raise EtcdUnavailable(f"the watch on {self.endpoint} ended (etcd closed the stream)")
        try:
            msg = json.loads(line.decode())
        except ValueError:  # UnicodeDecodeError too
            raise EtcdUnavailable(f"the watch on {self.endpoint} sent a broken line {line[:200]!r}") from None
        if "error" in msg and "result" not in msg:
            err = msg["error"]
            text = str(err.get("message", err)) if isinstance(err, dict) else str(err)
            if "auth" in text or "permission" in text or "token" in text:
                raise EtcdAuthError(f"etcd refused the watch on {self.endpoint}: {text}")
            raise EtcdUnavailable(f"the watch on {self.endpoint} failed: {text}")
        res = msg.get("result", {})
        if res.get("canceled"):
            if int(res.get("compact_revision", 0)):
                raise WatchCompacted(f"etcd compacted the history up to revision {res['compact_revision']}")
            raise EtcdRequestError(f"etcd cancelled the watch on {self.endpoint}: {res.get('cancel_reason', res)}")
        events = [WatchEvent(_kv(e["kv"]), e.get("type") == "DELETE") for e in res.get("events", [])]
        return int(res.get("header", {}).get("revision", 0)), events

    def close(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in next_message
            except OSError:
                pass
        self._conn.close()


class _ChunkedLines:
    """The lines of a chunked HTTP body (how etcd's gateway sends a watch), read straight from
    the connection's buffered file. Why not ``HTTPResponse.readline``: on a chunked body it takes
    a dozen Python calls per line, more than decoding the message, and every node reads every
    change (N x N lines with N nodes). A line may span chunks; the stream ends with the
    zero-size chunk or the connection (then what is left is the last line)."""

    def __init__(self, fp: BinaryIO) -> None:
        self._fp = fp
        self._buf = b""
        self._ended = False

    def readline(self) -> bytes:
        """The next line with its newline, or what is left (b"" at the end). Raises what the
        socket raises (TimeoutError when silent for the watch's idle time), ValueError for a
        broken chunk header or a closed file."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[: nl + 1], self._buf[nl + 1:]
                return line
            if self._ended:
                line, self._buf = self._buf, b""
                return line
            self._buf += self._chunk()

    def _chunk(self) -> bytes:
        header = self._fp.readline(1024)
        size = int(header.split(b";", 1)[0], 16) if header else 0  # ValueError: not a chunk header
        if size == 0:  # the last chunk (its trailers are not read: the stream is over) or the connection closed
            self._ended = True
            return b""
        data = self._fp.read(size)
        if len(data) < size:
            self._ended = True  # cut off mid-chunk: what came is the last of it
        else:
            self._fp.read(2)  # the chunk's CRLF
        return data
