"""The controlled reboot end to end on the demo job (a real tiny GPT on the CPU, real faults
injected by the job, the real daemon): causes, actions, checkpoints, validation verdicts, and the
faulted run ending where a fault-free run with the same seed ends."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, history

pytestmark = pytest.mark.slow
PY = sys.executable
# The faulted run and the clean run it is compared with: 250 steps, a checkpoint every 50. Each
# fault is placed explicitly (the default fractions of 250 would put the NaN on a checkpoint step)
# a few steps past a checkpoint, with more than the 20 validated steps between a resume and the
# next fault: nan 60 -> resume 50, hang 105 -> 100, crash 156 -> 150, corrupt_ckpt at 200 (step
# 200's file truncated, then a crash) -> 150. Every step is CPU time on a shared machine: no more
# of them than the claims need.
STEPS = 250
FAULTS = "nan@60,hang@105,crash@156,corrupt_ckpt@200"


def demo(out: Path, faults: str, steps: int = STEPS, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", "demo", "--out", str(out), "--faults", faults,
                           "--steps", str(steps)], cwd=str(ROOT), capture_output=True, text=True, timeout=timeout)


def timing_only_failure(attempt: dict) -> bool:
    """A resume whose validation failed on throughput or start-up time only."""
    checks = (attempt.get("validation") or {}).get("checks") or {}
    bad = {k for k, c in checks.items() if c["passed"] is False}
    return attempt["cause"] == "validation_failed" and bool(bad) and bad <= {"throughput", "startup"}


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("clean") / "demo"
    cp = demo(out, "none")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    return json.loads((out / "job_summary.json").read_text())


def test_faulted_demo_recovers_each_fault_and_ends_like_a_clean_run(tmp_path, fault_free):
    out = tmp_path / "demo"
    cp = demo(out, FAULTS)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    h = history(out / "state")
    raw = h["attempts"]
    # On a loaded 2-core machine a resume's validation may fail on timing alone (throughput,
    # start-up; the demo allows 50 % of the baseline): the daemon then rolls back further, as the
    # contract says. Allowed, but only for those checks; every fault is still seen and recovered
    # and the run still ends where the clean one does.
    atts = [a for a in raw if not timing_only_failure(a)]
    causes = [a["cause"] for a in atts]
    assert causes == ["nan", "hang", "crash", "crash", None], [a["cause"] for a in raw]
    assert [a["action"] for a in atts[:4]] == ["rollback", "restart", "restart", "restart"]
    # nan at step 60: the poison may have begun right after the last finite record
    # (step 50 on stdout, printed every 10 steps; 59 from the client's per-step reports), so the
    # onset is 51..60 and the rollback resumes from the checkpoint before it (step 50).
    onset = atts[0]["detection"]["onset_step"]
    assert 51 <= onset <= 60 and raw[1]["resume_step"] == 50, (onset, raw[1]["resume_step"])
    # The hung job's stacks were saved before it was killed.
    stacks = [e for e in h["events"] if e["event"] == "stacks_dumped"]
    assert stacks and Path(stacks[0]["data"]["path"]).exists()
    # The corrupt newest checkpoint (step 200) cost one cycle: quarantined, step 150 used instead.
    q = [e for e in h["events"] if e["event"] == "checkpoint_quarantined"]
    assert len(q) == 1 and q[0]["data"]["source"].endswith("step_000200.pt")
    assert (out / "checkpoints" / "quarantine" / "step_000200.pt").exists()
    # The newest good one below it: step 150, or a checkpoint the job saved on the daemon's request
    # after 150 (an emergency save at a precursor or a stop: on a loaded machine one lands at ~173).
    after_last_crash = raw[max(i for i, a in enumerate(raw) if a["cause"] == "crash") + 1]
    step = after_last_crash["resume_step"]
    assert step is not None and 150 <= step < 200, step
    assert (out / "checkpoints" / f"step_{step:06d}.pt").exists(), step
    # Every resume was validated and passed (timing-only failures aside, see above; a start from
    # scratch after such a rollback has nothing to validate against).
    resumes = [a for a in atts[1:] if a["resume_step"] is not None]
    assert len(resumes) >= 3 and all(a["validation"]["verdict"] == "pass" for a in resumes), \
        [a["validation"] for a in raw]
    # Deterministic data order + exact state restore: the faulted run ends where the clean one does.
    final = json.loads((out / "job_summary.json").read_text())
    assert final["step"] == fault_free["step"]
    assert abs(final["val_loss"] - fault_free["val_loss"]) / fault_free["val_loss"] < 0.05
    # The report: HTML with the loss curve and markers, and the PNG beside it.
    html = (out / "report" / "report.html").read_text()
    assert "data:image/png;base64" in html and "nan" in html and "quarantine" in html
    assert (out / "report" / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The narration names each detection and recovery in words.
    for words in ("detected nan", "detected hang", "failed verification", "validation passed"):
        assert words in cp.stdout, words
    # Nothing deleted: every checkpoint the job wrote is still on disk (one in quarantine).
    written = {p.name for p in (out / "checkpoints").glob("step_*.pt")} | {"step_000200.pt"}
    assert {f"step_{s:06d}.pt" for s in range(50, STEPS + 1, 50)} <= written


def test_validation_failure_rolls_back_with_diagnostics(tmp_path):
    out = tmp_path / "demo"
    # 200 steps (the crash's default fraction, 0.52, puts it at step 104, two checkpoints in):
    # crash at step 104 -> resume from 100; bad_resume makes that attempt train with LR x100, so
    # its loss is off -> validation_failed -> roll back further (to 50), with the diagnostics env.
    cp = demo(out, "crash,bad_resume", steps=200)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    atts = history(out / "state")["attempts"]
    causes = [a["cause"] for a in atts]
    # On a loaded 2-core machine a later validation may also fail on timing alone (throughput,
    # start-up): allowed, but only for those checks; the run must still end well.
    assert causes[:2] == ["crash", "validation_failed"] and causes[-1] is None, causes
    for a in atts[2:-1]:
        assert timing_only_failure(a), a["validation"]
    failed = atts[1]["validation"]
    assert failed["verdict"] == "fail" and failed["checks"]["initial_loss"]["passed"] is False
    assert atts[1]["action"] == "rollback"
    assert atts[2]["resume_step"] < atts[1]["resume_step"]
    assert atts[2]["env"]["NCCL_DEBUG"] == "INFO" and atts[2]["env"]["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert "NCCL_DEBUG" not in atts[1]["env"]
    last = atts[-1]
    seen = [(a["cause"], a["resume_step"], (a["validation"] or {}).get("verdict")) for a in atts]
    if last["resume_step"] is not None:
        assert (last["validation"] or {}).get("verdict") == "pass", seen
    else:  # timing-only failures (above) rolled back past the first checkpoint: a fresh start has
        assert len(atts) > 3 and last["validation"] is None, seen  # nothing to be validated against
    # The end in words and units, on the console and in the report: no Python repr, no raw JSON.
    end = [ln.split("] ", 1)[1].strip() for ln in  # without the "[mm:ss] " stamps
           cp.stdout[cp.stdout.index("== finished in"):cp.stdout.index("== report:")].splitlines()[1:]]
    facts = dict(ln.split(": ", 1) for ln in end if ": " in ln)
    assert not [ln for ln in end if re.search(r"[{}\[\]']|True|False|None", ln)], end
    assert re.fullmatch(r"\d+(\.\d)?% of the wall time was training that was kept", facts["goodput"]), facts
    by_cause = facts["lost time by cause"].split(", ")
    assert by_cause and all(re.fullmatch(r"[a-z_]+ \d.* (s|min|h)", c) for c in by_cause), facts
    assert any(c.startswith("crash ") for c in by_cause) and facts["wall time"].endswith((" s", " min"))
    page = (out / "report" / "report.html").read_text()
    summary = page[page.index("<h2>Summary</h2>"):page.index("<h2>Loss curve</h2>")]
    assert f"<td>lost time by cause</td><td>{facts['lost time by cause']}</td>" in summary
    assert not re.search(r"[{}\[\]]|&#x27;|&quot;", summary), summary
    # the restart table's marker is the decision: the crash restarted, the failed validation rolled back
    table = page[page.index("<h2>Restarts and rollbacks</h2>"):page.index("<h2>Attempt timeline</h2>")]
    marks = re.findall(r"<tr><td>(restart|rollback)</td><td>\d+</td><td>([a-z_]+)</td>", table)
    assert marks[:2] == [("restart", "crash"), ("rollback", "validation_failed")], marks
