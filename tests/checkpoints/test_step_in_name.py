"""Issue 34 D2: the step is the number after a step-like word, never the last number of a name.

``step_1000_v2.pt`` was step 2 and ``model-step500-rank0.pt`` step 0, so beside ``step_900.pt`` a
healthy run resumed 100 steps back. Each known layout's naming, through the real registry (real
entries on disk: folders with the file their layout waits for)."""
from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.checkpoints.discovery import Discovery
from supervisor.checkpoints.layouts import registry
from supervisor.checkpoints.layouts.names import name_step
from supervisor.checkpoints.layouts.spec import Layout

# name, what makes the entry (file, or folder holding that file), layout, step
CASES: list[tuple[str, str | None, Layout, int | None]] = [
    ("checkpoint-500", "trainer_state.json", Layout.HF, 500),
    ("epoch=2-step=500.ckpt", None, Layout.LIGHTNING, 500),
    ("epoch=12-step=3000-v1.ckpt", None, Layout.LIGHTNING, 3000),
    ("last.ckpt", None, Layout.LIGHTNING, None),
    ("ckpt.pt", None, Layout.SINGLE, None),
    ("step_500", ".metadata", Layout.DCP, 500),
    ("step-1000", ".metadata", Layout.DCP, 1000),
    ("global_step500", "mp_rank_00_model_states.pt", Layout.DEEPSPEED, 500),
    ("iter_0000500", "model_optim_rng.pt", Layout.MEGATRON, 500),
    ("model_500.pt", None, Layout.FILE, 500),
    ("step_1000.pt", None, Layout.FILE, 1000),
    ("ckpt_00001000.pt", None, Layout.FILE, 1000),
    ("step_1000_v2.pt", None, Layout.FILE, 1000),
    ("model-step500-rank0.pt", None, Layout.FILE, 500),
    ("model_500_rank0.pt", None, Layout.FILE, 500),
    ("model_rank3_500.pt", None, Layout.FILE, 500),
    ("global_step700.pt", None, Layout.FILE, 700),
    ("iter_800.pth", None, Layout.FILE, 800),
    ("llama-7b-step-20.pt", None, Layout.FILE, 20),
    ("model_300.safetensors", None, Layout.SAFETENSORS, 300),
    ("model_v2.pt", None, Layout.SINGLE, None),
    # Several numbers, none after a step word: not trusted for ordering (the manifest or the
    # content says the step), still one file per step, never a stepless overwritten file.
    ("model_3_900.pt", None, Layout.FILE, None),
    ("gpt2-medium_500.pt", None, Layout.FILE, None),
]


@pytest.mark.parametrize(("name", "inside", "layout", "step"), CASES, ids=[c[0] for c in CASES])
def test_each_layouts_name_gives_its_step(tmp_path: Path, name: str, inside: str | None, layout: Layout,
                                          step: int | None) -> None:
    p = tmp_path / name
    if inside is None:
        p.write_bytes(b"x")
    else:
        p.mkdir()
        (p / inside).write_bytes(b"x")
    entry = registry.recognise(p)
    assert entry is not None and entry.complete, (name, entry)
    assert (entry.spec.layout, entry.step) == (layout, step), name


def test_a_name_of_several_numbers_says_why_it_is_not_trusted() -> None:
    doubt = name_step("model_3_900.pt").doubt
    assert doubt is not None and "3, 900" in doubt and "manifest" in doubt, doubt
    assert name_step("step_1000_v2.pt").doubt is None


def test_discovery_puts_the_v2_suffixed_newer_step_first(tmp_path: Path) -> None:
    for name in ("step_900.pt", "step_1000_v2.pt", "model-step500-rank0.pt"):
        (tmp_path / name).write_bytes(b"x")
    got = [(c.path.name, c.step) for c in Discovery(tmp_path, settle_s=0.0).scan()]
    assert got == [("step_1000_v2.pt", 1000), ("step_900.pt", 900), ("model-step500-rank0.pt", 500)], got


def test_the_listing_says_why_a_names_numbers_were_not_trusted(tmp_path: Path) -> None:
    """model_3_900.pt (several numbers, no step word): its step comes from its manifest, and its
    row's notes say so; step_1000_v2.pt's row carries no such note."""
    import sys

    from supervisor.checkpoints.config import CheckpointsConfig
    from supervisor.checkpoints.service import CheckpointService
    from tests.helpers.ckpt_factory import torch_file

    ck = tmp_path / "ck"
    torch_file(ck / "model_3_900.pt", 900)
    torch_file(ck / "step_1000_v2.pt", 1000)
    (tmp_path / "state").mkdir()
    cfg = CheckpointsConfig(settle_s=0.0, load_test=False, write_manifests=True)
    svc = CheckpointService(cfg, ck, tmp_path / "state", sys.executable, ["python", "train.py"], tmp_path)
    rows = {r.path.name: r for r in svc.quicklist()}
    assert rows["step_1000_v2.pt"].step == 1000 and not any("several numbers" in n for n in rows["step_1000_v2.pt"].notes)
    assert any("several numbers (3, 900)" in n for n in rows["model_3_900.pt"].notes), rows["model_3_900.pt"].notes
