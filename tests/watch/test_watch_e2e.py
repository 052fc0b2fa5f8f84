"""Detection through the real daemon: trainer formats, remedy ladder, GPU faults from the fake
NVML backend, and the control verbs while a job runs."""
from __future__ import annotations

import json
import os
import subprocess
import time
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Daemon, helper, history, started_daemons
from tests.util import wait_for

PY = sys.executable


@pytest.mark.parametrize("fmt", ["json", "hf", "nanogpt", "torchtitan", "megatron"])
def test_nan_at_step_500_in_every_format_is_detected_with_its_onset(daemons, tmp_path, fmt):
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--max-restarts", "0", "--", PY,
                 helper("watch_nan_child.py"), fmt, "500"])
    assert d.wait(60) == 3
    a = history(sd)["attempts"][0]
    assert a["cause"] == "nan" and a["action"] == "give_up"
    det = a["detection"]
    if fmt != "hf":  # HF Trainer lines carry no step of their own
        # logged every 10 steps: finite at 490, so the onset is 491 (the poison may start there)
        assert det["onset_step"] == 491 and det["step"] == 500
    assert det["evidence"]


LADDER_JOB = """\
import json, os, sys
out = sys.argv[1]
n = len([p for p in os.listdir(out) if p.startswith("a")])
json.dump({"argv": sys.argv, "LR_SCALE": os.environ.get("LR_SCALE"),
           "skip": os.environ.get("TSUP_SKIP_BATCHES")}, open(os.path.join(out, f"a{n}.json"), "w"))
for step in range(1, 8):
    print(json.dumps({"step": step, "loss": float("nan") if step == 5 else 2.0}), flush=True)
import time; time.sleep(30)
"""


def test_remedy_ladder_applies_rungs_in_order_then_gives_up(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.py"
    job.write_text(LADDER_JOB)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""
[job]
command = ["{PY}", "{job}", "{out}", "--lr=1e-3"]
[state]
dir = "{sd}"
[policy]
max_restarts = 10
backoff_initial_s = 0
[shutdown]
grace_s = 2
[on.nan]
action = "restart"
remedies = [{{ env = {{ LR_SCALE = "0.5" }} }}, {{ args = ["--lr=1e-4"] }}]
""")
    d = daemons(["run", "--config", str(cfg)])
    assert d.wait(90) == 3
    runs = [json.loads((out / f"a{i}.json").read_text()) for i in range(4)]
    assert not (out / "a4.json").exists()
    # The first NaN gets a plain restart; each repeat climbs one rung (cumulative); a repeat
    # after the last rung gives up.
    assert [r["LR_SCALE"] for r in runs] == [None, None, "0.5", "0.5"]
    assert [r["argv"][-1] for r in runs] == ["--lr=1e-3", "--lr=1e-3", "--lr=1e-3", "--lr=1e-4"]
    h = history(sd)
    assert [a["cause"] for a in h["attempts"]] == ["nan"] * 4
    assert h["attempts"][-1]["action"] == "give_up"
    assert h["attempts"][2]["remedies"] and h["attempts"][1]["remedies"] == []
    assert "remedies did not help" in d.stderr()


def _timeline(tmp: Path, timeline: list) -> Path:
    p = tmp / "gpu.json"
    p.write_text(json.dumps({"devices": 2, "total_gb": 80, "timeline": timeline}))
    return p


class FakeGpuDaemon(Daemon):
    """The real daemon with the scripted fake GPU injected by a test-only launcher
    (tests/helpers/fake_gpu_daemon.py): production has no switch to a fake GPU."""

    def __init__(self, timeline: Path, args: list[str], tmp: Path) -> None:  # no super().__init__(): it would launch
        self.tmp = tmp
        self.stdout_path = tmp / "daemon.stdout"
        self.stderr_path = tmp / "daemon.stderr"
        e = {**os.environ, "PYTHONUNBUFFERED": "1"}
        e.pop("JOURNAL_STREAM", None)
        e.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen([PY, helper("fake_gpu_daemon.py"), str(timeline), "--log-format", "logfmt",
                                      *args], cwd=str(ROOT), env=e, stdout=open(self.stdout_path, "wb"),
                                     stderr=open(self.stderr_path, "wb"), start_new_session=True)


@pytest.fixture
def fake_gpu_daemons(tmp_path: Path):
    with started_daemons(lambda timeline, args: FakeGpuDaemon(timeline, args, tmp_path)) as start:
        yield start


def test_node_level_xid_gives_up_with_drain_advice(fake_gpu_daemons, tmp_path):
    sd = tmp_path / "sd"
    backend = _timeline(tmp_path, [[1.0, {"xid": {"device": 1, "code": 79}}]])
    d = fake_gpu_daemons(backend, ["wrap", "--state-dir", str(sd), "--", PY, "-c", "import time; time.sleep(60)"])
    assert d.wait(60) == 3
    a = history(sd)["attempts"][0]
    assert a["cause"] == "gpu_fault" and a["action"] == "give_up"
    assert "79" in a["summary"] and "drain" in d.stderr().lower()
    env = history(sd)["attempts"][0]["environment"]
    assert len(env["gpu"]["devices"]) == 2 and env["gpu"]["driver"]
    assert len(env["at_end"]["gpu"]["devices"]) == 2  # the state at the failure, too


def test_application_xid_restarts_and_gpu_memory_is_a_warning(fake_gpu_daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    # Memory creeps to 99.5 % (a warning by default), is released, then an application Xid.
    backend = _timeline(tmp_path, [[0.2, {"memory_ramp": {"device": 0, "to_frac": 0.995, "over_s": 1}}],
                                   [3.0, {"memory": {"device": 0, "used_frac": 0.01}}],
                                   [3.5, {"xid": {"device": 0, "code": 13}}]])
    script = ("import os, sys, time\n"
              "n = len(os.listdir(sys.argv[1])); open(os.path.join(sys.argv[1], str(n)), 'w').close()\n"
              "time.sleep(60) if n == 0 else sys.exit(0)\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text("[gpu]\npoll_s = 0.2\nmemory_polls = 3\n[shutdown]\ngrace_s = 5\n")
    d = fake_gpu_daemons(backend, ["wrap", "--config", str(cfg), "--state-dir", str(sd), "--backoff", "0", "--",
                                   PY, "-c", script, str(out)])
    assert d.wait(60) == 0
    h = history(sd)
    assert [a["cause"] for a in h["attempts"]] == ["gpu_fault", None]
    assert h["attempts"][0]["action"] == "restart"
    warned = [e for e in h["events"] if e["event"] == "detection_warned"]
    assert warned and warned[0]["data"]["cause"] == "gpu_memory"
    assert h["attempts"][1]["gate"]["passed"] is True


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", *args], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)


def test_control_verbs_while_running(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    script = ("import json, os, signal, sys, time\n"
              "from supervisor import client\n"
              "client.install()\n"
              "for step in range(10**6):\n"
              "    client.heartbeat(step); client.report(step=step, loss=2.0 - step * 1e-4)\n"
              "    if client.should_checkpoint(): open(os.path.join(sys.argv[1], f'ck{step}'), 'w').close()\n"
              "    if client.should_stop(): sys.exit(0)\n"
              "    time.sleep(0.01)\n")
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--", PY, "-c", script, str(out)])

    def status():
        cp = _cli("status", "--json", "--state-dir", str(sd))
        return json.loads(cp.stdout) if cp.returncode == 0 else None

    st = wait_for(lambda: (s := status()) and s.get("last_metric") and s["last_metric"]["step"] > 5
                  and s["heartbeats"] and s, 30)
    for key in ("state", "run_id", "attempt", "pids", "restarts_by_cause", "last_metric", "heartbeats", "gpus",
                "checkpoint", "goodput"):
        assert key in st
    assert st["state"] == "running" and st["pids"] and st["heartbeats"].get("0") is not None
    human = _cli("status", "--state-dir", str(sd))
    assert human.returncode == 0 and "running" in human.stdout
    assert _cli("checkpoint-now", "--state-dir", str(sd)).returncode == 0
    wait_for(lambda: any(p.name.startswith("ck") for p in out.iterdir()), 10, what="emergency checkpoint")
    cp = _cli("restart", "--reason", "config changed", "--state-dir", str(sd))
    assert cp.returncode == 0, cp.stderr
    wait_for(lambda: (s := status()) and s["attempt"] == 1 and s["state"] == "running", 30)
    assert _cli("stop", "--state-dir", str(sd)).returncode == 0
    assert d.wait(30) == 0
    h = history(sd)
    assert [a["cause"] for a in h["attempts"]] == ["manual", None]
    assert "config changed" in h["attempts"][0]["summary"]
    # Not a failure: the operator's restart does not spend the restart budget.
    assert h["attempts"][0]["counted"] is False
    # SPEC: with no daemon but a run in the state dir, status prints the last run's end and exits 3.
    cp = _cli("status", "--state-dir", str(sd))
    assert cp.returncode == 3 and "no daemon is running: the last run" in cp.stdout, cp.stderr
    last = json.loads(_cli("status", "--json", "--state-dir", str(sd)).stdout)
    assert last["daemon"] is False and last["run_id"] == h["run_id"] and last["exit_code"] == 0
    assert last["restarts_by_cause"] == {"manual": 1} and last["pids"] == []
    cp = _cli("status", "--state-dir", str(tmp_path / "never-ran"))
    assert cp.returncode == 1 and "no daemon is running" in cp.stderr


def test_gpu_lost_mid_run_gives_up(fake_gpu_daemons, tmp_path):
    sd = tmp_path / "sd"
    backend = _timeline(tmp_path, [[1.0, {"lost": {"device": 1}}]])
    d = fake_gpu_daemons(backend, ["wrap", "--state-dir", str(sd), "--grace", "2", "--", PY, "-c",
                                   "import time; time.sleep(60)"])
    assert d.wait(60) == 3
    a = history(sd)["attempts"][0]
    assert a["cause"] == "gpu_fault" and a["action"] == "give_up"
    assert a["detection"]["details"]["kind"] == "gpu_lost"


def test_gate_waits_for_gpu_memory_release_then_gives_up_when_it_is_not_released(fake_gpu_daemons, tmp_path):
    sd = tmp_path / "sd"
    # Memory held on device 0 that never goes away (a leaked context): the crashed job's memory
    # is not released, so the gate refuses the relaunch after gpu.release_timeout_s.
    backend = _timeline(tmp_path, [[0.3, {"memory": {"device": 0, "used_frac": 0.6}}]])
    cfg = tmp_path / "c.toml"
    cfg.write_text("[gpu]\nrelease_timeout_s = 1.5\n")
    t0 = time.monotonic()
    d = fake_gpu_daemons(backend, ["wrap", "--config", str(cfg), "--state-dir", str(sd), "--backoff", "0", "--",
                                   PY, "-c", "import sys, time; time.sleep(1.5); sys.exit(1)"])
    assert d.wait(60) == 3
    h = history(sd)
    assert len(h["attempts"]) == 1  # the relaunch never happened
    gates = [e for e in h["events"] if e["event"] == "health_gate"]
    assert gates[0]["data"]["passed"] is True  # nothing ran before the first launch
    assert gates[-1]["data"]["passed"] is False and gates[-1]["data"]["waited_s"] >= 1.5
    assert "gave up" in d.stderr() and "health gate" in d.stderr()
    assert time.monotonic() - t0 < 30
