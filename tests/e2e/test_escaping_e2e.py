"""A job's bidi controls, escape sequences and control bytes never reach the operator's terminal
as they are (issue 34), through the real daemon and the real CLI: the console of a ``wrap`` run
(``--log-format console``), ``status`` while the daemon runs and after it exited (the job log's
last lines), and what ``status``/``logs`` say of a state dir whose name holds them. U+202E
(RIGHT-TO-LEFT OVERRIDE) would make ``loss 2.3`` read backwards; each is shown as ``\\u202e``.
``logs`` itself prints the job's bytes as they are (docs/operating.md: ``logs > file`` equals the
file), so it is not checked here for the job's lines."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.util import wait_for

PY = sys.executable
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
JOB = """\
import os, sys, time
for i in range(6):
    print(f"epoch {i} \\u202eevil {i}\\u202c \\u2066iso\\u2069 \\u200fmark \\x1b[31mred\\x1b[0m \\x85end", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def _raw(text: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in text if c in BIDI or c in "\x1b\x85"]


def test_a_jobs_bidi_controls_are_escaped_on_the_console_and_in_status(daemons, tmp_path: Path) -> None:
    job, go, sd = tmp_path / "job.py", tmp_path / "go", tmp_path / "sd"
    job.write_text(JOB)
    cfg = tmp_path / "c.toml"
    cfg.write_text("[detectors]\nblind_after_lines = 5\nblind_after_s = 0\n")
    # The fixture starts with --log-format logfmt; the later flag is the one argparse keeps.
    d = daemons(["--log-format", "console", "wrap", "--config", str(cfg), "--state-dir", str(sd), "--",
                 PY, str(job), str(go)])
    wait_for(lambda: "metrics_blind" in d.stderr() and "evil 5" in d.stderr(), 30, 0.05,
             "the blind warning with the job's sample lines on the console")
    running = _cli("status", "--state-dir", str(sd))
    running_json = _cli("status", "--json", "--state-dir", str(sd))
    go.touch()
    assert d.wait(30) == 0, d.stderr()[-3000:]
    console = d.stderr()
    # The daemon's own lines: each sample said, its controls as visible escapes, none raw.
    assert not _raw(console) and "epoch 5 \\u202eevil 5\\u202c \\u2066iso\\u2069 \\u200fmark red \\x85end" in console, \
        console[-3000:]
    assert running.returncode == 0 and not _raw(running.stdout), running.stdout
    # JSON escapes what it holds its own way (\u202e in the document), and the reader's program reads it.
    assert "\u202e" in json.dumps(json.loads(running_json.stdout), ensure_ascii=False) and not _raw(running_json.stdout)
    # No daemon: status shows the end of the job's log, each line as a terminal draws it, escaped.
    after = _cli("status", "--state-dir", str(sd))
    assert after.returncode == 3 and not _raw(after.stdout), after.stdout
    assert "  epoch 5 \\u202eevil 5\\u202c \\u2066iso\\u2069 \\u200fmark red \\x85end" in after.stdout, after.stdout


def test_what_the_cli_says_of_a_state_dir_named_with_bidi_controls_is_escaped(tmp_path: Path) -> None:
    sd = tmp_path / "run\u202egol.txt"
    sd.mkdir()
    for verb in ("status", "logs", "stop"):
        cp = _cli(verb, "--state-dir", str(sd))
        assert cp.returncode == 1 and "run\\u202egol.txt" in cp.stderr and not _raw(cp.stderr), (verb, cp.stderr)
