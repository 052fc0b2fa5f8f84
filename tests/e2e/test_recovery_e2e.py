"""Issue 11 and 12 leftovers through the real daemon: checkpoint discovery confined to its dir,
verification overlapping the job's start-up, the validation metric in the manifest, the disk
cost of the last good copy."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import history, pid_alive
from tests.helpers.ckpt_factory import old_mtime, torch_file

PY = sys.executable


def wrap(sd: Path, *flags: str) -> list[str]:
    return ["wrap", "--state-dir", str(sd), "--backoff", "0", *flags, "--"]


# Writes where it resumed from, then exits 0.
RESUMED_FROM = "import os, sys; open(sys.argv[1], 'w').write(os.environ['TSUP_RESUME_FROM'])"


@pytest.mark.slow
def test_a_symlink_out_of_the_checkpoint_dir_is_never_resumed_from_unless_configured(daemons, tmp_path):
    ck, outside = tmp_path / "ck", tmp_path / "outside"
    torch_file(ck / "step_100.pt", 100)
    torch_file(outside / "step_900.pt", 900)
    (ck / "step_900.pt").symlink_to(outside / "step_900.pt")
    for follow in ("false", "true"):
        sd, out = tmp_path / f"sd-{follow}", tmp_path / f"resumed-{follow}"
        cfg = tmp_path / f"{follow}.toml"
        cfg.write_text(f"[checkpoints]\nfollow_symlinks_out = {follow}\n")
        d = daemons(wrap(sd, "--config", str(cfg), "--checkpoint-dir", str(ck)) + [PY, "-c", RESUMED_FROM, str(out)])
        assert d.wait(60) == 0, d.stderr()[-2000:]
        resumed = Path(out.read_text()).name
        assert resumed == ("step_900.pt" if follow == "true" else "step_100.pt")
        assert history(sd)["attempts"][0]["resume_step"] == (900 if follow == "true" else 100)
    assert (outside / "step_900.pt").exists()  # never moved or quarantined


# nanoGPT's order: the eval line, then the save of the one overwritten ckpt.pt (by rename); each
# version waits for the test to say go.
NANOGPT_EVALS = """
import os, sys, time, torch
out, ck = sys.argv[1], sys.argv[2]
for it, val in ((10, 2.75), (20, 2.5)):
    print(f"step {it}: train loss {val + 0.1:.4f}, val loss {val:.4f}", flush=True)
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {}, "iter_num": it}, os.path.join(ck, "ckpt.pt.tmp"))
    os.replace(os.path.join(ck, "ckpt.pt.tmp"), os.path.join(ck, "ckpt.pt"))
    while not os.path.exists(os.path.join(out, f"go{it}")):
        time.sleep(0.05)
"""


def _manifest_metric(ck: Path) -> tuple[float, int] | None:
    from supervisor.checkpoints.manifest import read_manifest

    m = read_manifest(ck / "ckpt.pt").manifest
    if m is None or "val_loss" not in m.metrics or m.step is None:
        return None
    return m.metrics["val_loss"]["value"], m.metrics["val_loss"]["step"]


@pytest.mark.slow
def test_the_val_loss_the_log_printed_is_kept_in_the_manifest_of_each_version(daemons, tmp_path):
    import json
    import subprocess

    from tests.conftest import ROOT
    from tests.util import wait_for

    sd, ck, out = tmp_path / "sd", tmp_path / "ck", tmp_path / "out"
    ck.mkdir(), out.mkdir()
    cfg = tmp_path / "c.toml"
    # The listing below reads the same config: with the default 2 s settle window a save that
    # the daemon verified in well under 2 s would still be "being written" there.
    cfg.write_text(f"[checkpoints]\nsettle_s = 0.2\ndir = {str(ck)!r}\n")
    d = daemons(wrap(sd, "--config", str(cfg), "--checkpoint-dir", str(ck))
                + [PY, "-c", NANOGPT_EVALS, str(out), str(ck)])
    assert wait_for(lambda: _manifest_metric(ck), 60, what="manifest of iter 10 with its val loss") == (2.75, 10)
    (out / "go10").touch()
    assert wait_for(lambda: _manifest_metric(ck) == (2.5, 20), 60, what="the next version's val loss")
    (out / "go20").touch()
    assert d.wait(60) == 0
    listing = subprocess.run([PY, "-m", "supervisor", "checkpoints", "--json", "--config", str(cfg),
                              "--state-dir", str(sd)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    rows = {Path(r["path"]).parent.name + "/" + Path(r["path"]).name: r for r in json.loads(listing.stdout)}
    assert rows["ck/ckpt.pt"]["val_metric"] == {"name": "val_loss", "value": 2.5, "step": 20}
    table = subprocess.run([PY, "-m", "supervisor", "checkpoints", "--config", str(cfg), "--state-dir",
                            str(sd)], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert "2.5" in table


# One overwritten ckpt.pt saved by rename (a new inode per save), versions 10 and 20; each
# waits for the test to say go.
NANOGPT_SAVES = """
import os, sys, time, torch
out, ck = sys.argv[1], sys.argv[2]
for it in (10, 20):
    torch.save({"model": {"w": torch.ones(4096)}, "iter_num": it}, os.path.join(ck, "ckpt.pt.tmp"))
    os.replace(os.path.join(ck, "ckpt.pt.tmp"), os.path.join(ck, "ckpt.pt"))
    while not os.path.exists(os.path.join(out, f"go{it}")):
        time.sleep(0.05)
"""


def _status(sd: Path) -> dict:
    """The running daemon's status over its control socket (what ``status --json`` prints), {}
    while it does not answer. Asked from this process: polled back to back, a CLI process per
    call spent a core."""
    from supervisor.ops.control import ControlError, DaemonNotRunning
    from supervisor.ops.controlclient import request

    try:
        return request(sd, "status", timeout=10.0)
    except (DaemonNotRunning, ControlError, OSError):
        return {}


@pytest.mark.slow
def test_the_last_good_copy_reports_its_disk_cost_and_a_size_cap_turns_it_off(daemons, tmp_path):
    from tests.util import wait_for

    for cap in (0, 1000):
        sd, out, ck = tmp_path / f"sd{cap}", tmp_path / f"out{cap}", tmp_path / f"ck{cap}"
        ck.mkdir(), out.mkdir()
        cfg = tmp_path / f"c{cap}.toml"
        cfg.write_text(f"[checkpoints]\nsettle_s = 0.2\nlast_good_max_bytes = {cap}\n")
        d = daemons(wrap(sd, "--config", str(cfg), "--checkpoint-dir", str(ck))
                    + [PY, "-c", NANOGPT_SAVES, str(out), str(ck)])
        kept = ck / "last_good" / "ckpt.pt"
        if cap:
            wait_for(lambda: "checkpoint_last_good_skipped" in d.stderr(), 60, what="the version too big to keep")
            assert not kept.exists()
            (out / "go10").touch(), (out / "go20").touch()
            assert d.wait(60) == 0
            continue
        # The first version seen is copied (how the job saves is not known yet): it costs its size.
        wait_for(lambda: kept.exists(), 60, what="version 10 kept")
        size = kept.stat().st_blocks * 512  # 16 KiB of weights; its manifest copy adds a few KiB
        assert size <= wait_for(lambda: _status(sd).get("last_good_disk_bytes"), 30, what="status") < 2 * size
        (out / "go10").touch()
        # The job replaced the file by rename: version 20 is kept as a hard link, no bytes for the
        # weights (the manifest copy is all that last_good/ adds).
        wait_for(lambda: kept.stat().st_ino == (ck / "ckpt.pt").stat().st_ino, 60, what="version 20 linked")
        assert wait_for(lambda: _status(sd).get("last_good_disk_bytes", size) < size, 30, what="status")
        (out / "go20").touch()
        assert d.wait(60) == 0


# Writes where it resumed from; from step 20 it "starts up" for a minute (longer than any load
# test), from anything else it exits 0 at once.
SLOW_START = """
import os, sys, time
out, frm = sys.argv[1], os.environ["TSUP_RESUME_FROM"]
open(os.path.join(out, "resumed" + os.environ["TSUP_ATTEMPT"]), "w").write(frm)
if frm.endswith("step_20.pt"):
    time.sleep(60)
"""


def _lost_a_member(src: Path, dst: Path) -> None:
    """A torch zip whose directory is whole but whose tensor data member is gone: it passes the
    structural checks (no manifest says otherwise) and fails to load."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for i in zin.infolist():
            if not i.filename.endswith("/data/0"):
                zout.writestr(i, zin.read(i))
    old_mtime(dst)


@pytest.mark.slow
def test_overlap_launches_at_once_and_a_failed_load_test_stops_the_job_and_falls_back(daemons, tmp_path):
    for verify in ("before-launch", "overlap"):
        sd, ck, out = tmp_path / f"sd-{verify}", tmp_path / f"ck-{verify}", tmp_path / f"out-{verify}"
        out.mkdir()
        torch_file(ck / "step_10.pt", 10)
        _lost_a_member(torch_file(tmp_path / f"whole-{verify}.pt", 20), ck / "step_20.pt")
        cfg = tmp_path / f"{verify}.toml"
        cfg.write_text(f'[checkpoints]\nverify = "{verify}"\n[policy]\nbackoff_initial_s = 30\n')
        d = daemons(wrap(sd, "--config", str(cfg), "--checkpoint-dir", str(ck), "--max-restarts", "3")
                    + [PY, "-c", SLOW_START, str(out)])
        assert d.wait(90) == 0, d.stderr()[-3000:]
        h = history(sd)
        resumed = [Path(a["checkpoint"]).name for a in h["attempts"]]
        if verify == "before-launch":
            assert resumed == ["step_10.pt"]  # the load test ran first and set the corrupt one aside
        else:
            # Launched from the newest on its structural checks; its load test failed beside the
            # job's start-up: the job was stopped and relaunched at once from the verified one.
            assert resumed == ["step_20.pt", "step_10.pt"]
            first = h["attempts"][0]
            assert first["cause"] == "checkpoint_load_error" and first["decision"]["delay_s"] == 0
            assert any(e["event"] == "checkpoint_chosen" and "overlap" in (e["message"] or "") for e in h["events"])
        assert not (ck / "step_20.pt").exists()
        assert [p.name for p in (ck / "quarantine").iterdir() if p.name.endswith(".pt")] == ["step_20.pt"]


def test_overlap_a_good_unverified_single_file_is_verified_beside_the_start_and_its_step_recorded(daemons, tmp_path):
    from tests.helpers.ckpt_factory import nanogpt
    from tests.util import wait_for

    sd, ck, out = tmp_path / "sd", tmp_path / "ck", tmp_path / "out"
    out.mkdir()
    nanogpt(ck, 7)  # ckpt.pt: its step is only inside the file
    job = ("import os, sys, time\n"
           "while not os.path.exists(sys.argv[1]):\n"
           "    time.sleep(0.05)\n")
    d = daemons(wrap(sd, "--checkpoint-dir", str(ck)) + [PY, "-c", job, str(out / "go")])

    def verified() -> bool:
        if not (sd / "ledger.sqlite").exists():
            return False
        h = history(sd)
        return any(e["event"] == "checkpoint_verified_after_launch" for e in h["events"]) and h["attempts"]

    wait_for(verified, 60, what="the load test beside the start-up")
    (out / "go").touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]
    [a] = history(sd)["attempts"]
    assert Path(a["checkpoint"]).name == "ckpt.pt" and a["resume_step"] == 7
    assert (ck / "last_good" / "ckpt.pt").exists()  # the version verified after the launch is kept


def test_overlap_a_load_test_the_job_outlives_is_stopped_when_the_daemon_exits(daemons, tmp_path):
    """The job resumes and finishes before the load test beside its start-up ends (a slow torch
    import under load): the daemon exits with it and stops the test, which is no verdict on the
    checkpoint (before, the test's process outlived the daemon)."""
    from tests.util import wait_for

    sd, ck, pids = tmp_path / "sd", tmp_path / "ck", tmp_path / "load-test-pids"
    torch_file(ck / "step_5.pt", 5)
    old_mtime(ck / "step_5.pt")  # settled: no wait for the save to end
    # job.python runs the load test (and the environment probe, which passes through): the load
    # test's payload names its expected keys; that one never ends on its own.
    slow = tmp_path / "python-slow-load-test"
    slow.write_text(f"#!/bin/sh\ncase \"$3\" in *expected_keys*|--serve) echo $$ >> {pids}; exec sleep 600;; esac\n"
                    f"exec {PY} \"$@\"\n")
    slow.chmod(0o755)
    cfg = tmp_path / "tsup.toml"
    # (no finite check of the newest checkpoint at the end: it would wait on the same stalled python)
    cfg.write_text(f'[job]\npython = "{slow}"\n[checkpoints]\ncheck_at_end = false\n')
    out = tmp_path / "resumed"
    job = f"import os, sys, time\nwhile not os.path.exists({str(pids)!r}):\n    time.sleep(0.02)\n" + RESUMED_FROM
    d = daemons(wrap(sd, "--config", str(cfg), "--checkpoint-dir", str(ck)) + [PY, "-c", job, str(out)])
    assert d.wait(60) == 0, d.stderr()[-3000:]
    assert Path(out.read_text()).name == "step_5.pt"  # launched on its structural checks
    started = [int(p) for p in pids.read_text().split()]  # the warm verifier's, and a cold one beside it if busy
    assert started
    wait_for(lambda: not any(pid_alive(p) for p in started), 10, what="the load tests' processes stopped with the daemon")
    h = history(sd)
    cancelled = [e for e in h["events"] if e["event"] == "checkpoint_load_test_cancelled"]
    assert cancelled and {Path(e["data"]["path"]).name for e in cancelled} == {"step_5.pt"}, h["events"]
    assert "no verdict" in cancelled[0]["message"]
    # Not a failure: nothing detected, nothing quarantined, the checkpoint where it was.
    assert [a["cause"] for a in h["attempts"]] == [None]
    assert (ck / "step_5.pt").exists() and not (ck / "quarantine").exists()
