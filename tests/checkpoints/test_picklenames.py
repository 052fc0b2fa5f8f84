"""The scan's allowlist is torch's own (issue 34, never harm the run): every global torch 2.13's
``weights_only`` load accepts by default is allowed by the scan, so a healthy checkpoint holding a
newer dtype (float8_e8m0fnu MX scales, float4_e2m1fn_x2 weights, the bits types) or an old save's
legacy tensor type is never refused for a name torch itself loads. Real files made by torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from supervisor.checkpoints.picklenames import allowed
from supervisor.checkpoints.picklescan import unsafe_pickle

LIST = """
from torch import _weights_only_unpickler as w
for k in w._get_allowed_globals():
    print(k)
"""

SAVE = """
import sys, torch
d = sys.argv[1]
u8 = torch.zeros(4, dtype=torch.uint8)
for dt in ("float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"):
    t = u8.view(torch.int16).view(getattr(torch, dt)) if dt == "bits16" else u8.view(getattr(torch, dt))
    torch.save({"t": t}, f"{d}/{dt}.pt")
    assert torch.load(f"{d}/{dt}.pt", weights_only=True)["t"].dtype == getattr(torch, dt)
"""


def test_every_global_torchs_weights_only_load_accepts_is_allowed() -> None:
    out = subprocess.run([sys.executable, "-c", LIST], capture_output=True, text=True, timeout=120, check=True).stdout
    names = [line.rsplit(".", 1) for line in out.split()]
    assert len(names) > 100, out  # the listing worked
    missing = [".".join(n) for n in names if not allowed(n[0], n[1])]
    assert missing == [], f"torch's weights_only allowlist names these and the scan refuses them: {missing}"


def test_files_of_the_newer_dtypes_pass_the_scan(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", SAVE, str(tmp_path)], check=True, timeout=120)
    files = sorted(tmp_path.glob("*.pt"))
    assert len(files) == 7
    for f in files:
        assert unsafe_pickle(f) is None, f.name
