"""What the job runs on, recorded with every attempt (the seed: tie every checkpoint to its
hyperparameters and environment). The daemon never imports torch: library versions come from a
short subprocess of the *job's* Python that reads package metadata and torch/version.py as text.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import childio

_NICE = r"""
import os
# It runs beside the job's first start-up: below it in CPU priority, also where the kernel
# groups CPU time by session (sched_autogroup; this probe has a session of its own).
try:
    with open("/proc/self/autogroup", "w") as f:
        f.write("10")
except OSError:
    pass
try:
    os.nice(10)
except OSError:
    pass
"""
_PROBE = r"""
import os
import json, sys, platform, importlib.metadata as md, importlib.util, re
out = {"python": platform.python_version(), "python_executable": sys.executable}
for dist in ("torch", "numpy", "transformers", "accelerate", "deepspeed", "megatron-core", "lightning",
             "pytorch-lightning", "peft", "datasets", "tokenizers", "flash-attn",
             "nvidia-nccl-cu12", "nvidia-nccl-cu13", "triton"):
    try:
        out.setdefault("packages", {})[dist] = md.version(dist)
    except Exception:
        pass
spec = importlib.util.find_spec("torch")  # locates the package without importing it
if spec and spec.submodule_search_locations:
    vf = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        text = open(vf).read()
        for key in ("cuda", "hip", "git_version"):
            m = re.search(r"^%s\s*(?::\s*\S+)?\s*=\s*'([^']*)'" % key, text, re.M)
            if m:
                out["torch_" + key] = m.group(1)
    except OSError:
        pass
nccl = out.get("packages", {}).get("nvidia-nccl-cu12") or out.get("packages", {}).get("nvidia-nccl-cu13")
if nccl:
    out["nccl"] = nccl
print(json.dumps(out))
"""


def python_probe(python: str, timeout: float = 20.0, nice: bool = True) -> dict[str, Any]:
    """``nice``: below the job in CPU priority (it runs beside the job's start-up); not where it
    runs while no job does and a launch waits for it (a multi-node launch barrier)."""
    # The job's Python runs its site hooks: what they print is read to bounded tails (childio).
    try:
        cp = childio.run([python, "-c", (_NICE if nice else "") + _PROBE], timeout_s=timeout,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except OSError as e:
        return {"error": f"could not run {python}: {e}"}
    if cp.timed_out:
        return {"error": f"could not run {python}: no answer within {timeout:g} s"}
    if cp.returncode != 0:
        return {"error": f"{python} failed: {cp.stderr_tail()}"}
    try:
        return json.loads(cp.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"unexpected output from {python}"}


def git_info(cwd: Path) -> dict[str, Any]:
    try:
        head = childio.run(["git", "-C", str(cwd), "rev-parse", "HEAD"], timeout_s=10)
        if head.returncode != 0:
            return {}
        # A checkout with a million changed files: only whether there is one matters (a tail of it).
        dirty = childio.run(["git", "-C", str(cwd), "status", "--porcelain", "--untracked-files=no"], timeout_s=10)
        return {"commit": head.stdout.decode(errors="replace").strip(), "dirty": bool(dirty.stdout.strip())}
    except OSError:
        return {}


_NPROC = re.compile(r"^--nproc[-_]per[-_]node(?:=(.+))?$")
_NNODES = re.compile(r"^--nnodes(?:=(.+))?$")


def world_from_launch(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """World size and node count from torchrun-style args or the environment."""
    out: dict[str, Any] = {}
    for i, a in enumerate(argv):
        for key, rx in (("nproc_per_node", _NPROC), ("nnodes", _NNODES)):
            m = rx.match(a)
            if m:
                val = m.group(1) if m.group(1) is not None else (argv[i + 1] if i + 1 < len(argv) else None)
                if val is not None:
                    out[key] = val
    for k in ("WORLD_SIZE", "NNODES", "SLURM_NNODES", "LOCAL_WORLD_SIZE"):
        if k in env:
            out[k.lower()] = env[k]
    try:
        nodes = int(str(out.get("nnodes", "1")).split(":")[-1])
        per = int(out["nproc_per_node"]) if str(out.get("nproc_per_node", "")).isdigit() else None
        if per is not None:
            out["world_size"] = nodes * per
    except ValueError:
        pass
    return out


def snapshot(python: str, cwd: Path, argv: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    seeds = {k: v for k, v in env.items() if "SEED" in k.upper()}
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "job_python": python_probe(python),
        "git": git_info(cwd),
        "world": world_from_launch(argv, env),
        "seeds": seeds,
    }
