"""Which checkpoint to resume from, and the memory of which ones are bad.

``select`` is pure: given quicklist rows (newest first), a mode and the anomaly's onset, it picks
the newest ready checkpoint (restart: last known good) or the newest ready one taken before
``onset_step - margin_steps`` (rollback), skipping ones marked bad, and says why.

``CheckpointBook`` persists bad marks and the attempt history in ``<state_dir>/checkpoint_book.json``
(not the ledger, which the runner owns): a checkpoint that failed to load at resume, or from which
the job failed ``bad_after_same_cause`` times in a row with the same cause before producing a
newer checkpoint, is bad. A corrupt newest checkpoint then costs one cycle, not 44.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import structlog

from .quicklist import Readiness
from .. import strictjson
from ..regularfile import read_regular_text

log = structlog.get_logger("supervisor.checkpoints")

Mode = Literal["restart", "rollback"]
# Causes that say the checkpoint itself is unusable: one is enough to mark it bad.
LOAD_ERROR_CAUSES = frozenset({"checkpoint_load_error"})


@dataclass(frozen=True)
class Choice:
    path: Path
    step: int | None
    layout: str
    reason: str  # "newest ready checkpoint (step 1000)", "newest ready before onset 1200 - margin 100"
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) for newer ones passed over
    quarantined: tuple[Any, ...] = ()  # QuarantineRecord(s) made while choosing (service fills it)
    readiness: Readiness | None = None
    # checkpoints.verify = "overlap": only the cheap structural checks ran; the load test runs
    # beside the job's start-up (CheckpointService.verify_chosen).
    verify_pending: bool = False


def worse_than_older(vals: Sequence[tuple[Path, int | None, float | None]], *, tolerance: float,
                     higher_is_better: bool = False) -> dict[Path, str]:
    """``prefer = "best_val"``: the candidates (newest first, with their recorded validation
    metric) whose value is worse than an older candidate's by more than ``tolerance`` (relative),
    each with the reason. A newer checkpoint is not always a better one: a run that drifted up
    for a while before it diverged has its best state further back."""
    out: dict[Path, str] = {}
    best: tuple[float, int | None] | None = None  # the best value among the older ones seen so far
    for path, step, val in reversed(vals):  # oldest first
        if val is None or val != val:
            continue
        if best is not None:
            ref, ref_step = best
            gap = (ref - val) if higher_is_better else (val - ref)
            if gap > tolerance * max(abs(ref), 1e-12):
                out[path] = (f"val {val:.4g} is worse than {ref:.4g} at step {ref_step} by more than "
                             f"{tolerance:.0%} (checkpoints.prefer = best_val)")
        if best is None or (val > best[0] if higher_is_better else val < best[0]):
            best = (val, step)
    return out


def select_explained(rows: Sequence[Readiness], *, mode: Mode, onset_step: int | None, margin_steps: int,
                     bad: set[Path] | frozenset[Path],
                     worse: Mapping[Path, str] | None = None) -> tuple[Choice | None, str]:
    """The choice (or None) and a one-line reason; ``rows`` newest first. ``worse``: candidates a
    rollback passes over for a better recorded validation metric further back (``worse_than_older``)."""
    skipped: list[tuple[str, str]] = []
    limit: int | None = None
    if mode == "rollback":
        if onset_step is None:
            what = "rollback without an onset step: falling back to the newest ready checkpoint"
        else:
            limit = onset_step - margin_steps
            what = f"newest ready checkpoint before onset {onset_step} - margin {margin_steps} (step < {limit})"
    else:
        what = "newest ready checkpoint (last known good)"
    for r in rows:
        if Path(r.path) in bad or r.bad:
            skipped.append((str(r.path), "marked bad"))
            continue
        if not r.ready:
            skipped.append((str(r.path), "; ".join(r.reasons) or "not ready"))
            continue
        if limit is not None:
            if r.step is None:
                skipped.append((str(r.path), "step unknown, cannot place it before the onset"))
                continue
            if r.step >= limit:
                skipped.append((str(r.path), f"step {r.step} is not before {limit}"))
                continue
        if mode == "rollback" and worse and Path(r.path) in worse:
            skipped.append((str(r.path), worse[Path(r.path)]))
            continue
        reason = f"{what}: step {r.step if r.step is not None else '?'}"
        n_worse = sum(1 for p, _ in skipped if worse and Path(p) in worse)
        if n_worse:
            reason += f"; passed over {n_worse} newer with a worse validation metric (checkpoints.prefer = best_val)"
        return Choice(path=Path(r.path), step=r.step, layout=r.layout, reason=reason, skipped=tuple(skipped),
                      readiness=r), reason
    if not rows:
        return None, "no checkpoints found"
    return None, f"no checkpoint qualifies as the {what}; checked {len(rows)}"


def select(rows: Sequence[Readiness], *, mode: Mode, onset_step: int | None, margin_steps: int,
           bad: set[Path] | frozenset[Path]) -> Choice | None:
    return select_explained(rows, mode=mode, onset_step=onset_step, margin_steps=margin_steps, bad=bad)[0]


@dataclass(frozen=True)
class AttemptNote:
    checkpoint: str | None
    step: int | None
    cause: str | None
    newer_checkpoint_appeared: bool
    at: float


class CheckpointBook:
    """Bad marks and attempt results, persisted as JSON in the state dir (thread-safe)."""

    FILE = "checkpoint_book.json"
    MAX_ATTEMPTS = 200

    def __init__(self, state_dir: Path, *, bad_after_same_cause: int = 2,
                 clock: Any = time.time) -> None:
        self.file = Path(state_dir) / self.FILE
        self.bad_after_same_cause = bad_after_same_cause
        self._clock = clock
        self._lock = threading.RLock()
        self._bad: dict[str, dict[str, Any]] = {}
        self._attempts: list[AttemptNote] = []
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(read_regular_text(self.file, "a checkpoint book"))  # no FIFO, no link
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("checkpoint_book_unreadable", path=str(self.file), error=str(exc),
                        next="starting without bad marks; renamed the file aside")
            try:
                os.replace(self.file, self.file.with_suffix(f".corrupt-{int(self._clock())}"))
            except OSError:
                pass
            return
        self._bad = {str(k): dict(v) for k, v in (data.get("bad") or {}).items()}
        self._attempts = [AttemptNote(**a) for a in data.get("attempts") or []]

    def _save(self) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
        data = {"bad": self._bad, "attempts": [a.__dict__ for a in self._attempts[-self.MAX_ATTEMPTS:]]}
        tmp.write_text(strictjson.dumps(data, indent=1))
        os.replace(tmp, self.file)

    @staticmethod
    def _key(path: Path | str) -> str:
        return str(Path(path).absolute())

    @staticmethod
    def _version(path: Path | str) -> list[int] | None:
        """(size, mtime_ns) of a file: a mark holds for this version only. A single overwritten
        checkpoint (nanoGPT ckpt.pt) gets a new version at each save, and the last good copy is
        restored to the same path: neither may inherit the bad mark of the version before."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return [st.st_size, st.st_mtime_ns] if os.path.isfile(path) else None

    def mark_bad(self, path: Path | str, reason: str) -> None:
        with self._lock:
            key = self._key(path)
            if self._is_bad(key):
                return
            self._bad[key] = {"reason": reason, "at": self._clock(), "version": self._version(key)}
            self._save()
        log.warning("checkpoint_marked_bad", path=key, reason=reason,
                    next="it will not be resumed from; the next older ready checkpoint is used")

    def _is_bad(self, key: str) -> bool:
        entry = self._bad.get(key)
        if entry is None:
            return False
        marked = entry.get("version")
        now = self._version(key)
        return marked is None or now is None or list(marked) == now

    def is_bad(self, path: Path | str) -> bool:
        with self._lock:
            return self._is_bad(self._key(path))

    def bad_reason(self, path: Path | str) -> str | None:
        with self._lock:
            key = self._key(path)
            return str(self._bad[key]["reason"]) if self._is_bad(key) else None

    def bad_paths(self) -> frozenset[Path]:
        with self._lock:
            return frozenset(Path(k) for k in self._bad if self._is_bad(k))

    def forget_bad(self, path: Path | str) -> None:
        """Operator override (e.g. after replacing the file by hand)."""
        with self._lock:
            if self._bad.pop(self._key(path), None) is not None:
                self._save()

    def note_attempt_result(self, checkpoint: Path | str | None, cause: str | None,
                            newer_checkpoint_appeared: bool, step: int | None = None) -> bool:
        """Record how an attempt resumed from ``checkpoint`` ended; True when that marked it bad.

        Bad when the cause is a load error, or when the last ``bad_after_same_cause`` attempts
        from this checkpoint all ended with the same cause and none produced a newer checkpoint.
        """
        cause_s = str(cause) if cause is not None else None
        with self._lock:
            self._attempts.append(AttemptNote(self._key(checkpoint) if checkpoint else None, step, cause_s,
                                              bool(newer_checkpoint_appeared), self._clock()))
            self._save()
            if checkpoint is None or cause_s is None or newer_checkpoint_appeared:
                return False
            if cause_s in LOAD_ERROR_CAUSES:
                self.mark_bad(checkpoint, f"the job failed to load it at resume ({cause_s})")
                return True
            n = self.bad_after_same_cause
            tail = self._attempts[-n:]
            key = self._key(checkpoint)
            if len(tail) == n and all(a.checkpoint == key and a.cause == cause_s and not a.newer_checkpoint_appeared
                                      for a in tail):
                self.mark_bad(checkpoint, f"the job failed {n} times in a row with {cause_s} after resuming from it, "
                                          "without producing a newer checkpoint")
                return True
            return False

    def attempts_without_progress(self) -> int:
        """Attempts in a row (most recent last) that ended without a newer checkpoint."""
        with self._lock:
            n = 0
            for a in reversed(self._attempts):
                if a.newer_checkpoint_appeared:
                    break
                n += 1
            return n

    def steps_seen(self, last: int | None = None) -> list[int | None]:
        """Resume steps of the recent attempts without progress (for the give-up message)."""
        with self._lock:
            n = self.attempts_without_progress() if last is None else last
            return [a.step for a in self._attempts[len(self._attempts) - n:]] if n else []

    def no_progress(self, limit: int) -> bool:
        return self.attempts_without_progress() >= limit
