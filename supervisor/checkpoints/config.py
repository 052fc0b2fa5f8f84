"""Config section [checkpoints]: where checkpoints live and what makes one ready to resume from."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..fieldmeta import meta


def _valid_regex(value: object) -> str | None:
    if value is None:
        return None
    try:
        pattern = re.compile(str(value))
    except re.error as exc:
        return f"expected a regular expression, got an invalid one ({exc})"
    if pattern.groups < 1:
        return "expected a regular expression with a group (or (?P<step>...)) that captures the step"
    return None


@dataclass(frozen=True)
class CheckpointsConfig:
    dir: str | None = field(default=None, metadata=meta(
        "directory the job writes its checkpoints to"))
    # Discovery
    glob: str | None = field(default=None, metadata=meta(
        "extra glob (relative to dir) for a layout discovery does not know, e.g. 'run-*/weights.bin'"))
    step_regex: str | None = field(default=None, metadata=meta(
        "regex with one group (or (?P<step>...)) reading the step from a name matched by glob",
        check=_valid_regex))
    settle_s: float = field(default=2.0, metadata=meta(
        "a checkpoint whose size/mtime changed within this many seconds is still being written", min=0))
    follow_symlinks_out: bool = field(default=False, metadata=meta(
        "follow a symlink in dir that leads outside it (off: such an entry is not a checkpoint, so nothing "
        "outside dir is hashed, load-tested, moved or handed to the job)"))
    # Manifests and integrity
    write_manifests: bool = field(default=True, metadata=meta(
        "write a manifest (origin=supervisor) beside checkpoints that come without one"))
    hash_algorithm: str = field(default="sha256", metadata=meta(
        "digest for integrity checks of supervisor manifests; blake3 needs the blake3 package",
        choices=("sha256", "blake3")))
    # Load test
    load_test: bool = field(default=True, metadata=meta(
        "load each candidate in a subprocess with the job's Python before resuming from it"))
    verify_in_background: bool = field(default=True, metadata=meta(
        "verify each new checkpoint (hash, load test) while the job runs, so a restart finds it "
        "already verified and a bad one is reported when it is written, not when it is needed"))
    verify: str = field(default="overlap", metadata=meta(
        "when a restart's checkpoint is load-tested: 'before-launch' (the job waits for it) or 'overlap' (the "
        "cheap structural checks first, then the load test beside the job's start-up; should it fail, the job "
        "is stopped and relaunched from an older verified checkpoint). A rollback always verifies first",
        choices=("before-launch", "overlap")))
    python: str | None = field(default=None, metadata=meta(
        "python for the load test; default: the job command's python, else the supervisor's"))
    load_timeout_s: float = field(default=300.0, metadata=meta(
        "seconds a load test may take before it counts as failed", min=0, min_exclusive=True))
    warm_verifier: bool = field(default=True, metadata=meta(
        "load tests run on one long-lived process of the job's Python (torch imported once; closed "
        "after 5 idle minutes; a busy or failed one falls back to a process per test)"))
    mmap: bool = field(default=True, metadata=meta(
        "torch.load(mmap=True) in the load test (falls back without it for old formats)"))
    expected_keys: tuple[str, ...] = field(default=(), metadata=meta(
        "top-level keys a checkpoint must hold, e.g. ['model', 'optimizer']"))
    check_finite: bool = field(default=False, metadata=meta(
        "the load test also checks that every tensor is finite (reads every byte)"))
    check_at_end: bool = field(default=True, metadata=meta(
        "when the job exits 0, load-test the newest checkpoint with the finite check before the run is "
        "called finished (non-finite weights: exit 3); the exit waits for it, up to load_timeout_s; false "
        "skips it (the end then says the weights were not checked)"))
    trust_pickles: bool = field(default=False, metadata=meta(
        "accept checkpoints that only load with weights_only=False (this runs pickled code)"))
    # Config match and validation metric
    job_config_file: str | None = field(default=None, metadata=meta(
        "the job's config file (JSON, TOML; YAML with PyYAML) compared with the manifest snapshot"))
    config_allow_diff: tuple[str, ...] = field(
        default=("resume", "resume_from", "resume_from_checkpoint", "init_from"), metadata=meta(
            "config keys (dotted, glob patterns allowed) that may differ from the snapshot"))
    val_metric: str = field(default="val_loss", metadata=meta(
        "name of the validation metric recorded for each checkpoint"))
    require_val_metric: bool = field(default=False, metadata=meta(
        "a checkpoint without a recorded validation metric is not ready"))
    # Selection, bad marks, quarantine
    prefer: str = field(default="newest", metadata=meta(
        "which checkpoint a rollback takes among the ready ones before the onset: 'newest', or "
        "'best_val' (skip one whose recorded val_metric is worse than an older one's by more than "
        "prefer_tolerance: a newer checkpoint is not always a better one)", choices=("newest", "best_val")))
    prefer_tolerance: float = field(default=0.02, metadata=meta(
        "with prefer = 'best_val': how much worse (relative, 0.02 = 2 %) a newer checkpoint's val_metric may "
        "be than an older one's before the rollback skips it", min=0))
    val_higher_is_better: bool = field(default=False, metadata=meta(
        "the val_metric improves upward (an accuracy); by default lower is better (a loss)"))
    margin_steps: int = field(default=0, metadata=meta(
        "rollback picks a checkpoint with step < anomaly onset - margin_steps", min=0))
    bad_after_same_cause: int = field(default=2, metadata=meta(
        "mark a checkpoint bad after this many failures in a row with the same cause from it", min=1))
    no_progress_attempts: int = field(default=3, metadata=meta(
        "give up after this many attempts in a row without a newer checkpoint", min=1))
    quarantine: bool = field(default=True, metadata=meta(
        "move bad checkpoints (never delete) to quarantine/ beside them, with a note"))
    preserve_last_good: bool = field(default=True, metadata=meta(
        "keep each verified version of a single overwritten checkpoint (nanoGPT ckpt.pt, last.ckpt) in "
        "last_good/ as soon as the background verifier passes it: a hard link when the job replaces the file "
        "by rename, else a reflink where the filesystem clones, else a copy; status shows last_good_disk_bytes"))
    last_good_max_bytes: int = field(default=0, metadata=meta(
        "keep no last_good/ version bigger than this many bytes (0: no limit): a kept version holds its size "
        "on disk once the job saves the next one", min=0))
    last_good_headroom_factor: float = field(default=2.0, metadata=meta(
        "a last_good/ copy (not a hard link or reflink) is made only if it leaves at least this many times the "
        "checkpoint's size free (and last_good_min_free_fraction of the filesystem): the job's own saves come "
        "first; a version skipped for room is a checkpoint_not_kept event", min=0, max=1e9))  # huge: keep none
    last_good_min_free_fraction: float = field(default=0.05, metadata=meta(
        "the share of the checkpoint filesystem a last_good/ copy must leave free (see last_good_headroom_factor)",
        min=0, max=1))
