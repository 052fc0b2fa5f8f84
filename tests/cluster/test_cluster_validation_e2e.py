"""Three real daemons and a real etcd: a post-restart validation that fails on one node only
rolls every node back together (issue 15 item 3: "a failed validation anywhere rolls all back").

Generation 1: NaN on n2 at step 35; all three resume generation 2 from step 30. In generation 2
n3's job reports losses 100 times the pre-fault level: n3's validation fails (validation_failed,
action rollback, onset at the resumed step 30), every node stops, and generation 3 resumes all
three from step 20, the newest step verified everywhere before 30; there validation passes and
the run finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.daemons import launches, node_config, start
from tests.cluster.etcdserver import EtcdServer
from tests.cluster.test_cluster_e2e import NODES, _prefix
from tests.conftest import history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
VALIDATION_STEPS = 5


def _with_validation(cfg: Path) -> Path:
    """node_config turns validation off (the other tests resume without a baseline); on here,
    over a few steps so the test stays short."""
    text = cfg.read_text()
    assert "[validation]\nenabled = false" in text
    cfg.write_text(text.replace("[validation]\nenabled = false",
                                f"[validation]\nenabled = true\nsteps = {VALIDATION_STEPS}"))
    return cfg


def test_a_failed_validation_on_one_node_rolls_all_three_back_to_the_same_step(
        etcd: EtcdServer, tmp_path: Path) -> None:
    prefix = _prefix()
    # TOTAL STEP_S SAVE NAN_NODE NAN_STEP BAD_NODE BAD_GEN
    args = ["60", "0.05", "10", "n2", "35", "n3", "2"]
    ds = {n: start(tmp_path, n, _with_validation(node_config(tmp_path, n, etcd, prefix, nodes=3, job_args=args)))
          for n in NODES}
    try:
        codes = {n: d.wait(100) for n, d in ds.items()}
    finally:
        for d in ds.values():
            if d.proc.poll() is None:
                d.kill()
    assert codes == {"n1": 0, "n2": 0, "n3": 0}, {n: d.stderr()[-2000:] for n, d in ds.items()}

    # The job's own record of its launches: three generations on every node, generation 2 from
    # step 30 (before the NaN at 35), generation 3 from step 20 (before the resume that failed).
    runs = {n: launches(tmp_path, n) for n in NODES}
    for n, ls in runs.items():
        assert [x["TSUP_GENERATION"] for x in ls] == ["1", "2", "3"], (n, ls)
        assert [x.get("TSUP_RESUME_STEP") or None for x in ls] == [None, "30", "20"], (n, ls)
        assert {x["TSUP_NNODES"] for x in ls} == {"3"}

    # Each node's ledger: the same three attempts, the same causes and resume steps; only n3
    # saw its validation fail, the others were told by the cluster.
    for n in NODES:
        h = history(tmp_path / n / "state")
        atts = h["attempts"]
        assert [a["cause"] for a in atts[:2]] == ["nan", "validation_failed"], (n, atts)
        assert [a["resume_step"] for a in atts] == [None, 30, 20], (n, [a["resume_step"] for a in atts])
        assert atts[1]["action"] == "rollback", (n, atts[1])
        assert atts[2]["cause"] is None and atts[2]["exit_code"] == 0, (n, atts[2])
        assert (atts[2]["validation"] or {}).get("verdict") == "pass", (n, atts[2]["validation"])
        events = h["events"]
        failed = [e for e in events if e["event"] == "validation_failed"]
        if n == "n3":
            assert failed and failed[0]["attempt"] == atts[1]["attempt"], (n, failed)
            assert (atts[1]["validation"] or {}).get("verdict") == "fail", atts[1]["validation"]
            assert atts[1]["validation"]["checks"]["initial_loss"]["passed"] is False
        else:
            assert not failed, (n, failed)  # their own resumed steps looked fine
            ended = [e for e in events if e["event"] == "cluster_generation_ended" and "n3" in (e["message"] or "")]
            assert ended, (n, [e["message"] for e in events if e["event"].startswith("cluster_")])
