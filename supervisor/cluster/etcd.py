"""A small etcd v3 client over etcd's JSON gateway (``/v3/...``), with the standard library.

Why not a client library: the maintained Python v3 clients (etcd3, python-etcd3, aetcd) pull in
grpcio and protobuf, tens of MB of native code in a daemon whose whole RSS budget is 55 MB, and
etcd3 has been unmaintained since 2020. The gateway ships with every etcd >= 3.3 and speaks the
same v3 API as JSON; we need a few calls of it. :meth:`EtcdClient.stream` opens the gateway's
streaming watch (``POST /v3/watch``: one long-lived HTTP response, a JSON message per line,
:mod:`supervisor.cluster.etcdwatch`), so a node at rest sends etcd nothing but its lease
keepalives (:mod:`supervisor.cluster.mirror`).

Keys and values are UTF-8 strings here (the gateway wants them base64-encoded). Every call
raises :class:`EtcdUnavailable` when no endpoint answers, so callers can keep supervising
locally and retry (its subclasses :class:`EtcdAuthError` and :class:`EtcdTlsError` when etcd
refuses this node's credentials); :class:`LeaseExpired` when a keepalive finds the lease gone.
TLS (server verification, client certificates) and user/password tokens: see
:mod:`supervisor.cluster.credentials` and :class:`EtcdClient`. The errors and the key types:
:mod:`supervisor.cluster.etcdtypes`.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable, Sequence

from .credentials import CredentialsError, PasswordAuth
from .etcdtypes import (EtcdAuthError, EtcdError, EtcdRequestError, EtcdTlsError, EtcdUnavailable, KeyRange, KeyValue,
                        Lease, LeaseExpired, _b64, _kv, _prefix_end)

AUTH_RETRY_S = 5.0  # after etcd refused the password, ask again only this much later
_PERMISSION_DENIED = 7  # the gRPC codes etcd's gateway puts in an error body
_FAILED_PRECONDITION = 9
_UNAUTHENTICATED = 16


def _token_rejected(status: int, out: dict[str, Any]) -> bool:
    """etcd says the token is invalid or expired (or from before an auth change): get a new one."""
    msg = str(out.get("message") or out.get("error") or "")
    return (status == 401 or out.get("code") == _UNAUTHENTICATED or "invalid auth token" in msg
            or "revision of auth store is old" in msg)


def same(key: str, target: str, value: int) -> dict[str, Any]:
    """A transaction's condition: ``key``'s ``target`` (CREATE, MOD or LEASE) equals ``value``; a
    missing key compares as 0 (MOD 0: the key does not exist)."""
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}[target]
    return {"key": _b64(key), "target": target, "result": "EQUAL", field: str(value)}


class EtcdClient:
    """etcd's v3 API for a list of endpoints (``http://host:port`` or ``https://``); the first
    that answers is kept until it stops answering. Thread-safe: one HTTP connection per call.

    ``tls``: the context for ``https://`` endpoints (verifies etcd, presents the client
    certificate; :func:`~supervisor.cluster.credentials.tls_context`). ``auth``: etcd's
    user/password auth; the token from ``/v3/auth/authenticate`` goes in the ``Authorization``
    header and is renewed when etcd says it is invalid or expired (simple tokens die with an
    etcd restart and after ``--auth-token-ttl`` unused). A refused password is not retried for
    :data:`AUTH_RETRY_S` (each try costs etcd a bcrypt)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 2.0, *, tls: ssl.SSLContext | None = None,
                 auth: PasswordAuth | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self.tls = tls
        self.auth = auth
        self.clock = clock
        self._good = 0
        self._auth_lock = threading.Lock()
        self._token: str | None = None
        self._refused: tuple[float, EtcdAuthError] | None = None  # (until, why): a refused password

    # ------------------------------------------------------------------ transport
    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        if self.auth is None:
            return self._checked(path, *self._send(path, data, None))
        token = self._token_now(stale=None)
        status, out = self._send(path, data, token)
        if _token_rejected(status, out):  # expired, or lost with an etcd restart: renew once
            token = self._token_now(stale=token)
            status, out = self._send(path, data, token)
        return self._checked(path, status, out)

    def _send(self, path: str, data: bytes, token: str | None) -> tuple[int, dict[str, Any]]:
        """One POST to the first endpoint that answers: (HTTP status, the JSON body)."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = token
        errors: list[str] = []
        tls_failures = 0
        n = len(self.endpoints)
        for i in range(n):
            idx = (self._good + i) % n
            conn = self._connection(idx)
            try:
                conn.request("POST", path, data, headers)
                resp = conn.getresponse()
                raw = resp.read()
            except ssl.SSLError as e:  # a handshake refused either way: a credentials problem, not a blip
                tls_failures += 1
                errors.append(f"{self.endpoints[idx]}: TLS: {e.reason or e}")
                continue
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
                return resp.status, json.loads(raw or b"{}")
            except ValueError:
                if b"CommonName of client" in raw:  # etcd >= 3.4.10 with auth on: a CN could pass for a user
                    raise EtcdAuthError(f"etcd's gateway refuses {path} because this node's client certificate has "
                                        "a Common Name while etcd's auth is on (it would pass for a user name); "
                                        "issue the certificate without a CN (a subject of O=... only) or use "
                                        "either client certificates or cluster.user") from None
                raise EtcdRequestError(f"etcd {path} answered HTTP {resp.status} with non-JSON {raw[:200]!r}") from None
        if tls_failures == n:
            raise EtcdTlsError(f"no etcd endpoint completed a TLS handshake for {path}: {'; '.join(errors)}; check "
                               "cluster.ca_file (the CA of etcd's certificate, whose names must include the "
                               "endpoint's host) and cluster.cert_file/key_file (a certificate etcd's "
                               "--trusted-ca-file signed)")
        raise EtcdUnavailable(f"no etcd endpoint answered {path}: {'; '.join(errors)}")

    def _connection(self, idx: int) -> http.client.HTTPConnection:
        url = urllib.parse.urlsplit(self.endpoints[idx])
        host, port = url.hostname or "127.0.0.1", url.port or 2379
        return (http.client.HTTPSConnection(host, port, timeout=self.timeout_s, context=self.tls)
                if url.scheme == "https" else http.client.HTTPConnection(host, port, timeout=self.timeout_s))

    def _checked(self, path: str, status: int, out: dict[str, Any]) -> dict[str, Any]:
        if status < 400 and not ("error" in out and "header" not in out and "result" not in out):
            return out
        msg = str(out.get("message") or out.get("error") or out)
        if _token_rejected(status, out) or "user name is empty" in msg:
            raise EtcdAuthError(f"etcd wants authentication for {path} ({msg}): set cluster.user and "
                                "cluster.password_file to an etcd user with read-write access to the run's prefix"
                                if self.auth is None else
                                f"etcd refused a fresh token of user \"{self.auth.user}\" for {path} ({msg})")
        if status == 403 or out.get("code") == _PERMISSION_DENIED or "permission denied" in msg:
            if self.auth is None:
                raise EtcdAuthError(f"etcd refused {path}: {msg}; its auth is on: set cluster.user and "
                                    "cluster.password_file to a user with readwrite on the run's prefix")
            raise EtcdAuthError(f'etcd refused {path} for user "{self.auth.user}": {msg}; grant the user a role '
                                "with readwrite on the run's prefix (cluster.prefix)")
        raise EtcdRequestError(f"etcd refused {path}: HTTP {status} {msg}")

    def _token_now(self, stale: str | None) -> str:
        """The current token; a new one when there is none or ``stale`` was refused."""
        assert self.auth is not None
        with self._auth_lock:
            if self._token is not None and self._token != stale:
                return self._token
            if self._refused is not None and self.clock() < self._refused[0]:
                raise self._refused[1]
            try:
                self._token = self._authenticate(self.auth)
            except EtcdAuthError as e:
                self._token, self._refused = None, (self.clock() + AUTH_RETRY_S, e)
                raise
            self._refused = None
            return self._token

    def _authenticate(self, auth: PasswordAuth) -> str:
        try:
            password = auth.password()
        except CredentialsError as e:
            raise EtcdAuthError(f"cannot authenticate to etcd: {e}") from None
        status, out = self._send("/v3/auth/authenticate", json.dumps({"name": auth.user, "password": password})
                                 .encode(), None)
        token = out.get("token")
        if status < 400 and isinstance(token, str) and token:
            return token
        msg = str(out.get("message") or out.get("error") or f"HTTP {status}")
        if out.get("code") == _FAILED_PRECONDITION or "not enabled" in msg:
            raise EtcdAuthError(f"etcd has authentication disabled ({msg}) but cluster.user is set: anyone who "
                                "reaches etcd could write the run's keys; enable it (etcdctl auth enable) or "
                                "remove cluster.user and cluster.password_file")
        raise EtcdAuthError(f'etcd refused user "{auth.user}" with the password in {auth.password_file} ({msg}); '
                            "check cluster.user and cluster.password_file")

    def check_access(self, prefix: str) -> None:
        """Read one key in the folder ``prefix/`` (what a role granted on the run's prefix covers):
        raises :class:`EtcdAuthError` or :class:`EtcdTlsError` when etcd refuses this client's
        credentials; an etcd that answers nobody is no verdict (every call retries it), so that
        passes."""
        folder = prefix.rstrip("/") + "/"
        try:
            self._range({"key": _b64(folder), "range_end": _prefix_end(folder), "limit": "1"})
        except (EtcdAuthError, EtcdTlsError):
            raise
        except EtcdUnavailable:
            pass

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

    def get_range(self, r: KeyRange) -> tuple[list[KeyValue], int]:
        """Every key in ``r`` and the store's revision when read."""
        return self._range(dict(r.body()))

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

    def put_if(self, key: str, value: str, conditions: Sequence[dict[str, Any]], lease: int = 0) -> bool:
        """Put ``key`` only if every condition (:func:`same`) holds, in one transaction; whether it did."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        out = self._post("/v3/kv/txn", {"compare": list(conditions), "success": [{"request_put": put}]})
        return bool(out.get("succeeded"))

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (what etcd's auto-compaction does); a watch that
        starts before it gets :class:`~supervisor.cluster.etcdwatch.WatchCompacted`."""
        self._post("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    # ------------------------------------------------------------------ streams
    def stream(self, path: str, body: dict[str, Any], idle_s: float | None
               ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
        """A streaming POST (etcd's watch, :mod:`supervisor.cluster.etcdwatch`) to the first
        endpoint that answers: (the open connection, its HTTP 200 response, the endpoint); a read
        on it silent for ``idle_s`` raises TimeoutError. Raises as the other calls do."""
        data = json.dumps(body).encode()
        token = self._token_now(stale=None) if self.auth is not None else None
        try:
            return self._open_stream(path, data, token, idle_s)
        except EtcdAuthError:
            if self.auth is None or token is None:
                raise
            return self._open_stream(path, data, self._token_now(stale=token), idle_s)  # expired, or lost in a restart

    def _open_stream(self, path: str, data: bytes, token: str | None, idle_s: float | None
                     ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = token
        errors: list[str] = []
        n = len(self.endpoints)
        for i in range(n):
            idx = (self._good + i) % n
            conn = self._connection(idx)
            try:
                conn.request("POST", path, data, headers)
                resp = conn.getresponse()
                if resp.status != 200:
                    raw = resp.read()
                    conn.close()
                    if resp.status >= 500:
                        errors.append(f"{self.endpoints[idx]}: HTTP {resp.status} {raw[:200]!r}")
                        continue
                    try:
                        out = json.loads(raw or b"{}")
                    except ValueError:
                        out = {"error": raw[:200].decode(errors="replace")}
                    self._checked(path, max(resp.status, 400), out)  # raises: auth, permission, refused
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                errors.append(f"{self.endpoints[idx]}: {e}")
                continue
            assert conn.sock is not None
            conn.sock.settimeout(idle_s)  # a watch at rest is silent; closing the connection ends a read
            self._good = idx
            return conn, resp, self.endpoints[idx]
        raise EtcdUnavailable(f"no etcd endpoint opened {path}: {'; '.join(errors)}")

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

