"""A load test's output is read to bounded tails (issue 34 part 3): a "python" that prints 100 MB
(400x OUTPUT_TAIL_BYTES) before its result line or its error costs the daemon a tail, not the
100 MB, and the result or the last error line is still read. The child is a real process: a
stand-in interpreter that ignores the load test's script."""
from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

from supervisor.checkpoints.loadtest import OUTPUT_TAIL_BYTES, LoadTestRequest, run_load_test

LOUD = 100 << 20


def loud_python(tmp: Path, stream: str, tail: str, code: int) -> str:
    """An executable that writes LOUD bytes to ``stream``, then ``tail`` to it, and exits ``code``."""
    exe = tmp / "loud-python"
    exe.write_text(f"#!{sys.executable}\nimport sys\nout = sys.{stream}.buffer\nblock = b'x' * (1 << 20)\n"
                   f"for _ in range({LOUD >> 20}):\n    out.write(block)\nout.write({tail.encode()!r})\n"
                   f"out.flush()\nsys.exit({code})\n")
    exe.chmod(0o755)
    return str(exe)


def run(tmp: Path, python: str):
    tracemalloc.start()
    try:
        res = run_load_test(LoadTestRequest(tmp / "ckpt.pt"), python=python, timeout_s=120)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return res, peak


def test_a_load_test_printing_100_mb_then_its_result_line_is_read_in_a_bounded_tail(tmp_path: Path):
    line = "\nTSUP_LOADTEST_RESULT " + json.dumps({"passed": True, "seconds": 0.5, "step": 42, "keys": ["model"]}) + "\n"
    res, peak = run(tmp_path, loud_python(tmp_path, "stdout", line, 0))
    assert res.passed and res.step == 42 and res.keys == ("model",), res
    assert peak < 8 * OUTPUT_TAIL_BYTES, peak


def test_a_load_test_crashing_after_100_mb_of_stderr_says_its_last_line_in_a_bounded_tail(tmp_path: Path):
    res, peak = run(tmp_path, loud_python(tmp_path, "stderr", "\nRuntimeError: unpickling failed\n", 1))
    # no verdict line: the process ended before one (not tested, nothing said of the checkpoint)
    want = "the load test process ended without a verdict (exit status 1): RuntimeError: unpickling failed"
    assert not res.passed and res.error == want and res.untested == want, res
    assert peak < 8 * OUTPUT_TAIL_BYTES, peak


def test_the_warm_verifier_drops_a_100_mb_line_without_a_newline_and_still_reads_the_reply(tmp_path: Path):
    """The warm process's stdout is read line by line for the reply: a load that prints 100 MB
    without a newline (100x LINE_BYTES) costs at most LINE_BYTES, and the reply after it is read."""
    from supervisor.checkpoints.warm import LINE_BYTES, WarmVerifier

    exe = tmp_path / "warm-python"
    reply = "\nTSUP_LOADTEST_RESULT " + json.dumps({"passed": True, "step": 7}) + "\n"
    exe.write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.readline()\nout = sys.stdout.buffer\n"
                   f"block = b'.' * (1 << 20)\nfor _ in range({100 * LINE_BYTES >> 20}):\n    out.write(block)\n"
                   f"out.write({reply.encode()!r})\nout.flush()\nsys.stdin.readline()\n")
    exe.chmod(0o755)
    warm = WarmVerifier(str(exe), None)
    tracemalloc.start()
    try:
        got = warm.request('{"path": "x"}', 120)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        warm.close()
    assert got is not None and got.data == {"passed": True, "step": 7}, got
    assert peak < 4 * LINE_BYTES, peak
