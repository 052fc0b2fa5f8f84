"""The systemd units: `systemd-analyze verify` must be silent (it only WARNS on typos)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "systemd"


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Z]\w*=", line))


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_is_clean(tmp_path: Path):
    # verify resolves ExecStart on this machine, where nothing is installed: point it at a binary
    # that exists, everything else as shipped.
    paths = []
    for src, dst in (("transformer-supervisor.service", "transformer-supervisor.service"),
                     ("transformer-supervisor@.service", "transformer-supervisor@night.service")):
        text = (UNITS / src).read_text()
        assert "ExecStart=/usr/local/bin/transformer-supervisor run --config " in text
        (tmp_path / dst).write_text(text.replace("ExecStart=/usr/local/bin/transformer-supervisor",
                                                 "ExecStart=/bin/true"))
        paths.append(str(tmp_path / dst))
    r = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr


def test_units_say_what_the_issue_asks():
    plain = _props((UNITS / "transformer-supervisor.service").read_text())
    tmpl = _props((UNITS / "transformer-supervisor@.service").read_text())
    assert plain["ExecStart"].endswith("run --config /etc/transformer-supervisor/config.toml")
    assert tmpl["ExecStart"].endswith("run --config /etc/transformer-supervisor/%i.toml")
    for p in (plain, tmpl):
        assert p["Type"] == "notify" and p["NotifyAccess"] == "main"
        assert p["Restart"] == "on-failure" and p["RestartPreventExitStatus"] == "2 3"
        assert p["KillMode"] == "mixed"
        assert p["ExecReload"] == "/bin/sh -c 'kill -HUP \"$$MAINPID\"'"
        assert p["StateDirectory"] == "transformer-supervisor"
        assert int(p["WatchdogSec"]) > 0
        # above the default grace (120 s) plus a checkpoint wait
        assert int(p["TimeoutStopSec"]) >= 240
        assert "LimitNOFILE" in p and "RuntimeDirectory" in p
        # nothing that would hide /dev/nvidia* from CUDA
        for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "MemoryDenyWriteExecute"):
            assert key not in p, key
