"""Two supervisors, each running `torchrun --nnodes=2 --rdzv-backend=c10d` on its node (one
machine here), a tiny gloo DDP job: the rank on node 1 crashes; both relaunch into a new
rendezvous (TSUP_RDZV_ID of the new generation, the leader's address) and the run finishes."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from tests.cluster.daemons import all_finish, node_config, start
from tests.cluster.etcdserver import EtcdServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
JOB = Path(__file__).resolve().parent / "ddp_job.py"


def test_a_crash_on_node_1_relaunches_both_into_a_new_rendezvous_and_the_run_finishes(
        etcd: EtcdServer, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    prefix, port = f"/tsup/ddp-{uuid.uuid4().hex[:8]}", free_port()
    ds = {}
    for n in ("n1", "n2"):
        cmd = (f"{TORCHRUN} --nnodes=2 --nproc-per-node=1 --max-restarts=0 --rdzv-backend=c10d "
               "--rdzv-endpoint=$TSUP_MASTER_ADDR:$TSUP_MASTER_PORT --rdzv-id=$TSUP_RDZV_ID "
               f"{JOB} {tmp_path / n / 'out'} 40 25")
        ds[n] = start(tmp_path, n, node_config(tmp_path, n, etcd, prefix, nodes=2, lease_ttl_s=5.0, job_args=[],
                                               command=[cmd], master_port=port))
    all_finish(ds, 240)
    import json

    runs = {n: [json.loads(x) for x in (tmp_path / n / "out" / "launches.jsonl").read_text().splitlines()]
            for n in ds}
    for n, rs in runs.items():
        assert [r["gen"] for r in rs] == [1, 2] and {r["world"] for r in rs} == {2}, (n, rs)
        assert rs[1]["resume"] == 20  # the newest step verified on both nodes before the crash at 25
        assert (tmp_path / n / "out" / "done").read_text().split() == ["2"]  # generation 2 finished
    assert sorted(r["rank"] for n in ds for r in runs[n] if r["gen"] == 2) == [0, 1]
