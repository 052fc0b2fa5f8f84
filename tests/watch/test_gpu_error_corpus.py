"""Causes named right (issue 35 part 8): every message of tests/corpus/gpu_errors/ goes through the
real LogWatcher, after a few training steps, and is filed under the cause its file name says; a
CUDA error is a `crash` whose summary is the CUDA message (it was `nccl_timeout`)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.events import Cause
from supervisor.core.observations import Detection
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "gpu_errors"
FILES = sorted(CORPUS.glob("*.log"))
# The summary a crash must carry: the CUDA message itself.
CUDA_MESSAGES = {
    "crash_illegal_memory_access": "CUDA error: an illegal memory access was encountered",
    "crash_device_side_assert": "CUDA error: device-side assert triggered",
    "crash_unspecified_launch_failure": "CUDA error: unspecified launch failure",
    "crash_misaligned_address": "CUDA error: misaligned address",
    "crash_cublas_execution_failed": "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(",
    "crash_cublas_not_supported": "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling",
    "crash_cudnn_internal_error": "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
    "crash_cudnn_execution_failed": "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
    "crash_nccl_watchdog_reports_cuda_error": "CUDA error: an illegal memory access was encountered",
}


def cause_of(path: Path) -> Cause:
    return next(c for c in sorted(Cause, key=lambda c: -len(c.value)) if path.stem.startswith(c.value + "_"))


def detections(lines: list[str]) -> list[Detection]:
    found: list[Detection] = []
    w = LogWatcher(DetectorsConfig(), found.append, lambda rec: None)
    w.feed("stdout", [f"iter {i}: loss 2.5000, time 12.34ms, mfu 1.20%" for i in range(40, 43)])
    w.feed("stderr", lines)
    return found


def test_the_corpus_covers_every_cause_and_every_cuda_message() -> None:
    causes = {cause_of(p) for p in FILES}
    assert causes == {Cause.CRASH, Cause.OOM, Cause.NCCL_TIMEOUT, Cause.GPU_FAULT}
    assert {p.stem for p in FILES if cause_of(p) is Cause.CRASH} == set(CUDA_MESSAGES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_message_is_filed_under_its_cause(path: Path) -> None:
    lines = path.read_text().splitlines()
    found = detections(lines)
    assert found, f"{path.name}: nothing detected"
    first = found[0]
    assert first.cause is cause_of(path), (path.name, first)
    assert first.source == "stderr" and first.step == 42
    if first.cause is Cause.CRASH:
        assert first.summary.startswith(CUDA_MESSAGES[path.stem]), first.summary
        assert first.summary.endswith("(last step 42)") and str(first.details["cuda_error"]) in first.summary
    else:
        assert Cause.CRASH not in {d.cause for d in found if d.cause is not first.cause} or path.stem.startswith(
            "nccl_timeout_unhandled"), [d.summary for d in found]  # NCCL's own report of a CUDA failure comes first


def test_a_cuda_error_is_never_an_nccl_timeout() -> None:
    found = detections(["RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert [d.cause for d in found] == [Cause.CRASH]
    assert found[0].summary == "CUDA error: an illegal memory access was encountered (last step 42)"


# A job that meets a CUDA error: a few steps, the error as PyTorch prints it, then it hangs on
# (as a rank often does after one) until the daemon stops it.
CUDA_JOB = ("import sys, time\nfor i in range(3):\n    print(f'iter {i}: loss 2.5000, time 12.34ms, mfu 1.20%', flush=True)\n"
            "print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr, flush=True)\n"
            "time.sleep(120)\n")


def test_a_cuda_error_through_the_daemon_is_a_crash_with_its_message(daemons, tmp_path: Path) -> None:
    from tests.conftest import history

    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--max-restarts", "0", "--grace", "5", "--", sys.executable, "-c",
                 CUDA_JOB])
    assert d.wait(90) == 3, d.stderr()[-3000:]  # the one allowed attempt spent: gave up
    [a] = history(sd)["attempts"]
    assert a["cause"] == "crash", a
    assert a["detection"]["summary"].startswith("CUDA error: an illegal memory access was encountered"), a["detection"]
    assert "CUDA error: an illegal memory access was encountered" in (a["summary"] or ""), a["summary"]


def test_ncclunhandledcudaerror_is_held_for_the_failure_it_names() -> None:
    """NCCL's "unhandled cuda error" names its CUDA failure a few lines on (issue 39): out of memory
    is oom; an older NCCL's report with no "Last error" is still nccl_timeout at the next NCCL line."""
    head = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
    oom = detections([head, "ncclUnhandledCudaError: Call to CUDA function failed.", "Last error:",
                      "Cuda failure 'out of memory'"])
    assert [d.cause for d in oom] == [Cause.OOM], [d.summary for d in oom]
    old = detections([head.replace(", NCCL version 2.21.5", ", NCCL version 2.10.3"),
                      "[E ProcessGroupNCCL.cpp:737] Some NCCL operations have failed or timed out."])
    assert [d.cause for d in old] == [Cause.NCCL_TIMEOUT] and "unhandled cuda error" in (old[0].evidence or "")
