"""``restart --from`` takes only what discovery calls a checkpoint (issue 24 build 3): not the
checkpoint dir itself, not a random folder, not even with ``--force``; through the real daemon."""
from __future__ import annotations

import signal
from pathlib import Path

from tests.conftest import history
from tests.daemon.test_hardening import SLEEPER, _cli, wrap
from tests.util import wait_for


def test_restart_from_the_checkpoint_dir_or_a_random_folder_is_refused_even_forced(daemons, tmp_path: Path) -> None:
    sd, ready, ck, rnd = tmp_path / "sd", tmp_path / "ready", tmp_path / "ck", tmp_path / "notes"
    ck.mkdir()
    rnd.mkdir()
    (rnd / "readme.txt").write_text("not a checkpoint\n")
    d = daemons(wrap(sd, "--checkpoint-dir", str(ck)) + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    for target, words in ((ck, "is the checkpoint dir"), (rnd, "not a checkpoint discovery recognises")):
        for force in ((), ("--force",)):
            cp = _cli("restart", "--state-dir", str(sd), "--from", str(target), *force)
            out = cp.stderr + cp.stdout
            assert cp.returncode == 1 and words in out and "Traceback" not in out, out
    assert len(history(sd)["attempts"]) == 1, "nothing restarted"
    d.signal(signal.SIGTERM)
    d.wait(30)
