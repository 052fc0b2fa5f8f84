"""Two real daemons and a real etcd, n2 started with a different ``--seed`` (issue 26 build 3):
no generation starts, and both nodes say which key differs, with each node's value, then give up
(exit 3) after ``wait_for_nodes_s``. Their own paths and names differ and are not a difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.daemons import launches, node_config, start
from tests.cluster.etcdserver import EtcdServer
from tests.cluster.test_cluster_e2e import _prefix
from tests.conftest import history

pytestmark = [pytest.mark.timeout(120)]


def _in_own_workdir(cfg: Path, workdir: Path) -> Path:
    """The job's workdir outside any git tree: its code version is the script's hash, the same
    on both nodes whatever is committed meanwhile."""
    text = cfg.read_text()
    assert "[job]\n" in text
    cfg.write_text(text.replace("[job]\n", f'[job]\nworkdir = "{workdir}"\n', 1))
    return cfg


def test_a_node_with_another_seed_starts_no_generation_and_both_name_the_difference(
        etcd: EtcdServer, tmp_path: Path) -> None:
    prefix = _prefix()
    ds = {n: start(tmp_path, n, _in_own_workdir(node_config(
        tmp_path, n, etcd, prefix, nodes=2, lease_ttl_s=3.0, wait_for_nodes_s=2.0,
        job_args=["20", "0.05", "10", "--seed", seed]), tmp_path))
        for n, seed in (("n1", "1"), ("n2", "2"))}
    try:
        codes = {n: d.wait(90) for n, d in ds.items()}
    finally:
        for d in ds.values():
            if d.proc.poll() is None:
                d.kill()
    assert codes == {"n1": 3, "n2": 3}, {n: d.stderr()[-3000:] for n, d in ds.items()}
    assert launches(tmp_path, "n1") == [] and launches(tmp_path, "n2") == []  # no generation started
    for n in ds:
        events = history(tmp_path / n / "state")["events"]
        told = [e["message"] for e in events if e["event"] == "cluster_launch_mismatch"]
        assert told and "seeds.--seed (n1: 1; n2: 2)" in told[0], (n, [e["event"] for e in events])
        assert "config." not in told[0] and "code" not in told[0].split(" differ:")[0], told[0]
        gave = [e["message"] for e in events if e["event"] == "gave_up"]
        assert gave and "seeds.--seed" in gave[-1], (n, gave)
