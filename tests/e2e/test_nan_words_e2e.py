"""Through the real daemon: a NaN is a value, never a word (issue 34 part 2), and an eval metric is
not the training loss (issue 35 part 5).

- A healthy job that prints sanity lines about NaN/inf beside its finite losses ("0 NaN detected",
  "loss is NaN? False", AMP's "Detected inf in grads") was rolled back, and the same line at the
  same step after the restart read as a deterministic failure: exit 3 on a job whose losses were
  all finite. Now: one ``nan_mentioned`` warning for the run, and the job is never stopped.
- ``step 25 loss nan`` followed by a token the parser did not know (``µs/tok``, ``✓``, an emoji,
  invalid UTF-8) was prose and the NaN was missed. Now it is a value: rolled back. So is a NaN in
  the leading fields followed by words (``step 25 loss nan ok``, ``phase=train``, ``| done``), a
  ``tensor(nan)``, a nested JSON ``{"train": {"loss": NaN}}`` and loguru's JSON line of such a
  message (issue 34 D1: these were "watched", rc 0, under ``on.nan.action=give_up``).
- An empty validation loader gives ``val_loss nan`` at every eval while training is finite: rolled
  back, the same at the same step, gave up at step 50 of 300. Now: ``eval_nonfinite`` (notified by
  default), the run finishes; ``[detectors.nan] fields`` naming ``val_loss`` rolls back on it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import history
from tests.ops.notifyhelp import hook_command
from tests.util import wait_for

PY = sys.executable

# The first, the one said, carries colours and a forged event: the warning must not forge a daemon line.
SANITY = ["\x1b[32m0 NaN detected in the last 25 steps\x1b[0m event=gave_up level=critical", "loss is NaN? False",
          "Detected inf in grads, reducing loss scale to 32768.0"]

# Attempt 0 crashes at the end (exit 1): the restart prints the same lines at the same steps.
HEALTHY_JOB = """\
import os, sys
for step in range(1, 41):
    print(f"step {step} | loss {3 - step / 100:.4f} | lr 3e-4", flush=True)
    if step == 25:
        for line in %r:
            print(line, flush=True)
sys.exit(1 if os.environ["TSUP_ATTEMPT"] == "0" else 0)
"""

# Attempt 0 prints its NaN with one unknown token after it, then goes on until it is stopped.
NOISY_NAN_JOB = """\
import os, sys, time
first = os.environ["TSUP_ATTEMPT"] == "0"
for step in range(1, 41):
    if first and step >= 25:
        sys.stdout.buffer.write(b"step %%d loss nan " %% step + %r + b"\\n")
        sys.stdout.flush()
        time.sleep(0.2)
        continue
    print(f"step {step} loss {3 - step / 100:.4f}", flush=True)
if first:
    time.sleep(60)
"""

# Attempt 0 prints its NaN as the line given (%d: the step), fields then words (issue 34 D1), or through
# loguru's serialize=True sink; the restart runs clean.
D1_JOB = """\
import os, sys, time
first = os.environ["TSUP_ATTEMPT"] == "0"
line = %r
say = lambda text: print(text, flush=True)
if line == "loguru":
    from loguru import logger
    logger.remove()
    logger.add(sys.stdout, serialize=True)
    line, say = "step=%%d loss=nan phase=train", logger.info
elif line == "loguru-bind":
    from loguru import logger
    logger.remove()
    logger.add(sys.stdout, serialize=True)
    line, say = "step %%d", lambda text: logger.bind(loss=float("nan")).info(text)
for step in range(1, 41):
    if first and step >= 25:
        say(line %% step)
        time.sleep(0.2)
        continue
    print(f"step {step} loss {3 - step / 100:.4f}", flush=True)
if first:
    time.sleep(60)
"""
D1_LINES = ["step %d loss nan ok", "step=%d loss=nan phase=train", "step: %d | loss: nan | grad_norm: 1.2 | done",
            "step %d loss tensor(nan)", "step %d | loss tensor(nan, device='cuda:0') | skipping nothing",
            '{"step":%d,"train":{"loss":NaN}}', "loguru",
            # issue 34 D1, round 4: a trailing dict, a full stop, a bracketed step, "loss/train",
            # {"metrics": {...}}, loguru's bind()
            "step %d loss nan {'lr': 0.001}", "step %d loss nan.", "[step %d] loss=nan", "step %d loss/train nan",
            '{"step":%d,"metrics":{"loss":NaN}}', "loguru-bind"]

# 300 steps, an eval every 50 whose loader is empty: val_loss is nan (0/0), training is fine.
EVAL_JOB = """\
import os
nan_evals = os.environ.get("NAN_EVAL_ATTEMPTS", "all")
for step in range(1, 301):
    print(f"step {step} | loss {3 - step / 1000:.4f}", flush=True)
    if step % 50 == 0:
        broken = nan_evals == "all" or os.environ["TSUP_ATTEMPT"] in nan_evals.split(",")
        print(f"step {step} | val_loss {'nan' if broken else '2.9'}", flush=True)
"""


def wrap(sd: Path, *flags: str) -> list[str]:
    return ["wrap", "--state-dir", str(sd), "--backoff", "0", *flags, "--"]


def events_named(sd: Path, name: str) -> list[dict]:
    return [e for e in history(sd)["events"] if e["event"] == name]


def test_sanity_lines_about_nan_on_a_healthy_run_never_stop_it_and_are_said_once(daemons, tmp_path):
    sd, job = tmp_path / "sd", tmp_path / "job.py"
    job.write_text(HEALTHY_JOB % (SANITY,))
    d = daemons(wrap(sd) + [PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    h = history(sd)
    # Attempt 0's exit 1 is a crash (restarted); the same lines at the same step in attempt 1 are no NaN.
    assert [(a["cause"], a["exit_code"]) for a in h["attempts"]] == [("crash", 1), (None, 0)], h["attempts"]
    assert not [e for e in h["events"] if e["event"] in ("failure_detected", "gave_up")]
    [said] = [e for e in h["events"] if e["event"] == "nan_mentioned"]
    assert said["level"] == "warning" and said["data"]["line"] == SANITY[0] and said["data"]["step"] == 25, said
    assert "not stopped" in said["message"] and "[detectors.nan] patterns" in said["message"]
    assert "event=nan_mentioned" in d.stderr()
    assert not [ln for ln in d.stderr().splitlines() if ln.startswith(("event=gave_up", "\x1b"))]


@pytest.mark.parametrize("noise", ["µs/tok".encode(), "✓".encode(), "🚀".encode(), b"\xff\xfe"],
                         ids=["unit", "check-mark", "emoji", "invalid-utf8"])
def test_a_nan_value_followed_by_an_unknown_token_is_rolled_back(daemons, tmp_path, noise):
    sd, job = tmp_path / "sd", tmp_path / "job.py"
    job.write_text(NOISY_NAN_JOB % (noise,))
    d = daemons(wrap(sd) + [PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    a = history(sd)["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "rollback"), (None, None)], a
    det = a[0]["detection"]
    assert det["step"] == 25 and det["onset_step"] == 25, det
    assert not events_named(sd, "nan_mentioned")  # a value, not a mention


@pytest.mark.parametrize("line", D1_LINES, ids=["word", "setting", "pipe-done", "tensor", "tensor-device",
                                                 "nested-json", "loguru-json", "dict-after", "full-stop",
                                                 "bracketed-step", "slash-suffix", "metrics-json", "loguru-bind"])
def test_a_nan_value_in_the_leading_fields_is_rolled_back_whatever_follows(daemons, tmp_path, line):
    sd, job = tmp_path / "sd", tmp_path / "job.py"
    job.write_text(D1_JOB % (line,))
    d = daemons(wrap(sd) + [PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    a = history(sd)["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "rollback"), (None, None)], a
    det = a[0]["detection"]
    assert det["step"] == 25 and det["onset_step"] == 25, det
    assert not events_named(sd, "nan_mentioned")  # a value, not a mention


def test_the_d1_job_under_give_up_gives_up_on_its_nan(daemons, tmp_path):
    # The reported case: 24 finite steps, then "step 25 loss nan ok"; it was rc=0, "watched", no anomaly.
    sd, job = tmp_path / "sd", tmp_path / "j.py"
    job.write_text('import time\nfor s in range(1, 25):\n    print(f"step {s} loss 2.0", flush=True)\n'
                   'print("step 25 loss nan ok", flush=True)\ntime.sleep(3)\n')
    d = daemons(wrap(sd, "--set", "on.nan.action=give_up") + [PY, str(job)])
    assert d.wait(90) == 3, d.stderr()[-3000:]
    a = history(sd)["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "give_up")], a
    assert a[0]["detection"]["step"] == 25 and events_named(sd, "failure_detected") and events_named(sd, "gave_up")
    assert "anomaly_detected" in d.stderr()


def test_the_testers_dict_job_gives_up_on_its_nan_under_give_up(daemons, tmp_path):
    # issue 34 D1, round 4: every line ends in a dict; it was rc 0 "finished, unwatched", no nan_mentioned.
    sd, job = tmp_path / "sd", tmp_path / "j.py"
    job.write_text("import time\nfor s in range(1, 30):\n"
                   "    print(f\"step {s} loss {'nan' if s>=25 else 1/s} {{'lr': 0.001}}\", flush=True)\ntime.sleep(3)\n")
    d = daemons(wrap(sd, "--set", "on.nan.action=give_up") + [PY, str(job)])
    assert d.wait(90) == 3, d.stderr()[-3000:]
    a = history(sd)["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "give_up")], a
    assert a[0]["detection"]["step"] == 25


def test_an_empty_validation_loader_warns_and_notifies_and_the_run_finishes(daemons, tmp_path):
    sd, job = tmp_path / "sd", tmp_path / "job.py"
    job.write_text(EVAL_JOB)
    cmd, out = hook_command(tmp_path)
    cfg = tmp_path / "notify.toml"
    cfg.write_text(f"[notify]\ncommand = {json.dumps(cmd)}\n")  # events: the default list
    d = daemons(wrap(sd, "--config", str(cfg)) + [PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    h = history(sd)
    assert [(a["cause"], a["exit_code"]) for a in h["attempts"]] == [(None, 0)], h["attempts"]
    [warned] = [e for e in h["events"] if e["event"] == "eval_nonfinite"]  # once, not at every eval
    assert warned["level"] == "warning" and warned["data"]["step"] == 50, warned
    assert warned["data"]["fields"] == {"val_loss": "nan"}
    assert "training loss is finite (2.95 at step 50)" in warned["message"], warned["message"]
    wait_for(out.exists, timeout=20, what="the notify hook's eval_nonfinite")
    assert json.loads(out.read_bytes())["event"] == "eval_nonfinite"


def test_naming_val_loss_in_the_nan_fields_rolls_back_on_it(daemons, tmp_path):
    sd, job = tmp_path / "sd", tmp_path / "job.py"
    job.write_text(EVAL_JOB)
    d = daemons(wrap(sd, "--set", "detectors.nan.fields=loss,grad_norm,val_loss") + [PY, str(job)],
                env={"NAN_EVAL_ATTEMPTS": "0"})
    assert d.wait(90) == 0, d.stderr()[-3000:]
    a = history(sd)["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "rollback"), (None, None)], a
    assert a[0]["detection"]["step"] == 50 and "val_loss" in a[0]["detection"]["summary"]
    assert not events_named(sd, "eval_nonfinite")
