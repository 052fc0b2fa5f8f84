"""The real NVML backend (supervisor/health/nvml.py) over NVIDIA's real ``pynvml`` module, with only
its C calls simulated (tests/helpers/nvml_clib.py): the error codes a MIG node, a container's
device cgroup and a dying GPU return (issue 39 item 3), event registration by supported types and
MIG slices on events (item 2)."""
from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.events import AttemptContext, Cause
from supervisor.core.observations import Detection
from supervisor.health.config import GpuConfig
from supervisor.health.gate import LaunchGate, run_gate
from supervisor.health.gpu import GpuDeviceError, GpuEventKind
from supervisor.health.gpumonitor import GpuMonitor
from supervisor.health.nvml import NvmlBackend
from tests.helpers.nvml_clib import (DBE, GPU_IS_LOST, NO_PERMISSION, UNKNOWN, XID, GiB, SimGpu, SimMig, SimNode,
                                     simulated_pynvml)


def backend(*gpus: SimGpu) -> tuple[NvmlBackend, SimNode]:
    node = SimNode(list(gpus))
    b = NvmlBackend(simulated_pynvml(node))
    b.init()
    return b, node


def mig_parent() -> SimGpu:
    """A MIG parent seen from a container: its own memory answers NO_PERMISSION; one slice is ours,
    one another tenant's (its handle is refused)."""
    return SimGpu("GPU-mig-parent", memory_error=NO_PERMISSION,
                  migs=[SimMig("MIG-ours", gi=1, ci=0, total=10 * GiB, used=3 * GiB),
                        SimMig("MIG-theirs", gi=2, ci=0, denied=True)])


def ctx(tmp: Path) -> AttemptContext:
    return AttemptContext(run_id="r", attempt=0, pgid=1, pid=1, started_monotonic=0.0, state_dir=tmp,
                          heartbeat_dir=tmp, checkpoint_dir=None, resume_from=None, resume_step=None)


def test_the_real_pynvml_runs_against_the_simulated_library() -> None:
    b, node = backend(SimGpu("GPU-aaaa", used=2 * GiB, procs={4242: GiB}))
    assert b.device_count() == 1 and b.driver_version() == "570.86.15" and b.cuda_driver_version() == "12.8"
    info = b.device_info(0)
    assert (info.uuid, info.name, info.pci_bus_id) == ("GPU-aaaa", "NVIDIA H100 80GB HBM3", "00000000:18:00.0")
    assert b.memory(0).used == 2 * GiB and b.processes(0) == {4242: GiB}
    assert b.utilization(0) is None, "a query the library lacks is None (FUNCTION_NOT_FOUND), not a crash"
    assert b.recovery_action(0) is None, "a driver before r570 has no recovery action field"
    node.gpus[0].recovery = 1
    assert b.recovery_action(0) == 1
    assert "nvmlDeviceGetMemoryInfo" in b._nvml.nvmlLib.calls  # the C calls were ours, through pynvml


def test_a_mig_parent_answering_no_permission_is_read_through_its_mig_devices() -> None:
    b, _ = backend(mig_parent())
    m = b.memory(0)
    assert (m.used, m.total) == (3 * GiB, 10 * GiB), "the slice we may open, not the parent, not the other tenant's"


def test_a_denied_handle_and_an_unknown_answer_are_that_device_alone() -> None:
    b, _ = backend(SimGpu("GPU-0"), SimGpu("GPU-1", handle_error=NO_PERMISSION), SimGpu("GPU-2", query_error=UNKNOWN))
    assert b.memory(0).total == 80 * GiB
    with pytest.raises(GpuDeviceError) as denied:
        b.memory(1)
    assert denied.value.kind == "no_permission" and denied.value.index == 1
    with pytest.raises(GpuDeviceError) as unknown:
        b.memory(2)
    assert unknown.value.kind == "unknown"


def test_the_gate_passes_with_a_named_warning_and_never_crashes(tmp_path: Path) -> None:
    parent = mig_parent()
    parent.migs[0].used = 0  # nothing of ours runs yet
    b, _ = backend(SimGpu("GPU-0"), parent, SimGpu("GPU-2", handle_error=NO_PERMISSION))
    v = run_gate(b, GpuConfig(release_timeout_s=0), clock=lambda: 0.0, sleep=lambda s: None)
    assert v.passed, v.reasons
    assert [w.split(" cannot")[0] for w in v.warnings] == ["GPU 2"], v.warnings  # its handle: no UUID to name
    assert "no_permission" in v.warnings[0]
    mem = v.details["memory"]
    assert isinstance(mem, list) and [d["device"] for d in mem] == [0, 1]


def test_a_gate_whose_backend_raises_the_unexpected_says_gpu_not_checkpoint() -> None:
    class Broken(NvmlBackend):
        def device_count(self) -> int:
            raise RuntimeError("NVML_ERROR_UNKNOWN from nvmlDeviceGetCount")

    b = Broken(simulated_pynvml(SimNode([SimGpu("GPU-0")])))
    v = LaunchGate(b, GpuConfig()).check()
    assert v.passed and v.unavailable and "GPU check failed unexpectedly" in v.warnings[0]
    refused = LaunchGate(b, GpuConfig(require=True)).check()
    assert not refused.passed and refused.failed_checks[0].value == "gpu_sight"


def test_the_recovery_action_refuses_a_relaunch_onto_that_gpu() -> None:
    b, _ = backend(SimGpu("GPU-0"), SimGpu("GPU-1", recovery=2))
    v = run_gate(b, GpuConfig(), clock=lambda: 0.0, sleep=lambda s: None)
    assert not v.passed and v.failed_checks[0].value == "gpu_repair"
    assert "GPU 1 (GPU-1): the driver asks for a node reboot" in v.reasons[0]


def test_events_register_only_supported_types_and_say_so(tmp_path: Path) -> None:
    b, node = backend(SimGpu("GPU-0"), SimGpu("GPU-1", supported_events=XID), SimGpu("GPU-2", register_error=NO_PERMISSION))
    assert b.wait_events(0.0) == []
    assert b.registered == {0: XID | DBE, 1: XID, 2: 0}, "GPU 1 has no ECC events: its Xids are still registered"
    node.send(1, 43, gi=3, ci=0)
    node.send(0, 0, kind=DBE)
    got = [*b.wait_events(1.0), *b.wait_events(1.0)]
    assert [(e.kind, e.index, e.code, e.gpu_instance) for e in got] == [
        (GpuEventKind.XID, 1, 43, 3), (GpuEventKind.ECC_DBE, 0, None, None)]


def test_one_bad_device_never_blinds_the_others(tmp_path: Path) -> None:
    gpus = [SimGpu(f"GPU-{i}") for i in range(8)]
    gpus[3].query_error = UNKNOWN
    gpus[5] = SimGpu("GPU-5", handle_error=NO_PERMISSION)
    b, node = backend(*gpus)
    got: list[Detection] = []
    mon = GpuMonitor(b, GpuConfig(events=False), threaded=False)
    mon.start(ctx(tmp_path), got.append)
    for t in range(4):
        mon.poll(float(t * 10))
    assert mon.available, "one device's errors do not blind the monitor"
    gpus_status = mon.gpus()
    assert gpus_status is not None and len(gpus_status) == 8
    assert gpus_status[5]["unknown"] and not gpus_status[5]["lost"]
    assert [d.details["device"] for d in got] == [3], "UNKNOWN that persists is a lost GPU; a refusal is not"
    assert got[0].cause is Cause.GPU_FAULT and "NVML_ERROR_UNKNOWN" in got[0].summary
    assert all(g["memory_total_bytes"] == 80 * GiB for g in gpus_status if g["index"] not in (3, 5))
    node.gpus[0].query_error = GPU_IS_LOST
    mon.poll(100.0)
    assert [d.details["device"] for d in got] == [3, 0]
    mon.stop()


def test_ecc_signs_and_the_ecc_xids_give_one_decision(tmp_path: Path) -> None:
    """Xid 94 (contained) with the ECC counter rising: one restart, not a restart and a give-up;
    a DBE event whose driver says no recovery is needed is contained too; without the field, the
    ECC error gives up once and its Xid 48 adds nothing."""
    b, n = backend(SimGpu("GPU-0"), SimGpu("GPU-1", recovery=0), SimGpu("GPU-2"))
    got: list[Detection] = []
    mon = GpuMonitor(b, GpuConfig(), threaded=False)
    mon.start(ctx(tmp_path), got.append)
    mon.poll(0.0)
    n.send(0, 94)
    n.gpus[0].ecc = 1
    mon.poll(10.0)
    n.send(1, 0, kind=DBE)
    n.gpus[1].ecc = 1
    mon.poll(20.0)
    n.send(1, 94)
    n.send(2, 0, kind=DBE)
    n.send(2, 48)
    n.gpus[2].ecc = 3
    mon.poll(30.0)
    mon.poll(40.0)
    decided = [(d.details["device"], d.suggested_action.value if d.suggested_action else None) for d in got]
    assert decided == [(0, "restart"), (1, "restart"), (2, "give_up")], [d.summary for d in got]
    assert "contained" in got[1].summary
    mon.stop()
