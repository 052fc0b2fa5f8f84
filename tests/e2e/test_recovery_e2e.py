"""Issue 11 and 12 leftovers through the real daemon: checkpoint discovery confined to its dir,
verification overlapping the job's start-up, the validation metric in the manifest, the disk
cost of the last good copy."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import history
from tests.helpers.ckpt_factory import torch_file

PY = sys.executable


def wrap(sd: Path, *flags: str) -> list[str]:
    return ["wrap", "--state-dir", str(sd), "--backoff", "0", *flags, "--"]


# Writes where it resumed from, then exits 0.
RESUMED_FROM = "import os, sys; open(sys.argv[1], 'w').write(os.environ['TSUP_RESUME_FROM'])"


def test_a_symlink_out_of_the_checkpoint_dir_is_never_resumed_from_unless_configured(daemons, tmp_path):
    ck, outside = tmp_path / "ck", tmp_path / "outside"
    torch_file(ck / "step_100.pt", 100)
    torch_file(outside / "step_900.pt", 900)
    (ck / "step_900.pt").symlink_to(outside / "step_900.pt")
    for follow in ("false", "true"):
        sd, out = tmp_path / f"sd-{follow}", tmp_path / f"resumed-{follow}"
        cfg = tmp_path / f"{follow}.toml"
        cfg.write_text(f"[checkpoints]\nfollow_symlinks_out = {follow}\n")
        d = daemons(wrap(sd, "--config", str(cfg), "--checkpoint-dir", str(ck)) + [PY, "-c", RESUMED_FROM, str(out)])
        assert d.wait(60) == 0, d.stderr()[-2000:]
        resumed = Path(out.read_text()).name
        assert resumed == ("step_900.pt" if follow == "true" else "step_100.pt")
        assert history(sd)["attempts"][0]["resume_step"] == (900 if follow == "true" else 100)
    assert (outside / "step_900.pt").exists()  # never moved or quarantined
