"""Config section [cluster]: one supervisor per node of a multi-node run, coordinated through
etcd. No endpoints (the section absent): a single-node run, exactly as without this section."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

from ..config.schema import Problem, meta


def _check_prefix(value: str) -> str | None:
    if value and (not value.startswith("/") or value.endswith("/")):
        return f'expected a key prefix such as "/transformer-supervisor/myrun" (leading /, no trailing /), got "{value}"'
    return None


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

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints)

    def min_needed(self) -> int:
        return self.min_nodes or self.nodes

    def node_name(self) -> str:
        return self.node_id or socket.gethostname()

    def key_prefix(self, job_name: str) -> str:
        return self.prefix or f"/transformer-supervisor/{job_name}"

    def address(self) -> str:
        if self.advertise_addr:
            return self.advertise_addr
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return socket.gethostname()


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
    if c.min_nodes > c.nodes:
        out.append(Problem("cluster.min_nodes", f"expected <= cluster.nodes ({c.nodes}), got {c.min_nodes}"))
    if "/" in c.node_id:
        out.append(Problem("cluster.node_id", f'expected a name without "/", got "{c.node_id}"'))
    return out
