"""GPU health through the real daemon on a simulated node (issue 39): the real NVML backend over
NVIDIA's real ``pynvml`` with only its C calls simulated (tests/helpers/nvml_clib.py, injected by
the test-only launcher tests/helpers/fake_gpu_daemon.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Daemon, helper, history, started_daemons
from tests.util import wait_for

PY = sys.executable
GiB = 1024**3


class SimGpuDaemon(Daemon):
    def __init__(self, node: dict[str, Any], args: list[str], tmp: Path, env: dict[str, str] | None = None
                 ) -> None:  # no super().__init__(): it would launch
        self.tmp = tmp
        self.stdout_path = tmp / "daemon.stdout"
        self.stderr_path = tmp / "daemon.stderr"
        spec = tmp / "node.json"
        spec.write_text(json.dumps({"simulated": node}))
        e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        e.pop("JOURNAL_STREAM", None)
        e.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen([PY, helper("fake_gpu_daemon.py"), str(spec), "--log-format", "logfmt", *args],
                                     cwd=str(ROOT), env=e, stdout=open(self.stdout_path, "wb"),
                                     stderr=open(self.stderr_path, "wb"), start_new_session=True)


@pytest.fixture
def sim_daemons(tmp_path: Path):
    with started_daemons(lambda node, args, env=None: SimGpuDaemon(node, args, tmp_path, env)) as start:
        yield start


# The job: counts its launches in OUT, runs until the file OUT/stop appears (or 60 s), exits 0.
JOB = ("import os, sys, time\nout = sys.argv[1]\nn = len([p for p in os.listdir(out) if p.startswith('a')])\n"
       "open(os.path.join(out, f'a{n}'), 'w').close()\nprint(f'attempt {n} running', flush=True)\n"
       "end = time.monotonic() + 60\n"
       "while not os.path.exists(os.path.join(out, 'stop')) and time.monotonic() < end:\n    time.sleep(0.05)\n")


def test_a_mig_parent_and_a_denied_handle_leave_a_running_job_and_name_the_gpu(sim_daemons, tmp_path: Path) -> None:
    """A MIG parent answering NO_PERMISSION for its memory (a container) and a GPU whose handle a
    device cgroup denies: the gate passes with a warning naming the GPU, the job runs and ends
    normally; never a crash of the gate, never a give-up labelled checkpoint_load_error."""
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    node = {"gpus": [{"uuid": "GPU-00000000-aaaa"},
                     {"uuid": "GPU-11111111-bbbb", "memory_error": "no_permission",
                      "migs": [{"uuid": "MIG-11111111-0001", "gi": 1, "ci": 0}]},
                     {"uuid": "GPU-22222222-cccc", "handle_error": "no_permission"}]}
    cfg = tmp_path / "c.toml"
    cfg.write_text("[gpu]\npoll_s = 0.1\n")
    d = sim_daemons(node, ["wrap", "--config", str(cfg), "--state-dir", str(sd), "--", PY, "-c", JOB, str(out)])
    wait_for(lambda: "gpu_device_unknown" in d.stderr() and (out / "a0").exists(), timeout=60,
             what="the job running and the denied GPU said")
    (out / "stop").touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]
    a = history(sd)["attempts"]
    assert len(a) == 1 and a[0]["cause"] is None and a[0]["exit_code"] == 0
    gate = a[0]["gate"]
    assert gate["passed"] is True and any(w.startswith("GPU 2 cannot be read") for w in gate["warnings"]), gate
    assert "no_permission" in json.dumps(gate["details"]["unknown_devices"])
    assert [m["device"] for m in gate["details"]["memory"]] == [0, 1], "the MIG parent is read through its slice"
    assert "checkpoint_load_error" not in d.stderr() and "could not choose a checkpoint" not in d.stderr()
    unknown = [line for line in d.events() if line.startswith("event=gpu_device_unknown")]
    assert unknown and "device=2" in unknown[0] and "no_permission" in unknown[0]


def test_foreign_memory_and_foreign_xids_never_delay_or_stop_the_job(sim_daemons, tmp_path: Path) -> None:
    """The job's GPUs come from its CUDA_VISIBLE_DEVICES (a GPU by UUID and a MIG slice): another
    process holding 87 % of another GPU does not hold up the gate, and Xids of another GPU (an
    application one and a node-level one) and of another tenant's MIG slice are noted, not acted on;
    messages name the job's device as cuda:N with its UUID."""
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    node = {"gpus": [{"uuid": "GPU-00000000-aaaa", "used": 0},
                     {"uuid": "GPU-11111111-bbbb", "used": 70 * GiB, "procs": {"999999": 70 * GiB}},
                     {"uuid": "GPU-22222222-cccc", "memory_error": "no_permission",
                      "migs": [{"uuid": "MIG-22222222-0001", "gi": 1, "ci": 0},
                               {"uuid": "MIG-22222222-0002", "gi": 2, "ci": 0, "used": 9 * GiB}]}],
            "events": [[0.5, 1, 13, None, None], [0.6, 2, 43, 2, 0], [0.7, 1, 79, None, None]]}
    cfg = tmp_path / "c.toml"
    cfg.write_text("[gpu]\npoll_s = 0.1\nrelease_timeout_s = 30\n")
    d = sim_daemons(node, ["wrap", "--config", str(cfg), "--state-dir", str(sd),
                           "--env", "CUDA_VISIBLE_DEVICES=GPU-00000000,MIG-22222222-0001", "--",
                           PY, "-c", JOB, str(out)])
    wait_for(lambda: d.stderr().count("event=gpu_xid_foreign") >= 3 and (out / "a0").exists(), timeout=60,
             what="the three foreign Xids noted while the job runs")
    (out / "stop").touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]
    h = history(sd)
    a = h["attempts"]
    assert len(a) == 1 and a[0]["cause"] is None and a[0]["exit_code"] == 0
    gate = a[0]["gate"]
    assert gate["passed"] is True and gate["waited_s"] == 0, gate
    assert [m["device"] for m in gate["details"]["memory"]] == [0, 2], "GPU 1 is not the job's: not looked at"
    labels = [m["label"] for m in gate["details"]["memory"]]
    assert labels == ["GPU 0 (cuda:0, GPU-00000000-aaaa)", "GPU 2 (cuda:1, MIG-22222222-0001)"], labels
    foreign = [line for line in d.events() if line.startswith("event=gpu_xid_foreign")]
    assert any("xid 13 on GPU 1" in f and "does not use" in f for f in foreign), foreign
    assert any("xid 43 on GPU 2 (MIG GI 2, CI 0)" in f and "MIG slice" in f for f in foreign), foreign
    assert any("xid 79 on GPU 1" in f for f in foreign), foreign
    assert not [e for e in h["events"] if e["event"] in ("failure_detected", "detection_warned")]
    resolved = [line for line in d.events() if line.startswith("event=gpu_devices_resolved")]
    assert resolved and "CUDA_VISIBLE_DEVICES" in resolved[0]


@pytest.mark.parametrize("reset_xid", [109, 156])
def test_xid_63_and_92_warn_and_a_reset_xid_refuses_a_relaunch(sim_daemons, tmp_path: Path, reset_xid: int) -> None:
    """NVIDIA's catalog: 63 (a row remapping recorded) and 92 (a high corrected-error rate) are
    'ignore': recorded, the job runs on; 109 and the reset codes the old table did not list (156)
    need a GPU reset: the run gives up (exit 3) rather than relaunch onto that GPU."""
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    node = {"gpus": [{"uuid": "GPU-00000000-aaaa"}],
            "events": [[0.2, 0, 63, None, None], [0.3, 0, 92, None, None]], "xid_file": str(tmp_path / "xid")}
    cfg = tmp_path / "c.toml"
    cfg.write_text("[gpu]\npoll_s = 0.1\n[shutdown]\ngrace_s = 5\n")
    d = sim_daemons(node, ["wrap", "--config", str(cfg), "--state-dir", str(sd), "--backoff", "0", "--",
                           PY, "-c", JOB, str(out)])
    wait_for(lambda: len([e for e in history(sd)["events"] if e["event"] == "detection_warned"]) >= 2
             if (sd / "ledger.sqlite").exists() else False, timeout=60, what="Xid 63 and 92 recorded as warnings")
    assert (out / "a0").exists() and d.proc.poll() is None, "the job runs on after 63 and 92"
    (tmp_path / "xid.new").write_text(str(reset_xid))
    os.replace(tmp_path / "xid.new", tmp_path / "xid")  # whole, at once: the node raises the reset code now
    assert d.wait(60) == 3, d.stderr()[-3000:]
    h = history(sd)
    a = h["attempts"]
    assert len(a) == 1 and a[0]["cause"] == "gpu_fault" and a[0]["action"] == "give_up", a
    assert f"Xid {reset_xid}" in a[0]["summary"] and "drain or reset this node" in a[0]["summary"]
    warned = [e["data"] for e in h["events"] if e["event"] == "detection_warned"]
    assert sorted(w["value"] for w in warned) == [63.0, 92.0], warned


# Attempt 0 exits 1 at once; attempt 1 runs until OUT/stop appears.
CRASH_THEN_RUN = ("import os, sys, time\nout = sys.argv[1]\nn = len([p for p in os.listdir(out) if p.startswith('a')])\n"
                  "open(os.path.join(out, f'a{n}'), 'w').close()\nn == 0 and sys.exit(1)\n"
                  "end = time.monotonic() + 60\n"
                  "while not os.path.exists(os.path.join(out, 'stop')) and time.monotonic() < end:\n"
                  "    time.sleep(0.05)\n")


def test_a_stale_xid_raised_between_attempts_is_not_delivered_to_the_next(sim_daemons, tmp_path: Path) -> None:
    """An Xid 43 raised after attempt 0 ended (its crash's own fault, queued in NVML's event set
    while no attempt listens) is dropped when attempt 1 starts: the fresh job is not restarted."""
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    node = {"gpus": [{"uuid": "GPU-00000000-aaaa"}], "xid_file": str(tmp_path / "xid")}
    cfg = tmp_path / "c.toml"
    # the backoff holds attempt 1 back while the test raises the Xid (the test waits for the end, not a time)
    cfg.write_text("[gpu]\npoll_s = 0.1\n[policy]\nbackoff_initial_s = 6\nbackoff_jitter = 0\n")
    d = sim_daemons(node, ["wrap", "--config", str(cfg), "--state-dir", str(sd), "--", PY, "-c", CRASH_THEN_RUN,
                           str(out)])
    wait_for(lambda: (sd / "ledger.sqlite").exists() and history(sd)["attempts"]
             and history(sd)["attempts"][0]["ended_at"], timeout=60, what="attempt 0 ended")
    assert not (out / "a1").exists(), "attempt 1 must not have started yet (the backoff)"
    (tmp_path / "xid.new").write_text("43")
    os.replace(tmp_path / "xid.new", tmp_path / "xid")
    wait_for(lambda: (out / "a1").exists() and "event=gpu_events_stale" in d.stderr(), timeout=60,
             what="attempt 1 running, the stale Xid dropped")
    (out / "stop").touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]
    a = history(sd)["attempts"]
    assert [x["cause"] for x in a] == ["crash", None], a
    stale = [line for line in d.events() if line.startswith("event=gpu_events_stale")]
    assert "xid 43 on GPU 0" in stale[0], stale
