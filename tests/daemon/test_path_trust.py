"""A root daemon refuses a state or checkpoint dir another user could swap under it (issue 24
build 4), through the real CLI: exit 2, the component named, nothing started or created."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from supervisor.ownpaths import unsafe_component

PY = sys.executable
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the check is for a root daemon; needs root to chown")


def _job(marker: Path) -> list[str]:
    return [PY, "-c", "import sys; open(sys.argv[1], 'w').write('ran')", str(marker)]


def _wrap(sd: Path) -> list[str]:
    return ["wrap", "--state-dir", str(sd), "--backoff", "0", "--grace", "2", "--"]


def test_state_dir_under_a_folder_owned_by_another_uid_is_refused(daemons, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    sd, marker = theirs / "sd", tmp_path / "ran"
    d = daemons(_wrap(sd) + _job(marker))
    assert d.wait(30) == 2
    err = d.stderr()
    assert f"{theirs} is owned by uid {NOBODY}" in err and "Traceback" not in err, err
    assert not marker.exists() and not sd.exists()  # nothing started, nothing made


def test_state_dir_under_a_world_writable_folder_is_refused(daemons, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    sd, marker = open_dir / "sd", tmp_path / "ran"
    d = daemons(_wrap(sd) + _job(marker))
    assert d.wait(30) == 2
    assert f"{open_dir} is writable by others" in d.stderr() and not marker.exists()


def test_a_root_owned_sticky_folder_like_tmp_is_accepted(daemons, tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    sd, marker = sticky / "sd", tmp_path / "ran"
    d = daemons(_wrap(sd) + _job(marker))
    assert d.wait(30) == 0, d.stderr()
    assert marker.read_text() == "ran"


def test_checkpoint_dir_owned_by_another_uid_is_refused(daemons, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    os.chown(ck, NOBODY, NOBODY)
    sd, marker = tmp_path / "sd", tmp_path / "ran"
    cfgp = tmp_path / "c.toml"
    cmd = ", ".join(f'"{a}"' for a in _job(marker))
    cfgp.write_text(f'[job]\ncommand = [{cmd}]\n[state]\ndir = "{sd}"\n[checkpoints]\ndir = "{ck}"\n')
    d = daemons(["run", "--config", str(cfgp)])
    assert d.wait(30) == 2
    assert f"checkpoint dir {ck}" in d.stderr() and f"owned by uid {NOBODY}" in d.stderr(), d.stderr()
    assert not marker.exists()


def test_a_symlink_is_judged_by_where_it_leads(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (tmp_path / "link").symlink_to(theirs)
    why = unsafe_component(tmp_path / "link" / "sd", 0)
    assert why is not None and str(theirs) in why
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    assert stat.S_IMODE(os.stat(mine).st_mode) & 0o022 == 0
    assert unsafe_component(mine / "not-yet", 0) is None
