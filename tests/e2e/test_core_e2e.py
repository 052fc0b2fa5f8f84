"""The supervision core end to end: the real daemon, real jobs, real signals, real SQLite."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import helper, history, pid_alive
from tests.util import wait_for

JOBS = helper("core_jobs.py")
PY = sys.executable


def wrap(sd: Path, *flags: str) -> list[str]:
    return ["wrap", "--state-dir", str(sd), "--backoff", "0", *flags, "--"]


def short_leftover_grace(tmp_path: Path) -> list[str]:
    """A config whose leftover grace is 1 s: stubborn leftovers are SIGKILLed without a 10 s wait."""
    cfg = tmp_path / "leftover.toml"
    cfg.write_text("[shutdown]\nleftover_grace_s = 1\n")
    return ["--config", str(cfg)]


def test_success_exits_zero_and_records_the_attempt(daemons, tmp_path):
    sd = tmp_path / "sd"
    d = daemons(wrap(sd) + [PY, JOBS, "exit", "0"])
    assert d.wait() == 0
    h = history(sd)
    assert [a["exit_code"] for a in h["attempts"]] == [0]
    assert h["attempts"][0]["cause"] is None and h["attempts"][0]["argv"] == [PY, JOBS, "exit", "0"]


def test_crash_loop_gives_up_with_exit_3_after_budget(daemons, tmp_path):
    sd = tmp_path / "sd"
    # Killed by SIGKILL each time (a signal that could come from outside): not a deterministic
    # repeat, so the budget decides.
    job = "import os; os.kill(os.getpid(), 9)"
    d = daemons(wrap(sd, "--max-restarts", "2") + [PY, "-c", job])
    assert d.wait() == 3
    h = history(sd)
    assert len(h["attempts"]) == 3
    for a in h["attempts"]:
        assert a["cause"] == "crash" and a["signal"] == "SIGKILL"
        assert a["argv"] == [PY, "-c", job]
        assert set(a) >= {"attempt", "argv", "cwd", "started_at", "ended_at", "exit_code", "signal", "cause",
                          "action", "checkpoint", "remedies", "validation"}
    assert [a["action"] for a in h["attempts"]] == ["restart", "restart", "give_up"]
    last = d.events()[-1]
    assert "gave_up" in d.stderr() and "restart budget spent" in d.stderr()
    assert "event=gave_up" in last or "gave_up" in last


def test_an_ended_attempts_heartbeat_folder_goes_when_empty_and_stays_with_files(daemons, tmp_path):
    # Attempt 0 writes a file where the client would put its heartbeats, attempt 1 writes nothing:
    # a week of restarts leaves no empty folders, and nothing the job wrote is removed.
    sd = tmp_path / "sd"
    job = ("import os, sys; a = os.environ['TSUP_ATTEMPT']; "
           "a == '0' and open(os.path.join(os.environ['TSUP_HEARTBEAT_DIR'], 'rank0.hb'), 'w').write('1'); "
           "os.kill(os.getpid(), 9)")
    d = daemons(wrap(sd, "--max-restarts", "1") + [PY, "-c", job])
    assert d.wait() == 3
    assert sorted(p.name for p in (sd / "heartbeats").iterdir()) == ["attempt-0"]
    assert (sd / "heartbeats" / "attempt-0" / "rank0.hb").read_text() == "1"


def test_an_identical_crash_gives_up_on_the_second_attempt(daemons, tmp_path):
    # exit 1 before any step, from scratch, same argv and env: deterministic, no third attempt.
    sd = tmp_path / "sd"
    d = daemons(wrap(sd, "--max-restarts", "10") + [PY, "-c", "import sys; sys.exit(1)"])
    assert d.wait() == 3
    h = history(sd)
    assert [a["exit_code"] for a in h["attempts"]] == [1, 1]
    assert "identical to attempt 0" in h["reason"] and "Try: read the traceback" in h["reason"]


def test_killing_signal_is_named(daemons, tmp_path):
    sd = tmp_path / "sd"
    d = daemons(wrap(sd, "--max-restarts", "0") + [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert d.wait() == 3
    a = history(sd)["attempts"][0]
    assert a["signal"] == "SIGSEGV" and a["exit_code"] is None and a["cause"] == "crash"


@pytest.mark.slow
def test_env_and_resume_args_on_relaunch(daemons, tmp_path):
    sd, ck, out = tmp_path / "sd", tmp_path / "ck", tmp_path / "out"
    ck.mkdir(), out.mkdir()
    script = ("import os, sys, json\n"
              "n = len(os.listdir(sys.argv[1]))\n"
              "json.dump({k: v for k, v in os.environ.items() if k.startswith('TSUP_')} | {'argv': sys.argv},"
              " open(os.path.join(sys.argv[1], f'env{n}.json'), 'w'))\n"
              "if not n:\n"
              "    import torch\n"
              "    from supervisor.client import save_checkpoint\n"
              "    save_checkpoint({'model': {'w': torch.zeros(2)}}, os.path.join(sys.argv[2], 'step_100.pt'), step=100)\n"
              "sys.exit(0 if n else 1)\n")
    d = daemons(wrap(sd, "--checkpoint-dir", str(ck), "--resume-arg=--resume={checkpoint}",
                     "--max-restarts", "3") + [PY, "-c", script, str(out), str(ck)])
    assert d.wait() == 0
    first = json.loads((out / "env0.json").read_text())
    second = json.loads((out / "env1.json").read_text())
    assert first["TSUP_ATTEMPT"] == "0" and first["TSUP_RESUME_FROM"] == ""
    assert not any(a.startswith("--resume") for a in first["argv"])
    assert second["TSUP_ATTEMPT"] == "1" and second["TSUP_RESUME_FROM"].endswith("step_100.pt")
    assert second["argv"][-1] == f"--resume={second['TSUP_RESUME_FROM']}"
    assert first["TSUP_RUN_ID"] == second["TSUP_RUN_ID"] and first["TSUP_HEARTBEAT_DIR"]
    assert Path(first["TSUP_CHECKPOINT_DIR"]) == ck
    h = history(sd)
    assert h["attempts"][1]["argv"][-1] == second["argv"][-1]  # the ledger has exactly what was exec'd
    assert h["attempts"][1]["checkpoint"] == second["TSUP_RESUME_FROM"]
    assert second["TSUP_RESUME_STEP"] == "100" and h["attempts"][1]["resume_step"] == 100
    assert any(e["event"] == "checkpoint_chosen" for e in h["events"])


def test_daemon_sigterm_stops_job_gracefully_and_exits_zero(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    d = daemons(wrap(sd) + [PY, JOBS, "flush_on_term", str(out)])
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143  # stopped by SIGTERM before the job finished: 128 + 15
    assert (out / "flushed").read_text() == "ok"
    assert "stopped on request" in d.stderr()


def test_child_ignoring_sigterm_is_killed_after_grace(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    d = daemons(wrap(sd, "--grace", "1") + [PY, JOBS, "ignore_term", str(out)])
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    job_pid = int((out / "ready").read_text())
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143  # stopped by SIGTERM before the job finished: 128 + 15
    assert time.monotonic() - t0 < 1 + 3  # grace + slack
    assert not pid_alive(job_pid)
    assert "shutdown_escalated" in d.stderr()


def test_second_sigterm_escalates_immediately(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    d = daemons(wrap(sd, "--grace", "60") + [PY, JOBS, "ignore_term", str(out)])
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    d.signal(signal.SIGTERM)
    wait_for(lambda: "shutdown_signal_sent" in d.stderr(), 10)
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143 and time.monotonic() - t0 < 5  # SIGTERM before the job finished: 128 + 15


def test_group_with_grandchildren_is_fully_gone_no_zombies(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    d = daemons(wrap(sd, "--grace", "1") + [PY, JOBS, "forker", str(out), "3"])
    wait_for(lambda: (out / "ready").exists() and len(list(out.glob("g*"))) == 3, 20, what="tree ready")
    pids = [int(p) for p in (out / "pids").read_text().split()]
    pids += [int(p.read_text()) for p in out.glob("g*")]
    assert len(pids) == 7 and all(pid_alive(p) for p in pids)
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143  # stopped by SIGTERM before the job finished: 128 + 15
    wait_for(lambda: not any(pid_alive(p) for p in pids), 5, what="every process of the tree gone")


def test_leader_exit_leaves_no_orphans_before_relaunch(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    # The leader starts a stubborn child and crashes: the child must be gone before attempt 1.
    script = ("import os, sys, signal, time\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "    open(os.path.join(sys.argv[1], 'child%d' % os.getpid()), 'w').close()\n"
              "    time.sleep(3600)\n"
              "while not any(n.startswith('child') for n in os.listdir(sys.argv[1])): time.sleep(0.01)\n"
              "sys.exit(1)\n")
    d = daemons(wrap(sd, "--max-restarts", "1", *short_leftover_grace(tmp_path)) + [PY, "-c", script, str(out)])
    assert d.wait(60) == 3
    kids = [int(p.name[5:]) for p in out.glob("child*")]
    assert len(kids) == 2
    assert not any(pid_alive(k) for k in kids)
    assert "job_leftovers" in d.stderr()


def test_hybrid_waits_for_the_emergency_checkpoint(daemons, tmp_path):
    sd, out, ck = tmp_path / "sd", tmp_path / "out", tmp_path / "ck"
    out.mkdir(), ck.mkdir()
    d = daemons(wrap(sd, "--shutdown", "hybrid", "--checkpoint-dir", str(ck)) +
                [PY, JOBS, "ckpt_on_usr1", str(ck), str(out)])
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143  # stopped by SIGTERM before the job finished: 128 + 15
    assert (out / "terminated").read_text() == "1"  # SIGTERM came after exactly one checkpoint
    assert (ck / "step_1001.pt").exists()
    assert "shutdown_checkpoint_seen" in d.stderr()


def test_daemon_kill9_then_restart_stops_leftover_and_continues_ledger(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    args = wrap(sd, "--max-restarts", "5", "--grace", "1", *short_leftover_grace(tmp_path)) + [
        PY, JOBS, "ignore_term", str(out)]
    d1 = daemons(args)
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    old_job = int((out / "ready").read_text())
    run1 = history(sd)["run_id"]
    os.kill(d1.proc.pid, signal.SIGKILL)  # only the daemon: its job survives in its own session
    d1.proc.wait(10)
    assert pid_alive(old_job)
    (out / "ready").unlink()
    d2 = daemons(args)
    wait_for(lambda: (out / "ready").exists(), 30, what="relaunched job ready")
    new_job = int((out / "ready").read_text())
    assert new_job != old_job and not pid_alive(old_job)
    h = history(sd)
    assert h["run_id"] == run1
    assert [a["attempt"] for a in h["attempts"]] == [0, 1]
    assert h["attempts"][0]["counted"] is False and "daemon was restarted" in h["attempts"][0]["summary"]
    d2.signal(signal.SIGTERM)
    assert d2.wait(30) == 143  # stopped by SIGTERM before the job finished: 128 + 15


def test_fast_printer_is_never_blocked_and_nothing_is_lost(daemons, tmp_path):
    sd = tmp_path / "sd"
    n = 300_000
    log_file = tmp_path / "job.log"
    t0 = time.monotonic()
    d = daemons(wrap(sd, "--log-file", str(log_file)) + [PY, JOBS, "spam", str(n)])
    assert d.wait(120) == 0
    elapsed = time.monotonic() - t0
    out = d.stdout_path.read_bytes()
    assert out.count(b"\n") == n
    assert log_file.read_bytes() == out  # the log file is an exact copy of the pass-through
    assert out.splitlines()[-1].startswith(f"line {n - 1} ".encode())
    assert n / elapsed > 20_000  # loose: a blocked pipe would take far longer (measured in scripts/bench)


def test_sighup_reload_valid_and_invalid(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    cfgp = tmp_path / "c.toml"
    base = (f'[job]\nname = "r"\ncommand = ["{PY}", "{JOBS}", "flush_on_term", "{out}"]\n'
            f'[state]\ndir = "{sd}"\n')
    cfgp.write_text(base)
    d = daemons(["run", "--config", str(cfgp)])
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    cfgp.write_text(base + "[policy]\nmax_restarts = 4\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "config_reloaded" in d.stderr(), 10)
    assert "policy.max_restarts" in d.stderr()
    cfgp.write_text(base + "[policy]\nmax_restarts = \"ten\"\nbogus = 1\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "reload_rejected" in d.stderr(), 10)
    # The rejection names the key, what was expected and the bad value; nothing else in the log
    # does (an assertion on the bare word "ten" would also match "listening").
    rejected = [l for l in d.stderr().splitlines() if "reload_rejected" in l]
    assert len(rejected) == 1, rejected
    assert re.search(r'policy\.max_restarts: expected a non-negative integer, got \\?"ten\\?"', rejected[0]), rejected[0]
    assert "policy.bogus" in rejected[0]
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143  # stopped by SIGTERM before the job finished: 128 + 15


def test_a_reload_of_wrap_with_a_config_file_keeps_the_command_and_the_flags(daemons, tmp_path):
    """`wrap --config FILE --backoff 0 -- CMD`: the file has no command; a reload reads it again
    with the same flags over it (every reload was refused: "job.command: required")."""
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    cfgp = tmp_path / "c.toml"
    cfgp.write_text('[policy]\nmax_restarts = 3\n')
    d = daemons(["wrap", "--config", str(cfgp), "--state-dir", str(sd), "--backoff", "0", "--",
                 PY, str(JOBS), "flush_on_term", str(out)])
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    cfgp.write_text('[policy]\nmax_restarts = 4\n')
    d.signal(signal.SIGHUP)
    wait_for(lambda: "config_reloaded" in d.stderr() or "reload_rejected" in d.stderr(), 10, what="the reload")
    assert "reload_rejected" not in d.stderr(), d.stderr()[-2000:]
    [line] = [x for x in d.stderr().splitlines() if "config_reloaded" in x]
    assert "policy.max_restarts" in line and "job.command" not in line and "backoff" not in line, line
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143


def test_unstartable_command_gives_up_clearly(daemons, tmp_path):
    sd = tmp_path / "sd"
    d = daemons(wrap(sd) + ["/nonexistent/python3", "train.py"])
    assert d.wait(30) == 3
    assert "cannot start the job" in d.stderr()


def test_secrets_in_the_environment_are_never_logged_or_stored(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    cfgp = tmp_path / "c.toml"
    base = (f'[job]\ncommand = ["{PY}", "{JOBS}", "flush_on_term", "{out}"]\n'
            f'env = {{ API_TOKEN = "tok-s3cr3t-1", PLAIN = "visible" }}\n[state]\ndir = "{sd}"\n')
    cfgp.write_text(base)
    d = daemons(["run", "--config", str(cfgp)], env={"DB_PASSWORD": "pw-hunter2", "MY_SECRET_KEY": "k-77"})
    wait_for(lambda: (out / "ready").exists(), 20, what="job ready")
    cfgp.write_text(base.replace("tok-s3cr3t-1", "tok-s3cr3t-2"))
    d.signal(signal.SIGHUP)
    wait_for(lambda: "config_reloaded" in d.stderr(), 10)
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143  # stopped by SIGTERM before the job finished: 128 + 15
    stored = b"".join(p.read_bytes() for p in sd.iterdir() if p.name.startswith("ledger.sqlite"))
    h = json.dumps(history(sd))
    for secret in ("tok-s3cr3t-1", "tok-s3cr3t-2", "pw-hunter2", "k-77"):
        assert secret not in d.stderr() and secret.encode() not in stored and secret not in h, secret
    assert "job.env.API_TOKEN" in d.stderr()  # the change itself is reported, its value is not
    assert history(sd)["attempts"][0]["env"]["PLAIN"] == "visible"


def test_no_progress_gives_up_with_the_steps_seen(daemons, tmp_path):
    sd, ck = tmp_path / "sd", tmp_path / "ck"
    ck.mkdir()
    from supervisor.client import save_checkpoint
    import torch

    save_checkpoint({"model": {"w": torch.zeros(2)}}, ck / "step_000100.pt", step=100)
    cfg = tmp_path / "c.toml"
    cfg.write_text("[checkpoints]\nno_progress_attempts = 3\n")
    # Every attempt dies before writing a newer checkpoint: restarting cannot help.
    d = daemons(wrap(sd, "--config", str(cfg), "--checkpoint-dir", str(ck), "--max-restarts", "10") +
                [PY, "-c", "import os; os.kill(os.getpid(), 9)"])  # not an identical repeat (a SIGKILL)
    assert d.wait(120) == 3
    h = history(sd)
    assert len(h["attempts"]) == 3 and h["attempts"][0]["checkpoint"].endswith("step_000100.pt")
    assert h["state"] == "gave_up" and "no progress: 3 attempts in a row" in h["reason"]
    assert "gave up" in d.stderr()


def test_an_identical_failure_is_remembered_across_a_daemon_restart(daemons, tmp_path):
    # Attempt 0 exits 1 before any step; attempt 1 hangs and its daemon is killed -9; the next
    # daemon's attempt 2 exits 1 exactly as attempt 0 did: the second identical failure, so it
    # gives up (no third identical attempt), the repeat identity read back from the ledger.
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    job = ("import os, sys, time\n"
           "if os.environ['TSUP_ATTEMPT'] == '1':\n"
           f"    open({str(out / 'ready')!r}, 'w').write(str(os.getpid()))\n"
           "    time.sleep(3600)\n"
           "sys.exit(1)\n")
    args = wrap(sd, "--max-restarts", "10", *short_leftover_grace(tmp_path)) + [PY, "-c", job]
    d1 = daemons(args)
    wait_for(lambda: (out / "ready").exists(), 30, what="attempt 1 running")
    os.kill(d1.proc.pid, signal.SIGKILL)
    d1.proc.wait(10)
    d2 = daemons(args)
    assert d2.wait(60) == 3
    h = history(sd)
    assert [a["attempt"] for a in h["attempts"]] == [0, 1, 2]
    assert [a["exit_code"] for a in h["attempts"]][::2] == [1, 1]
    assert "identical to attempt 0" in h["reason"], h["reason"]
