"""Tiny real checkpoints in every layout discovery knows (tests only; imports torch).

``LAYOUT_CASES`` has one maker per layout in ``supervisor/checkpoints/layouts/registry.py``
(tests/checkpoints/test_checkpoint_layouts.py checks that it covers every spec): a new layout
adds its maker there.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from supervisor.checkpoints.layouts.spec import Layout


def state(step: int, *, nan: bool = False) -> dict[str, Any]:
    w = torch.full((4, 4), float(step))
    if nan:
        w[0, 0] = float("nan")
    return {"model": {"w": w, "b": torch.zeros(4)}, "optimizer": {"lr": 1e-3}, "step": step}


def old_mtime(path: Path, age_s: float = 60.0) -> None:
    """Age a file or folder tree so it counts as settled without waiting."""
    t = os.stat(path).st_mtime - age_s
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            for n in files + dirs:
                os.utime(os.path.join(root, n), (t, t))
    os.utime(path, (t, t))


def torch_file(path: Path, step: int, **kw: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state(step, **kw), path)
    old_mtime(path)
    return path


def nanogpt(folder: Path, iter_num: int) -> Path:
    p = folder / "ckpt.pt"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {}, "iter_num": iter_num, "best_val_loss": 2.5,
                "config": {"lr": 1e-3}}, p)
    old_mtime(p)
    return p


def lightning(folder: Path, epoch: int, step: int, name: str | None = None) -> Path:
    p = folder / (name or f"epoch={epoch}-step={step}.ckpt")
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.ones(2)}, "optimizer_states": [], "global_step": step, "epoch": epoch}, p)
    old_mtime(p)
    return p


def safetensors_file(path: Path) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"model.w": torch.ones(3, 3), "model.b": torch.zeros(3)}, str(path))
    old_mtime(path)
    return path


def hf_folder(folder: Path, step: int) -> Path:
    from safetensors.torch import save_file

    d = folder / f"checkpoint-{step}"
    d.mkdir(parents=True)
    save_file({"w": torch.ones(2, 2)}, str(d / "model.safetensors"))
    torch.save({"state": {}, "param_groups": []}, d / "optimizer.pt")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (d / "config.json").write_text(json.dumps({"hidden_size": 8}))
    old_mtime(d)
    return d


def dcp_folder(folder: Path, step: int) -> Path:
    import torch.distributed.checkpoint as dcp

    d = folder / f"step-{step}"
    dcp.save({"model": {"w": torch.ones(3)}, "optimizer": {"lr": torch.tensor(1e-3)}}, checkpoint_id=str(d))
    old_mtime(d)
    return d


def megatron_folder(folder: Path, it: int, *, tracker: bool = True) -> Path:
    d = folder / f"iter_{it:07d}" / "mp_rank_00"
    d.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {}, "iteration": it}, d / "model_optim_rng.pt")
    if tracker:
        (folder / "latest_checkpointed_iteration.txt").write_text(str(it))
    old_mtime(d.parent)
    return d.parent


def deepspeed_folder(folder: Path, step: int) -> Path:
    d = folder / f"global_step{step}"
    d.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "global_steps": step}, d / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"state": {}}}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    old_mtime(d)
    return d


# One complete, loadable checkpoint of each layout at ``step`` in ``folder``; the returned path is
# what discovery lists. The single overwritten file says its step only inside (iter_num).
LAYOUT_CASES: Mapping[Layout, Callable[[Path, int], Path]] = {
    Layout.FILE: lambda folder, step: torch_file(folder / f"step_{step}.pt", step),
    Layout.SINGLE: nanogpt,
    Layout.LIGHTNING: lambda folder, step: lightning(folder, 0, step),
    Layout.SAFETENSORS: lambda folder, step: safetensors_file(folder / f"model_{step}.safetensors"),
    Layout.HF: hf_folder,
    Layout.DCP: dcp_folder,
    Layout.MEGATRON: megatron_folder,
    Layout.DEEPSPEED: deepspeed_folder,
}


def malicious(path: Path, marker: Path) -> Path:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Evil(), "optimizer": {}}, path)
    old_mtime(path)
    return path


def flip_byte(path: Path, offset: int | None = None) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        off = offset if offset is not None else st.st_size // 2
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: same size, same mtime


def truncate(path: Path, keep: float = 0.5) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.truncate(int(st.st_size * keep))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def count_files(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))
