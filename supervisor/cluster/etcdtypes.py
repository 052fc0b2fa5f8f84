"""What the etcd client's callers hold and catch: its errors, :class:`KeyValue`, :class:`KeyRange`,
:class:`Lease`, and the gateway's base64 form of keys and values. Apart from the client
(:mod:`supervisor.cluster.etcd`) because the watch, the mirror, the trust check and the agent use
them without its transport.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from ..errors import SupervisorError
from ..redact import redact_line

#: The most of one human text (an end request's summary, a plan's reason) a node writes to etcd.
WIRE_TEXT_CHARS = 2000


def wire_text(text: str) -> str:
    """A human text as it leaves the node for etcd (another node, its logs, its `status`): cut at
    WIRE_TEXT_CHARS and through the one redaction gate, the values learned on this node (its job's
    env) included. The full gate is safe here: no node compares or digests these texts (trust.py
    checks generations, writers, leases and revisions; digest.py compares only the launch
    digests), so a value masked on one node and not on another cannot make them disagree."""
    return redact_line(text, WIRE_TEXT_CHARS)


class EtcdError(SupervisorError):
    """Raised for an etcd request that failed; the subclasses say how."""

    code = "etcd"


class EtcdUnavailable(EtcdError):
    """Raised when no etcd endpoint answered (refused, timed out, 5xx); retry later."""

    code = "etcd_unavailable"


class EtcdAuthError(EtcdUnavailable):
    """Raised when etcd refuses this client's credentials (a wrong password, no permission on the
    key, auth wanted but not configured). An outage for the caller: the node cannot keep its lease,
    so local supervision goes on and the fence applies; every call tries again (a fixed password
    file heals it)."""

    code = "etcd_auth"


class EtcdTlsError(EtcdUnavailable):
    """Raised when no endpoint completed a TLS handshake (etcd's certificate not trusted, or
    this node's client certificate refused)."""

    code = "etcd_tls"


class EtcdRequestError(EtcdError):
    """Raised when etcd refused a request (4xx or an error body): a bug or a bad config."""

    code = "etcd_request"


class LeaseExpired(EtcdError):
    """Raised when a lease is gone (expired or revoked): its keys are deleted; grant a new one."""

    code = "lease_expired"


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class KeyRange:
    """The keys from ``key`` up to (not including) ``end`` (raw bytes: a prefix's end need not
    be UTF-8), what a range read or a watch covers."""

    key: str
    end: bytes

    @staticmethod
    def under(prefix: str) -> "KeyRange":
        return KeyRange(prefix, _prefix_end_bytes(prefix))

    @staticmethod
    def only(key: str) -> "KeyRange":
        return KeyRange(key, key.encode() + b"\0")

    def body(self) -> dict[str, str]:
        return {"key": _b64(self.key), "range_end": _b64(self.end)}


@dataclass(frozen=True)
class Lease:
    id: int
    ttl: int


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> str:
    # binascii directly: base64.b64decode's argument checks cost more than the decoding, and a
    # watch decodes a key and a value for every change every node sees (N x N with N nodes).
    return binascii.a2b_base64(s).decode(errors="replace")


def _prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (etcd's convention), base64."""
    return _b64(_prefix_end_bytes(prefix))


def _prefix_end_bytes(prefix: str) -> bytes:
    b = bytearray(prefix.encode())
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\0"


def _kv(d: dict[str, Any]) -> KeyValue:
    return KeyValue(_unb64(d["key"]), _unb64(d.get("value", "")), int(d.get("create_revision", 0)),
                    int(d.get("mod_revision", 0)), int(d.get("version", 0)), int(d.get("lease", 0)))
