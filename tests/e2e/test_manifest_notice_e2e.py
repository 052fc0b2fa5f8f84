"""The supervisor's own files in the user's checkpoint folder are said (issue 37 part 10): at
start, one ``checkpoint_manifests_on`` naming the folder, what is written there and the setting
that turns it off; nothing said with ``write_manifests = false``."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import history

PY = sys.executable

JOB = "pass"


def run(daemons, tmp_path: Path, name: str, *flags: str) -> tuple[Path, list[dict]]:
    sd, ckpt = tmp_path / name, tmp_path / f"{name}-ckpt"
    d = daemons(["wrap", "--state-dir", str(sd), "--checkpoint-dir", str(ckpt), *flags, "--",
                 PY, "-c", JOB])
    assert d.wait(120) == 0, d.stderr()[-3000:]
    return ckpt, [e for e in history(sd)["events"] if e["event"] == "checkpoint_manifests_on"]


def test_the_manifests_written_into_the_checkpoint_dir_are_said_once_with_how_to_turn_them_off(daemons, tmp_path):
    ckpt, said = run(daemons, tmp_path, "on")
    [ev] = said
    assert ev["data"]["path"] == str(ckpt) and ev["level"] == "info"
    assert f"in {ckpt}" in ev["message"] and "<checkpoint>.manifest.json" in ev["message"]
    assert "[checkpoints] write_manifests = false" in ev["message"], ev["message"]

    ckpt, said = run(daemons, tmp_path, "off", "--set", "checkpoints.write_manifests=false")
    assert said == []
