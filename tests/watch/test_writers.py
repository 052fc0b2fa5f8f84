"""Whose is a text log (issue 34, X1: supervisor/watch/writers.py): a NaN in a file another process
writes into the job's tree is not acted on (``metric_file_untrusted``); one in a file the job holds
open is, from its first line; one in a file the job opens, appends and closes per step is, once the
file carried the job's steps. Real processes, real files. Through the real daemon:
tests/e2e/test_foreign_logs_e2e.py."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest
from structlog.testing import capture_logs

from supervisor.core.causes import Cause
from supervisor.core.observations import MetricRecord
from supervisor.events import AttemptContext
from supervisor.watch.writers import MAX_FDS, MIN_STEPS, Writers, alarming, held_open, job_tree
from tests.util import wait_for
from tests.watch.test_metricfiles import Watch


def ctx(tmp: Path, pid: int) -> AttemptContext:
    return AttemptContext("r", 1, pid, pid, time.monotonic(), tmp, tmp / "hb", None, None, None)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The attempt's job: a process that waits (its writes, where a test needs them, by a child)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


def run(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def read(w: Watch, step: int) -> bool:
    return step in w.steps("log:")


def watching(tmp: Path, pid: int) -> Watch:
    w = Watch([tmp], use_inotify=False)
    w.mf.baseline()
    w.mf.start(ctx(tmp, pid))
    return w


def test_a_nan_in_a_file_another_process_writes_is_not_acted_on_and_is_said(tmp_path: Path, job) -> None:
    w = watching(tmp_path, job.pid)
    try:
        with capture_logs() as logs:
            for name in ("notes.txt", "notes.log"):  # an operator's notes, another tool's log
                run(f"open({str(tmp_path / name)!r}, 'w').write('step 4 loss nan\\n')")
            wait_for(lambda: len([e for e in logs if e["event"] == "metric_file_untrusted"]) == 2, 10,
                     what="both files said untrusted")
            w.mf.scan_now()
        assert w.detections == []
        said = {e["path"]: e for e in logs if e["event"] == "metric_file_untrusted"}
        assert set(said) == {str(tmp_path / "notes.txt"), str(tmp_path / "notes.log")}
        e = said[str(tmp_path / "notes.txt")]
        assert e["log_level"] == "warning" and e["step"] == 4 and "watch_files" in e["next"] and "goes on" in e["next"]
        assert "holding it open" in e["why"]
    finally:
        w.mf.stop()


def test_a_nan_in_the_first_line_of_a_file_the_job_holds_open_is_acted_on(tmp_path: Path) -> None:
    log, go = tmp_path / "train.log", tmp_path.parent / f"{tmp_path.name}-go"
    code = (f"import os, time\nt = time.monotonic()\nwhile not os.path.exists({str(go)!r}) and time.monotonic() - t < 30:\n"
            f"    time.sleep(0.01)\nf = open({str(log)!r}, 'a')\nf.write('step 1 loss nan\\n'); f.flush()\ntime.sleep(60)\n")
    # The job is a shell whose child writes and holds the file: a descendant counts.
    p = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "$0"; true', code], start_new_session=True)
    try:
        w = watching(tmp_path, p.pid)
        try:
            go.touch()
            wait_for(lambda: w.detections, 10, what="the NaN acted on")
            assert [d.cause for d in w.detections] == [Cause.NAN] and w.detections[0].source == f"log:{log}"
        finally:
            w.mf.stop()
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the shell and its writer
        p.wait()


def test_a_file_the_job_appends_to_per_step_is_trusted_once_it_carried_the_job_s_steps(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        w = watching(tmp_path, p.pid)
        try:
            for s in range(1, MIN_STEPS + 1):
                with open(log, "a") as f:  # open, append, close: never seen held open
                    f.write(f"step {s} loss {1.0 / s}\n")
                wait_for(partial(read, w, s), 10, what=f"step {s} read")
            with open(log, "a") as f:
                f.write(f"step {MIN_STEPS + 1} loss nan\n")
            wait_for(lambda: w.detections, 10, what="the NaN acted on")
            assert w.detections[0].cause is Cause.NAN and w.detections[0].step == MIN_STEPS + 1
        finally:
            w.mf.stop()
    finally:
        p.kill()
        p.wait()


def test_without_a_job_known_every_record_is_admitted_as_before(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    (tmp_path / "notes.txt").write_text("step 4 loss nan\n")
    w.mf.scan_now()
    assert [d.cause for d in w.detections] == [Cause.NAN]


@dataclass
class F:
    path: str
    ident: tuple[int, int]
    kind: str = "log"
    fresh: bool = True
    seen: float = 0.0


def test_one_file_short_of_steps_is_withheld_and_looked_for_once_per_schedule(tmp_path: Path) -> None:
    now = [0.0]
    looks: list[int] = []

    def tree(pid: int) -> list[int]:
        looks.append(pid)
        return []

    wr = Writers(clock=lambda: now[0], tree=tree)
    wr.attempt(4242)
    rec = [MetricRecord(1, 2.0, at=0.0)]
    nan = [MetricRecord(2, float("nan"), at=0.0)]
    f = F(str(tmp_path / "x.log"), (1, 2))
    assert wr.admit(f, rec) == rec and looks == [4242]  # looked for at its first records
    assert wr.admit(f, nan) == [] and looks == [4242]  # looked at already: not again at once
    now[0] = 1.5
    assert wr.admit(f, [MetricRecord(2, 1.0, at=0.0)]) and len(looks) == 2  # the schedule (backing off)
    # No step of the job known (rule c): new in the run, MIN_STEPS steps in MIN_WRITES reads over SPREAD_S.
    assert wr.admit(f, [MetricRecord(3, float("nan"), at=0.0)]) != []
    assert wr.withheld == 1
    # The next attempt (a resume): the file the job logged its steps to is still its log, a NaN in
    # its first record there is acted on; a file short of steps is said again, once.
    wr.attempt(4343)
    assert wr.admit(f, nan) == nan
    other = F(str(tmp_path / "notes.txt"), (1, 3))
    with capture_logs() as logs:
        assert wr.admit(other, nan) == [] and wr.admit(other, nan) == []
        wr.attempt(4444)
        assert wr.admit(other, nan) == []
    assert [e["path"] for e in logs if e["event"] == "metric_file_untrusted"] == [other.path, other.path]
    assert alarming(MetricRecord(None, 1.0, extra={"x": float("inf")}, at=0.0))
    assert not alarming(MetricRecord(3, 1.0, grad_norm=2.0, at=0.0))


class Steps:
    """The job's output at ``step`` (None: no step source)."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def mark(self) -> None:
        return None

    def __call__(self) -> list[tuple[str, int]]:
        return [] if self.step is None else [("stdout", self.step), ("log:/w/other.log", 10 ** 6)]


def recs(*steps: int, nan_at: int | None = None) -> list[MetricRecord]:
    return [MetricRecord(s, float("nan") if s == nan_at else 1.0, at=0.0) for s in steps]


def judged(job: int | None, writes: list[tuple[float, list[MetricRecord]]], *, fresh: bool = True,
           final: bool = False, kind: str = "log") -> tuple[list[MetricRecord], list[Any]]:
    """What the last of ``writes`` (each: when it was read, its records) admits, the job at ``job``
    (its output's step, None: no trusted step source), never seen holding the file."""
    now = [0.0]
    wr = Writers(clock=lambda: now[0], tree=lambda pid: [], job_steps=Steps(job))
    wr.attempt(4242)
    f = F("/w/x", (1, 2), kind, fresh)
    out: list[MetricRecord] = []
    with capture_logs() as logs:
        for i, (t, batch) in enumerate(writes):
            now[0] = t
            out = wr.admit(f, batch, final=final and i == len(writes) - 1)
    return [r for r in out if alarming(r)], [e for e in logs if e["event"] == "metric_file_untrusted"]


def test_the_job_s_own_files_are_trusted_and_foreign_ones_are_not_whatever_their_kind() -> None:
    for kind in ("log", "jsonl", "csv", "tb", "mlflow"):
        # D4/D5: one record, a NaN, another process's file: not acted on, said.
        out, said = judged(15, [(0.0, recs(4, nan_at=4))], kind=kind)
        assert out == [] and len(said) == 1 and "0 step(s)" in said[0]["why"], kind
    # D3: an old run's log copied in (4 records at once, steps far from the job's at 15).
    out, said = judged(15, [(0.0, recs(100, 101, 102, 103, nan_at=103))])
    assert out == [] and "at once" in said[0]["why"]
    # D2: a foreign file appended over time, steps 1..4 while the job prints steps 20..80.
    writes = [(0.5 * i, recs(i + 1, nan_at=4)) for i in range(4)]
    out, said = judged(80, writes)
    assert out == [] and "does not track" in said[0]["why"], said
    # The job's own open-append-close log: its steps are the job's (+-2), or behind by its flush cadence.
    out, _ = judged(4, writes)
    assert [r.step for r in out] == [4]
    csv = [(0.0, recs(*range(1, 100))), (5.0, recs(*range(100, 200))), (10.0, recs(250, nan_at=250))]
    out, _ = judged(399, csv)  # CSVLogger: 100 steps a flush, the job 150 steps on
    assert [r.step for r in out] == [250]
    # No step of the job known (rule c): new in the run and grown over time, else not.
    out, _ = judged(None, writes)
    assert [r.step for r in out] == [4]
    out, said = judged(None, writes, fresh=False)
    assert out == [] and "before the run" in said[0]["why"]
    out, said = judged(None, [(0.0, recs(1)), (0.1, recs(2)), (0.2, recs(3, nan_at=3))])
    assert out == [] and "under" in said[0]["why"]
    # Written whole in the job's last moment, the job gone (no step of it known): the job's.
    out, _ = judged(None, [(0.0, recs(*range(1, 31), nan_at=30))], final=True)
    assert [r.step for r in out] == [30]


def test_a_file_named_in_config_is_trusted() -> None:
    wr = Writers(tree=lambda pid: [], named=["/w/*.tfevents*"])
    wr.attempt(4242)
    nan = recs(4, nan_at=4)
    assert wr.admit(F("/w/a.tfevents.1", (1, 2), "tb"), nan) == nan
    assert wr.admit(F("/w/b.jsonl", (1, 3), "jsonl"), nan) == []


def test_a_tensorboard_file_named_for_a_process_of_the_job_s_tree_is_the_job_s() -> None:
    # TensorBoard without TensorFlow opens, appends and closes per flush: the name says the writer.
    wr = Writers(tree=lambda pid: [pid, 777], proc="/nonexistent")
    wr.attempt(4242)
    nan = recs(99, nan_at=99)
    host = socket.gethostname()
    assert wr.admit(F(f"/w/events.out.tfevents.1796683862.{host}.777.0", (1, 2), "tb"), nan) == nan
    assert wr.admit(F(f"/w/events.out.tfevents.1796683862.{host}.778.0", (1, 3), "tb"), nan) == []
    assert wr.admit(F("/w/events.out.tfevents.1796683862.otherhost.777.0", (1, 4), "tb"), nan) == []


def test_held_open_reads_a_bounded_number_of_links(tmp_path: Path) -> None:
    target = tmp_path / "t.log"
    target.write_text("")
    with open(target):
        assert held_open([os.getpid()], {str(target)}) == {str(target)}
        assert held_open([os.getpid()], {str(tmp_path / "other.log")}) == set()
    assert job_tree(2 ** 22 + 7) == []  # no such process
    # A tree far past the link budget (a /proc laid out in a folder): 200 processes of 50
    # descriptors each; the file held by the last one is past MAX_FDS links and is not seen.
    proc = tmp_path / "proc"
    for pid in range(200):
        fd = proc / str(pid) / "fd"
        fd.mkdir(parents=True)
        for n in range(50):
            (fd / str(n)).symlink_to(str(target) if pid == 199 else f"/dev/null{n}")
    pids = list(range(200))
    assert 200 * 50 > MAX_FDS
    assert held_open(pids, {str(target)}, str(proc)) == set()
    assert held_open(pids[-1:], {str(target)}, str(proc)) == {str(target)}
