"""Issue 38 part 2 through the real daemon: with [job] prewarm on, ``pgrep -f job.py`` finds the
job of every attempt (the first, cold through the runner, and the next, run in the standby), and
each one's /proc/PID/cmdline and ``sys.orig_argv`` are the configured command."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import history
from tests.e2e.test_prewarm_e2e import WAITS_FOR_STANDBY, _wrap

PY = sys.executable

# Each attempt says what pgrep -f and its own cmdline show; attempt 0 fails once the standby for
# attempt 1 is up, so that attempt 1 runs in it.
JOB = WAITS_FOR_STANDBY + """
import json, subprocess
me, attempt = str(os.getpid()), os.environ["TSUP_ATTEMPT"]
found = subprocess.run(["pgrep", "-f", "job.py --tag"], capture_output=True, text=True).stdout.split()
def cmd(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode()
    except OSError:
        return ""
# A process pgrep matched while it was forked from the daemon (whose argv holds the command) and
# not yet exec'd (the next standby, started meanwhile) reads as what it became: only those that
# still match are the ones pgrep really finds.
others = [c for c in (cmd(p) for p in found if p != me) if "job.py\\0--tag" in c]
json.dump({"found": me in found, "others": others, "orig_argv": sys.orig_argv,
           "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").decode().split("\\0")},
          open(f"attempt-{attempt}.json", "w"))
print("step 1: loss 1.0", flush=True)
if attempt == "0":
    wait_for_standby()
    sys.exit(1)
"""


def test_pgrep_finds_the_job_of_every_attempt_with_prewarm_on(daemons, tmp_path: Path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    (out / "job.py").write_text(JOB)
    argv = [PY, "job.py", "--tag", "t1"]
    d = daemons(_wrap(sd, out) + argv)
    assert d.wait(60) == 0, d.stderr()[-3000:]
    rows = history(sd)["attempts"]
    assert [r["prewarm"].split(":")[0] for r in rows] == ["cold", "used"], rows
    for n in (0, 1):
        seen = json.loads((out / f"attempt-{n}.json").read_text())
        assert seen["found"], seen  # (and the wrap daemon, whose own argv holds the command)
        assert not [c for c in seen["others"] if "standby.py" in c], seen  # never the waiting standby
        assert seen["cmdline"] == argv and seen["orig_argv"] == argv, seen
