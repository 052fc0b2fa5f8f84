"""Client verbs with a config holding one bad value (issue 34 D9): ``status``, ``logs`` and ``stop``
read only its state dir and still reach the daemon (a warning names the bad key); ``reload`` is
refused naming the key, exit 2 as check-config, never a traceback. The real CLI, a real daemon."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, helper
from tests.util import wait_for

TSUP = [sys.executable, "-m", "supervisor"]


def test_stop_status_logs_reach_the_daemon_and_reload_is_refused(daemons, tmp_path: Path):
    sd = tmp_path / "state"
    d = daemons(["wrap", "--name", "w", "--state-dir", str(sd), "--backoff", "0.1", "--",
                 sys.executable, helper("ops_job.py")], env={"OPS_DIR": str(tmp_path)})
    wait_for(lambda: (sd / "control.sock").exists(), 30, 0.1, "control socket")
    conf = tmp_path / "bad.toml"
    conf.write_text(f'[job]\nname = "w"\ncommand = ["true"]\n[state]\ndir = "{sd}"\n[shutdown]\ngrace_s = inf\n')

    def tsup(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*TSUP, *args, "--config", str(conf)], capture_output=True, text=True, timeout=120,
                              cwd=str(ROOT))

    r = tsup("status", "--json")
    assert r.returncode == 0 and '"state"' in r.stdout, r.stdout + r.stderr
    assert "grace_s" in r.stderr and "warning" in r.stderr and "Traceback" not in r.stderr
    r = tsup("logs", "-n", "5")
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr and "grace_s" in r.stderr, r.stderr
    r = tsup("reload")
    assert r.returncode == 2 and "grace_s" in r.stderr and "reload refused" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    r = tsup("stop", "--wait")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert d.proc.wait(30) == 0
