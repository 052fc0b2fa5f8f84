"""Three real daemons and a real etcd: a post-restart validation that fails on one node only
rolls every node back together (issue 15 item 3: "a failed validation anywhere rolls all back").

Generation 1: NaN on n2 at step 38; all three resume generation 2 from step S (30, or 20 when a
node's job lagged behind step 30 when stopped: the jobs here are not in lockstep as DDP ranks
are). In generation 2 n3's job reports losses 100 times the pre-fault level: n3's validation fails
(validation_failed, action rollback, onset at the resumed step S), every node stops, and
generation 3 resumes all three from S - 10, the newest step verified everywhere before S; there
validation passes and the run finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.daemons import all_finish, launches, node_config, start
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
    args = ["60", "0.05", "10", "n2", "38", "n3", "2"]
    ds = {n: start(tmp_path, n, _with_validation(node_config(tmp_path, n, etcd, prefix, nodes=3, job_args=args)))
          for n in NODES}
    all_finish(ds, 100)

    # The job's own record of its launches: three generations on every node, each generation
    # resumed from one step on all three; generation 3 from the newest step before generation
    # 2's (the resume whose validation failed).
    runs = {n: launches(tmp_path, n) for n in NODES}
    for n, ls in runs.items():
        assert [x["TSUP_GENERATION"] for x in ls] == ["1", "2", "3"], (n, ls)
        assert {x["TSUP_NNODES"] for x in ls} == {"3"}
    resumed = {n: [x.get("TSUP_RESUME_STEP") or None for x in ls] for n, ls in runs.items()}
    assert len({tuple(r) for r in resumed.values()}) == 1, resumed  # the same steps on every node
    first, s2, s3 = resumed["n1"]
    assert first is None and s2 in ("30", "20"), resumed  # 30 unless a job lagged behind it at the NaN
    assert s3 == str(int(s2) - 10), resumed  # rolled back past the resume that failed validation

    # Each node's ledger: the same three attempts, the same causes and resume steps; only n3
    # saw its validation fail, the others were told by the cluster.
    for n in NODES:
        h = history(tmp_path / n / "state")
        atts = h["attempts"]
        assert [a["cause"] for a in atts[:2]] == ["nan", "validation_failed"], (n, atts)
        assert [a["resume_step"] for a in atts] == [None, int(s2), int(s3)], (n, [a["resume_step"] for a in atts])
        assert atts[1]["action"] == "rollback" and atts[1]["detection"]["onset_step"] == int(s2), (n, atts[1])
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
