"""GPU monitor against the scripted fake backend (no GPU here), plus the real NVML backend going blind."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from supervisor.config.schema import Problem, build
from supervisor.events import Action, AttemptContext, Cause
from supervisor.core.observations import Detection
from supervisor.health.config import GpuConfig
from supervisor.health.gpu import GpuBlindError
from supervisor.health.gpufake import FakeBackend
from supervisor.health.nvml import NullBackend, NvmlBackend, make_backend
from supervisor.health.gpumonitor import GpuMonitor
from supervisor.health.gpureading import linear_slope
from supervisor.health.xid import XidLevel, classify_xid
from tests.util import wait_for

GiB = 1024**3


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def ctx(pid: int, tmp: Path) -> AttemptContext:
    return AttemptContext(run_id="r", attempt=0, pgid=pid, pid=pid, started_monotonic=0.0,
                          state_dir=tmp, heartbeat_dir=tmp, checkpoint_dir=None, resume_from=None,
                          resume_step=None)


def run_for(mon: GpuMonitor, clock: FakeClock, seconds: float, step: float = 0.5) -> None:
    end = clock.t + seconds
    while clock.t < end:
        clock.advance(step)
        mon.poll(clock.t)


def started(backend: FakeBackend, clock: FakeClock, tmp: Path, **cfg: object) -> tuple[GpuMonitor, list[Detection]]:
    got: list[Detection] = []
    mon = GpuMonitor(backend, GpuConfig(**cfg), clock=clock, threaded=False)  # type: ignore[arg-type]
    mon.start(ctx(12345, tmp), got.append)
    return mon, got


def test_memory_creep_raises_gpu_memory_with_a_sane_trend(tmp_path: Path) -> None:
    clock = FakeClock()
    # 80 GiB device: 50% at t=0, then a linear climb of 1 GiB/s toward 100%
    fake = FakeBackend(2, total_gb=80, clock=clock, timeline=[
        (0, {"memory": {"device": 1, "used_frac": 0.5}}),
        (0, {"memory_ramp": {"device": 1, "to_bytes": 80 * GiB, "over_s": 40}}),
        (0, {"processes": {"device": 1, "pids": {"job": 30 * GiB}}})])
    fake.init()
    mon, got = started(fake, clock, tmp_path, poll_s=1.0, memory_watermark=0.9, memory_polls=3)
    run_for(mon, clock, 31)
    assert got == [], "below the watermark nothing is raised"
    run_for(mon, clock, 5)
    assert len(got) == 1
    d = got[0]
    assert d.cause == Cause.GPU_MEMORY and d.details["device"] == 1
    assert d.details["polls_above"] == 3
    slope = d.details["slope_bytes_per_s"]
    assert isinstance(slope, float) and slope == pytest.approx(1 * GiB, rel=0.05)
    eta = d.details["seconds_to_exhaustion"]
    used = d.details["used_bytes"]
    assert isinstance(used, int) and isinstance(eta, float)
    assert eta == pytest.approx((80 * GiB - used) / GiB, rel=0.1) and 2 < eta < 8, eta
    assert d.details["job_memory_bytes"] == 30 * GiB
    run_for(mon, clock, 10)
    assert len(got) == 1, "reported once while it stays above"
    gpus = mon.gpus()
    assert gpus is not None and gpus[1]["memory_fraction"] == 1.0
    faults = gpus[1]["faults"]
    assert isinstance(faults, (list, tuple)) and "memory_watermark" in faults, faults


def test_memory_spike_that_drops_back_is_not_reported(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = FakeBackend(1, clock=clock, timeline=[(1, {"memory": {"used_frac": 0.99}}),
                                                  (2.6, {"memory": {"used_frac": 0.4}})])
    fake.init()
    mon, got = started(fake, clock, tmp_path, poll_s=0.5, memory_polls=5)
    run_for(mon, clock, 10)
    assert got == []


def test_xid_79_suggests_give_up_and_xid_13_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = FakeBackend(2, clock=clock, timeline=[(1, {"xid": {"device": 0, "code": 13}}),
                                                  (2, {"xid": {"device": 1, "code": 79}})])
    fake.init()
    mon, got = started(fake, clock, tmp_path)
    run_for(mon, clock, 3)
    assert [(d.cause, d.details["code"], d.suggested_action) for d in got] == [
        (Cause.GPU_FAULT, 13, Action.RESTART), (Cause.GPU_FAULT, 79, Action.GIVE_UP)]
    assert "drain or reset this node" in got[1].summary
    assert got[1].details["level"] == "node" and got[1].details["uuid"] == "GPU-fake-0001"


def test_xid_overrides_and_unknown_codes() -> None:
    assert classify_xid(79, {"79": "warn"}).action == Action.WARN
    assert classify_xid(13, {"13": "give_up"}).action == Action.GIVE_UP
    unknown = classify_xid(9999, None, "give_up")
    assert unknown.level == XidLevel.UNKNOWN and unknown.action == Action.GIVE_UP



# NVIDIA's Xid catalog, its immediate-action bucket (supervisor/health/xid.py says its source and date):
# RESTART_APP -> restart, IGNORE -> warn (63, 92 and 121 used to give up healthy runs), RESET_GPU and
# worse -> give up: no relaunch onto that GPU (109 used to restart; 46, 136, 143, 155, 156, 158 were unlisted).
CATALOG_BUCKETS = {
    Action.RESTART: (8, 13, 31, 32, 43, 45, 68, 69, 94),
    Action.WARN: (63, 92, 121),
    Action.GIVE_UP: (46, 48, 61, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 154, 155, 156, 158),
}


@pytest.mark.parametrize("code,action", [(c, a) for a, codes in CATALOG_BUCKETS.items() for c in codes])
def test_each_xid_follows_the_catalogs_immediate_action(code: int, action: Action) -> None:
    info = classify_xid(code)
    assert info.action == action and info.level != XidLevel.UNKNOWN, (code, info)
    assert ("drain or reset" in info.advice) == (action == Action.GIVE_UP)


def test_xid_override_from_config(tmp_path: Path) -> None:
    problems: list = []
    cfg = build(GpuConfig, {"xid_actions": {"13": "give_up"}}, "gpu", problems)
    assert problems == []
    clock = FakeClock()
    fake = FakeBackend(1, clock=clock, timeline=[(1, {"xid": {"code": 13}})])
    fake.init()
    got: list[Detection] = []
    mon = GpuMonitor(fake, cfg, clock=clock, threaded=False)
    mon.start(ctx(1, tmp_path), got.append)
    run_for(mon, clock, 2)
    assert len(got) == 1 and got[0].suggested_action == Action.GIVE_UP


def test_gpu_lost_mid_run_is_reported_once(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = FakeBackend(4, clock=clock, timeline=[(5, {"lost": {"device": 2}})])
    fake.init()
    mon, got = started(fake, clock, tmp_path)
    run_for(mon, clock, 4)
    assert got == [] and mon.status()["state"] == "ok"
    run_for(mon, clock, 6)
    assert len(got) == 1
    assert got[0].cause == Cause.GPU_FAULT and got[0].details["kind"] == "gpu_lost"
    assert got[0].details["device"] == 2 and got[0].suggested_action == Action.GIVE_UP
    st = mon.status()
    assert st["available"] is True and st["state"] == "fault"
    gpus = mon.gpus()
    assert gpus is not None and gpus[2]["lost"] is True and gpus[0]["lost"] is False


def test_double_bit_ecc_event_and_counter_report_once(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = FakeBackend(1, clock=clock, timeline=[(1, {"ecc_dbe": {"device": 0}})])
    fake.init()
    mon, got = started(fake, clock, tmp_path)
    run_for(mon, clock, 3)
    assert len(got) == 1 and got[0].details["kind"] == "ecc_double_bit"
    assert got[0].suggested_action == Action.GIVE_UP


def test_ecc_counter_rise_without_events(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = FakeBackend(1, clock=clock, timeline=[(2, {"ecc_dbe": {"device": 0, "count": 2}})])
    fake.init()
    mon, got = started(fake, clock, tmp_path, events=False)
    run_for(mon, clock, 4)
    assert len(got) == 1 and "0 -> 2" in (got[0].evidence or "")


def test_real_nvml_without_a_driver_is_blind_never_healthy(tmp_path: Path) -> None:
    backend = NvmlBackend()
    with pytest.raises(GpuBlindError):
        backend.init()
    blind: list[str] = []
    got: list[Detection] = []
    mon = GpuMonitor(backend, GpuConfig(), on_blind=blind.append)  # threaded, like the daemon
    mon.start(ctx(1, tmp_path), got.append)
    try:
        mon.poll(0.0)
        st = mon.status()
        assert st["available"] is False and st["state"] == "unavailable"
        assert "nvmlInit failed" in str(st["reason"])
        assert mon.gpus() is None
        snap = mon.snapshot()
        assert snap["available"] is False
        text = json.dumps([st, snap, mon.gpus()]).lower()
        assert "healthy" not in text and '"ok"' not in text
        assert len(blind) == 1 and got == [], "blind is not a failure cause"
    finally:
        mon.stop()
    mon.start(ctx(1, tmp_path), got.append)  # the next attempt: still blind, no second log line
    mon.stop()
    assert len(blind) == 2 and mon.available is False


def test_blind_log_line_is_emitted_once(tmp_path: Path) -> None:
    code = (
        "import structlog, sys\n"
        "structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))\n"
        "from supervisor.health.gpumonitor import GpuMonitor\n"
        "from supervisor.health.nvml import NvmlBackend\n"
        "m = GpuMonitor(NvmlBackend(), threaded=False)\n"
        "for _ in range(3):\n"
        "    m.start(None, lambda d: None); m.poll(0.0); m.stop()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("gpu_blind") == 1, out.stderr


def test_monitor_survives_backend_exceptions_then_goes_blind(tmp_path: Path) -> None:
    class Flaky(FakeBackend):
        def memory(self, index: int):
            raise RuntimeError("NVML_ERROR_UNKNOWN")

    clock = FakeClock()
    fake = Flaky(1, clock=clock)
    fake.init()
    mon, got = started(fake, clock, tmp_path, poll_s=1.0)
    run_for(mon, clock, 1.5)
    assert mon.available, "one failure is not blindness"
    run_for(mon, clock, 4)
    assert mon.available is False and "in a row failed" in str(mon.status()["reason"])
    assert got == []


def test_threaded_monitor_sees_events_from_a_real_clock_timeline(tmp_path: Path) -> None:
    fake = FakeBackend(2, timeline=[(0.2, {"xid": {"device": 1, "code": 48}})])
    got: list[Detection] = []
    lock = threading.Lock()

    def emit(d: Detection) -> None:
        with lock:
            got.append(d)

    mon = GpuMonitor(fake, GpuConfig(poll_s=0.1))
    mon.start(ctx(1, tmp_path), emit)
    try:
        wait_for(lambda: got, timeout=5, what="the Xid 48 detection")
        wait_for(lambda: mon.polls >= 2, timeout=5, what="two polls")
    finally:
        mon.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("tsup-gpu")], "threads joined"
    assert got[0].details["code"] == 48 and got[0].suggested_action == Action.GIVE_UP
    snap = mon.snapshot()
    assert snap["device_count"] == 2 and snap["driver"] == "999.99.99-fake"
    devices = snap["devices"]
    assert isinstance(devices, list) and [d["uuid"] for d in devices] == ["GPU-fake-0000", "GPU-fake-0001"]


def test_fake_loads_from_a_timeline_file(tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps({"devices": [{"name": "Fake H100", "total_gb": 80}, {"total_gb": 40}],
                                "timeline": [[0, {"memory": {"device": 1, "used_frac": 0.25}}]]}))
    backend = FakeBackend.from_file(path)
    backend.init()
    assert backend.device_count() == 2 and backend.device_info(0).name == "Fake H100"
    assert backend.memory(1).used == 10 * GiB
    blind = tmp_path / "blind.json"
    blind.write_text(json.dumps({"init_error": "NVML Shared Library Not Found"}))
    with pytest.raises(GpuBlindError):
        FakeBackend.from_file(blind).init()


def test_production_cannot_switch_to_the_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only tests inject the fake: neither the old environment variable nor a config value does."""
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps({"devices": 2}))
    monkeypatch.setenv("TSUP_GPU_BACKEND", f"fake:{path}")
    assert isinstance(make_backend("nvml"), NvmlBackend)
    assert isinstance(make_backend("none"), NullBackend)
    with pytest.raises(ValueError, match='expected "nvml" or "none"'):
        make_backend(f"fake:{path}")
    problems: list[Problem] = []
    cfg = build(GpuConfig, {"backend": f"fake:{path}"}, "gpu", problems)
    assert problems and 'gpu.backend: expected "nvml" or "none"' in str(problems[0]), (cfg, problems)
    import supervisor.health.nvml as nvml_mod
    assert not hasattr(nvml_mod, "BACKEND_ENV")


def test_linear_slope() -> None:
    assert linear_slope([(0, 0), (1, 2), (2, 4)]) == pytest.approx(2.0)
    assert linear_slope([(0, 5)]) is None
    assert linear_slope([(1, 5), (1, 6)]) is None


def test_an_xid_line_in_the_log_follows_the_same_table() -> None:
    from supervisor.watch.config import DetectorsConfig
    from supervisor.watch.logwatch import LogWatcher

    def first(line: str) -> Detection:
        found: list[Detection] = []
        LogWatcher(DetectorsConfig(), found.append, lambda rec: None).feed("stderr", [line])
        return found[0]

    assert first("NVRM: Xid (PCI:0000:3b:00): 63, pid=1896, Row Remapper: New row marked").suggested_action \
        == Action.WARN
    assert first("NVRM: Xid (PCI:0000:3b:00): 109, pid=1896, Ch 00000010").suggested_action == Action.GIVE_UP
