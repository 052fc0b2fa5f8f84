"""job.log rotation by the output keeper ([job] log_max_bytes, log_keep; issue 37 part 10), with
real jobs, pipes and files: every byte in job.log + job.log.1..N, no line cut in two, the stderr
log rotated on its own, at most N kept, and the daemon's catch-up reading bursts back from the
rotated files."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.cli.logs import copy_last_lines
from supervisor.job.keeper import CHUNK, ROTATE_CUT_AFTER, rotated_logs
from supervisor.job.osapi import OsApi
from supervisor.job.output import SinkFanout
from supervisor.job.process import JobProcess, LaunchSpec
from tests.job.test_catchup import BURST, HeldSink
from tests.util import wait_for

# 30000 numbered lines (1.8 MB) on one stream (argv[1]), each line one write: more than the pipe
# (1 MiB) and a keeper read (CHUNK) hold, so it rotates several times however the keeper's reads
# fall. One stream: job.log is both as the keeper read them, and a read of a full pipe may end
# mid-line, so the other stream's bytes could land inside a line, rotation or not.
PRINTER = ("import sys\n"
           "out = getattr(sys, sys.argv[1])\n"
           "for i in range(30000):\n"
           "    out.write(f'line {i:05d} ' + 'x' * 48 + '\\n'); out.flush()\n")
LINES = [f"line {i:05d} " + "x" * 48 for i in range(30000)]
# print() with PYTHONUNBUFFERED (as the supervisor starts Python jobs) writes a line's text and its
# newline apart: the keeper's reads end mid-line, and a rotation must still fall between lines.
SPLIT_PRINTER = "for i in range(30000):\n    print(f'line {i:05d} ' + 'x' * 48)\n"
MAX = 8192


def run(tmp_path: Path, code: str, *args: str, keep: int, sink: HeldSink | None = None,
        max_bytes: int = MAX, env: dict[str, str] | None = None) -> tuple[JobProcess, HeldSink]:
    fan = SinkFanout()
    if sink is None:
        sink = HeldSink()
        sink.release.set()
    fan.add(sink)
    spec = LaunchSpec((sys.executable, "-c", code, *args), str(tmp_path), {**os.environ, **(env or {})}, {},
                      log_rotate=(max_bytes, keep))
    return JobProcess(spec, fan, None, tmp_path / "job.log", lambda _s: None, OsApi()), sink


def finish(job: JobProcess) -> None:
    wait_for(lambda: job.poll() is not None, 60, what="the job's exit")
    assert job.pumps_done(60), "the output was not handled to its end"
    job.close()
    assert os.waitstatus_to_exitcode(job.status or 0) == 0


def oldest_first(log: Path) -> list[Path]:
    return [Path(p) for p in reversed(rotated_logs(str(log)))] + [log]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_every_byte_is_in_job_log_and_its_rotated_files(tmp_path: Path, stream: str) -> None:
    log = tmp_path / "job.log"
    with capture_logs() as logs:
        job, sink = run(tmp_path, PRINTER, stream, keep=100)
        finish(job)
    assert sink.got[stream] == LINES  # every line handled, in order
    files = oldest_first(log)
    assert len(files) > 5, files  # 1.8 MB in reads of at most 256 KiB, at 8 KiB
    assert [p.name for p in files[:-1]] == [f"job.log.{n}" for n in range(len(files) - 1, 0, -1)]
    data = [p.read_bytes() for p in files]
    assert all(MAX <= len(d) <= MAX + CHUNK for d in data[:-1]), [len(d) for d in data]
    assert all(d.endswith(b"\n") for d in data[:-1]), "a line cut in two across two files"
    lines = b"".join(data).decode().splitlines()
    assert lines == LINES  # every byte, once, in order, across the files
    # job.stderr.log rotates on its own, at the same size: every stderr byte there too.
    err_files = oldest_first(tmp_path / "job.stderr.log")
    if stream == "stderr":
        assert len(err_files) > 5 and b"".join(p.read_bytes() for p in err_files).decode().splitlines() == LINES
    else:
        assert err_files == [tmp_path / "job.stderr.log"] and not err_files[0].read_bytes()
    # Each rotation of job.log is said once, naming the file and the setting; the stderr log's are not.
    rotated = [e for e in logs if e["event"] == "job_log_rotated"]
    assert len(rotated) == len(files) - 1
    assert f"renamed to {log}.1" in rotated[0]["message"] and "log_max_bytes 8192" in rotated[0]["message"]
    assert not [e for e in logs if e["event"] in ("job_log_rotate_failed", "output_unparsed")]
    # The logs verb's tail reaches into job.log.1 when job.log holds fewer lines than asked.
    in_current = data[-1].count(b"\n")
    for n in (in_current + 5, 0):
        assert _tail(log, n) == (lines[-n:] if n else lines)


def _tail(log: Path, n: int) -> list[str]:
    import io

    buf = io.BytesIO()
    with open(log, "rb") as f:
        copy_last_lines(log, f, f.seek(0, 2), n, buf)
    return buf.getvalue().decode().splitlines()


def test_only_log_keep_rotated_files_are_kept_the_newest(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    (tmp_path / "job.log.3").write_text("left by a larger log_keep\n")
    job, _ = run(tmp_path, PRINTER, "stderr", keep=2)
    finish(job)
    assert sorted(p.name for p in tmp_path.glob("job.log*")) == ["job.log", "job.log.1", "job.log.2"]
    kept = b"".join(p.read_bytes() for p in oldest_first(log)).decode().splitlines()
    assert 0 < len(kept) < 30000 and kept == LINES[-len(kept):]  # the newest, in order
    assert sorted(p.name for p in tmp_path.glob("job.stderr.log*")) == [
        "job.stderr.log", "job.stderr.log.1", "job.stderr.log.2"]


def test_a_burst_read_back_after_rotations_is_read_from_the_rotated_files(tmp_path: Path) -> None:
    """The daemon's handling held still while the job prints 6.7 MB: the keeper sends places in
    job.log instead of bytes and rotates job.log past 1 MiB meanwhile; the catch-up finds each
    range in the file it has become (job.log.3, .2 ...) and every line is handled, in order."""
    held = HeldSink()
    job, _ = run(tmp_path, BURST, "120000", keep=20, sink=held, max_bytes=1 << 20)
    try:
        with capture_logs() as logs:
            wait_for(held.entered.is_set, 30, what="the first lines reaching the held sink")
            wait_for(lambda: job.poll() is not None, 60, what="the job finishing while nothing is handled")
            assert len(rotated_logs(str(tmp_path / "job.log"))) >= 3  # 6.7 MB at 1 MiB, in reads of <= 256 KiB
            held.release.set()
            finish(job)
        out = held.got["stdout"]
        assert len(out) == 120_000 and all(ln.startswith(f"iter {i}:") for i, ln in enumerate(out))
        assert held.got["stderr"] == [f"eval {i}" for i in range(0, 120_000, 1000)]
        assert job.link.gauge.read_back > 1 << 20 and job.link.gauge.unparsed == 0
        assert not [e for e in logs if e["event"] == "output_unparsed"]
        assert job.output_lag().bytes == 0
    finally:
        held.release.set()
        if job.poll() is None:
            job.signal_group(9)
        job.close()


def test_a_rotation_falls_between_two_lines_when_the_job_writes_a_line_in_pieces(tmp_path: Path) -> None:
    job, sink = run(tmp_path, SPLIT_PRINTER, keep=100, env={"PYTHONUNBUFFERED": "1"})
    finish(job)
    data = [p.read_bytes() for p in oldest_first(tmp_path / "job.log")]
    assert len(data) > 5
    assert all(d.endswith(b"\n") for d in data[:-1]), "a line cut in two across job.log.N and job.log.N-1"
    assert b"".join(data).decode().splitlines() == sink.got["stdout"] == LINES


def test_a_line_longer_than_the_cut_allowance_is_cut_rather_than_let_the_log_grow(tmp_path: Path) -> None:
    code = "import sys\nsys.stdout.write('y' * %d)\nsys.stdout.flush()\nprint('end')\n" % (3 * ROTATE_CUT_AFTER)
    job, sink = run(tmp_path, code, keep=10)
    finish(job)
    files = oldest_first(tmp_path / "job.log")
    assert len(files) >= 2 and all(p.stat().st_size <= MAX + ROTATE_CUT_AFTER + CHUNK for p in files)
    assert b"".join(p.read_bytes() for p in files) == b"y" * (3 * ROTATE_CUT_AFTER) + b"end\n"
