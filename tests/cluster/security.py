"""Credentials for a secured test etcd: a throwaway PKI made with the ``openssl`` CLI (a CA, a
server certificate for 127.0.0.1, client certificates; the ``cryptography`` package is not in
the venv) and etcd's user/role auth switched on through the gateway (no etcdctl needed)."""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import ssl
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.etcdserver import Unavailable

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise Unavailable("no openssl CLI to make the test certificates")
    r = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args[:2])} failed: {r.stderr[-500:]}")


@dataclass(frozen=True)
class Ca:
    cert: Path
    key: Path

    @classmethod
    def make(cls, d: Path, name: str) -> "Ca":
        d.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
                 "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
        return cls(d / f"{name}.pem", d / f"{name}.key")

    def issue(self, name: str, *, server: bool) -> tuple[Path, Path]:
        """A certificate signed by this CA: (cert, key); a server one names 127.0.0.1 and localhost.
        A client one has no Common Name (subject O=name): with auth on, etcd's gateway refuses a
        client certificate that has one (its CN would otherwise pass for a user name)."""
        d = self.cert.parent
        ext = d / f"{name}.ext"
        ext.write_text("keyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid\n" + (
            "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n" if server
            else "extendedKeyUsage=clientAuth\n"))
        _openssl("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}" if server else f"/O={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", self.cert.name, "-CAkey", self.key.name,
                 "-set_serial", str(secrets.randbits(63)), "-days", "2", "-extfile", ext.name,
                 "-out", f"{name}.pem", cwd=d)
        return d / f"{name}.pem", d / f"{name}.key"


@dataclass(frozen=True)
class Pki:
    """A CA with etcd's server certificate and one client certificate it signed."""

    ca: Ca
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, d: Path) -> "Pki":
        ca = Ca.make(d, "tsup-test-ca")
        server = ca.issue("etcd-server", server=True)
        client = ca.issue("node-client", server=False)
        return cls(ca, *server, *client)

    def etcd_args(self) -> list[str]:
        return ["--cert-file", str(self.server_cert), "--key-file", str(self.server_key),
                "--client-cert-auth", "--trusted-ca-file", str(self.ca.cert)]

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _prefix_end(prefix: str) -> str:
    return _b64(prefix[:-1] + chr(ord(prefix[-1]) + 1))


def _call(endpoint: str, path: str, body: dict[str, object], context: ssl.SSLContext | None,
          token: str | None = None) -> dict[str, object]:
    headers = {"Authorization": token} if token else {}
    req = urllib.request.Request(endpoint + path, json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10, context=context) as r:
        out: dict[str, object] = json.loads(r.read())
    assert "error" not in out, (path, out)
    return out


def enable_auth(endpoint: str, user: str, password: str, prefix: str, context: ssl.SSLContext | None = None) -> str:
    """etcd's auth on: a root user, and ``user`` with a role that may read and write the keys
    under ``prefix`` (and nothing else). Returns root's password."""
    root_pw = secrets.token_hex(8)
    calls: list[tuple[str, dict[str, object]]] = [
        ("/v3/auth/user/add", {"name": "root", "password": root_pw}),
        ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("/v3/auth/user/add", {"name": user, "password": password}),
        ("/v3/auth/role/add", {"name": "tsup-run"}),
        ("/v3/auth/role/grant", {"name": "tsup-run", "perm": {"permType": "READWRITE", "key": _b64(prefix),
                                                              "range_end": _prefix_end(prefix)}}),
        ("/v3/auth/user/grant", {"user": user, "role": "tsup-run"}),
        ("/v3/auth/enable", {}),
    ]
    for path, body in calls:
        _call(endpoint, path, body, context)
    return root_pw


def change_password(endpoint: str, root_pw: str, user: str, password: str) -> None:
    """What an operator rotating a password does (as root); the auth store's revision moves on,
    so etcd refuses the tokens it gave before."""
    token = _call(endpoint, "/v3/auth/authenticate", {"name": "root", "password": root_pw}, None)["token"]
    assert isinstance(token, str)
    _call(endpoint, "/v3/auth/user/changepw", {"name": user, "password": password}, None, token)
