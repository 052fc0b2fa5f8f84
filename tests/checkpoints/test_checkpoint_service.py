"""The pre-resume gate end to end on real files: quarantine, rollback, bad marks, last_good, CLI."""
from __future__ import annotations

import dataclasses

import io
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.manifest import manifest_path
from supervisor.checkpoints.inprogress import in_progress
from supervisor.checkpoints.service import CheckpointService
from supervisor.cli.verbs import checkpoints_verb
from supervisor.client._checkpoint import save_checkpoint
from tests.helpers import ckpt_factory as F

CFG = CheckpointsConfig(settle_s=1.0, expected_keys=("model", "optimizer"))
NO_LOAD = replace(CFG, load_test=False)  # where the load test is not the subject: each one costs ~2 s


def make(tmp_path: Path, cfg: CheckpointsConfig = CFG) -> CheckpointService:
    (tmp_path / "state").mkdir(exist_ok=True)
    return CheckpointService(cfg, tmp_path / "ck", tmp_path / "state", sys.executable, ["python", "train.py"], tmp_path)


def saved(tmp_path: Path, step: int) -> Path:
    p = save_checkpoint(F.state(step), tmp_path / "ck" / f"step_{step}.pt", step=step)
    F.old_mtime(p)
    return p


def test_corrupt_newest_is_quarantined_and_the_previous_one_chosen(tmp_path: Path) -> None:
    saved(tmp_path, 100)
    newest = saved(tmp_path, 200)
    F.flip_byte(newest)
    files_before = F.count_files(tmp_path / "ck")
    choice = make(tmp_path, NO_LOAD).choose_for_resume("restart", None)
    assert choice is not None and choice.step == 100 and choice.path.name == "step_100.pt"
    assert [q.source.name for q in choice.quarantined] == ["step_200.pt"]
    q = tmp_path / "ck" / "quarantine"
    assert (q / "step_200.pt").exists() and (q / "step_200.pt.manifest.json").exists()
    note = json.loads((q / "step_200.pt.quarantine.json").read_text())
    assert "sha256 mismatch" in note["reason"] and note["at"] and "transformer-supervisor" in note["by"]
    # Nothing deleted: every file is still there (plus the note).
    assert F.count_files(tmp_path / "ck") == files_before + 1
    assert not newest.exists()
    assert [c.step for c in make(tmp_path, NO_LOAD).scan()] == [100], "quarantine/ is not a candidate"


def test_rollback_picks_the_checkpoint_before_the_onset(tmp_path: Path) -> None:
    for s in (500, 1000, 1500):
        saved(tmp_path, s)
    svc = make(tmp_path, replace(NO_LOAD, margin_steps=100))
    c = svc.choose_for_resume("rollback", onset_step=1050)
    assert c is not None and c.step == 500, c
    c2 = make(tmp_path, NO_LOAD).choose_for_resume("rollback", onset_step=1050)
    assert c2 is not None and c2.step == 1000
    assert make(tmp_path, NO_LOAD).choose_for_resume("rollback", onset_step=400) is None


def test_load_error_at_resume_marks_bad_then_the_next_older_is_used(tmp_path: Path) -> None:
    saved(tmp_path, 100)
    p200 = saved(tmp_path, 200)
    svc = make(tmp_path, NO_LOAD)
    first = svc.choose_for_resume("restart", None)
    assert first is not None and first.path == p200
    # The job could not load it (e.g. mismatched keys): one cycle, then it is bad.
    assert svc.note_attempt_result(first.path, "checkpoint_load_error", newer_checkpoint_appeared=False)
    assert svc.is_bad(p200)
    second = make(tmp_path, NO_LOAD).choose_for_resume("restart", None)  # a new service: the mark persisted
    assert second is not None and second.step == 100
    assert (tmp_path / "ck" / "quarantine" / "step_200.pt").exists()


def test_no_progress_counts_attempts(tmp_path: Path) -> None:
    svc = make(tmp_path, replace(CFG, no_progress_attempts=2))
    svc.note_attempt_result("/ck/a.pt", "crash", False, step=5)
    assert not svc.no_progress()
    svc.note_attempt_result("/ck/a.pt", "hang", False, step=5)
    assert svc.no_progress() and svc.steps_seen() == [5, 5] and svc.attempts_without_progress() == 2


def test_nanogpt_single_file_preserved_then_restored_after_a_bad_overwrite(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    p = F.nanogpt(ck, 1000)
    svc = make(tmp_path)
    c = svc.choose_for_resume("restart", None)
    assert c is not None and c.path == p and c.step == 1000
    lg = ck / "last_good" / "ckpt.pt"
    assert lg.exists() and manifest_path(lg).exists()
    # The job overwrites ckpt.pt with garbage, then dies.
    p.write_bytes(b"\x00garbage" * 10)
    F.old_mtime(p)
    c2 = make(tmp_path).choose_for_resume("restart", None)
    assert c2 is not None and c2.path == p and c2.step == 1000 and "last_good" in c2.reason
    assert torch.load(p, weights_only=True)["iter_num"] == 1000
    assert (ck / "quarantine" / "ckpt.pt").read_bytes().startswith(b"\x00garbage")


def test_a_save_after_the_load_test_is_not_kept_as_the_last_good_copy(tmp_path: Path) -> None:
    """The background verifier tests version 1000 of a nanoGPT ckpt.pt; the job then saves
    again and is caught mid-save (a truncated file) before the copy is made. The last good copy
    must stay the verified one (measured in the recovery bench: a copy of the truncated file
    was kept, then both were quarantined and the run went back to iteration 0)."""
    ck = tmp_path / "ck"
    p = F.nanogpt(ck, 1000)
    F.old_mtime(p)
    svc = make(tmp_path)
    svc.set_writer_active(True)
    row = svc.verify_newest()
    lg = ck / "last_good" / "ckpt.pt"
    assert row is not None and row.ready and lg.exists()
    assert torch.load(lg, weights_only=True)["iter_num"] == 1000
    F.nanogpt(ck, 1250)
    assert svc.load_tests.run(p, "single").passed  # the background test of version 1250
    whole = p.read_bytes()
    p.write_bytes(whole[: len(whole) // 3])  # the save at 1500, cut short by the kill
    assert svc._keep_last_good(p) is None
    assert torch.load(lg, weights_only=True)["iter_num"] == 1000
    c = make(tmp_path).choose_for_resume("restart", None)
    assert c is not None and c.step == 1000 and "last_good" in c.reason


def test_a_version_overwritten_during_its_load_test_is_still_kept(tmp_path: Path) -> None:
    """The job saves again while the background verifier load-tests ckpt.pt (here: the job's
    python touches the file as the test ends). Snapshot first (issue 24): the version tested is a
    capture in last_good/, so it is kept once it passes; the file now on disk is another version,
    so no manifest is written for it, nothing is quarantined, and the next tick verifies it."""
    ck = tmp_path / "ck"
    p = F.nanogpt(ck, 1000)
    python = tmp_path / "python-then-the-job-saves"
    python.write_text(f'#!/bin/sh\n{sys.executable} "$@"\nrc=$?\ntouch {p}\nexit $rc\n')
    python.chmod(0o755)
    (tmp_path / "state").mkdir()
    # A process per test (the stand-in touches the file as its process ends; a warm one never ends).
    cold = dataclasses.replace(CFG, warm_verifier=False)
    svc = CheckpointService(cold, ck, tmp_path / "state", str(python), ["python", "train.py"], tmp_path)
    assert svc.verify_newest() is None  # the live file holds a version not tested yet
    assert not manifest_path(p).exists()
    lg = ck / "last_good" / "ckpt.pt"
    assert torch.load(lg, weights_only=True)["iter_num"] == 1000 and not (ck / "quarantine").exists()
    assert [x.name for x in (ck / "last_good").iterdir() if x.name.startswith(".")] == []  # no temp left


def test_newest_complete_and_megatron_in_progress(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    F.megatron_folder(ck, 1000)
    F.megatron_folder(ck, 2000, tracker=False)  # tracker still names 1000: 2000 is being saved
    svc = make(tmp_path, NO_LOAD)
    n = svc.newest_complete()
    assert n is not None and n.step == 1000
    [writing] = in_progress(ck)
    assert writing.path.name == "iter_0002000" and "names iteration 1000" in writing.reason


def test_cli_json_and_table(tmp_path: Path) -> None:
    saved(tmp_path, 100)
    F.torch_file(tmp_path / "ck" / "step_200.pt", 200)  # no manifest: the CLI writes none
    out = io.StringIO()
    assert checkpoints_verb(tmp_path / "ck", NO_LOAD, True, tmp_path / "state", out=out, err=io.StringIO()) == 0
    rows = json.loads(out.getvalue())
    assert [r["step"] for r in rows] == [200, 100] and all(r["ready"] for r in rows)
    assert rows[0]["sha256_ok"] is None and not manifest_path(tmp_path / "ck" / "step_200.pt").exists()
    out2 = io.StringIO()
    assert checkpoints_verb(tmp_path / "ck", NO_LOAD, False, tmp_path / "state", out=out2, err=io.StringIO()) == 0
    assert "step_100.pt" in out2.getvalue() and "ready" in out2.getvalue()
    assert checkpoints_verb(tmp_path / "nope", CFG, True, tmp_path / "state", out=io.StringIO(), err=io.StringIO()) == 2


def test_a_single_overwritten_file_never_reports_the_step_of_an_earlier_version(tmp_path: Path) -> None:
    # No manifest written (write_manifests off): the step comes from the load test, and only for the
    # version that was tested; after the job overwrites ckpt.pt the old iter_num is not reused.
    ck = tmp_path / "ck"
    p = F.nanogpt(ck, 150)
    svc = make(tmp_path)
    svc.write_manifests = False
    assert svc.evaluate(svc.scan()[0]).step == 150
    assert svc.scan()[0].step == 150
    F.nanogpt(ck, 350)
    F.old_mtime(p)
    svc.scan()  # changed since the previous scan: not settled yet
    [c] = svc.scan()
    assert c.step != 150  # unknown until tested, never the stale 150
    assert svc.evaluate(c).step == 350 and svc.scan()[0].step == 350


def test_each_verified_version_of_a_single_file_is_kept_at_once_linked_when_the_job_renames(tmp_path: Path) -> None:
    import os

    ck = tmp_path / "ck"
    p = F.nanogpt(ck, 150)
    svc = make(tmp_path)
    lg = ck / "last_good" / "ckpt.pt"
    first = svc.verify_newest()
    assert first is not None and first.ready and lg.exists()  # kept by the background verifier, not at restart
    assert torch.load(lg, weights_only=True)["iter_num"] == 150
    assert os.stat(lg).st_ino != os.stat(p).st_ino  # first version: how the job saves is unknown, so a copy
    # The job saves by rename (a new inode): the next verified version is hard-linked, no extra disk.
    os.replace(F.nanogpt(tmp_path / "elsewhere", 350), p)
    F.old_mtime(p)
    svc.scan()
    second = svc.verify_newest()
    assert second is not None and second.ready
    assert os.stat(lg).st_ino == os.stat(p).st_ino and torch.load(lg, weights_only=True)["iter_num"] == 350


def test_a_restart_choice_does_not_wait_for_a_background_load_test(tmp_path: Path) -> None:
    # The job's Python (used for load tests) holds every load test until the test releases it:
    # had the background verification kept the service's lock through its load test, the
    # restart's choice would wait for the release and never come back before it.
    import threading

    from tests.util import wait_for

    started, release = tmp_path / "load-test-started", tmp_path / "release"
    held = tmp_path / "held-python"
    held.write_text(f"#!/bin/sh\ntouch {started}\nn=0\nwhile [ ! -e {release} ] && [ $n -lt 3000 ]; do sleep 0.02; "
                    f"n=$((n+1)); done\nexec {sys.executable} \"$@\"\n")
    held.chmod(0o755)
    saved(tmp_path, 100)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    svc = CheckpointService(CFG, tmp_path / "ck", state, str(held), ("python", "train.py"), tmp_path)
    rows: list[object] = []
    bg = threading.Thread(target=lambda: rows.append(svc.verify_newest()))
    bg.start()
    try:
        wait_for(started.exists, timeout=10, what="the background load test")
        choices: list[object] = []
        fg = threading.Thread(target=lambda: choices.append(svc.choose_for_resume("restart", None, overlap=True)))
        fg.start()
        wait_for(lambda: bool(choices), timeout=10, what="the restart's choice, while the load test is held")
        choice = choices[0]
        assert choice is not None and choice.step == 100 and choice.verify_pending  # type: ignore[attr-defined]
    finally:
        release.touch()
        bg.join(timeout=60)
    assert rows and rows[0] is not None and rows[0].ready, rows  # type: ignore[attr-defined]


class _Payload:
    def __reduce__(self):
        import os
        return (os.system, ("true",))


def test_a_single_file_the_scan_refuses_is_never_kept_as_the_last_good_copy(tmp_path: Path) -> None:
    """A torch zip whose weights load with weights_only=True (its load test passes) but which
    carries a second pickle that runs code: refused, and no copy of it lands in last_good/ (where
    it read as a verified version)."""
    import pickle
    import zipfile

    ck = tmp_path / "ck"
    p = F.nanogpt(ck, 1000)
    with zipfile.ZipFile(p, "a") as z:
        prefix = z.namelist()[0].split("/", 1)[0]
        z.writestr(f"{prefix}/extra.pkl", pickle.dumps(_Payload(), protocol=2))
    F.old_mtime(p)
    assert torch.load(p, weights_only=True)["iter_num"] == 1000  # what the load test sees
    svc = make(tmp_path)
    svc.verify_newest()  # the daemon's verification of a new save: where last_good/ is kept
    assert not (ck / "last_good" / "ckpt.pt").exists()
    assert any("pickle scan refused" in why for _path, why in svc.take_not_kept()), "the refusal is said"
    c = svc.choose_for_resume("restart", None)
    assert c is None or c.path != p, c
