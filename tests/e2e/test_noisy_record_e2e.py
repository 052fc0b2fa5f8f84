"""Through the real daemon (issue 34, "the fault hidden by noise around it"): a job whose metric
record is a Python dict with a ``train_loss`` key (``{'step': 20, 'train_loss': nan}``, D6), or a
JSON record with text after it and a logging prefix before it (``2024-01-01 12:00:00 INFO
{"step": 20, "loss": nan} rank=0``, D7). Both were missed: the dict's ``train_loss`` was dropped,
the JSON record with a suffix only counted unread (or, behind a prefix too, not even that), and the
run ended "finished, watched" over a NaN model. Now each is rolled back at step 20, its evidence
the job's line, and the end of the clean restart says no line went unread.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import history

PY = sys.executable

# Attempt 0 writes its NaN from step 20 (the line as %s builds it from s and loss), then waits to be
# stopped; the restart runs clean.
JOB = """\
import os, sys, time
first = os.environ["TSUP_ATTEMPT"] == "0"
for s in range(1, 31):
    loss = float("nan") if first and s >= 20 else 2.5 - s / 100
    print(%s, flush=True)
    if first and s >= 20:
        time.sleep(0.2)
if first:
    time.sleep(60)
"""

FORMS = {
    "dict_train_loss": ("{'step': s, 'train_loss': loss, 'epoch': s / 30}", "{'step': 20, 'train_loss': nan"),
    "json_prefix_suffix": ("f'2024-01-01 12:00:00 INFO {{\"step\": {s}, \"loss\": {loss}}} rank=0 (12.3 it/s)'",
                           '2024-01-01 12:00:00 INFO {"step": 20, "loss": nan} rank=0'),
}


def config(tmp: Path) -> Path:
    cfg = tmp / "t.toml"
    cfg.write_text(f'[job]\nworkdir = "{tmp}"\n\n[shutdown]\ngrace_s = 2\n')
    return cfg


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_nan_record_with_noise_around_it_is_rolled_back(daemons, tmp_path: Path, form: str) -> None:
    expr, evidence = FORMS[form]
    job = tmp_path / "job.py"
    job.write_text(JOB % expr)
    d = daemons(["wrap", "--state-dir", str(tmp_path / "sd"), "--backoff", "0", "--config", str(config(tmp_path)),
                 "--", PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    h = history(tmp_path / "sd")
    a = h["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "rollback"), (None, None)], a
    assert (a[0]["detection"]["step"], a[0]["detection"]["onset_step"]) == (20, 20), a[0]["detection"]
    assert a[0]["detection"]["evidence"].startswith(evidence), a[0]["detection"]
    assert "unread" not in h["reason"] and "NOT fully watched" not in h["reason"], h["reason"]
