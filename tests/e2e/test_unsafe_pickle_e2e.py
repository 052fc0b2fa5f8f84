"""Issue 24 build 3 through the real daemon: with verify = "overlap" (the default) a newest
checkpoint whose pickle references os.system is never handed to the job; the next older one is."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.checkpoints.test_picklescan import _malicious
from tests.conftest import history
from tests.helpers.ckpt_factory import old_mtime, torch_file

PY = sys.executable
# Writes where it resumed from and its argv, then exits 0.
RECORD = ("import os, sys, json; open(sys.argv[1], 'w').write(json.dumps("
          "[os.environ.get('TSUP_RESUME_FROM', ''), sys.argv]))")


@pytest.mark.parametrize("fmt", ["zip_protocol2", "legacy_protocol1"])
def test_an_unsafe_newest_checkpoint_is_never_named_to_the_job(daemons, tmp_path: Path, fmt: str) -> None:
    """legacy_protocol1 (issue 34 part 5): torch.save(pickle_protocol=1, legacy format) starts
    with no PROTO opcode (no \\x80); the scan once passed any such file unread."""
    import json

    sd, ck, out, marker = tmp_path / "sd", tmp_path / "ck", tmp_path / "resumed", tmp_path / "ran"
    torch_file(ck / "step_10.pt", 10)
    legacy = fmt == "legacy_protocol1"
    old_mtime(_malicious(ck / "step_20.pt", marker, zip_format=not legacy, protocol=1 if legacy else 2))
    assert legacy == (not (ck / "step_20.pt").read_bytes().startswith((b"PK", b"\x80")))
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--checkpoint-dir", str(ck), "--"]
                + [PY, "-c", RECORD, str(out)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    frm, argv = json.loads(out.read_text())
    assert Path(frm).name == "step_10.pt" and not any("step_20" in a for a in argv), (frm, argv)
    h = history(sd)
    assert [Path(a["checkpoint"]).name for a in h["attempts"]] == ["step_10.pt"]
    refused = [e for e in h["events"] if e["event"] == "checkpoint_refused_unsafe_pickle"]
    assert refused and "posix.system" in refused[0]["message"] and "allowlist" in refused[0]["message"], h["events"]
    assert not marker.exists(), "the malicious pickle was never loaded"
    kept = (ck / "step_20.pt").exists() or (ck / "quarantine" / "step_20.pt").exists()
    assert kept, "never deleted"


@pytest.mark.slow
def test_a_dcp_save_whose_byte_item_runs_code_is_never_named_to_the_job(daemons, tmp_path: Path) -> None:
    """Issue 34: a torch.distributed.checkpoint save whose non-tensor (BytesIO) item pickles an
    os.system reduce (DCP's reader torch.loads it with weights_only=False on resume) passed the
    load test, which reads only the metadata's byte ranges: the daemon took it, under the overlap
    hand-over and the full gate alike. Now the job resumes from the older clean save."""
    import json

    from tests.checkpoints.test_dcp_byte_items import _save

    sd, ck, out, marker = tmp_path / "sd", tmp_path / "ck", tmp_path / "resumed", tmp_path / "ran"
    _save(ck / "step-10", marker, bad=False)
    _save(ck / "step-20", marker, bad=True)
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--checkpoint-dir", str(ck), "--"]
                + [PY, "-c", RECORD, str(out)])
    assert d.wait(180) == 0, d.stderr()[-3000:]
    frm, argv = json.loads(out.read_text())
    assert Path(frm).name == "step-10" and not any("step-20" in a for a in argv), (frm, argv)
    h = history(sd)
    assert [Path(a["checkpoint"]).name for a in h["attempts"]] == ["step-10"]
    refused = [e for e in h["events"] if e["event"] == "checkpoint_refused_unsafe_pickle"]
    assert refused and "[optim.evil]" in refused[0]["message"] and "posix.system" in refused[0]["message"], h["events"]
    assert not marker.exists(), "the payload never ran"
    assert (ck / "step-20" / "__0_0.distcp").exists(), "never deleted"


@pytest.mark.slow
def test_a_zip_polyglot_newest_checkpoint_is_never_named_to_the_job(daemons, tmp_path: Path) -> None:
    """Issue 34 D1: two torch zips of one length glued together; zipfile (the scan) read the
    second (harmless), torch's reader loads the first (an os.system payload), so under verify =
    "overlap" the job ran it. Now the scan refuses the archive, the job resumes from step_10."""
    import json

    from tests.checkpoints.test_zip_polyglot import _pair

    sd, ck, out, marker = tmp_path / "sd", tmp_path / "ck", tmp_path / "resumed", tmp_path / "ran"
    torch_file(ck / "step_10.pt", 10)
    a, b = _pair(marker)
    (ck / "step_20.pt").write_bytes(a + b)
    old_mtime(ck / "step_20.pt")
    # The job loads as a careless one would (weights_only=False): the payload would run.
    job = ("import os, sys, json, torch; frm = os.environ.get('TSUP_RESUME_FROM', ''); "
           "frm and torch.load(frm, weights_only=False); " + RECORD.split("; ", 1)[1])
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--checkpoint-dir", str(ck), "--"]
                + [PY, "-c", job, str(out)])
    assert d.wait(120) == 0, d.stderr()[-3000:]
    frm, argv = json.loads(out.read_text())
    assert Path(frm).name == "step_10.pt" and not any("step_20" in a for a in argv), (frm, argv)
    h = history(sd)
    assert [Path(a["checkpoint"]).name for a in h["attempts"]] == ["step_10.pt"]
    refused = [e for e in h["events"] if e["event"] == "checkpoint_refused_unsafe_pickle"]
    assert refused and "data before its archive" in refused[0]["message"], h["events"]
    assert not marker.exists(), "the payload never ran"
    assert (ck / "step_20.pt").exists() or (ck / "quarantine" / "step_20.pt").exists(), "never deleted"
