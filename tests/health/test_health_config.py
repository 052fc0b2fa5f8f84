"""[gpu]/[host] config: bad values are named with their key; gpu_check is ready."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.schema import Problem, build
from supervisor.health.config import GpuConfig
from supervisor.health.gpucheck import CHILD

ROOT = Path(__file__).resolve().parents[2]


def test_bad_values_are_reported_with_their_key() -> None:
    problems: list[Problem] = []
    build(GpuConfig, {"backend": "cuda", "xid_actions": {"79": "drain"}, "memory_watermark": 1.5,
                      "xid_default_action": "giveup"}, "gpu", problems)
    text = "\n".join(map(str, problems))
    assert 'gpu.backend: expected "nvml" or "none", got "cuda"' in text
    assert "gpu.xid_actions.79: expected one of restart" in text
    assert "gpu.memory_watermark" in text and "did you mean 'give_up'" in text


def test_gpu_check_is_ready_and_says_blind_without_a_gpu() -> None:
    script = ROOT / "scripts" / "gpu_check"
    assert os.access(script, os.X_OK)
    compile(CHILD, "child.py", "exec")  # the OOM child that runs only on a GPU machine
    out = subprocess.run([sys.executable, "-m", "supervisor.health.gpucheck", "--seconds", "0.2"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "| nvml available | False | **NO** |" in out.stdout
    assert "| supervised CUDA OOM | skipped | **NO** |" in out.stdout
    assert "healthy" not in out.stdout.lower()


@pytest.mark.slow
def test_gpu_check_oom_pipeline_through_the_real_daemon_cli_simulated() -> None:
    """The OOM half of gpu_check on CPU (a child that prints a CUDA OOM): wrap, relaunch, history.

    Whether the daemon classifies it ``oom`` and records the gate is the wiring's job; the row for
    it is printed either way, and the integrator's end-to-end tests assert it.
    """
    out = subprocess.run([sys.executable, "-m", "supervisor.health.gpucheck", "--seconds", "0.1",
                          "--simulate-oom", "--oom-timeout", "120"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert "| wrap exit code | 0 | yes |" in out.stdout, out.stdout + out.stderr
    assert "| relaunched | 2 | yes |" in out.stdout
    assert "| attempt 0 cause |" in out.stdout and "| gate before relaunch |" in out.stdout
