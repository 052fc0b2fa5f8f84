"""``status`` and ``logs -n N`` read a bounded part of the job log (issue 34 D4): a tqdm bar off
a terminal writes ``\\r``-separated segments and never a newline, one "line" of hundreds of MB; it
was read whole into memory (``status`` at 1.0 GB RSS, past 15 s on a 3 GB sparse log). Now each
shown line is its last 64 KiB at most, said as cut, the backward scan reads at most ``n`` x 256 KiB,
and ``status`` shows what a terminal would (a line's last ``\\r`` segment)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

from supervisor.cli.logs import MAX_LINE_BYTES, copy_last_lines, copy_lines_capped, terminal_lines

PY = sys.executable
BIG = 300 << 20
BAR = "\r".join(f"train: {i}%|{'#' * (i // 10)}| {i}/100 [00:{i:02d}<00:10]" for i in range(101))


def _copy(data: bytes, n: int, path: Path) -> bytes:
    path.write_bytes(data)
    out = io.BytesIO()
    with path.open("rb") as f:
        copy_last_lines(path, f, len(data), n, out)
    return out.getvalue()


def test_an_over_long_line_keeps_its_last_64_kib_said_as_cut(tmp_path: Path) -> None:
    long = b"x" * (3 * MAX_LINE_BYTES) + b"END"
    got = _copy(b"first\n" + long + b"\nlast\n", 3, tmp_path / "job.log")
    lines = got.split(b"\n")
    assert lines[0] == b"first" and lines[2] == b"last" and lines[3] == b""
    cut = 3 * MAX_LINE_BYTES + 3 - MAX_LINE_BYTES
    assert lines[1] == f"\u2026({cut} bytes cut) ".encode() + long[-MAX_LINE_BYTES:]
    # Short lines, and all of a log (-n 0), are copied byte for byte as ever.
    assert _copy(b"a\r\nb\x1b[2J\nc", 2, tmp_path / "j2.log") == b"b\x1b[2J\nc"
    assert _copy(b"first\n" + long, 0, tmp_path / "j3.log") == b"first\n" + long


def test_an_unterminated_line_past_the_scan_budget_starts_cut(tmp_path: Path) -> None:
    data = b"older\n" + b"y" * (30 * MAX_LINE_BYTES) + BAR.encode()
    got = _copy(data, 5, tmp_path / "job.log")
    assert got.startswith("\u2026(cut) ".encode()) and got.endswith(BAR.encode()) and b"older" not in got
    assert len(got) <= MAX_LINE_BYTES + 40
    buf = io.BytesIO()
    copy_lines_capped(io.BytesIO(b"ab\ncdefgh\n"), 0, 10, buf, max_line=3)
    assert buf.getvalue() == "ab\n\u2026(3 bytes cut) fgh\n".encode()


def test_status_shows_the_last_segment_of_a_redrawn_line() -> None:
    assert terminal_lines(f"epoch 1\r\nloading\n{BAR}".encode(), 10) == ["epoch 1", "loading", BAR.rsplit("\r")[-1]]
    assert terminal_lines(b"a\nb\nc\n", 2) == ["b", "c"] and terminal_lines(b"", 3) == []


def _measured(args: list[str]) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """One CLI run in a fresh process, its wall time and its max RSS (KiB): measured by a wrapper
    whose only child it is (RUSAGE_CHILDREN of this test process would hold every child so far)."""
    wrapper = ("import json, resource, subprocess, sys, time; t = time.monotonic(); "
               "cp = subprocess.run(sys.argv[1:], capture_output=True); d = lambda b: b.decode('utf-8', 'replace'); "
               "print(json.dumps([cp.returncode, d(cp.stdout), d(cp.stderr), time.monotonic() - t, "
               "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    cp = subprocess.run([PY, "-c", wrapper, *args], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    rc, out, err, wall, rss = json.loads(cp.stdout)
    return subprocess.CompletedProcess(args, rc, out, err), wall, rss


def test_a_300_mb_unterminated_log_costs_status_and_logs_a_bounded_read(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "ledger.sqlite").write_bytes(b"garbled, not a ledger" * 200)  # status still shows the log's tail
    log = sd / "job.log"
    with log.open("wb") as f:
        f.write(b"step 1 loss 2.5\n")
        f.truncate(BIG)  # sparse: 300 MB of one line without a newline
        f.seek(BIG)
        f.write(("\r".join([BAR] * 4000)).encode())  # then a bar redrawn in place, ~20 MB, still no newline
    size = log.stat().st_size
    assert size > BIG
    base, _wall, base_rss = _measured([PY, "-c", "import supervisor.cli.main"])
    assert base.returncode == 0
    t = time.monotonic()
    st, st_wall, st_rss = _measured([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sd)])
    logs, logs_wall, logs_rss = _measured([PY, "-m", "supervisor", "logs", "-n", "5", "--state-dir", str(sd)])
    tail = json.loads(st.stdout)["log_tail"]
    assert tail[-1] == BAR.rsplit("\r")[-1], tail  # what a terminal shows: the bar's last state
    assert logs.returncode == 0 and logs.stdout.startswith("\u2026(cut) ") and logs.stdout.endswith(BAR)
    assert len(logs.stdout.encode()) <= MAX_LINE_BYTES + 40
    # Reading 300 MB took seconds and a GB; a bounded read is well under either on a loaded machine.
    assert st_wall < 10 and logs_wall < 10 and time.monotonic() - t < 20, (st_wall, logs_wall)
    assert st_rss - base_rss < 64 << 10 and logs_rss - base_rss < 64 << 10, (base_rss, st_rss, logs_rss)
