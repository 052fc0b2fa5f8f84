"""The command line by convention: help for every flag and the exit codes, --wait/--json on stop
and restart, a quiet end when stdout's reader goes away, checkpoints still being written,
hashing progress, status times people read."""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.cli import main as cli, render, verbs as cliverbs
from supervisor.cli.parser import build_parser
from supervisor.cli.render import status_table
from supervisor.humanize import duration
from supervisor.ledger.store import Ledger
from tests.conftest import ROOT, helper
from tests.util import wait_for

TSUP = [sys.executable, "-m", "supervisor"]


def _sub(name: str) -> argparse.ArgumentParser:
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_every_wrap_flag_has_help():
    p = _sub("wrap")
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and action.help != argparse.SUPPRESS, action.dest


def test_every_verb_and_flag_has_help_and_every_verb_a_description():
    """Walks the whole argparse tree: a verb without a help line or a description, or a flag or
    positional without help, fails here (issue 23 build 8)."""
    ap = build_parser()
    missing: list[str] = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        if path and not (p.description or "").strip():
            missing.append(f"{path}: description")
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sp in action.choices.items():
                    if not helps.get(name):
                        missing.append(f"{path} {name}: help")
                    walk(sp, f"{path} {name}".strip())
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path or '(top)'} {'/'.join(action.option_strings) or action.dest}: help")

    walk(ap, "")
    assert missing == []


def test_install_units_help_has_no_rst():
    r = subprocess.run([*TSUP, "install-units", "--help"], capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert r.returncode == 0 and "install" in r.stdout
    assert "``" not in r.stdout and ":func:" not in r.stdout and "::\n" not in r.stdout, r.stdout


@pytest.mark.parametrize("argv", [["--help"], ["wrap", "--help"], ["run", "--help"]])
def test_exit_codes_are_in_help(argv):
    r = subprocess.run([*TSUP, *argv], capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert r.returncode == 0
    assert "exit status:" in r.stdout
    for code in ("0", "1", "2", "3", "130", "141"):
        assert f"\n  {code} " in r.stdout, code


def test_stop_and_restart_take_wait_and_json():
    for verb in ("stop", "restart"):
        opts = {o for a in _sub(verb)._actions for o in a.option_strings}
        assert {"--wait", "--json", "--timeout"} <= opts, verb


def _big_ledger(sd: Path) -> None:
    led = Ledger(sd)
    run_id, _ = led.open_run("big", {})
    for i in range(4000):
        led.event(run_id, None, "note", "info", f"event {i} " + "x" * 60, {"i": i})
    led.close()


def test_history_json_into_head_ends_quietly(tmp_path: Path):
    sd = tmp_path / "st"
    _big_ledger(sd)
    cmd = f"{' '.join(TSUP)} history --json --state-dir {sd} | head -n 3"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=60,
                       cwd=str(ROOT))
    assert r.stdout.count("\n") == 3
    assert r.stderr == "", r.stderr  # no BrokenPipeError traceback, no "Exception ignored"
    assert r.returncode == 141  # like any command killed by SIGPIPE


def test_broken_pipe_in_process(monkeypatch, tmp_path: Path):
    sd = tmp_path / "st"
    _big_ledger(sd)

    class Closed(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return os.open(os.devnull, os.O_WRONLY)

    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(["history", "--json", "--state-dir", str(sd)]) == 141


def test_stop_and_restart_wait_against_a_real_daemon(daemons, tmp_path: Path):
    sd = tmp_path / "state"
    d = daemons(["wrap", "--name", "w", "--state-dir", str(sd), "--backoff", "0.1", "--",
                 sys.executable, helper("ops_job.py")], env={"OPS_DIR": str(tmp_path)})
    wait_for(lambda: (sd / "control.sock").exists(), 30, 0.1, "control socket")

    def tsup(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*TSUP, *args, "--state-dir", str(sd)], capture_output=True, text=True, timeout=120,
                              cwd=str(ROOT))

    wait_for(lambda: json.loads(tsup("status", "--json").stdout or "{}").get("pids"), 30, 0.1, "the job runs")
    r = tsup("restart", "--reason", "test", "--wait", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] is True and out["accepted"] is True and out["wait"]["done"] is True
    assert out["wait"]["attempt"] == 1 and out["wait"]["pids"]
    r = tsup("restart", "--wait")
    assert r.returncode == 0 and "attempt 2 is " in r.stdout, r.stdout + r.stderr
    # status: times people read
    table = tsup("status").stdout
    assert "supervised for" in table and "e+09" not in table and "at=" not in table
    r = tsup("stop", "--wait", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["wait"]["done"] is True and out["wait"]["exit_code"] == 0 and out["wait"]["state"] == "stopped"
    assert d.proc.wait(30) == 0
    r = tsup("stop", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == "not_running"


def test_humane_status_times():
    now = 1_800_000_000.0
    st = render.humane_status({"state": "backoff", "restart_in_s": 3.0, "seconds_since_last_good_checkpoint": 245.0,
                                 "newest_checkpoint": "/c/step_100.pt",
                                 "last_metric": {"step": 5, "loss": 1.5, "at": now - 2, "fmt": "json",
                                                 "source": "stdout", "age_s": 2.0},
                                 "goodput_detail": {"total_s": 7300, "lost_by_cause": {"crash": 65, "startup": 4}}},
                                now=now)
    assert st["newest_good_checkpoint"].startswith("/c/step_100.pt  (saved 4 min 05 s ago, at ")
    assert st["restart_in"].startswith("3.0 s, at ")
    assert st["last_metric"] == {"step": 5, "loss": 1.5, "age_s": 2.0}
    assert st["lost_time"] == "crash 1 min 05 s, startup 4.0 s" and st["supervised_for"] == "2 h 01 min"
    assert "seconds_since_last_good_checkpoint" not in st and "restart_in_s" not in st
    assert duration(3 * 86400 + 7200) == "3 d 02 h"


def _save(path: Path, mb: int) -> None:
    import torch

    from supervisor.client import save_checkpoint

    save_checkpoint({"w": torch.zeros(mb * 1024 * 1024 // 4)}, path, step=int(path.stem.split("_")[1]),
                    config={"lr": 1.0})
    old = time.time() - 3600
    os.utime(path, (old, old))


def test_checkpoints_lists_one_being_written(tmp_path: Path):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / ".step_000200.pt.4242.tmp").write_bytes(b"\0" * 4096)  # the client's temp name, mid-save
    (ck / "checkpoint-300").mkdir()  # an HF save without its trainer_state.json yet
    (ck / "checkpoint-300" / "model.safetensors").write_bytes(b"\0" * 100)
    r = subprocess.run([*TSUP, "checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "st")],
                       capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr
    assert "no checkpoints found" not in r.stdout
    assert "no complete checkpoint yet" in r.stdout
    assert "writing" in r.stdout and ".step_000200.pt.4242.tmp" in r.stdout and "temporary name" in r.stdout
    r = subprocess.run([*TSUP, "checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "st"),
                        "--json"], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    rows = json.loads(r.stdout)
    tmp_row = next(x for x in rows if x["path"].endswith(".tmp"))
    assert tmp_row["writing"] is True and tmp_row["ready"] is False and tmp_row["step"] == 200
    assert tmp_row["reasons"][0].startswith("still being written")


def test_checkpoints_show_hashing_progress(tmp_path: Path):
    ck = tmp_path / "ck"
    ck.mkdir()
    _save(ck / "step_000100.pt", 72)  # above the 64 MiB progress threshold
    r = subprocess.run([*TSUP, "checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "st")],
                       capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr
    assert "hashing step_000100.pt (72.0 MiB) ..." in r.stderr and "hashed step_000100.pt (72.0 MiB) in " in r.stderr
    assert "step_000100.pt" in r.stdout and "yes" in r.stdout


def test_hash_progress_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    t = [0.0]
    out = Tty()
    p = cliverbs.HashProgress(out, min_bytes=100, clock_fn=lambda: t[0])
    f = Path("/x/step_1.pt")
    for done in (0, 50, 100, 150, 200):
        t[0] += 0.3
        p(f, done, 200)
    p(Path("/x/small.pt"), 10, 10)  # under the threshold: silent
    text = out.getvalue()
    assert "\rhashing step_1.pt: 100 B of 200 B (50 %)" in text
    assert text.endswith("\r") and "small.pt" not in text


def test_render_status_table():
    text = status_table({
        "state": "running", "run_id": "gpt-small-1", "attempt": 3, "pids": [101, 102],
        "restarts_by_cause": {"nan": 2, "oom": 1, "crash": 0},
        "last_metric": {"step": 1200, "loss": 2.3456789, "grad_norm": None, "age_s": 3.0},
        "heartbeats": {"0": 1.25, "1": 300.0},
        "gpus": [{"index": 0, "memory_used_bytes": 3 * 1024**3, "memory_total_bytes": 80 * 1024**3}],
        "checkpoint": "/ckpt/step_1000.pt", "goodput": 0.934, "uptime_s": 42,
    })
    width = text.splitlines()[0].index("running")  # the label column
    lines = dict((ln[:width].strip(), ln[width:].strip()) for ln in text.splitlines())
    assert lines["state"] == "running"
    # one truth per line: what this attempt resumed from, and the newest good checkpoint beside it
    assert lines["resumed from"] == "/ckpt/step_1000.pt" and lines["newest good checkpoint"] == "(none yet)"
    assert lines["attempt"] == "3"
    assert lines["pids"] == "101 102"
    assert lines["restarts"] == "3 (nan 2, oom 1)"
    assert lines["last step"] == "step=1200  loss=2.346  (3.0s ago)"
    assert lines["heartbeats"] == "rank0 1.2s ago  rank1 5.0m ago"
    assert lines["gpus"] == "gpu0  3.0 GiB / 80.0 GiB"
    assert lines["goodput"] == "93.4 %"
    assert lines["uptime s"] == "42"
    assert status_table({"state": "starting", "last_metric": None}).splitlines()[-1].endswith("(no metric seen yet)")
    fresh = status_table({"checkpoint": None, "newest_good_checkpoint": "/c/step_5.pt  (saved 3 s ago)"})
    assert fresh.splitlines() == ["resumed from            (nothing: a fresh start)",
                                  "newest good checkpoint  /c/step_5.pt  (saved 3 s ago)"]
    assert "none yet" not in fresh


def test_status_says_how_far_the_parsers_are_behind_the_job_only_when_they_are():
    behind = status_table({"state": "running", "output_lag": {"seconds": 12.5, "bytes": 4_500_000, "max_seconds": 12.5,
                                                              "unparsed_bytes": 0}})
    assert "output  parsers 12.5 s behind the job (4500000 bytes of the job log still to read" in behind
    assert "output" not in status_table({"state": "running", "output_lag": {"seconds": 0.0, "bytes": 0,
                                                                             "max_seconds": 3.0, "unparsed_bytes": 0}})
    lost = status_table({"output_lag": {"seconds": 0, "bytes": 0, "max_seconds": 1, "unparsed_bytes": 49}})
    assert "49 bytes could not be read back (output_unparsed)" in lost


def test_restart_from_waits_for_the_load_test_not_the_usual_thirty_seconds() -> None:
    """`restart --from` is answered after the checkpoint's load test (checkpoints.load_timeout_s,
    300 s by default); a 30 s wait made the CLI report a failure for a restart that then ran."""
    from supervisor.checkpoints.config import CheckpointsConfig
    from supervisor.cli.verbs import _answer_timeout

    assert _answer_timeout("restart", {"from": "/x/ckpt.pt"}) > CheckpointsConfig().load_timeout_s
    assert _answer_timeout("restart", {"from": "/x/ckpt.pt", "force": True}) == 30.0  # no load test
    assert _answer_timeout("restart", {}) == _answer_timeout("stop", None) == 30.0


def test_history_of_a_run_the_ledger_does_not_hold_is_an_error_naming_it(tmp_path: Path, capsys):
    sd = tmp_path / "st"
    led = Ledger(sd)
    run_id, _ = led.open_run("job", {})
    led.close()
    assert cli.main(["history", "--json", "--state-dir", str(sd), "--run", "nosuch-run"]) == 1
    assert "no run 'nosuch-run'" in capsys.readouterr().err
    assert cli.main(["history", "--json", "--state-dir", str(sd), "--run", run_id]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == run_id


def test_history_json_is_what_the_helper_reads(tmp_path: Path):
    """The suite reads `history --json` in-process (tests/conftest.py ``history``): it must be what
    the command prints, for a real run with an attempt, events and a final state."""
    from tests.conftest import history

    sd = tmp_path / "st"
    run = subprocess.run([*TSUP, "wrap", "--state-dir", str(sd), "--", sys.executable, "-c", "print('loss 1.5')"],
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    cp = subprocess.run([*TSUP, "history", "--json", "--state-dir", str(sd)], capture_output=True, text=True,
                        timeout=60, cwd=str(ROOT))
    assert cp.returncode == 0, cp.stderr
    printed = json.loads(cp.stdout)
    assert printed["attempts"] and printed["events"] and printed["state"] == "finished"
    assert history(sd) == printed
