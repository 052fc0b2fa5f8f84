"""The pre-launch gate against the fake backend with a fake clock (a 60 s wait passes instantly)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from supervisor.health.config import GpuConfig
from supervisor.health.gate import LaunchGate, run_gate
from supervisor.health.gpufake import FakeBackend
from supervisor.health.nvml import NvmlBackend

GiB = 1024**3


class FakeClock:
    """Monotonic seconds that move only when the gate sleeps."""

    def __init__(self) -> None:
        self.t = 50.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.slept.append(dt)
        self.t += dt


def busy_then_released(clock: FakeClock, release_at: float, devices: int = 2) -> FakeBackend:
    """The previous attempt (pid 4242) holds 60 GiB on device 1 until ``release_at``."""
    fake = FakeBackend(devices, total_gb=80, clock=clock, timeline=[
        (0, {"memory": {"device": 1, "used_bytes": 60 * GiB}}),
        (0, {"processes": {"device": 1, "pids": {"4242": 60 * GiB}}}),
        (release_at, {"memory": {"device": 1, "used_bytes": 300 * 1024**2}}),
        (release_at, {"processes": {"device": 1, "pids": {}}})])
    fake.init()
    return fake


def test_gate_waits_for_memory_release_then_passes(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = busy_then_released(clock, release_at=7.2)
    v = run_gate(fake, GpuConfig(release_timeout_s=60), [4242], clock, sleep=clock.sleep,
                 checkpoint_dir=tmp_path)
    assert v.passed and v.reasons == () and not v.unavailable
    assert 7.2 <= v.waited_s <= 8.0
    assert max(clock.slept) <= 0.5, "polls at least twice a second"
    assert v.details["storage_probe"]["ok"] is True  # type: ignore[index]
    assert "after waiting" in v.summary()
    json.dumps(v.to_dict())  # the ledger stores it as JSON


def test_gate_times_out_when_memory_stays_held(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = busy_then_released(clock, release_at=1000)
    v = run_gate(fake, GpuConfig(release_timeout_s=30), [4242], clock, sleep=clock.sleep)
    assert not v.passed and v.waited_s == pytest.approx(30, abs=0.01)
    assert len(v.reasons) == 1
    assert "GPU memory not released after 30.0 s" in v.reasons[0]
    assert "GPU 1 (GPU-fake-0001) at 75.0% held by previous pids [4242]" in v.reasons[0]


def test_gate_passes_at_once_when_nothing_is_held() -> None:
    clock = FakeClock()
    fake = FakeBackend(8, clock=clock)
    fake.init()
    v = run_gate(fake, GpuConfig(), [], clock, sleep=clock.sleep)
    assert v.passed and v.waited_s == 0 and clock.slept == [] and v.details["device_count"] == 8


def test_missing_device_lost_gpu_and_pending_retirement_fail_the_gate() -> None:
    clock = FakeClock()
    fake = FakeBackend(4, clock=clock, timeline=[
        (1, {"lost": {"device": 3}}), (1, {"pending": {"device": 0, "retired_pages": True}}),
        (1, {"pending": {"device": 1, "remap": True}})])
    fake.init()
    gate = LaunchGate(fake, GpuConfig(), clock=clock, sleep=clock.sleep)
    assert gate.check().passed
    clock.t += 2
    v = gate.check([1])
    assert not v.passed
    assert any("GPU 3 is lost" in r for r in v.reasons)
    assert any("GPU 0 (GPU-fake-0000) needs a reset (retired pages pending)" in r for r in v.reasons)
    assert any("GPU 1 (GPU-fake-0001) needs a reset (row remapping pending)" in r for r in v.reasons)
    assert "gate failed" in v.summary()

    fewer = FakeBackend(7, clock=clock)
    fewer.init()
    v2 = run_gate(fewer, GpuConfig(), [], clock, sleep=clock.sleep, expected_devices=8)
    assert not v2.passed and "only 7 of 8 expected GPUs" in v2.reasons[0]
    v3 = run_gate(fewer, GpuConfig(expected_devices=6), [], clock, sleep=clock.sleep, expected_devices=8)
    assert v3.passed, "gpu.expected_devices wins over the first count"


def test_blind_gate_is_unavailable_and_passes_with_a_warning_unless_required() -> None:
    clock = FakeClock()
    v = run_gate(NvmlBackend(), GpuConfig(), [], clock, sleep=clock.sleep)  # no driver on this machine
    assert v.passed and v.unavailable and v.warnings and "unavailable" in v.warnings[0]
    assert "healthy" not in json.dumps(v.to_dict()).lower()
    assert "GPU health unavailable" in v.summary()
    strict = run_gate(NvmlBackend(), GpuConfig(require=True), [], clock, sleep=clock.sleep)
    assert not strict.passed and strict.unavailable and "gpu.require = true" in strict.reasons[0]


def test_gate_fails_on_a_read_only_checkpoint_dir(tmp_path: Path) -> None:
    where = tmp_path / "ckpt"
    where.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {out.stderr.strip()}")
    try:
        clock = FakeClock()
        fake = FakeBackend(1, clock=clock)
        fake.init()
        v = LaunchGate(fake, GpuConfig(), checkpoint_dir=where, clock=clock, sleep=clock.sleep).check()
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)
    assert not v.passed and v.reasons[0].startswith("storage probe failed")
    assert "read-only file system" in v.reasons[0]
