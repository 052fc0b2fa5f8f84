"""Hardening under faults and hostile input (issue 12), through the real daemon where the row
is about the daemon."""
from __future__ import annotations

import os
import subprocess
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import history, pid_alive
from tests.util import wait_for

PY = sys.executable
# The pid written to a temp file and renamed: a test that sees the file sees the whole pid.
SLEEPER = [PY, "-c", "import os,sys,time; t=sys.argv[1]+'.tmp'; open(t,'w').write(str(os.getpid())); "
           "os.replace(t, sys.argv[1]); time.sleep(600)"]


def wrap(sd: Path, *flags: str) -> list[str]:
    return ["wrap", "--state-dir", str(sd), "--backoff", "0", "--grace", "2", *flags, "--"]


def test_second_daemon_on_a_live_state_dir_is_refused_and_touches_nothing(daemons, tmp_path):
    sd, ready = tmp_path / "sd", tmp_path / "ready"
    d1 = daemons(wrap(sd) + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    job = int(ready.read_text())
    before = history(sd)
    ready.unlink()
    d2 = daemons(wrap(sd) + SLEEPER + [str(ready)])
    assert d2.wait(30) == 2
    assert f"pid {d1.proc.pid}" in d2.stderr() and "already running" in d2.stderr()
    after = history(sd)
    assert after["run_id"] == before["run_id"]
    assert after.get("state") == before.get("state") and after.get("state") != "gave_up"
    assert len(after["attempts"]) == len(before["attempts"])
    assert not ready.exists() and pid_alive(job) and d1.proc.poll() is None
    d1.signal(signal.SIGTERM)
    assert d1.wait(30) == 143


def test_state_dir_deleted_while_running_is_noticed_and_said(daemons, tmp_path):
    sd, ready = tmp_path / "sd", tmp_path / "ready"
    d1 = daemons(wrap(sd) + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    shutil.rmtree(sd)
    wait_for(lambda: "event=state_dir_lost" in d1.stderr(), 15, what="state_dir_lost event")
    assert f"pid {d1.proc.pid}" in d1.stderr()
    assert d1.proc.poll() is None  # the job keeps its supervisor (the re-take: test_state_dir_retake.py)
    d1.signal(signal.SIGTERM)
    assert d1.wait(30) == 143


def test_state_dir_is_created_0700(daemons, tmp_path):
    sd = tmp_path / "fresh" / "sd"
    d = daemons(wrap(sd) + [PY, "-c", "pass"])
    assert d.wait(30) == 0
    assert stat.S_IMODE(os.stat(sd).st_mode) == 0o700


def _cli(*args: str) -> "subprocess.CompletedProcess[str]":
    import subprocess

    return subprocess.run([PY, "-m", "supervisor", *args], capture_output=True, text=True, timeout=120,
                          cwd=str(Path(__file__).resolve().parents[2]))


def test_deep_json_on_the_control_socket_gets_a_clear_error_reply(daemons, tmp_path):
    import json
    import socket

    sd, ready = tmp_path / "sd", tmp_path / "ready"
    d = daemons(wrap(sd) + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(sd / "control.sock"))
    s.sendall(b'{"verb": "status", "args": ' + b"[" * 5000 + b"]" * 5000 + b"}\n")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        assert chunk, "connection dropped without a reply"
        buf += chunk
    reply = json.loads(buf)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request" and "deep" in reply["error"]["message"]
    assert "Traceback" not in d.stderr() and "RecursionError" not in d.stderr()
    assert _cli("status", "--state-dir", str(sd)).returncode == 0


def test_restart_from_an_unready_checkpoint_is_refused_with_reasons_unless_forced(daemons, tmp_path):
    import pickle

    sd, ready = tmp_path / "sd", tmp_path / "ready"
    d = daemons(wrap(sd) + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    cp = _cli("restart", "--state-dir", str(sd), "--from", "/nonexistent/ckpt.pt")
    assert cp.returncode == 1 and "does not exist" in cp.stderr + cp.stdout, cp.stderr
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps(_NeedsCode()))
    cp = _cli("restart", "--state-dir", str(sd), "--from", str(evil))
    assert cp.returncode == 1 and "refused" in cp.stderr + cp.stdout, cp.stderr
    assert history(sd)["attempts"][-1]["attempt"] == 0  # nothing restarted
    cp = _cli("restart", "--state-dir", str(sd), "--from", str(evil), "--force")
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: len(history(sd)["attempts"]) == 2, 30, 0.5, "forced restart")  # a history CLI per look
    d.signal(signal.SIGTERM)
    d.wait(30)


class _NeedsCode:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_job_name_with_control_characters_is_rejected_by_check_config(tmp_path):
    for bad in ("a\\u0000b", "a\\nb", "a\\u001bb"):
        cfgp = tmp_path / "c.toml"
        cfgp.write_text(f'[job]\nname = "{bad}"\ncommand = ["true"]\n')
        cp = _cli("check-config", str(cfgp))
        assert cp.returncode == 2 and "job.name" in cp.stderr + cp.stdout, (bad, cp.stdout, cp.stderr)
        assert "Traceback" not in cp.stderr


def test_secret_in_remedies_env_is_masked_in_ledger_and_reload_event(daemons, tmp_path):
    sd, ready = tmp_path / "sd", tmp_path / "ready"
    cfgp = tmp_path / "c.toml"
    cmd = ", ".join(f'"{a}"' for a in SLEEPER + [str(ready)])
    base = f'[job]\ncommand = [{cmd}]\n[state]\ndir = "{sd}"\n'
    on = '[on.nan]\nremedies = [{{ env = {{ HF_TOKEN = "{}", PLAIN_R = "shown" }} }}]\n'
    cfgp.write_text(base + on.format("rem-s3cr3t-1"))
    d = daemons(["run", "--config", str(cfgp)])
    wait_for(ready.exists, 30, what="job ready")
    cfgp.write_text(base + on.format("rem-s3cr3t-2"))
    d.signal(signal.SIGHUP)
    wait_for(lambda: "config_reloaded" in d.stderr(), 10)
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143
    import json

    stored = b"".join(p.read_bytes() for p in sd.iterdir() if p.name.startswith("ledger.sqlite"))
    h = json.dumps(history(sd))
    for secret in ("rem-s3cr3t-1", "rem-s3cr3t-2"):
        assert secret not in d.stderr() and secret.encode() not in stored and secret not in h, secret
    assert "on.nan" in d.stderr() and b"shown" in stored


def test_ledger_has_a_schema_version_and_refuses_corrupt_or_newer_files(daemons, tmp_path):
    import sqlite3

    from supervisor.ledger.schema import LEDGER_FILE, SCHEMA_VERSION

    sd = tmp_path / "sd"
    d = daemons(wrap(sd) + [PY, "-c", "pass"])
    assert d.wait(30) == 0
    db = sqlite3.connect(sd / LEDGER_FILE)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    d = daemons(wrap(sd) + [PY, "-c", "pass"])
    assert d.wait(30) == 2 and "newer" in d.stderr() and "Traceback" not in d.stderr()
    cp = _cli("history", "--state-dir", str(sd))
    assert cp.returncode == 1 and "newer" in cp.stderr
    for name in os.listdir(sd):
        if name.startswith(LEDGER_FILE):
            os.unlink(sd / name)
    (sd / LEDGER_FILE).write_bytes(b"this is not a sqlite file" * 100)
    d = daemons(wrap(sd) + [PY, "-c", "pass"])
    assert d.wait(30) == 2 and "corrupt" in d.stderr() and "Traceback" not in d.stderr()
    assert (sd / LEDGER_FILE).read_bytes().startswith(b"this is not")  # left as it was


def test_ledger_of_version_0_is_migrated(tmp_path):
    import sqlite3

    from supervisor.ledger.schema import LEDGER_FILE, SCHEMA, SCHEMA_VERSION
    from supervisor.ledger.store import Ledger

    tmp_path.joinpath("sd").mkdir()
    db = sqlite3.connect(tmp_path / "sd" / LEDGER_FILE)
    db.executescript(SCHEMA)
    db.close()
    led = Ledger(tmp_path / "sd")
    assert led.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    led.close()


def test_metric_batches_are_one_transaction(tmp_path):
    from supervisor.ledger.store import Ledger

    led = Ledger(tmp_path / "sd")
    run, _ = led.open_run("m", {})
    statements: list[str] = []
    led.db._conn.set_trace_callback(statements.append)
    led.metrics_batch(run, 0, [(float(i), i, 1.0, None, None, None) for i in range(1000)])
    led.db._conn.set_trace_callback(None)
    assert sum(1 for s in statements if s.lstrip().upper().startswith("INSERT")) == 1
    assert len(list(led.metrics(run))) == 1000
    assert stat.S_IMODE(os.stat(led.path).st_mode) == 0o600
    led.close()


def _tiny_tmpfs(path: Path, size: str = "16m") -> bool:
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=755", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a tiny tmpfs (a full disk)")
    return True


def _fill(path: Path) -> None:
    try:
        with open(path / "filler", "ab") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass


def test_full_disk_ledger_errors_are_reported_once_and_supervision_stop_sigterm_keep_working(daemons, tmp_path):
    mnt = tmp_path / "tfs"
    _tiny_tmpfs(mnt)
    try:
        sd, ready = mnt / "sd", tmp_path / "ready"
        # 1. the job finishes while the disk is full: the daemon exits 0 like always
        job = [PY, "-c", "import os,sys,time\nopen(sys.argv[1],'w').write('1')\n"
               "while not os.path.exists(sys.argv[1]+'.go'): time.sleep(0.05)\n"
               "for i in range(200): print('line', i, flush=True)\n", str(ready)]
        d = daemons(wrap(sd) + job)
        wait_for(ready.exists, 30, what="job ready")
        _fill(mnt)
        Path(str(ready) + ".go").write_text("")
        assert d.wait(30) == 0
        assert d.stderr().count("ledger_write_failed") == 1, d.stderr()[-3000:]
        # 2. stop and SIGTERM still work on a full disk
        (mnt / "filler").unlink()
        ready.unlink()
        os.unlink(str(ready) + ".go")
        d = daemons(wrap(sd) + SLEEPER + [str(ready)])
        wait_for(ready.exists, 30, what="job ready")
        _fill(mnt)
        for _ in range(3):
            _cli("reload", "--state-dir", str(sd))  # events the ledger cannot keep
        st = _cli("status", "--state-dir", str(sd), "--json")
        assert st.returncode == 0 and "\"ledger_write_errors\"" in st.stdout, (st.stderr, d.proc.poll(), d.stderr()[-3000:])
        assert _cli("stop", "--state-dir", str(sd)).returncode == 0
        assert d.wait(30) == 0
        assert d.stderr().count("ledger_write_failed") == 1, d.stderr()[-3000:]
        ready.unlink()
        d = daemons(wrap(sd) + SLEEPER + [str(ready)])
        (mnt / "filler").unlink()
        wait_for(ready.exists, 30, what="job ready")
        _fill(mnt)
        time.sleep(0.5)
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 143
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _request_s(sd: Path, verb: str) -> float:
    """One control request through the client the CLI uses; its reply time."""
    from supervisor.ops.controlclient import request

    t = time.monotonic()
    request(sd, verb, timeout=30)
    return time.monotonic() - t


@pytest.mark.slow
def test_metric_flood_is_kept_or_counted_and_control_answers(daemons, tmp_path):
    import json
    import sqlite3
    from contextlib import closing

    n = 300_000
    sd, done = tmp_path / "sd", tmp_path / "done"
    flood = (f"import sys,time\nw=sys.stdout.write\nfor i in range({n}): w(f'step {{i}} loss 1.{{i%7}}\\n')\n"
             f"sys.stdout.flush()\nopen({str(done)!r},'w').write('1')\ntime.sleep(600)\n")
    # The job sleeps after its burst: on a loaded machine the loop's catch-up outlasts the hang
    # timeout learned from the burst's steps (its floor), and a hang stop is not what this tests.
    d = daemons(wrap(sd, "--heartbeat-timeout", "900") + [PY, "-c", flood])
    wait_for(lambda: (sd / "control.sock").exists(), 30, what="socket")
    from supervisor.ops.controlclient import request

    def accounted() -> bool:
        # status over the socket from this process (what `status --json` prints): a CLI process
        # per look cost more CPU than the loop's booking it waits for
        st = request(sd, "status", timeout=30.0)
        with closing(sqlite3.connect(sd / "ledger.sqlite")) as db:
            kept = db.execute("SELECT count(*) FROM metrics").fetchone()[0]
        return kept + st["metrics_dropped"] == n

    # Replies are timed while the loop books the burst, not only while the job writes it: the
    # job is done in well under a second (one or two requests, whose "median" was then the
    # worst), the loop's work goes on for ~20 s here and more on a loaded machine.
    latencies: list[float] = []

    def answered_then_booked() -> bool:
        latencies.append(_request_s(sd, "reload"))
        return done.exists() and accounted()

    t0 = time.monotonic()
    wait_for(answered_then_booked, 180, interval=0.05, what="every metric line kept or counted")
    catch_up = time.monotonic() - t0
    print(f"reload latencies while {catch_up:.1f} s of flood were booked (n, p50, worst 3):", len(latencies),
          sorted(latencies)[len(latencies) // 2], sorted(latencies)[-3:])
    st = json.loads(_cli("status", "--state-dir", str(sd), "--json").stdout)
    if st["metrics_dropped"]:
        wait_for(lambda: "metrics_dropped" in d.stderr(), 10, what="the drop said")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143
    # The speed is measured in the bench (bench_core control, the same catch-up: p50 18 ms, worst
    # 71 ms against its <= 100 ms over a 17.7 s catch-up); this guards that the loop answers all
    # through the catch-up, never held behind the burst. Bounds relative to the catch-up, which a
    # loaded machine slows as much as the replies: healthy, the p50 is ~1/1500 of it and the worst
    # ~1/25 (103 replies over 18.7 s with other suites beside it); a loop that books the burst
    # before it answers gives a few replies as long as the catch-up, and the old long GIL switch
    # interval (3 s replies over a ~20 s catch-up) fails the p50 bound 30x over the healthy one.
    p50, worst = sorted(latencies)[len(latencies) // 2], max(latencies)
    assert len(latencies) >= 20 and p50 < catch_up / 50 and worst < catch_up / 3, (catch_up, p50, worst)


def test_job_log_is_never_opened_through_a_symlink_and_files_are_0600(daemons, tmp_path):
    sd = tmp_path / "sd"
    d = daemons(wrap(sd) + [PY, "-c", "print('hello')"])
    assert d.wait(30) == 0
    logs = [p for p in sd.iterdir() if p.name.endswith(".log")]
    assert logs, list(sd.iterdir())
    for p in [*logs, sd / "ledger.sqlite", sd / "daemon.lock"]:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for p in logs:
        p.unlink()
        p.symlink_to(victim)
    d = daemons(wrap(sd, "--max-restarts", "0") + [PY, "-c", "print('overwrite')"])
    d.wait(30)
    assert victim.read_text() == "precious\n"


def test_state_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    import pytest

    from supervisor.daemon import statelock

    sd = tmp_path / "sd"
    sd.mkdir()
    monkeypatch.setattr(statelock.os, "geteuid", lambda: os.stat(sd).st_uid + 4242)
    with pytest.raises(statelock.StateDirLocked, match="owned by uid"):
        statelock.StateLock.acquire(sd)
    assert not (sd / statelock.LOCK_NAME).exists()


def test_checkpoint_discovery_does_not_follow_symlinks_out_of_its_dir(tmp_path):
    from supervisor.checkpoints.discovery import Discovery

    ck, outside = tmp_path / "ck", tmp_path / "outside"
    ck.mkdir()
    outside.mkdir()
    (outside / "step_900.pt").write_bytes(b"x" * 10)
    (ck / "step_100.pt").write_bytes(b"y" * 10)
    (ck / "step_900.pt").symlink_to(outside / "step_900.pt")
    (ck / "step_500.pt").symlink_to(ck / "step_100.pt")  # inside: kept
    old = time.time() - 60
    for p in (outside / "step_900.pt", ck / "step_100.pt"):
        os.utime(p, (old, old))
    found = {c.path.name for c in Discovery(ck, settle_s=0).scan()}
    assert found == {"step_100.pt", "step_500.pt"}
    found = {c.path.name for c in Discovery(ck, settle_s=0, follow_symlinks_out=True).scan()}
    assert "step_900.pt" in found


ESCAPER = r"""
import os, signal, sys, time
out = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # the grandchild: out of the group and the session, deaf to SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(out + ".tmp", "w").write(str(os.getpid()))
        os.replace(out + ".tmp", out)
        while True:
            time.sleep(3600)
    os._exit(0)  # its parent leaves at once: the grandchild is re-parented to the daemon
os.wait()
time.sleep(600)
"""


def test_stop_also_stops_a_double_forked_grandchild_that_ignores_sigterm(daemons, tmp_path):
    sd, gpid_file = tmp_path / "sd", tmp_path / "gpid"
    d = daemons(wrap(sd) + [PY, "-c", ESCAPER, str(gpid_file)])
    wait_for(gpid_file.exists, 30, what="grandchild ready")
    gpid = int(gpid_file.read_text())
    try:
        time.sleep(1.2)  # a tick or two: the daemon sees it as its own orphan
        assert _cli("stop", "--state-dir", str(sd)).returncode == 0
        assert d.wait(60) == 0
        wait_for(lambda: not pid_alive(gpid), 10, what="grandchild gone")
    finally:
        try:
            os.kill(gpid, signal.SIGKILL)
        except ProcessLookupError:
            pass
