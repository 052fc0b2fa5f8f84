"""Config section [cluster]: one supervisor per node of a multi-node run, coordinated through
etcd. No endpoints (the section absent): a single-node run, exactly as without this section."""
from __future__ import annotations

import ipaddress
import urllib.parse
from types import ModuleType
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..config.schema import Problem
from ..fieldmeta import meta

if TYPE_CHECKING:  # ssl and the credential loaders only when a cluster is configured: a single-node
    import ssl  # daemon's start does not pay for them

    from .credentials import PasswordAuth


def _check_prefix(value: str) -> str | None:
    if value and (not value.startswith("/") or value.endswith("/")):
        return f'expected a key prefix such as "/transformer-supervisor/myrun" (leading /, no trailing /), got "{value}"'
    return None


#: What every node must agree on by default: every group of the launch digest (cluster/digest.py).
REQUIRE_SAME_GROUPS = ("argv", "seeds", "config", "code", "packages")


def check_require_same(value: tuple[str, ...]) -> str | None:
    """The config check of ``[cluster] require_same`` (here, not in digest.py: a single-node start
    does not import the digest machinery)."""
    groups = REQUIRE_SAME_GROUPS
    bad = [s for s in value if s.split(".", 1)[0] not in groups]
    if bad:
        return (f"expected groups of {', '.join(groups)} (or dotted keys within them, e.g. \"packages.torch\"), "
                f"got {', '.join(repr(s) for s in bad)}")
    return None


def _socket() -> ModuleType:
    import socket  # gethostname: a name lookup module a single-node start does not need

    return socket


@dataclass(frozen=True)
class ClusterConfig:
    endpoints: tuple[str, ...] = field(default=(), metadata=meta(
        'etcd client URLs, e.g. ["http://etcd-0:2379", "http://etcd-1:2379"]; none: single node'))
    prefix: str = field(default="", metadata=meta(
        "the run's key prefix in etcd, the same on every node and new for every run "
        "(default: /transformer-supervisor/<job.name>)", check=_check_prefix))
    node_id: str = field(default="", metadata=meta("this node's name in the run (default: the host name)"))
    advertise_addr: str = field(default="", metadata=meta(
        "the address the other nodes reach this node at, the rendezvous endpoint when it is rank 0 "
        "(default: the address the host name resolves to)"))
    nodes: int = field(default=1, metadata=meta("how many nodes the run has; a generation starts at once when "
                                                "this many are ready", min=1))
    min_nodes: int = field(default=0, metadata=meta(
        "the fewest nodes to go on with after wait_for_nodes_s; fewer: give up, exit 3 (0: all of them)", min=0))
    lease_ttl_s: float = field(default=10.0, metadata=meta(
        "a node silent this long is lost (node_lost); a node cut off from etcd this long stops its job", min=2))
    wait_for_nodes_s: float = field(default=300.0, metadata=meta(
        "how long the leader waits for all nodes before a generation, then goes on with min_nodes", min=0))
    master_port: int = field(default=29500, metadata=meta(
        "the rendezvous port handed to the job (TSUP_MASTER_PORT, MASTER_PORT)", min=1, max=65535))
    request_timeout_s: float = field(default=2.0, metadata=meta("timeout of one etcd request", min=0.1))
    require_same: tuple[str, ...] = field(default=REQUIRE_SAME_GROUPS, metadata=meta(
        "what every node of a generation must run the same, compared before each generation (docs/multinode.md): "
        "argv, seeds, config, code, packages, or dotted keys within them (\"packages.torch\"); [] compares nothing",
        check=check_require_same))
    ca_file: str = field(default="", metadata=meta(
        "PEM file of the CA that signed etcd's server certificate, for https:// endpoints (default: the "
        "system's trust store); the certificate must name the endpoint's host"))
    cert_file: str = field(default="", metadata=meta(
        "this node's client certificate (PEM), presented to an etcd started with --client-cert-auth"))
    key_file: str = field(default="", metadata=meta(
        "the client certificate's private key (PEM, unencrypted; default: inside cert_file)"))
    user: str = field(default="", metadata=meta(
        "etcd user for etcd's auth (a token from /v3/auth/authenticate, renewed when it expires); "
        "needs password_file"))
    password_file: str = field(default="", metadata=meta(
        "file whose first line is user's password (the password never goes in this config); read "
        "at each token renewal"))
    insecure: bool = field(default=False, metadata=meta(
        "accept plain http:// to an etcd that is not on this machine (anyone on the network path "
        "could read and forge the run's keys)"))

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints)

    def min_needed(self) -> int:
        return self.min_nodes or self.nodes

    def node_name(self) -> str:
        return self.node_id or _socket().gethostname()

    def key_prefix(self, job_name: str) -> str:
        return self.prefix or f"/transformer-supervisor/{job_name}"

    def tls(self) -> ssl.SSLContext | None:
        """The TLS context for https:// endpoints (None: plain HTTP only). Raises
        :class:`~supervisor.cluster.credentials.CredentialsError` for a bad file."""
        if not any(e.startswith("https://") for e in self.endpoints):
            return None
        from .credentials import tls_context

        return tls_context(self.ca_file, self.cert_file, self.key_file)

    def password_auth(self) -> PasswordAuth | None:
        from .credentials import PasswordAuth

        return PasswordAuth(self.user, self.password_file) if self.user else None

    @property
    def secured(self) -> bool:
        """TLS or auth configured: the daemon checks etcd accepts them before it starts."""
        return bool(self.user) or any(e.startswith("https://") for e in self.endpoints)

    def address(self) -> str:
        if self.advertise_addr:
            return self.advertise_addr
        try:
            return _socket().gethostbyname(_socket().gethostname())
        except OSError:
            return _socket().gethostname()


def cluster_problems(c: ClusterConfig) -> list[Problem]:
    """The checks that span the section's keys."""
    out: list[Problem] = []
    if c == ClusterConfig():
        return out
    if not c.endpoints:
        out.append(Problem("cluster.endpoints", 'required with [cluster]: expected etcd URLs such as '
                                                '["http://etcd:2379"] (remove the section for a single node)'))
    for i, e in enumerate(c.endpoints):
        if not (e.startswith("http://") or e.startswith("https://")):
            out.append(Problem(f"cluster.endpoints[{i}]", f'expected "http://HOST:PORT", got "{e}"'))
        elif "@" in urllib.parse.urlsplit(e).netloc:
            out.append(Problem(f"cluster.endpoints[{i}]", "credentials in the URL are not used (and would be shown); "
                               "expected https://HOST:PORT with cluster.user and cluster.password_file"))
        elif e.startswith("http://") and not c.insecure and not _loopback(e):
            out.append(Problem(f"cluster.endpoints[{i}]", f'"{e}" is plain HTTP to a host other than this machine: '
                               "anyone on the network path could read and forge the run's keys; use https:// "
                               "(cluster.ca_file, cert_file, key_file) or set cluster.insecure = true to accept it"))
    out.extend(_credential_problems(c))
    if c.min_nodes > c.nodes:
        out.append(Problem("cluster.min_nodes", f"expected <= cluster.nodes ({c.nodes}), got {c.min_nodes}"))
    if "/" in c.node_id:
        out.append(Problem("cluster.node_id", f'expected a name without "/", got "{c.node_id}"'))
    return out


def _loopback(endpoint: str) -> bool:
    host = urllib.parse.urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _credential_problems(c: ClusterConfig) -> list[Problem]:
    """TLS files and auth keys that fit together, and files that load."""
    out: list[Problem] = []
    https = any(e.startswith("https://") for e in c.endpoints)
    for key in ("ca_file", "cert_file", "key_file"):
        if getattr(c, key) and not https:
            out.append(Problem(f"cluster.{key}", "set, but no endpoint is https://; expected https:// endpoints "
                                                 "for TLS (or remove it)"))
    if c.key_file and not c.cert_file:
        out.append(Problem("cluster.key_file", "set without cluster.cert_file; expected both (the client "
                                               "certificate and its key)"))
    if bool(c.user) != bool(c.password_file):
        out.append(Problem("cluster.password_file" if c.user else "cluster.user",
                           "etcd auth needs both cluster.user and cluster.password_file"))
    auth = c.password_auth()
    checks: list[Callable[[], object]] = [c.tls] if https and not out else []
    if auth is not None and c.password_file:
        checks.append(auth.password)  # readable and not empty; etcd alone can say whether it is right
    from .credentials import CredentialsError

    for check in checks:
        try:
            check()
        except CredentialsError as e:
            out.append(Problem(e.key, e.problem))
    return out
