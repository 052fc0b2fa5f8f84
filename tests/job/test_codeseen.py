"""Issue 34 part 6: what a standby imported is compared at the hand-over with what is on disk
(stat calls only, bounded): an edited or replaced module, a new or changed .pth file, a
distribution installed or removed are each a change, named; nothing changed is none."""
from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from supervisor.job import codeseen
from supervisor.job.codeseen import CodeSeen


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path holding one module, imported."""
    folder = tmp_path / "site-packages"
    folder.mkdir()
    (folder / "tsup_seen_demo.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "tsup_seen_demo", raising=False)
    importlib.import_module("tsup_seen_demo")
    yield folder
    sys.modules.pop("tsup_seen_demo", None)


def test_nothing_changed_is_no_change_and_an_edited_module_is_named(site: Path) -> None:
    seen = CodeSeen()
    assert seen.changed() is None
    assert str(site / "tsup_seen_demo.py") in seen.files
    st = os.stat(site / "tsup_seen_demo.py")
    (site / "tsup_seen_demo.py").write_text("VERSION = 2\n")  # same size: the mtime (and ctime) tell
    os.utime(site / "tsup_seen_demo.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert seen.changed() == "code changed (tsup_seen_demo)"


def test_an_in_place_edit_of_the_same_size_with_its_mtime_put_back_is_a_change(site: Path) -> None:
    f = site / "tsup_seen_demo.py"
    seen = CodeSeen()
    before = os.stat(f)
    deadline = time.monotonic() + 10
    while True:  # the kernel's ctime clock is coarse (a tick of some ms): the edit is made until it lands past it
        with open(f, "r+b") as fh:  # in place: the same inode, the same size
            fh.write(b"VERSION = 2\n")
        os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back, as `touch -r` or `cp -p` do
        after = os.stat(f)
        if after.st_ctime_ns != before.st_ctime_ns or time.monotonic() > deadline:
            break
    assert after.st_ctime_ns != before.st_ctime_ns
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert f.read_text() == "VERSION = 2\n"
    assert seen.changed() == "code changed (tsup_seen_demo)"


def test_a_replaced_or_removed_module_is_a_change(site: Path) -> None:
    seen = CodeSeen()
    f = site / "tsup_seen_demo.py"
    st = os.stat(f)
    tmp = site / "new.tmp"
    tmp.write_text("VERSION = 1\n")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only the inode differs
    tmp.replace(f)
    assert seen.changed() == "code changed (tsup_seen_demo)"
    seen = CodeSeen()
    f.unlink()
    assert seen.changed() == "code changed (tsup_seen_demo)"


@pytest.mark.parametrize("change", ["new_pth", "edited_pth", "dist_added", "dist_removed"])
def test_pth_files_and_installed_distributions_on_the_path_are_compared(site: Path, change: str) -> None:
    (site / "old.pth").write_text("# nothing\n")
    (site / "tsup_seen_demo-1.0.dist-info").mkdir()
    seen = CodeSeen()
    if change == "new_pth":
        (site / "hotfix.pth").write_text("import os\n")
        want = f"code changed (hotfix.pth in {site})"
    elif change == "edited_pth":
        (site / "old.pth").write_text("/somewhere/else\n")
        want = f"code changed (old.pth in {site})"
    elif change == "dist_added":
        (site / "tsup_seen_demo-2.0.dist-info").mkdir()
        want = f"code changed (tsup_seen_demo-2.0.dist-info in {site})"
    else:
        (site / "tsup_seen_demo-1.0.dist-info").rmdir()
        want = f"code changed (tsup_seen_demo-1.0.dist-info in {site})"
    assert seen.changed() == want


def test_the_comparison_is_cheap_and_bounded(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch  # noqa: F401  (a real job's imports: about 2,000 modules)

    seen = CodeSeen()
    assert len(seen.files) > 1000
    t0 = time.monotonic()
    assert seen.changed() is None
    assert time.monotonic() - t0 < 2.0, "stat calls only"
    # Past the bound the standby does not guess: it says so, and the attempt starts cold.
    monkeypatch.setattr(codeseen, "MAX_CODE_FILES", 100)
    assert CodeSeen().changed() == "more than 100 module files to compare"
    monkeypatch.setattr(codeseen, "MAX_CODE_FILES", 20_000)
    # A folder 100x past the listing bound: read up to it, the folder's own identity for the rest.
    monkeypatch.setattr(codeseen, "MAX_DIR_ENTRIES", 50)
    for i in range(5000):
        (site / f"m{i}.txt").touch()
    seen = CodeSeen()
    assert len([k for k in seen.paths if k.startswith(str(site))]) <= 51
    os.utime(site, ns=(0, 1))  # what adding or removing an entry does to the folder
    assert seen.changed() == f"code changed ({site.name} in {site.parent})"


def test_a_file_replaced_while_its_module_was_imported_makes_the_standby_unusable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The full run's race: the standby began importing v1 (its identity taken before the import),
    # the operator's upgrade replaced the file before the import's own stat; after the import the
    # file looks unchanged at the hand-over, yet the module in memory is v1. The module replaces
    # its own file while it runs, so the replacement lands inside the import, as it did.
    folder = tmp_path / "site-packages"
    folder.mkdir()
    mod = folder / "tsup_raced_demo.py"
    mod.write_text(f"import os\nVERSION = 1\nopen({str(mod)!r} + '.new', 'w').write('VERSION = 2\\n')\n"
                   f"os.replace({str(mod)!r} + '.new', {str(mod)!r})\n")
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    seen = CodeSeen()
    seen.before("tsup_raced_demo")
    try:
        assert importlib.import_module("tsup_raced_demo").VERSION == 1
        seen.note()
        assert seen.raced == "tsup_raced_demo"
        assert seen.changed() == "code changed (tsup_raced_demo: its file changed while the standby imported it)"
        # Without the look before, the stat after the import saw the new file: no change at all.
        blind = CodeSeen()
        assert blind.changed() is None
    finally:
        sys.modules.pop("tsup_raced_demo", None)
