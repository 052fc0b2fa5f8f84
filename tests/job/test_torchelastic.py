"""Reading torchrun's error files (job/torchelastic.py), fast: the files are written in the layout
and format torch 2.x uses (torch/distributed/elastic/multiprocessing: per-rank
``<log dir>/<run>_*/attempt_<k>/<local rank>/error.json``, the agent's copy with ``errorCode``);
tests/e2e/test_torchrun_rootcause.py runs the real torchrun."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from supervisor.config.model import config_from_table
from supervisor.core.messages import Launch, Resume
from supervisor.job import torchelastic
from supervisor.job.launch import launch_spec

TB = ('Traceback (most recent call last):\n  File "/venv/torch/errors/__init__.py", line 362, in wrapper\n'
      '    return f(*args, **kwargs)\n  File "/srv/train.py", line 16, in main\n'
      '    raise ValueError("boom at step 3")\nValueError: boom at step 3\n')


def _launch(attempt: int) -> Launch:
    return Launch(attempt, Resume(None, None, "fresh"), None, {}, (), 0, False)


def _error(stamp: str, code: int | None = None) -> dict:
    msg: dict = {"message": "ValueError: boom at step 3", "extraInfo": {"py_callstack": TB, "timestamp": stamp}}
    if code is not None:
        msg["errorCode"] = code
    return {"message": msg}


def test_the_failing_rank_is_the_per_rank_file_with_the_same_failure(tmp_path: Path) -> None:
    stamp = str(int(time.time()))
    logs = tmp_path / "logs"
    for rank, data in ((0, {"message": {"message": "RuntimeError: peer gone", "extraInfo": {
            "py_callstack": "", "timestamp": stamp}}}), (1, _error(stamp))):
        f = logs / "none_abc" / "attempt_0" / str(rank) / "error.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(data))
    ours = tmp_path / "error.json"
    ours.write_text(json.dumps(_error(stamp, code=1)))
    rc = torchelastic.read_root_cause(ours, argv=["torchrun", f"--log-dir={logs}", "train.py"], env={},
                                      since=time.time() - 5)
    assert rc is not None
    assert (rc.rank, rc.exc_type, rc.message, rc.error_code) == (1, "ValueError", "boom at step 3", 1)
    assert rc.last_frame == "/srv/train.py:16 in main"
    assert rc.line() == "rank 1 raised ValueError: boom at step 3 (at /srv/train.py:16 in main)"
    assert json.loads(json.dumps(rc.to_json()))["rank"] == 1


def test_no_rank_when_no_per_rank_file_matches_and_none_for_junk_or_stale_files(tmp_path: Path) -> None:
    ours = tmp_path / "error.json"
    ours.write_text(json.dumps(_error(str(int(time.time())))))
    rc = torchelastic.read_root_cause(ours, env={"TMPDIR": str(tmp_path / "empty")}, since=time.time() - 5)
    assert rc is not None and rc.rank is None and rc.line().startswith("raised ValueError: boom at step 3")
    ours.write_text("{half a fil")
    assert torchelastic.read_root_cause(ours, since=0) is None
    ours.write_text(json.dumps(_error("1")))
    old = time.time() - 3600
    os.utime(ours, (old, old))
    assert torchelastic.read_root_cause(ours, since=time.time() - 5) is None  # an earlier run's file
    assert torchelastic.read_root_cause(tmp_path / "missing.json", since=0) is None



def test_the_jobs_exception_message_is_masked_and_bounded(tmp_path: Path) -> None:
    # The message reaches the exit summary, the log, the ledger and history.
    ours = tmp_path / "error.json"
    text = "OperationalError: cannot reach postgres://u:pw-s3cr3t@db/x with token=tk-s3cr3t " + "x" * 100_000
    ours.write_text(json.dumps({"message": {"message": text, "extraInfo": {"py_callstack": TB, "timestamp": "1"}}}))
    rc = torchelastic.read_root_cause(ours, env={"TMPDIR": str(tmp_path / "empty")}, since=time.time() - 5)
    assert rc is not None and rc.exc_type == "OperationalError"
    assert "s3cr3t" not in rc.line() and "postgres://u:<redacted>@db/x" in rc.message
    assert len(rc.message) < 1100 and rc.message.endswith("chars)")

def test_each_attempt_gets_its_own_error_file_unless_the_job_sets_one(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    stale = torchelastic.error_file(sd, 2)
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    cfg = config_from_table({"job": {"command": [sys.executable, "t.py"]}})
    spec = launch_spec(cfg, _launch(2), run_id="r", state_dir=sd, job_env={})
    assert spec.env[torchelastic.ENV] == str(sd / "torchelastic" / "attempt-2" / "error.json")
    assert not stale.exists() and stale.parent.is_dir()  # the folder is ready, an old file gone
    own = config_from_table({"job": {"command": [sys.executable, "t.py"], "env": {torchelastic.ENV: "/x/e.json"}}})
    assert launch_spec(own, _launch(0), run_id="r", state_dir=sd, job_env={}).env[torchelastic.ENV] \
        == "/x/e.json"
