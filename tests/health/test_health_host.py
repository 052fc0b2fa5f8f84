"""Host health with real processes (psutil), real tmpfs mounts (root), and the storage probe."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from supervisor.events import Action, AttemptContext, Cause
from supervisor.core.observations import Detection
from supervisor.health.config import GpuConfig, HostConfig
from supervisor.health.gpufake import FakeBackend
from supervisor.health.gpumonitor import GpuMonitor
from supervisor.health.gpureading import job_tree_pids
from supervisor.health.host import (HostMonitor, StorageBaseline, check_disk, host_memory,
                                    probe_storage, tree_rss)

HELPER = Path(__file__).parents[1] / "helpers" / "health_tree.py"
MiB = 1024 * 1024


@pytest.fixture
def tree() -> Iterator[list[int]]:
    """A real parent with two children, each holding 40 MiB."""
    proc = subprocess.Popen([sys.executable, str(HELPER), "2", "40"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("pids "), line
        yield [int(p) for p in line.split()[1:]]
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=30)


def ctx(pid: int, tmp: Path, ckpt: Path | None = None) -> AttemptContext:
    return AttemptContext(run_id="r", attempt=0, pgid=pid, pid=pid, started_monotonic=0.0,
                          state_dir=tmp, heartbeat_dir=tmp, checkpoint_dir=ckpt, resume_from=None,
                          resume_step=None)


def test_tree_rss_and_pids_of_a_real_child_tree(tree: list[int]) -> None:
    parent, *children = tree
    assert job_tree_pids(parent) == frozenset(tree)
    rss = tree_rss(parent)
    assert rss is not None and rss >= 3 * 40 * MiB
    assert tree_rss(children[0]) is not None and tree_rss(children[0]) < rss  # type: ignore[operator]
    mem = host_memory()
    assert 0 < mem["available_bytes"] <= mem["total_bytes"]
    assert 0.0 < mem["available_fraction"] <= 1.0


def test_tree_rss_of_a_gone_pid_is_none() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert tree_rss(p.pid) is None


def test_gpu_memory_is_mapped_to_the_job_tree(tree: list[int], tmp_path: Path) -> None:
    parent, child1, child2 = tree
    outsider = os.getpid()
    fake = FakeBackend(1, timeline=[(0, {"processes": {"pids": {str(child2): 3 * MiB, str(outsider): 5 * MiB,
                                                                str(parent): 1 * MiB}}})])
    mon = GpuMonitor(fake, GpuConfig(), threaded=False)
    mon.start(ctx(parent, tmp_path), lambda d: None)
    mon.check()
    mon.stop()
    gpus = mon.gpus()
    assert gpus is not None and gpus[0]["job_memory_bytes"] == 4 * MiB


def test_probe_storage_on_a_writable_dir(tmp_path: Path) -> None:
    res = probe_storage(tmp_path, StorageBaseline.record(tmp_path))
    assert res.ok and res.reason is None and res.seconds < 5
    assert list(tmp_path.iterdir()) == [], "the probe file is removed"


def test_probe_storage_missing_dir(tmp_path: Path) -> None:
    res = probe_storage(tmp_path / "gone")
    assert not res.ok and "does not exist" in (res.reason or "")


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {out.stderr.strip()}")


def _umount(where: Path) -> None:
    if os.path.ismount(where):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "mnt"
    _mount_tmpfs(where, "2m")
    try:
        yield where
    finally:
        _umount(where)


def test_disk_low_on_a_small_tmpfs(tmpfs: Path, tmp_path: Path) -> None:
    assert check_disk(tmpfs, min_free_gb=0.001).ok  # 1 MB of 2 MiB
    low = check_disk(tmpfs, min_free_gb=0.01)
    assert not low.ok and "host.disk_min_free_gb" in (low.reason or "")
    by_size = check_disk(tmpfs, min_free_gb=0.0, last_checkpoint_bytes=1_500_000, ckpt_multiple=2.0)
    assert not by_size.ok and "2 x the last checkpoint" in (by_size.reason or "")
    assert by_size.needed_bytes == 3_000_000

    got: list[Detection] = []
    mon = HostMonitor(HostConfig(disk_min_free_gb=0.001, disk_ckpt_multiple=2.0), checkpoint_dir=tmpfs,
                      state_dir=tmp_path, last_checkpoint_bytes=lambda: 500_000, threaded=False)
    mon.start(ctx(os.getpid(), tmp_path), got.append)
    mon.poll(time.monotonic())
    assert got == [] and mon.status()["state"] == "ok"
    (tmpfs / "model.pt").write_bytes(b"\0" * 1_200_000)  # now < 1 MB left, 2 x 0.5 MB needed
    mon.check()
    mon.check()
    mon.stop()
    assert len(got) == 1, "reported once per attempt"
    assert got[0].cause == Cause.DISK_LOW and got[0].details["dir"] == "checkpoint_dir"
    assert got[0].details["needed_bytes"] == 1_000_000
    assert mon.status()["state"] == "disk_low"


def test_read_only_remount_fails_the_probe(tmpfs: Path, tmp_path: Path) -> None:
    baseline = StorageBaseline.record(tmpfs)
    assert probe_storage(tmpfs, baseline).ok
    out = subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot remount read-only here: {out.stderr.strip()}")
    res = probe_storage(tmpfs, baseline)
    assert not res.ok and "read-only file system" in (res.reason or "")
    got: list[Detection] = []
    mon = HostMonitor(HostConfig(disk_min_free_gb=0.0), checkpoint_dir=tmpfs, threaded=False)
    mon.start(ctx(os.getpid(), tmp_path), got.append)
    mon.probe()
    mon.stop()
    assert len(got) == 1 and got[0].cause == Cause.DISK_LOW and got[0].details["kind"] == "storage"
    assert got[0].suggested_action == Action.GIVE_UP and "read-only" in got[0].summary


def test_vanished_mount_fails_the_probe(tmp_path: Path) -> None:
    where = tmp_path / "mnt"
    _mount_tmpfs(where, "2m")
    try:
        baseline = StorageBaseline.record(where)
        assert baseline.mount_point == str(where)
    finally:
        _umount(where)
    assert where.is_dir() and not os.path.ismount(where)  # the empty mount point is left behind
    res = probe_storage(where, baseline)
    assert not res.ok and "no longer on the volume seen at start" in (res.reason or "")
    assert list(where.iterdir()) == [], "nothing written to the wrong disk"


def test_host_monitor_thread_runs_and_stops(tmp_path: Path) -> None:
    from tests.util import wait_for

    mon = HostMonitor(HostConfig(poll_s=0.05, disk_min_free_gb=0.0), checkpoint_dir=tmp_path,
                      state_dir=tmp_path)
    mon.start(ctx(os.getpid(), tmp_path), lambda d: None)
    try:
        wait_for(lambda: mon.status().get("state") == "ok", timeout=5, what="a host check")
    finally:
        mon.stop()
    st = mon.status()
    assert st["job_rss_bytes"] and st["job_rss_bytes"] > 0  # type: ignore[operator]
    snap = mon.snapshot()
    assert snap["checkpoint_dir_free_bytes"] and "memory" in snap
