"""A small etcd v3 client over etcd's JSON gateway (``/v3/...``), with the standard library.

Why not a client library: the maintained Python v3 clients (etcd3, python-etcd3, aetcd) pull in
grpcio and protobuf, tens of MB of native code in a daemon whose whole RSS budget is 55 MB, and
etcd3 has been unmaintained since 2020. The gateway ships with every etcd >= 3.3 and speaks the
same v3 API as JSON; we need eight calls of it. Watches are polled by revision (``min_mod_revision``),
which at the coordination's pace (a few reads a second) costs nothing and needs no stream.

Keys and values are UTF-8 strings here (the gateway wants them base64-encoded). Every call
raises :class:`EtcdUnavailable` when no endpoint answers, so callers can keep supervising
locally and retry; :class:`LeaseExpired` when a keepalive finds the lease gone.
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import SupervisorError


class EtcdError(SupervisorError):
    """Raised for an etcd request that failed; the subclasses say how."""

    code = "etcd"


class EtcdUnavailable(EtcdError):
    """Raised when no etcd endpoint answered (refused, timed out, 5xx); retry later."""

    code = "etcd_unavailable"


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
class Lease:
    id: int
    ttl: int


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> str:
    return base64.b64decode(s).decode(errors="replace")


def _prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (etcd's convention)."""
    b = bytearray(prefix.encode())
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return _b64(bytes(b[: i + 1]))
    return _b64(b"\0")


def _kv(d: dict[str, Any]) -> KeyValue:
    return KeyValue(_unb64(d["key"]), _unb64(d.get("value", "")), int(d.get("create_revision", 0)),
                    int(d.get("mod_revision", 0)), int(d.get("version", 0)), int(d.get("lease", 0)))


class EtcdClient:
    """etcd's v3 API for a list of endpoints (``http://host:port``); the first that answers is
    kept until it stops answering. Thread-safe: one HTTP connection per call."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._good = 0

    # ------------------------------------------------------------------ transport
    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        errors: list[str] = []
        n = len(self.endpoints)
        for i in range(n):
            idx = (self._good + i) % n
            url = urllib.parse.urlsplit(self.endpoints[idx])
            conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            conn = conn_cls(url.hostname or "127.0.0.1", url.port or 2379, timeout=self.timeout_s)
            try:
                conn.request("POST", path, data, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                errors.append(f"{self.endpoints[idx]}: {e}")
                continue
            finally:
                conn.close()
            if resp.status >= 500:
                errors.append(f"{self.endpoints[idx]}: HTTP {resp.status} {raw[:200]!r}")
                continue
            self._good = idx
            try:
                out = json.loads(raw or b"{}")
            except ValueError:
                raise EtcdRequestError(f"etcd {path} answered HTTP {resp.status} with non-JSON {raw[:200]!r}") from None
            if resp.status >= 400 or "error" in out and "header" not in out and "result" not in out:
                raise EtcdRequestError(f"etcd refused {path}: HTTP {resp.status} {out.get('message') or out}")
            return out
        raise EtcdUnavailable(f"no etcd endpoint answered {path}: {'; '.join(errors)}")

    # ------------------------------------------------------------------ keys
    def put(self, key: str, value: str, lease: int = 0) -> int:
        """Set ``key``; the new revision."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self._post("/v3/kv/put", body)["header"]["revision"])

    def get(self, key: str) -> KeyValue | None:
        kvs, _rev = self._range({"key": _b64(key)})
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: str, min_mod_revision: int = 0) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (changed at or after ``min_mod_revision`` when given) and
        the store's revision when read: a poll for changes since a revision is a watch."""
        body: dict[str, Any] = {"key": _b64(prefix), "range_end": _prefix_end(prefix)}
        if min_mod_revision:
            body["min_mod_revision"] = str(min_mod_revision)
        return self._range(body)

    def _range(self, body: dict[str, Any]) -> tuple[list[KeyValue], int]:
        out = self._post("/v3/kv/range", body)
        return [_kv(d) for d in out.get("kvs", [])], int(out["header"]["revision"])

    def delete(self, key: str) -> int:
        """Delete ``key``; how many keys were deleted (0 or 1)."""
        return int(self._post("/v3/kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix: str) -> int:
        return int(self._post("/v3/kv/deleterange", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
                   .get("deleted", 0))

    def create(self, key: str, value: str, lease: int = 0) -> tuple[bool, KeyValue | None]:
        """Put ``key`` only if it does not exist (compare-and-swap on its create revision):
        (True, None) when this call created it, else (False, the key as it is)."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        out = self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": _b64(key)}}]})
        if out.get("succeeded"):
            return True, None
        kvs = (out.get("responses") or [{}])[0].get("response_range", {}).get("kvs", [])
        return False, (_kv(kvs[0]) if kvs else None)

    def replace(self, key: str, value: str, mod_revision: int, lease: int = 0) -> bool:
        """Put ``key`` only if it was last changed at ``mod_revision`` (compare-and-swap)."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        out = self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}],
            "success": [{"request_put": put}]})
        return bool(out.get("succeeded"))

    # ------------------------------------------------------------------ leases
    def grant(self, ttl_s: int) -> Lease:
        out = self._post("/v3/lease/grant", {"TTL": str(int(ttl_s))})
        if out.get("error"):
            raise EtcdRequestError(f"etcd refused a lease of {ttl_s} s: {out['error']}")
        return Lease(int(out["ID"]), int(out["TTL"]))

    def keepalive(self, lease_id: int) -> int:
        """Refresh the lease; its TTL. Raises :class:`LeaseExpired` when it is gone."""
        out = self._post("/v3/lease/keepalive", {"ID": str(lease_id)})
        ttl = int(out.get("result", {}).get("TTL", 0))
        if ttl <= 0:
            raise LeaseExpired(f"lease {lease_id:x} has expired (its keys are gone); a new one must be granted")
        return ttl

    def revoke(self, lease_id: int) -> None:
        """Revoke the lease (its keys go at once); a lease already gone is fine."""
        try:
            self._post("/v3/lease/revoke", {"ID": str(lease_id)})
        except EtcdRequestError as e:
            if "not found" not in str(e):
                raise

    def healthy(self) -> bool:
        try:
            self._range({"key": _b64("health")})
            return True
        except EtcdError:
            return False
