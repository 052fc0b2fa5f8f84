"""The checkpoint dir found from checkpoint-shaped entries appearing under the working tree:
real checkpoints of every layout, the time bound, the folders never looked into, the bounds."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from supervisor.checkpoints import appearing
from supervisor.checkpoints.appearing import scan
from supervisor.checkpoints.layouts.spec import Layout
from tests.helpers import ckpt_factory as F

LONG_AGO = 0.0  # ckpt_factory ages what it writes by 60 s: "since" before that


def fresh(path: Path) -> Path:
    """Touch a made checkpoint (a file, or a folder and what is in it) to now."""
    now = time.time()
    for root, dirs, files in os.walk(path) if path.is_dir() else []:
        for n in files + dirs:
            os.utime(os.path.join(root, n), (now, now))
    os.utime(path, (now, now))
    return path


@pytest.mark.parametrize("layout", [Layout.FILE, Layout.HF, Layout.LIGHTNING, Layout.SAFETENSORS, Layout.DCP])
def test_a_checkpoint_of_each_layout_names_its_folder(tmp_path: Path, layout: Layout) -> None:
    folder = tmp_path / "exp" / "run1" / "ckpts"
    made = F.LAYOUT_CASES[layout](folder, 40)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.bin.txt").write_text("x")
    hit = scan([tmp_path], since=LONG_AGO)
    assert hit is not None and hit.folder == folder and hit.entry == made, hit
    assert hit.layout == layout


def test_only_what_appeared_since_the_run_began(tmp_path: Path) -> None:
    F.torch_file(tmp_path / "old" / "step_5.pt", 5)  # aged 60 s: from an earlier run
    assert scan([tmp_path], since=time.time() - 5) is None
    new = fresh(F.torch_file(tmp_path / "new" / "step_10.pt", 10))
    hit = scan([tmp_path], since=time.time() - 5)
    assert hit is not None and hit.entry == new and hit.folder == tmp_path / "new"


def test_the_newest_of_several_wins(tmp_path: Path) -> None:
    F.torch_file(tmp_path / "a" / "step_5.pt", 5)
    b = F.torch_file(tmp_path / "b" / "step_6.pt", 6)
    os.utime(b, (time.time(), time.time()))
    hit = scan([tmp_path], since=LONG_AGO)
    assert hit is not None and hit.folder == tmp_path / "b"


def test_venvs_git_site_packages_caches_and_skipped_dirs_are_never_looked_into(tmp_path: Path) -> None:
    for where in (".git/objects", "venv2/lib/python3.11/site-packages/pkg", ".venv", "node_modules/x",
                  "__pycache__", "env/x", "state"):
        F.torch_file(tmp_path / where / "step_5.pt", 5)
    (tmp_path / "venv2" / "pyvenv.cfg").write_text("home = /usr\n")
    assert scan([tmp_path], since=LONG_AGO, skip=[tmp_path / "state"]) is None


def test_a_stepless_file_counts_only_when_its_name_says_checkpoint(tmp_path: Path) -> None:
    F.torch_file(tmp_path / "data" / "tokens.pt", 0)  # a cache, recognised by suffix alone
    assert scan([tmp_path], since=LONG_AGO) is None
    F.torch_file(tmp_path / "out" / "ckpt.pt", 0)
    hit = scan([tmp_path], since=LONG_AGO)
    assert hit is not None and hit.folder == tmp_path / "out" and hit.layout == Layout.SINGLE


def test_the_walk_is_bounded_in_depth_and_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path.joinpath(*[f"d{i}" for i in range(appearing.MAX_DEPTH + 1)])
    F.torch_file(deep / "step_5.pt", 5)
    assert scan([tmp_path], since=LONG_AGO) is None
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(50):
        (wide / f"f{i:03}.txt").write_text("")
    F.torch_file(wide / "zz" / "step_1.pt", 1)
    assert scan([tmp_path], since=LONG_AGO) is not None
    monkeypatch.setattr(appearing, "MAX_ENTRIES", 20)  # the budget runs out in the 50 files
    assert scan([tmp_path], since=LONG_AGO) is None


def test_an_unreadable_or_missing_root_is_passed_over(tmp_path: Path) -> None:
    assert scan([tmp_path / "absent"], since=LONG_AGO) is None
