"""A link to a folder inside a checkpoint folder (issue 34, "never harm the run", an adversarial
round): ``checkpoint-100/global_step100 -> /elsewhere/global_step100`` holding an ``os.system``
pickle was called ready (layout hf, load test passed, no word of the link): every walker lists a
link to a folder without going into it, and DeepSpeed's resume loads ``global_stepN/*.pt`` with
``weights_only=False``. Now a link out of the checkpoint's folder (outside the checkpoint dir, to
a checkpoint beside it, dangling, a loop of links) refuses it: not ready, never chosen, never moved
or deleted, the reason naming the link, its target and what to do; a link that stays inside the
folder is not followed, its target walked where it is. Real files, real service, real CLI."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.folderlinks import folder_link_out
from supervisor.checkpoints.hashing import tree_files
from supervisor.checkpoints.manifest import stat_record
from supervisor.checkpoints.picklescan import unsafe_pickle
from supervisor.checkpoints.resumechoice import choose
from supervisor.checkpoints.scancache import cached_refusal
from supervisor.checkpoints.service import CheckpointService
from supervisor.checkpoints.structure import structure_problem
from tests.conftest import ROOT
from tests.helpers import ckpt_factory as F


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def _payload_folder(folder: Path, marker: Path) -> Path:
    """A DeepSpeed ``global_stepN/`` whose model states are a protocol-2 pickle calling os.system."""
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    return folder


def _checkpoint(ck: Path, step: int = 100) -> Path:
    """The adversarial round's checkpoint: a clean HF-looking folder with DeepSpeed's ``latest``."""
    d = ck / f"checkpoint-{step}"
    d.mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, d / "pytorch_model.bin")
    (d / "latest").write_text(f"global_step{step}")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def _settled(*paths: Path) -> None:
    for p in paths:
        F.old_mtime(p)


def _svc(tmp_path: Path, **cfg: object) -> CheckpointService:
    (tmp_path / "state").mkdir(exist_ok=True)
    return CheckpointService(CheckpointsConfig(settle_s=0.0, **cfg), tmp_path / "ck", tmp_path / "state",  # type: ignore[arg-type]
                             sys.executable, ["python", "train.py"], tmp_path)


@pytest.fixture
def linked_out(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(the good older checkpoint, the linked one, the link's outside target, the payload's marker)."""
    ck, marker = tmp_path / "ck", tmp_path / "RAN"
    good = F.hf_folder(ck, 50)
    bad = _checkpoint(ck)
    target = _payload_folder(tmp_path / "elsewhere" / "global_step100", marker)
    (bad / "global_step100").symlink_to(target, target_is_directory=True)
    _settled(bad)
    return good, bad, target, marker


def test_a_folder_link_out_with_a_payload_is_refused_naming_link_and_target(linked_out: tuple[Path, ...]) -> None:
    _, bad, target, marker = linked_out
    why = unsafe_pickle(bad)
    assert why is not None and why.startswith("global_step100: a link to a folder outside the checkpoint"), why
    assert str(target) in why and "not handed to the job" in why and "replace the link" in why, why
    assert folder_link_out(bad) == why
    refusal = cached_refusal(bad)
    assert refusal is not None and refusal.file == "global_step100" and not refusal.transient, refusal
    assert not marker.exists()


@pytest.mark.parametrize("cfg", [{}, {"trust_pickles": True}, {"load_test": False}, {"follow_symlinks_out": True}])
def test_the_linked_checkpoint_is_never_ready_chosen_moved_or_load_tested(
        tmp_path: Path, linked_out: tuple[Path, ...], cfg: dict[str, object]) -> None:
    good, bad, target, marker = linked_out
    svc = _svc(tmp_path, **cfg)
    rows = {r.path: r for r in svc.quicklist()}
    row = rows[bad]
    assert not row.ready and row.complete and row.load_test is None, row  # complete: never quarantined
    assert "global_step100" in row.reasons[0] and str(target) in row.reasons[0], row.reasons
    assert rows[good].ready, rows[good].reasons
    assert svc.load_tests.cached(bad) is None, "nothing reached through the link is load-tested"
    lt = svc.load_tests.run(bad, "hf", finite=True)  # asked for directly (the daemon's end-of-run check)
    assert not lt.passed and not lt.untested and "outside the checkpoint" in (lt.error or ""), lt
    for overlap in (True, False):
        for action in ("restart", "rollback"):
            outcome = choose(svc, action, None, overlap=overlap)
            assert outcome.choice is not None and outcome.choice.path == good, (action, overlap, outcome)
            assert not outcome.quarantined, outcome.quarantined
    problems, _, verified = svc.structural(next(c for c in svc.scan() if c.path == bad))
    assert problems and "outside the checkpoint" in problems[0] and not verified, problems
    assert (bad / "global_step100").is_symlink() and (target / "mp_rank_00_model_states.pt").exists()
    assert not (tmp_path / "ck" / "quarantine").exists() and not marker.exists()


def test_no_walker_goes_through_the_link(linked_out: tuple[Path, ...]) -> None:
    """Every walker lists the link without going into it: the refusal above is what keeps the job
    from loading what none of them read (a truncated safetensors file there is not seen either)."""
    _, bad, target, _ = linked_out
    (target / "model.safetensors").write_bytes(b"\xff" * 8)
    assert structure_problem(bad) is None
    assert all("global_step100" not in p.relative_to(bad).parts for p in tree_files(bad))
    assert stat_record(bad)["files"] == 3  # pytorch_model.bin, latest, trainer_state.json


def test_a_link_to_a_checkpoint_beside_it_is_refused(tmp_path: Path) -> None:
    """Inside the checkpoint dir but outside this checkpoint: the other one is rotated away or
    quarantined on its own verdict, so this one is refused the same way."""
    ck, marker = tmp_path / "ck", tmp_path / "RAN"
    other = _payload_folder(ck / "global_step90", marker)
    bad = _checkpoint(ck)
    (bad / "global_step100").symlink_to("../global_step90")
    _settled(other, bad)
    why = unsafe_pickle(bad)
    assert why is not None and "outside the checkpoint" in why and str(other) in why, why
    assert not _svc(tmp_path).evaluate(next(c for c in _svc(tmp_path).scan() if c.path == bad)).ready


def test_a_dangling_link_out_is_refused_before_its_target_appears(tmp_path: Path) -> None:
    bad = _checkpoint(tmp_path / "ck")
    (bad / "global_step100").symlink_to(tmp_path / "later" / "global_step100")
    why = unsafe_pickle(bad)
    assert why is not None and "nothing that exists now" in why and str(tmp_path / "later") in why, why


def test_a_loop_of_links_is_refused_and_costs_nothing(tmp_path: Path) -> None:
    bad = _checkpoint(tmp_path / "ck")
    (bad / "a").symlink_to("b")
    (bad / "b").symlink_to("a")
    why = unsafe_pickle(bad)
    assert why is not None and why.startswith("a: a link that cannot be resolved"), why
    assert folder_link_out(bad) == why


def test_a_link_inside_the_folder_is_not_followed_its_target_scanned_where_it_is(tmp_path: Path) -> None:
    ck, marker = tmp_path / "ck", tmp_path / "RAN"
    d = _checkpoint(ck)
    (d / "sub" / "deeper").mkdir(parents=True)
    (d / "sub" / "deeper" / "up").symlink_to("../..")  # a loop back to the checkpoint: not walked again
    (d / "sub" / "self").symlink_to(".")
    (d / "alias").symlink_to("sub")
    _settled(d)
    assert unsafe_pickle(d) is None and folder_link_out(d) is None
    svc = _svc(tmp_path)
    row = svc.evaluate(svc.scan()[0])
    assert row.ready, row.reasons
    # The same link, its target now holding a payload: refused for the payload at its real place.
    _payload_folder(d / "sub" / "global_step100", marker)
    why = unsafe_pickle(d)
    assert why is not None and why.startswith("sub/global_step100/mp_rank_00_model_states.pt"), why
    assert "system" in why and folder_link_out(d) is None
    assert not marker.exists()


def test_a_file_link_out_is_still_read_as_the_file_it_names(tmp_path: Path) -> None:
    ck, marker = tmp_path / "ck", tmp_path / "RAN"
    d = _checkpoint(ck)
    outside = tmp_path / "elsewhere"
    clean = F.torch_file(outside / "clean.pt", 1)
    (outside / "evil.pt").write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    (d / "extra.pt").symlink_to(clean)
    assert unsafe_pickle(d) is None and folder_link_out(d) is None
    (d / "extra.pt").unlink()
    (d / "extra.pt").symlink_to(outside / "evil.pt")
    why = unsafe_pickle(d)
    assert why is not None and why.startswith("extra.pt") and "system" in why, why


def test_the_checkpoints_verb_says_the_linked_checkpoint_is_not_ready(tmp_path: Path,
                                                                     linked_out: tuple[Path, ...]) -> None:
    """The adversarial round's repro through the real CLI: no longer "ready": true."""
    good, bad, target, marker = linked_out
    sd = tmp_path / "sd"
    sd.mkdir()
    cp = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "--checkpoint-dir", str(good.parent),
                         "--state-dir", str(sd), "--json"], cwd=str(ROOT), capture_output=True, text=True,
                        timeout=300)
    assert cp.returncode == 0, cp.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(cp.stdout)}
    row = rows[bad.name]
    assert row["ready"] is False and row["load_test"] is None, row
    assert row["reasons"][0].startswith("global_step100: a link to a folder outside the checkpoint"), row
    assert str(target) in row["reasons"][0], row
    assert rows[good.name]["ready"] is True, rows[good.name]
    assert bad.exists() and not marker.exists()


# Resumes as DeepSpeed does (global_stepN/*.pt named by `latest`, weights_only=False), then records
# where it resumed from and exits 0.
DEEPSPEED_LIKE_JOB = """
import glob, json, os, sys, torch
frm = os.environ.get("TSUP_RESUME_FROM", "")
latest = os.path.join(frm, "latest")
if frm and os.path.isfile(latest):
    for f in glob.glob(os.path.join(frm, open(latest).read().strip(), "*.pt")):
        torch.load(f, weights_only=False)
open(sys.argv[1], "w").write(json.dumps([frm, sys.argv]))
"""


def test_the_real_daemon_resumes_from_the_older_checkpoint(daemons, tmp_path: Path,
                                                           linked_out: tuple[Path, ...]) -> None:
    from tests.conftest import history

    good, bad, target, marker = linked_out
    sd, out = tmp_path / "sd", tmp_path / "resumed"
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--checkpoint-dir", str(good.parent), "--",
                 sys.executable, "-c", DEEPSPEED_LIKE_JOB, str(out)])
    assert d.wait(120) == 0, d.stderr()[-3000:]
    frm, argv = json.loads(out.read_text())
    assert Path(frm) == good and not any(bad.name in a for a in argv), (frm, argv)
    assert [Path(a["checkpoint"]).name for a in history(sd)["attempts"]] == [good.name]
    assert not marker.exists(), "the payload behind the link never ran"
    assert (bad / "global_step100").is_symlink() and (target / "mp_rank_00_model_states.pt").exists()
    assert not (good.parent / "quarantine").exists(), "never moved"
    # The end-of-run check never says the newest (linked) checkpoint's tensors were all checked.
    assert "every tensor of the newest checkpoint" not in d.stderr(), d.stderr()[-3000:]
    assert "outside the checkpoint" in d.stderr()
