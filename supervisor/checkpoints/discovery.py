"""Find checkpoints in a directory, in the layouts people use, skipping ones still being written.

Layouts (``Candidate.layout``):
  ``file``        one file per step: step_1000.pt, ckpt_00001000.pt, model_500.safetensors, ...
  ``single``      one overwritten file without a step in its name (nanoGPT ckpt.pt); the step
                  comes from its manifest or the load test (``iter_num`` inside)
  ``lightning``   epoch=0-step=500.ckpt and last.ckpt
  ``safetensors`` a *.safetensors file
  ``hf``          HF Trainer checkpoint-500/ (trainer_state.json inside: the Trainer writes it
                  last, so a folder without it is still being saved, or its save died)
  ``dcp``         torch.distributed.checkpoint / torchtitan step-1000/ with .metadata
  ``megatron``    Megatron-LM iter_0001000/ (latest_checkpointed_iteration.txt beside it)
  ``deepspeed``   DeepSpeed global_step1000/
  ``custom``      matched by the configured glob, step from the configured regex
  ``last_good``   a copy the supervisor kept aside in last_good/ (see quarantine.preserve_last_good)

A checkpoint is still being written when its name is a temp name (.x, *.tmp, *.partial, tmp-*)
or a DCP folder has no .metadata yet (an HF folder no trainer_state.json), or its size / newest
mtime changed within ``settle_s`` or since the previous scan. The clock is injected so tests need
not wait.

Not checkpoints although they look like one: HF's ``training_args.bin`` (a pickle of the
TrainingArguments), and beside HF checkpoint-N/ folders the final export ``Trainer.save_model``
writes at the top of its output dir (``model.safetensors``, ``pytorch_model.bin``, adapters):
weights without optimizer or trainer state, which ``--resume_from_checkpoint`` cannot resume.
"""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Callable, Iterable

from .manifest import MANIFEST_SUFFIX, is_manifest, stat_record

QUARANTINE_DIR = "quarantine"
LAST_GOOD_DIR = "last_good"
NOTE_SUFFIX = ".quarantine.json"


class Layout(StrEnum):
    FILE = "file"
    SINGLE = "single"
    LIGHTNING = "lightning"
    SAFETENSORS = "safetensors"
    HF = "hf"
    DCP = "dcp"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    CUSTOM = "custom"
    LAST_GOOD = "last_good"

    @property
    def is_folder(self) -> bool:
        return self in (Layout.HF, Layout.DCP, Layout.MEGATRON, Layout.DEEPSPEED)


@dataclass(frozen=True)
class Candidate:
    """A complete, settled checkpoint. ``step`` is None when its name does not say."""

    path: Path
    step: int | None
    layout: Layout
    mtime: float  # newest mtime in the file or folder (seconds since the epoch)
    size: int  # bytes, a folder's files summed

    def with_step(self, step: int | None) -> "Candidate":
        return replace(self, step=step)


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".tar")
_TEMP_SUFFIXES = (".tmp", ".temp", ".partial", ".part", ".incomplete", ".lock", ".swp")
_LIGHTNING = re.compile(r"(?:^|[-_])step=(\d+)")
_STEP_IN_NAME = re.compile(r"(\d+)(?=\.[A-Za-z]+$|$)")  # the last number before the extension
_SHARD = re.compile(r"-\d+-of-\d+\.")  # model-00001-of-00002.safetensors: a shard, not a step
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_MEGATRON_DIR = re.compile(r"^iter_(\d+)$")
_DEEPSPEED_DIR = re.compile(r"^global_step(\d+)$")
_STEP_DIR = re.compile(r"^(?:step|ckpt|checkpoint|iter|epoch)[-_]?(\d+)$")
HF_STATE_FILE = "trainer_state.json"
# Files the HF Trainer writes that are never checkpoints: the pickled TrainingArguments, anywhere.
NEVER_CHECKPOINTS = frozenset({"training_args.bin"})
# The final model Trainer.save_model(output_dir) exports beside the checkpoint-N/ folders.
HF_EXPORT_NAMES = frozenset({"model.safetensors", "pytorch_model.bin", "adapter_model.safetensors",
                             "adapter_model.bin"})


def is_temp_name(name: str) -> bool:
    low = name.lower()
    return (name.startswith(".") or low.startswith(("tmp-", "tmp_", "tmp.")) or low.endswith(_TEMP_SUFFIXES)
            or ".tmp" in low or ".partial" in low)


def written_by_supervisor(name: str) -> bool:
    """An entry of a checkpoint dir that the supervisor itself writes, never the job: manifests,
    quarantine notes, the ``quarantine/`` and ``last_good/`` folders, and their temp files. A scan
    for signs of the job at work (files being written) must skip these: the background
    verification writes a manifest seconds after each checkpoint, whatever the job is doing."""
    return (name in (QUARANTINE_DIR, LAST_GOOD_DIR) or name.endswith((MANIFEST_SUFFIX, NOTE_SUFFIX))
            or (name.startswith(".") and (f"{MANIFEST_SUFFIX}." in name or name.endswith(".restore.tmp"))))


def classify(path: Path) -> tuple[Layout, int | None] | None:
    """The layout and step of one directory entry, or None when it is not a checkpoint."""
    name = path.name
    if is_temp_name(name) or is_manifest(path) or name.endswith(NOTE_SUFFIX):
        return None
    if path.is_dir():
        if (path / ".metadata").is_file():
            m = _STEP_IN_NAME.search(name)
            return Layout.DCP, int(m.group(1)) if m else None
        if m := _HF_DIR.match(name):
            if not (path / HF_STATE_FILE).is_file():
                return None  # the Trainer writes trainer_state.json last: a save in progress (or one that died)
            return Layout.HF, int(m.group(1))
        if m := _MEGATRON_DIR.match(name):
            return Layout.MEGATRON, int(m.group(1))
        if m := _DEEPSPEED_DIR.match(name):
            return Layout.DEEPSPEED, int(m.group(1))
        return None  # step-1000/ without .metadata: a DCP save in progress, or not a checkpoint
    if not path.is_file() or not name.lower().endswith(CHECKPOINT_SUFFIXES) or name in NEVER_CHECKPOINTS:
        return None
    if _SHARD.search(name):
        return None
    if name.endswith(".ckpt") and (name == "last.ckpt" or name.startswith("last-v") or _LIGHTNING.search(name)):
        m = _LIGHTNING.search(name)
        return Layout.LIGHTNING, int(m.group(1)) if m else None
    m = _STEP_IN_NAME.search(name)
    if name.endswith(".safetensors"):
        return Layout.SAFETENSORS, int(m.group(1)) if m else None
    if m:
        return Layout.FILE, int(m.group(1))
    return Layout.SINGLE, None


def hf_step(folder: Path) -> int | None:
    try:
        data = json.loads((folder / "trainer_state.json").read_text())
        step = data.get("global_step")
        return step if isinstance(step, int) else None
    except (OSError, ValueError, AttributeError):
        return None


def megatron_latest(checkpoint_dir: Path) -> int | None:
    """The iteration Megatron's tracker file names (``latest_checkpointed_iteration.txt``)."""
    try:
        text = (checkpoint_dir / "latest_checkpointed_iteration.txt").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class Discovery:
    """Scans one checkpoint dir. Keeps the previous scan's sizes to notice files still growing.

    Thread-safe; ``clock`` returns wall-clock seconds (comparable with file mtimes).
    """

    def __init__(self, checkpoint_dir: Path, *, glob: str | None = None, step_regex: str | None = None,
                 settle_s: float = 2.0, clock: Callable[[], float] = time.time,
                 follow_symlinks_out: bool = False) -> None:
        self.dir = Path(checkpoint_dir)
        # A symlink in the checkpoint dir that leads outside it is skipped unless this is set:
        # the supervisor hashes, load-tests and hands the job only what lives in its own dir.
        self.follow_symlinks_out = follow_symlinks_out
        self.glob = glob
        self.step_regex = re.compile(step_regex) if step_regex else None
        self.settle_s = settle_s
        self.clock = clock
        self._last_seen: dict[Path, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self.unsettled: tuple[Path, ...] = ()  # from the last scan, for status / logs
        # False while no job runs (between attempts): nothing can still be writing, so a file
        # that just appeared is as final as it will get and the settle window does not apply.
        self.writer_active = True

    def _entries(self) -> Iterable[tuple[Path, Layout, int | None]]:
        return (e for e in self._all_entries() if self.follow_symlinks_out or self._inside(e[0]))

    def _inside(self, p: Path) -> bool:
        """``p`` resolves inside the checkpoint dir (a symlink out of it does not)."""
        try:
            return p.resolve().is_relative_to(self.dir.resolve())
        except (OSError, RuntimeError):  # a symlink loop
            return False

    def _all_entries(self) -> Iterable[tuple[Path, Layout, int | None]]:
        seen: set[Path] = set()
        if self.glob:
            for p in sorted(self.dir.glob(self.glob)):
                if QUARANTINE_DIR in p.relative_to(self.dir).parts or LAST_GOOD_DIR in p.relative_to(self.dir).parts:
                    continue
                if is_temp_name(p.name) or is_manifest(p) or p.name.endswith(NOTE_SUFFIX):
                    continue
                step = None
                # Searched in the path relative to dir, so the regex can read a folder name too.
                if self.step_regex and (m := self.step_regex.search(p.relative_to(self.dir).as_posix())):
                    step = int(m.group("step") if "step" in self.step_regex.groupindex else m.group(1))
                seen.add(p)
                yield p, Layout.CUSTOM, step
        try:
            children = sorted(self.dir.iterdir())
        except OSError:
            return
        hf_output_dir = any(_HF_DIR.match(p.name) and p.is_dir() for p in children)
        for p in children:
            if p in seen or p.name in (QUARANTINE_DIR, LAST_GOOD_DIR):
                continue
            if hf_output_dir and p.name in HF_EXPORT_NAMES:
                continue  # the Trainer's final export, not a resumable checkpoint (see the module doc)
            c = classify(p)
            if c is None:
                continue
            layout, step = c
            if layout is Layout.HF and step is None:
                step = hf_step(p)
            yield p, layout, step
        lg = self.dir / LAST_GOOD_DIR
        if lg.is_dir():
            for p in sorted(lg.iterdir()):
                if classify(p) is not None:
                    yield p, Layout.LAST_GOOD, None

    def scan(self) -> list[Candidate]:
        """Complete, settled checkpoints, newest first (by step, then mtime)."""
        now = self.clock()
        out: list[Candidate] = []
        unsettled: list[Path] = []
        with self._lock:
            current: dict[Path, tuple[int, int]] = {}
            for path, layout, step in self._entries():
                try:
                    st = stat_record(path)
                except OSError:
                    continue  # vanished while we looked (renamed by its writer): next scan
                key = (st["size"], st["mtime_ns"])
                current[path] = key
                prev = self._last_seen.get(path)
                mtime = st["mtime_ns"] / 1e9
                if self.writer_active and (now - mtime < self.settle_s or (prev is not None and prev != key)):
                    unsettled.append(path)
                    continue
                out.append(Candidate(path=path, step=step, layout=layout, mtime=mtime, size=st["size"]))
            self._last_seen = current
            self.unsettled = tuple(unsettled)
        return sort_newest_first(out)


def sort_newest_first(cands: Iterable[Candidate]) -> list[Candidate]:
    # A step beats a mtime (copies change mtimes); unknown steps sort by mtime among themselves.
    # Ties at the same step: the original before its last_good copy.
    return sorted(cands, key=lambda c: (c.step if c.step is not None else -1, c.layout is not Layout.LAST_GOOD,
                                        c.mtime), reverse=True)


def newest_complete(cands: Iterable[Candidate]) -> Candidate | None:
    """The newest of ``cands`` (sorted newest first, as scans return them) that is the job's own
    checkpoint, not a last_good copy: the one place that says which checkpoint is the newest."""
    return next((c for c in cands if c.layout is not Layout.LAST_GOOD), None)
