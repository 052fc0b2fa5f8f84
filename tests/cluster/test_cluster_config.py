"""[cluster]: absent means a single node; present, check-config names every problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.model import ConfigError, config_from_table


def cfg(**cluster):
    table = {"job": {"command": ["python", "train.py"]}}
    if cluster:
        table["cluster"] = cluster
    return config_from_table(table)


def test_absent_is_a_single_node() -> None:
    c = cfg()
    assert not c.cluster.enabled


def test_defaults_fill_in() -> None:
    c = cfg(endpoints=["http://127.0.0.1:2379"], nodes=3)
    assert c.cluster.enabled and c.cluster.min_needed() == 3
    assert c.cluster.key_prefix("myrun") == "/transformer-supervisor/myrun" and c.cluster.node_name()


def test_every_problem_is_named() -> None:
    with pytest.raises(ConfigError) as e:
        cfg(endpoints=["etcd:2379"], nodes=2, min_nodes=3, prefix="run/", lease_ttl_s=0.5)
    text = str(e.value) + "".join(str(p) for p in e.value.problems)
    for path in ("cluster.endpoints[0]", "cluster.min_nodes", "cluster.prefix", "cluster.lease_ttl_s"):
        assert path in text, text
    with pytest.raises(ConfigError, match="cluster.endpoints"):
        cfg(nodes=2)  # a [cluster] without endpoints


def test_check_config_reports_it(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[job]\ncommand = ["python", "t.py"]\n[cluster]\nendpoints = ["http://e:2379"]\nnodes = 2\n'
                 'min_nodes = 5\n')
    r = subprocess.run([sys.executable, "-m", "supervisor", "check-config", str(p)], capture_output=True, text=True)
    assert r.returncode != 0 and "cluster.min_nodes" in r.stdout + r.stderr
