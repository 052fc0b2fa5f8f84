"""`status` shows every node of a multi-node run (the text table; --json carries the same)."""

from __future__ import annotations

from supervisor.cli.render import render_status


def test_the_table_lists_every_node() -> None:
    text = render_status({"state": "running", "attempt": 1, "cluster": {
        "node_id": "n2", "leader": "n1", "etcd_reachable": False, "generation": 3, "rank": 1,
        "nodes": {"n1": {"phase": "running", "gen": 3, "state": "running", "addr": "10.0.0.1"},
                  "n2": {"phase": "waiting", "gen": 2, "state": "starting", "addr": "10.0.0.2"}}}})
    assert "generation 3, leader n1, this node n2 (rank 1); etcd unreachable" in text
    assert "n1: running, generation 3, running (10.0.0.1)" in text
    assert "n2: waiting, generation 2, starting (10.0.0.2)" in text


def test_a_single_node_shows_no_cluster_row() -> None:
    assert "cluster" not in render_status({"state": "running", "attempt": 0})
