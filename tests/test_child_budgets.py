"""Every short-lived child of the daemon reads its output to a bounded tail or head
(supervisor/childio.py; issue 34 part 3): the environment probe run with the job's Python, and
py-spy's stack dump. Each child here is a real process writing 400 MB, 100x past its bound."""
from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

from supervisor import childio
from supervisor.job.envsnapshot import python_probe
from supervisor.watch.stacks import DUMP_BYTES, dump_stacks

LOUD_MB = 400


def loud(tmp: Path, name: str, stream: str, first: str, last: str, code: int = 0) -> str:
    """An executable that writes ``first``, LOUD_MB of filler, then ``last`` to ``stream``."""
    exe = tmp / name
    exe.write_text(f"#!{sys.executable}\nimport sys\nout = sys.{stream}.buffer\nout.write({first.encode()!r})\n"
                   f"block = b'x' * (1 << 20)\nfor _ in range({LOUD_MB}):\n    out.write(block)\n"
                   f"out.write({last.encode()!r})\nout.flush()\nsys.exit({code})\n")
    exe.chmod(0o755)
    return str(exe)


def peak_of(fn):
    tracemalloc.start()
    try:
        value = fn()
        return value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_environment_probe_of_a_python_that_prints_400_mb_first_reads_its_result_in_a_tail(tmp_path: Path):
    python = loud(tmp_path, "python3", "stdout", "site hook noise\n", "\n" + json.dumps({"python": "3.11.9"}) + "\n")
    got, peak = peak_of(lambda: python_probe(python, timeout=120))
    assert got == {"python": "3.11.9"}
    assert peak < 8 * childio.KEEP_BYTES, peak


def test_a_stack_dump_of_400_mb_keeps_its_head_and_says_what_was_left_out(tmp_path: Path):
    spy = loud(tmp_path, "py-spy", "stdout", "Thread 1 (idle): MainThread\n", "the end\n")
    path, peak = peak_of(lambda: dump_stacks([1], tmp_path / "stacks", timeout_s=120, py_spy=spy))
    assert path is not None
    text = path.read_text()
    assert "Thread 1 (idle): MainThread" in text and "the end" not in text
    assert f"more bytes of this dump not kept (the first {DUMP_BYTES} are)" in text
    assert len(text) < DUMP_BYTES + 4096
    assert peak < 4 * DUMP_BYTES, peak  # the head, its copy, its text and the write: not the 400 MB
