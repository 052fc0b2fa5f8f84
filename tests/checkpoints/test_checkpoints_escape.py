"""A checkpoint named by the job with control bytes (issue 34 D3): ``torch.save(..., 'ckpt/step_99
\\x1b]0;T\\x07\\x1b[2J\\nready yes FORGED.pt')`` must not forge a line of the ``checkpoints`` table or of
its stderr progress, nor drive the terminal: through the real CLI, every control byte is an escape."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from supervisor.checkpoints.inprogress import InProgress, render
from tests.helpers import ckpt_factory as F

HOSTILE = "step_99\x1b]0;T\x07\x1b[2J\nready yes FORGED.pt"


def test_a_hostile_checkpoint_name_is_escaped_in_the_table_and_the_progress_line(tmp_path: Path) -> None:
    ck = tmp_path / "ckpt"
    F.torch_file(ck / HOSTILE, 99)
    F.torch_file(ck / "step_50.pt", 50)
    cp = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "--no-load-test", "--checkpoint-dir",
                         str(ck), "--state-dir", str(tmp_path / "sd")], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    for stream in (cp.stdout, cp.stderr):
        assert "\x1b" not in stream and "\x07" not in stream
        assert not any(line.startswith("ready yes FORGED") for line in stream.splitlines()), stream
    escaped = "step_99\\x1b]0;T\\x07\\x1b[2J\\nready yes FORGED.pt"
    assert escaped in cp.stdout and f"{escaped}: " in cp.stderr, (cp.stdout, cp.stderr)
    assert "step_50.pt" in cp.stdout  # the honest one is listed as ever
    assert len(cp.stdout.splitlines()) == 3, cp.stdout  # the header and one line per checkpoint


def test_a_checkpoint_being_written_under_a_hostile_name_is_one_escaped_line(tmp_path: Path) -> None:
    row = InProgress(path=tmp_path / HOSTILE, step=None, size=10, mtime=0.0, reason="no manifest\nyet")
    text = render([row], now=1.0)
    assert "\n" not in text and "\x1b" not in text and "\\x1b[2J\\nready yes FORGED.pt" in text
    assert "no manifest\\nyet" in text
