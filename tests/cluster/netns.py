"""Network namespaces on a bridge for the partition test: each simulated node gets a namespace
with its own address, joined to a bridge the test creates; etcd listens on the bridge's address.
Cutting a node's veth is a real partition of that node (etcd and the other nodes unreachable).
Needs root and iproute2; :class:`Unavailable` carries the skip reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid


class Unavailable(Exception):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


class Bridge:
    """A bridge 10.R.0.1/24 and one namespace per node at 10.R.0.(2+i)."""

    def __init__(self, nodes: list[str]) -> None:
        if os.geteuid() != 0 or not shutil.which("ip"):
            raise Unavailable("network namespaces need root and iproute2 (ip)")
        self.tag = uuid.uuid4().hex[:5]
        self.subnet = 100 + int(self.tag, 16) % 100
        self.bridge = f"tsbr{self.tag}"
        self.host_ip = f"10.{self.subnet}.0.1"
        self.nodes = {n: (f"tsup-{self.tag}-{n}", f"tsv{self.tag}{i}", f"10.{self.subnet}.0.{2 + i}")
                      for i, n in enumerate(nodes)}
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
        except subprocess.CalledProcessError as e:
            raise Unavailable(f"cannot create a bridge here: {e.stderr.strip()}") from None
        try:
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for ns, veth, addr in self.nodes.values():
                _ip("netns", "add", ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as e:
            self.close()
            raise Unavailable(f"cannot set up namespaces here: {e.stderr.strip()}") from None

    def addr(self, node: str) -> str:
        return self.nodes[node][2]

    def argv(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the node's namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.nodes[node][0], *argv]

    def cut(self, node: str) -> None:
        _ip("link", "set", self.nodes[node][1], "down")

    def heal(self, node: str) -> None:
        _ip("link", "set", self.nodes[node][1], "up")

    def close(self) -> None:
        for ns, veth, _addr in self.nodes.values():
            _ip("link", "del", veth, check=False)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)
