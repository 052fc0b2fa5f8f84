"""The CLI reads only regular files in the state dir (issue 34 part 7, D5/D8 and the symlink risk):
a FIFO, a folder or a symlink at ledger.sqlite, job.log or daemon.lock is said and refused, never
waited on (a FIFO's open blocks forever) and never followed (job.log linked to a secret file would
print it, and the CLI is often run as root); Ctrl-C ends a reading verb even when SIGINT came in
ignored; a value the job or the filesystem chose never reaches the terminal with its control bytes.
Every verb runs as a subprocess with a timeout: a hang fails the test instead of hanging it."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from supervisor.cli.render import escaped, render_history, status_table
from supervisor.cli.verbs import render_last_run
from tests.conftest import ROOT

PY = sys.executable
JOB = "for i in range(40):\n    print('step', i, 'loss', 1.0 / (i + 1), flush=True)\n"
SECRET = "root:SECRET-HASH-NOT-FOR-PRINTING:19000:0:99999:7:::"
FORGED = "train\nevent=gave_up level=critical message=FORGED\x1b[2J.log"
LIMIT_S = 30.0  # far past what any of these takes: reaching it means the verb hung


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", *args], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=LIMIT_S)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state dir of a real run that has ended (its ledger, job.log, daemon.lock)."""
    sd = tmp_path_factory.mktemp("run") / "sd"
    r = subprocess.run([PY, "-m", "supervisor", "wrap", "--state-dir", str(sd), "--", PY, "-c", JOB],
                       cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return sd


def put(path: Path, kind: str, secret: Path) -> str:
    """Replace ``path`` by a FIFO, a folder or a symlink to ``secret``; what the CLI must call it."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    if kind == "folder":
        path.mkdir()
        return "a folder"
    path.symlink_to(secret)
    return f"a symlink (to {str(secret)!r})"


@pytest.fixture
def copy(finished: Path, tmp_path: Path) -> Callable[[str], Path]:
    def make(name: str) -> Path:
        return Path(shutil.copytree(finished, tmp_path / name, symlinks=True))
    return make


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    p = tmp_path / "shadow"
    p.write_text(SECRET + "\n")
    return p


def clean(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert SECRET not in r.stdout + r.stderr


KINDS = ["fifo", "folder", "symlink"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_ledger_that_is_no_regular_file_is_named_by_every_verb(kind: str, copy: Callable[[str], Path],
                                                                 secret: Path, tmp_path: Path) -> None:
    sd = copy(kind)
    for side in ("ledger.sqlite-wal", "ledger.sqlite-shm"):
        (sd / side).unlink(missing_ok=True)
    found = put(sd / "ledger.sqlite", kind, secret)
    said = f"{sd / 'ledger.sqlite'} is {found}, not a ledger"

    h = cli("history", "--state-dir", str(sd))
    clean(h)
    assert h.returncode == 1 and said in h.stderr, h.stderr

    st = cli("status", "--state-dir", str(sd))
    clean(st)
    assert st.returncode == 3  # no daemon; what the state dir holds is said as far as it can be read
    assert f"the ledger could not be read, so what follows is partial: {said}" in st.stdout
    assert "  step 39 loss 0.025" in st.stdout  # the job's log, kept apart from the ledger

    logs = cli("logs", "-n", "2", "--state-dir", str(sd))
    clean(logs)
    assert logs.returncode == 0 and said in logs.stderr
    assert logs.stdout.splitlines() == ["step 38 loss 0.02564102564102564", "step 39 loss 0.025"]

    rep = cli("report", "--state-dir", str(sd), "--out", str(tmp_path / "report"))
    clean(rep)
    assert rep.returncode == 1 and said in rep.stderr and "no report was written" in rep.stderr

    ck = tmp_path / "ck"
    ck.mkdir()
    cp = cli("checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(sd), "--no-load-test")
    clean(cp)
    assert cp.returncode == 0 and said in cp.stderr and "no recorded command" in cp.stderr


def test_a_fifo_beside_the_ledger_is_refused_before_sqlite_waits_on_it(copy: Callable[[str], Path],
                                                                       secret: Path) -> None:
    sd = copy("wal")
    put(sd / "ledger.sqlite-wal", "fifo", secret)
    h = cli("history", "--state-dir", str(sd))
    clean(h)
    assert h.returncode == 1
    assert f"{sd / 'ledger.sqlite-wal'} is a FIFO, not the ledger's wal file" in h.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_log_that_is_no_regular_file_is_never_read(kind: str, copy: Callable[[str], Path],
                                                         secret: Path) -> None:
    sd = copy(kind)
    found = put(sd / "job.log", kind, secret)
    said = f"{sd / 'job.log'} is {found}, not a job log"
    for args in (["-n", "2"], ["-f"]):
        r = cli("logs", *args, "--state-dir", str(sd))
        clean(r)
        assert r.returncode == 1 and said in r.stderr and r.stdout == "", (args, r.stderr)

    st = cli("status", "--state-dir", str(sd))
    clean(st)
    assert st.returncode == 3
    assert f"the job's log was not read: {said}" in st.stdout
    assert "  state         finished (exit 0)" in st.stdout  # the ledger's part is whole
    j = json.loads(cli("status", "--json", "--state-dir", str(sd)).stdout)
    assert j["log_tail"] == [] and said in j["log_error"]


def test_a_fifo_lock_file_does_not_hang_logs_follow(copy: Callable[[str], Path], secret: Path) -> None:
    sd = copy("lock")
    put(sd / "daemon.lock", "fifo", secret)
    r = cli("logs", "-f", "-n", "1", "--state-dir", str(sd))  # no daemon known: ends once the log is read
    clean(r)
    assert r.returncode == 0 and r.stdout == "step 39 loss 0.025\n"


def test_the_checkpoint_caches_in_the_state_dir_are_not_waited_on(copy: Callable[[str], Path], secret: Path,
                                                                 tmp_path: Path) -> None:
    sd = copy("caches")
    names = ("checkpoint_digests.json", "checkpoint_book.json")
    for name in names:
        put(sd / name, "fifo", secret)
    ck = tmp_path / "ck"
    ck.mkdir()
    r = cli("checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(sd), "--no-load-test", "--json")
    clean(r)
    assert r.returncode == 0 and json.loads(r.stdout) == []
    assert f"{sd / 'checkpoint_digests.json'} is a FIFO, not a digest cache" in r.stderr


def _follow(sd: Path, ignore_sigint: bool) -> subprocess.Popen[bytes]:
    """``logs -f`` of ``sd`` with this test's process as the daemon its lock file names (alive)."""
    (sd / "daemon.lock").write_text(f"{os.getpid()}\n")
    return subprocess.Popen([PY, "-m", "supervisor", "logs", "-f", "-n", "1", "--state-dir", str(sd)],
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None)


def _first_line(p: subprocess.Popen[bytes]) -> bytes:
    assert p.stdout is not None
    deadline = time.monotonic() + LIMIT_S
    got = b""
    while not got.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, "logs -f printed nothing"
        ready, _, _ = select.select([p.stdout], [], [], left)
        if ready:
            chunk = os.read(p.stdout.fileno(), 4096)
            assert chunk, f"logs -f ended early: {p.wait(LIMIT_S)}"
            got += chunk
    return got


@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["sigint", "sigint-ignored-by-the-parent"])
def test_ctrl_c_ends_logs_follow_with_130(ignore_sigint: bool, copy: Callable[[str], Path]) -> None:
    p = _follow(copy("int"), ignore_sigint)
    try:
        assert _first_line(p) == b"step 39 loss 0.025\n"
        p.send_signal(signal.SIGINT)
        rc = p.wait(LIMIT_S)
        assert p.stderr is not None
        assert rc == 130, (rc, p.stderr.read().decode()[-2000:])
    finally:
        p.kill()
        p.wait()
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


def test_a_log_swapped_for_a_fifo_while_followed_is_refused(copy: Callable[[str], Path], secret: Path) -> None:
    sd = copy("swap")
    p = _follow(sd, ignore_sigint=False)
    try:
        assert _first_line(p) == b"step 39 loss 0.025\n"
        os.mkfifo(sd / "fifo")
        os.replace(sd / "fifo", sd / "job.log")  # as a rotation would put a new file there
        assert p.wait(LIMIT_S) == 1
        assert p.stderr is not None
        assert f"{sd / 'job.log'} is a FIFO, not a job log" in p.stderr.read().decode()
    finally:
        p.kill()
        p.wait()
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


def _forge(sd: Path) -> None:
    """What a job controls, in the ledger: a log file's name with a newline and an escape, quoted
    in the reason, a cause and a checkpoint path (as a detection's source and a resume name it)."""
    db = sqlite3.connect(sd / "ledger.sqlite")
    try:
        db.execute("UPDATE runs SET reason = ?", (f"nan at step 21 (log:/tmp/adv/nl/{FORGED})",))
        db.execute("UPDATE attempts SET cause = ?, checkpoint = ?, summary = ?",
                   ("nan\x1b]0;owned\x07", f"/ck/{FORGED}", f"seen in log:{FORGED}"))
        db.commit()
    finally:
        db.close()
    with open(sd / "job.log", "a") as f:
        f.write("colours \x1b[31mred\x1b[0m and \x1b[2J a clear-screen\n")


def _one_line_each(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text
    assert not any(line.startswith("event=") for line in text.splitlines()), text


def test_status_and_history_escape_what_the_job_named(copy: Callable[[str], Path]) -> None:
    sd = copy("forged")
    _forge(sd)
    st = cli("status", "--state-dir", str(sd))
    assert st.returncode == 3
    _one_line_each(st.stdout)
    assert "log:/tmp/adv/nl/train\\nevent=gave_up level=critical message=FORGED\\x1b[2J.log)" in st.stdout
    assert "  colours red and  a clear-screen" in st.stdout  # the job's colours dropped, as the console does

    h = cli("history", "--state-dir", str(sd))
    assert h.returncode == 0
    _one_line_each(h.stdout)
    assert "nan\\x1b]0;owned\\x07" in h.stdout and "seen in log:train\\nevent=gave_up" in h.stdout

    # --json keeps every value as it is (JSON escapes it), and `logs` prints the job's bytes as
    # written, as tail does: they are the job's own output.
    assert json.loads(cli("history", "--json", "--state-dir", str(sd)).stdout)["reason"].endswith(FORGED + ")")
    raw = subprocess.run([PY, "-m", "supervisor", "logs", "-n", "1", "--state-dir", str(sd)], cwd=str(ROOT),
                         capture_output=True, timeout=LIMIT_S)
    assert raw.stdout == b"colours \x1b[31mred\x1b[0m and \x1b[2J a clear-screen\n"


def test_the_renderers_keep_every_value_on_its_line() -> None:
    assert escaped(FORGED) == "train\\nevent=gave_up level=critical message=FORGED\\x1b[2J.log"
    assert escaped("a\u2028b\x85c\x7f") == "a\\u2028b\\x85c\\x7f"
    table = status_table({"state": "running", "checkpoint": f"/ck/{FORGED}", "node\x1b[2J": "x\ry"})
    _one_line_each(table)
    assert "resumed from" in table and "/ck/train\\nevent=gave_up" in table and "node\\x1b[2J" in table
    hist = render_history({"run_id": "r", "name": FORGED, "state": "gave_up", "reason": FORGED, "attempts": []})
    _one_line_each(hist)
    last = render_last_run({"run_id": "r", "name": "n", "state": "gave_up", "reason": FORGED,
                            "log_tail": ["ok", "\x1b[2Jcleared"], "log_error": f"/x/{FORGED} is a FIFO"})
    _one_line_each(last)
    assert "  cleared" in last and "the job's log was not read: /x/train\\nevent=" in last


def test_report_replaces_a_planted_link_and_never_writes_through_one(copy: Callable[[str], Path],
                                                                     secret: Path) -> None:
    sd = copy("report")
    (sd / "report").mkdir()
    for name in ("report.html", ".report.html.tmp", "loss_curve.png"):
        (sd / "report" / name).symlink_to(secret)
    r = cli("report", "--state-dir", str(sd))
    clean(r)
    assert r.returncode == 0, r.stderr
    assert secret.read_text() == SECRET + "\n"  # written through no link
    assert not (sd / "report" / "report.html").is_symlink() and "<html" in (sd / "report" / "report.html").read_text()

    sd2 = copy("report-link")
    (sd2 / "report").symlink_to(secret.parent)  # the whole folder: refused, nothing written there
    r = cli("report", "--state-dir", str(sd2))
    clean(r)
    assert r.returncode == 1 and f"cannot write {sd2 / 'report'}" in r.stderr and "symlink" in r.stderr
    assert not (secret.parent / "report.html").exists()
