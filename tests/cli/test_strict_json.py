"""Strict JSON everywhere (issue 23, Build 8): no bare NaN / Infinity in anything the project
writes; a non-finite number is the string "NaN", "Infinity" or "-Infinity" (docs/configuration.md, "Machine-readable
output"), so a NaN loss stays visible and a browser's JSON.parse reads the document."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor import strictjson
from tests.conftest import ROOT


def strict_loads(text: str) -> Any:
    """A parser as strict as JSON.parse: the bare tokens Python accepts are an error."""
    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token!r}")

    return json.loads(text, parse_constant=refuse)


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=str(cwd), capture_output=True,
                          text=True, timeout=120)


def test_the_helper_spells_every_non_finite_number_and_reads_it_back() -> None:
    class Odd:
        pass

    doc = {"loss": math.nan, "gn": [math.inf, -math.inf, 1.5], "t": (2, math.nan), math.inf: "key",
           "obj": Odd()}
    text = strictjson.dumps(doc, default=lambda o: {"as": math.nan})
    back = strict_loads(text)
    assert back == {"loss": "NaN", "gn": ["Infinity", "-Infinity", 1.5], "t": [2, "NaN"], "Infinity": "key",
                    "obj": {"as": "NaN"}}
    assert math.isnan(strictjson.number(back["loss"])) and strictjson.number(back["gn"][1]) == -math.inf
    assert strictjson.number("loss") == "loss" and strictjson.number(3) == 3
    # Files written before the rule (bare NaN) still read: json.loads accepts them.
    assert math.isnan(strictjson.number(json.loads('{"v": NaN}')["v"]))
    with pytest.raises(ValueError):
        strict_loads('{"v": NaN}')


def test_a_nan_run_gives_strict_history_and_status_json_with_the_nan_visible(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    job = ("for i in range(1, 6): print(f'step {i} loss {2.0 / i if i < 4 else float(\"nan\")}', flush=True)\n"
           "import time; time.sleep(30)")
    cp = cli("wrap", "--state-dir", str(sd), "--set", "on.nan.action=give_up", "--", sys.executable, "-c", job,
             cwd=tmp_path)
    assert cp.returncode == 3, cp.stderr
    hist = cli("history", "--json", "--state-dir", str(sd))
    assert hist.returncode == 0, hist.stderr
    doc = strict_loads(hist.stdout)  # raises on a bare NaN
    (attempt,) = doc["attempts"]
    assert attempt["cause"] == "nan"
    assert attempt["detection"]["value"] == "NaN", attempt["detection"]
    status = cli("status", "--json", "--state-dir", str(sd))
    assert status.returncode == 3, status.stderr
    assert strict_loads(status.stdout)["state"] == "gave_up"


def test_a_manifest_with_a_nan_metric_is_strict_json_and_reads_back_as_nan(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from supervisor.checkpoints.manifest import manifest_path, read_manifest
    from supervisor.client import save_checkpoint

    ckdir = tmp_path / "ckpt"
    ckdir.mkdir()
    path = save_checkpoint({"w": torch.zeros(2)}, ckdir / "step-7.pt", step=7,
                           metrics={"val_loss": math.nan, "grad_norm": math.inf})
    raw = strict_loads(manifest_path(Path(path)).read_text())
    assert raw["metrics"]["val_loss"] == {"value": "NaN", "step": 7}
    assert raw["metrics"]["grad_norm"]["value"] == "Infinity"
    got = read_manifest(Path(path))
    assert got.manifest is not None, got
    assert math.isnan(got.manifest.metrics["val_loss"]["value"])
    assert got.manifest.metrics["grad_norm"]["value"] == math.inf
    old = time.time() - 600  # settled: a file written this second is listed as still being written
    for f in (Path(path), manifest_path(Path(path))):
        os.utime(f, (old, old))
    listing = cli("checkpoints", "--json", "--checkpoint-dir", str(ckdir), "--state-dir", str(tmp_path / "sd"))
    assert listing.returncode == 0, listing.stderr
    (row,) = strict_loads(listing.stdout)
    assert row["val_metric"] == {"name": "val_loss", "value": "NaN", "step": 7}, row


def test_the_daemon_s_json_log_lines_are_strict() -> None:
    import io

    import structlog

    from supervisor import logsetup

    buf = io.StringIO()
    try:
        logsetup.configure("json", stream=buf)
        structlog.get_logger("supervisor.test").info("loss_seen", loss=math.nan, gn=[math.inf])
    finally:
        logsetup.configure("logfmt", stream=io.StringIO())
    rec = strict_loads(buf.getvalue().strip().splitlines()[-1])
    assert (rec["event"], rec["loss"], rec["gn"]) == ("loss_seen", "NaN", ["Infinity"])
