"""The job's GPUs (issue 39 item 1): CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES / gpu.devices
resolved to NVML devices by UUID, on the real NVML backend over the simulated C library; and the
events that are not the job's (item 2): a stale Xid, a co-tenant's application Xid."""
from __future__ import annotations

from pathlib import Path

from supervisor.events import AttemptContext
from supervisor.core.observations import Detection
from supervisor.health.config import GpuConfig
from supervisor.health.devices import resolve, visible_list
from supervisor.health.gpumonitor import GpuMonitor
from supervisor.health.nvml import NvmlBackend
from tests.helpers.nvml_clib import GiB, SimGpu, SimMig, SimNode, simulated_pynvml


def node(*gpus: SimGpu) -> tuple[NvmlBackend, SimNode]:
    n = SimNode(list(gpus))
    b = NvmlBackend(simulated_pynvml(n))
    b.init()
    return b, n


def four() -> tuple[NvmlBackend, SimNode]:
    return node(SimGpu("GPU-aaaa0000"), SimGpu("GPU-bbbb1111"), SimGpu("GPU-cccc2222", name="NVIDIA A100"),
                SimGpu("GPU-dddd3333", migs=[SimMig("MIG-dddd-0001", 1, 0), SimMig("MIG-dddd-0002", 2, 0)]))


def test_visible_lists_as_cuda_reads_them() -> None:
    assert visible_list(None) is None and visible_list("all") is None
    assert visible_list("") == [] and visible_list("none") == [] and visible_list("void") == []
    assert visible_list("2, 0") == ["2", "0"]
    assert visible_list("0,1,-1,2") == ["0", "1"], "CUDA stops at the first entry it cannot use"


def test_ordinals_uuids_prefixes_and_mig_names() -> None:
    b, _ = four()
    sel = resolve(b, (), {"CUDA_VISIBLE_DEVICES": "3,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [(d.index, d.cuda) for d in sel.devices] == [(3, 0), (1, 1)] and not sel.notes
    assert sel.label(1) == "GPU 1 (cuda:1, GPU-bbbb1111)" and not sel.watches(0)
    by_uuid = resolve(b, (), {"CUDA_VISIBLE_DEVICES": "GPU-cccc,MIG-dddd-0002"})
    assert [(d.index, d.cuda, d.mig.gi if d.mig else None) for d in by_uuid.devices] == [(2, 0, None), (3, 1, 2)]
    assert by_uuid.slices(3) == ("MIG-dddd-0002",) and by_uuid.owns_slice(3, 2, 0) and not by_uuid.owns_slice(3, 1, 0)
    assert by_uuid.owns_slice(3, None, None), "an event of the whole GPU touches the job's slice"
    old_form = resolve(b, (), {"CUDA_VISIBLE_DEVICES": "MIG-GPU-dddd3333/1/0"})
    assert [(d.index, d.mig.gi if d.mig else None) for d in old_form.devices] == [(3, 1)]


def test_mixed_gpus_by_ordinal_are_said_to_be_uncertain_and_unknown_entries_kept() -> None:
    b, _ = four()
    sel = resolve(b, (), {"CUDA_VISIBLE_DEVICES": "0,GPU-ffff"})
    assert sel.notes and "UUIDs" in sel.notes[0], "CUDA orders mixed GPUs by speed, NVML by PCI bus"
    assert sel.unresolved == ("GPU-ffff",) and [d.index for d in sel.devices] == [0]


def test_nvidia_visible_devices_then_cuda_within_it_and_the_config_wins() -> None:
    b, _ = four()
    sel = resolve(b, (), {"NVIDIA_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "1"})
    assert [d.index for d in sel.devices] == [2], "CUDA's ordinal 1 within the container's GPUs 1 and 2"
    alone = resolve(b, (), {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa0000,3"})
    assert [d.index for d in alone.devices] == [0, 3] and alone.devices[0].cuda is None
    configured = resolve(b, ("GPU-bbbb1111",), {"CUDA_VISIBLE_DEVICES": "0"})
    assert configured.source == "gpu.devices" and configured.indices == (1,)
    every = resolve(b, (), {})
    assert every.every and every.indices == (0, 1, 2, 3)


def ctx(tmp: Path, pid: int = 1) -> AttemptContext:
    return AttemptContext(run_id="r", attempt=0, pgid=pid, pid=pid, started_monotonic=0.0, state_dir=tmp,
                          heartbeat_dir=tmp, checkpoint_dir=None, resume_from=None, resume_step=None)


def test_a_stale_xid_is_not_delivered_to_the_next_attempt(tmp_path: Path) -> None:
    b, n = node(SimGpu("GPU-0"))
    got: list[Detection] = []
    mon = GpuMonitor(b, GpuConfig(), threaded=False)
    mon.start(ctx(tmp_path), got.append)
    mon.poll(0.0)
    mon.stop()
    n.send(0, 43)  # raised while the attempt was being stopped: the crash's own Xid
    n.send(0, 31)
    mon.start(ctx(tmp_path), got.append)  # the next attempt
    for t in range(3):
        mon.poll(float(t))
    assert got == [], [d.summary for d in got]
    n.send(0, 79)  # the new attempt's own fault is seen
    mon.poll(5.0)
    assert [d.details["code"] for d in got] == [79]
    mon.stop()


def test_an_application_xid_while_only_others_use_the_gpu_is_noted(tmp_path: Path) -> None:
    import os

    b, n = node(SimGpu("GPU-0", procs={999_999: GiB}))  # a co-tenant's notebook on the job's GPU
    got: list[Detection] = []
    mon = GpuMonitor(b, GpuConfig(), threaded=False)
    mon.start(ctx(tmp_path, os.getpid()), got.append)
    mon.poll(0.0)
    n.send(0, 13)
    mon.poll(0.1)
    assert got == [], "the GPU lists processes and none is the job's: another process's fault"
    n.gpus[0].procs[os.getpid()] = GiB  # the job on it too: the Xid may be the job's
    mon.poll(10.0)
    n.send(0, 31)
    mon.poll(10.1)
    assert [d.details["code"] for d in got] == [31]
    mon.stop()


def test_hostile_visible_devices_are_bounded_and_never_raise() -> None:
    b, _ = four()
    huge = ",".join(["9" * 5000, "²", "GPU-" + "x" * 100_000, "MIG-GPU-aaaa0000/1²/0", ""] + ["1"] * 100_000)
    sel = resolve(b, (), {"CUDA_VISIBLE_DEVICES": huge})
    assert [d.index for d in sel.devices] == [] and len(sel.unresolved) == 4, "stops at the empty entry"
    many = resolve(b, (), {"CUDA_VISIBLE_DEVICES": ",".join(["0"] * 100_000)})
    assert len(many.devices) == 256 and many.indices == (0,)
