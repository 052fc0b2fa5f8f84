"""supervisor.client: no-op outside supervision, heartbeat/report files, signals, resume info, misuse."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from supervisor import client
from supervisor.client import ClientUsageError, _heartbeat, _metrics, _signals
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher

REPO = Path(__file__).resolve().parents[2]
TSUP_VARS = ("TSUP_RUN_ID", "TSUP_ATTEMPT", "TSUP_RESUME_FROM", "TSUP_RESUME_STEP", "TSUP_SKIP_BATCHES",
             "TSUP_HEARTBEAT_DIR", "TSUP_CHECKPOINT_DIR", "TSUP_HEARTBEAT_INTERVAL_S", "TSUP_STOP_SIGNAL",
             "TSUP_CHECKPOINT_SIGNAL", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def reset() -> None:
    _heartbeat._reset_for_tests()
    _metrics._reset_for_tests()
    _signals._reset_for_tests()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for v in TSUP_VARS:
        monkeypatch.delenv(v, raising=False)
    reset()
    yield monkeypatch
    reset()


@pytest.fixture
def supervised(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    hb = tmp_path / "hb"
    clean_env.setenv("TSUP_RUN_ID", "run-1")
    clean_env.setenv("TSUP_ATTEMPT", "2")
    clean_env.setenv("TSUP_HEARTBEAT_DIR", str(hb))
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("TSUP_HEARTBEAT_INTERVAL_S", "3600")
    return hb


def run_py(code: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in TSUP_VARS}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**base, "PYTHONPATH": str(REPO), **env},
                          capture_output=True, text=True, timeout=timeout, check=False)


# -- outside supervision --------------------------------------------------------------------

def test_noop_and_silent_outside_supervision(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    res = run_py("""
        import signal, sys
        from supervisor import client
        client.heartbeat(1)
        client.report(1, loss=2.0)
        with client.checkpointing():
            pass
        assert client.install() is False
        assert client.should_stop() is False and client.should_checkpoint() is False
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        info = client.resume_info()
        assert info.path is None and info.attempt == 0 and not info.resuming and info.run_id is None
        assert not client.supervised()
        assert "torch" not in sys.modules
        print("ok")
    """, {"TSUP_HEARTBEAT_DIR": str(hb)})  # a stray dir without TSUP_RUN_ID: still not supervised
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ok\n" and res.stderr == ""
    assert not hb.exists()


def test_import_never_imports_torch() -> None:
    res = run_py("import sys, supervisor.client as c; c.resume_info(); print('torch' in sys.modules)",
                 {"TSUP_RUN_ID": "r"})
    assert res.stdout.strip() == "False", res.stderr


# -- misuse fails fast ------------------------------------------------------------------------

@pytest.mark.parametrize("call,msg", [
    (lambda: client.heartbeat("x"), "step must be an integer"),  # type: ignore[arg-type]
    (lambda: client.heartbeat(1.5), "step must be an integer"),  # type: ignore[arg-type]
    (lambda: client.heartbeat(True), "not a bool"),
    (lambda: client.report(1, loss="high"), "loss must be a number"),  # type: ignore[arg-type]
    (lambda: client.report(1, tokens=[1]), "tokens must be a number"),  # type: ignore[arg-type]
    (lambda: client.report(step="7", loss=1.0), "step must be an integer"),  # type: ignore[arg-type]
    (lambda: client.report(5), "needs at least one metric"),
])
def test_misuse_raises_clear_errors_even_outside_supervision(clean_env: pytest.MonkeyPatch, call: object,
                                                             msg: str) -> None:
    with pytest.raises(ClientUsageError, match=msg):
        call()  # type: ignore[operator]


def test_malformed_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TSUP_RESUME_STEP", "ten")
    with pytest.raises(ClientUsageError, match="TSUP_RESUME_STEP='ten' is not an integer"):
        client.resume_info()


# -- supervised ---------------------------------------------------------------------------------

def test_heartbeat_file_and_interval(supervised: Path) -> None:
    client.heartbeat(np.int64(10))  # type: ignore[arg-type]  # what a job passes: a numpy step
    path = supervised / "heartbeat-rank3.json"
    raw = path.read_bytes()
    assert len(raw) == _heartbeat.RECORD_BYTES
    rec = json.loads(raw)
    assert rec["rank"] == 3 and rec["world_size"] == 4 and rec["attempt"] == 2 and rec["step"] == 10
    assert rec["state"] == "running" and rec["pid"] == os.getpid() and rec["seq"] == 1
    assert abs(rec["t"] - time.time()) < 5
    client.heartbeat(11)  # within the interval: not written
    assert json.loads(path.read_bytes())["seq"] == 1
    with client.checkpointing():
        rec = json.loads(path.read_bytes())
        assert rec["state"] == "checkpointing" and rec["step"] == 11
    rec = json.loads(path.read_bytes())
    assert rec["state"] == "running" and rec["seq"] == 3


def test_a_heartbeat_file_deleted_with_its_folder_is_written_again_once_the_folder_is_back(
        supervised: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    client.heartbeat(1)
    path = supervised / "heartbeat-rank3.json"
    shutil.rmtree(supervised)  # the supervisor's state dir deleted under the job
    with client.checkpointing():  # a beat now: the folder is not back, the old descriptor takes it
        pass
    supervised.mkdir()  # the daemon re-took its state dir (statelock.py)
    with client.checkpointing():
        rec = json.loads(path.read_bytes())
    assert rec["state"] == "checkpointing" and rec["step"] == 1
    client.report(step=2, loss=1.0)  # and the metric reports, looked at once a second
    shutil.rmtree(supervised)
    _metrics._looked_at = 0.0  # the once-a-second look is due
    client.report(step=3, loss=1.0)  # into the old file: the folder is not back
    supervised.mkdir()
    _metrics._looked_at = 0.0
    client.report(step=4, loss=1.5)
    lines = (supervised / "metrics-rank3.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [4]
    assert "off" not in capsys.readouterr().err


def test_heartbeat_cost_is_tiny(supervised: Path) -> None:
    client.heartbeat(0)
    n = 200_000
    t0 = time.perf_counter()
    for i in range(n):
        client.heartbeat(i)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 5e-6  # the benchmark measures the real figure (~0.3 us); shared CI cores are noisy


def test_report_writes_json_lines_the_logwatcher_reads(supervised: Path) -> None:
    client.report(1, loss=2.5, grad_norm=1.0, lr=3e-4, tokens_per_sec=1000, mfu=0.4)
    client.report(2, loss=float("nan"))
    path = supervised / "metrics-rank3.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["step"] == 1 and first["loss"] == 2.5 and first["mfu"] == 0.4 and first["rank"] == 3
    assert first["attempt"] == 2
    assert "NaN" in lines[1]
    # A report is also a heartbeat.
    assert json.loads((supervised / "heartbeat-rank3.json").read_bytes())["step"] == 1
    got: list = []
    dets: list = []
    w = LogWatcher(DetectorsConfig(), dets.append, got.append)
    w.feed(f"file:{path}", lines)
    assert [m.fmt for m in got] == ["client", "client"] and got[0].tokens_per_sec == 1000
    assert dets and dets[0].cause.value == "nan" and dets[0].step == 2


def test_resume_info_from_environment(supervised: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TSUP_RESUME_FROM", "/ckpt/step_1000.pt")
    clean_env.setenv("TSUP_RESUME_STEP", "1000")
    clean_env.setenv("TSUP_SKIP_BATCHES", "500")
    clean_env.setenv("TSUP_CHECKPOINT_DIR", "/ckpt")
    info = client.resume_info()
    assert info == client.ResumeInfo(path="/ckpt/step_1000.pt", step=1000, skip_batches=500, attempt=2,
                                     run_id="run-1", checkpoint_dir="/ckpt")
    assert info.resuming
    with pytest.raises(AttributeError):
        info.step = 3  # type: ignore[misc]


def test_unwritable_heartbeat_dir_warns_once_and_never_raises(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    clean_env.setenv("TSUP_RUN_ID", "r")
    clean_env.setenv("TSUP_HEARTBEAT_DIR", str(blocker / "hb"))  # a dir below a regular file
    client.heartbeat(1)
    client.heartbeat(2)
    client.report(1, loss=1.0)
    err = capsys.readouterr().err
    assert err.count("cannot write heartbeats") == 1 and "cannot write metrics" in err


def test_signals_set_flags_and_do_not_kill(tmp_path: Path) -> None:
    res = run_py("""
        import os, signal, time
        from supervisor import client
        assert client.should_stop() is False          # installs the handlers lazily
        os.kill(os.getpid(), signal.SIGUSR1)
        assert client.should_checkpoint() is True
        assert client.should_checkpoint() is False     # reading clears it
        os.kill(os.getpid(), signal.SIGTERM)           # would kill without the handler
        assert client.should_stop() is True and client.should_stop() is True
        print("survived")
    """, {"TSUP_RUN_ID": "r", "TSUP_HEARTBEAT_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "survived"


def test_configured_signals(tmp_path: Path) -> None:
    res = run_py("""
        import os, signal
        from supervisor import client
        client.install()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGINT)
        assert client.should_checkpoint() and client.should_stop()
        print("ok")
    """, {"TSUP_RUN_ID": "r", "TSUP_STOP_SIGNAL": "INT", "TSUP_CHECKPOINT_SIGNAL": "SIGUSR2"})
    assert res.returncode == 0, res.stderr


def test_install_from_a_thread_fails_fast(tmp_path: Path) -> None:
    res = run_py("""
        import threading
        from supervisor import client
        errors = []
        def worker():
            try:
                client.should_stop()
            except client.ClientUsageError as exc:
                errors.append(str(exc))
        t = threading.Thread(target=worker); t.start(); t.join()
        print(errors[0])
    """, {"TSUP_RUN_ID": "r"})
    assert "must run in the main thread" in res.stdout, res.stderr


def test_bad_signal_name(tmp_path: Path) -> None:
    res = run_py("from supervisor import client; client.install()", {"TSUP_RUN_ID": "r", "TSUP_STOP_SIGNAL": "SIGNOPE"})
    assert res.returncode != 0 and "TSUP_STOP_SIGNAL='SIGNOPE' is not a signal name" in res.stderr


def test_save_checkpoint_is_exported_lazily() -> None:
    assert callable(client.save_checkpoint)
    assert "save_checkpoint" in client.__all__
    with pytest.raises(AttributeError):
        client.no_such_thing  # noqa: B018


def test_sigterm_without_install_keeps_default(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "from supervisor import client; import time\n"
                          "client.heartbeat(1); print('up', flush=True); time.sleep(60)"],
                         env={**os.environ, "PYTHONPATH": str(REPO), "TSUP_RUN_ID": "r",
                              "TSUP_HEARTBEAT_DIR": str(tmp_path)}, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.stdout:
            p.stdout.close()
