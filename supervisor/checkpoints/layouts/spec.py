"""What every checkpoint layout says about itself: the ``LayoutSpec`` its module exports.

A spec answers four questions, each in one place:

- how to recognise an entry of the checkpoint dir as this layout, and its step (``recognise``,
  with ``pending`` as the weaker guess for an entry no layout recognises);
- what makes it complete (``Found.missing``: None, or what the writer has not written yet);
- what the load-test child does for it (``load``: the name the child script dispatches on, sent
  to it explicitly; the child never guesses from a file's extension);
- which tensors the finite check judges (``finite_scope``: the model's and the optimizer's, not
  the callback and loop state some trainers keep beside them);
- how to quarantine it (``sidecars``: the files beside it that move with it; files and folders
  both move by one rename) and whether a verified copy is kept in last_good/ (``keeps_last_good``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Callable, Sequence

from ..manifest import manifest_path


class Layout(StrEnum):
    """``Candidate.layout``: a spec's name, or where a checkpoint came from (custom, last_good)."""

    FILE = "file"
    SINGLE = "single"
    LIGHTNING = "lightning"
    SAFETENSORS = "safetensors"
    HF = "hf"
    DCP = "dcp"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    # Not formats: matched by the configured glob, and a copy the supervisor kept in last_good/.
    # Their load test follows what the entry itself is (registry.load_kind).
    CUSTOM = "custom"
    LAST_GOOD = "last_good"


class LoadKind(StrEnum):
    """What the load-test child does; ``_loadtest_script.LOADERS`` has one function per value."""

    TORCH = "torch"  # one torch.save file, weights_only
    SAFETENSORS = "safetensors"  # one safetensors file, header bounds-checked
    DCP = "dcp"  # a torch.distributed.checkpoint folder: .metadata and every byte range it names
    FOLDER = "folder"  # a folder of weight/optimizer files (HF, Megatron, DeepSpeed): each one loaded


@dataclass(frozen=True)
class Found:
    """A directory entry a spec recognised. ``missing``: what its writer has not written yet
    (None: complete); an incomplete one is listed as being written, never resumed from."""

    step: int | None
    missing: str | None = None


def manifest_only(path: Path) -> tuple[Path, ...]:
    """The default sidecars: the manifest beside the checkpoint."""
    return (manifest_path(path),)


def never_pending(path: Path) -> str | None:
    return None


def shadows_nothing(children: Sequence[Path]) -> frozenset[str]:
    return frozenset()


@dataclass(frozen=True)
class TensorScope:
    """Where a torch checkpoint keeps the model's and the optimizer's tensors: the finite check
    (``checkpoints.check_finite``, rollback targets) looks only at ``keys`` of a loaded object
    that has ``marker`` at its top level. Told apart by content, not by name: a checkpoint saved
    under any name (a custom ModelCheckpoint filename, a last_good/ copy, ``restart --from``) holds
    the same keys. Without a scope every tensor in the object is checked."""

    marker: str
    keys: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"marker": self.marker, "keys": list(self.keys)}


@dataclass(frozen=True)
class LayoutSpec:
    layout: Layout
    folder: bool  # a folder (True) or one file; the registry asks a spec only about its kind
    load: LoadKind
    recognise: Callable[[Path], Found | None]
    doc: str  # one line for people: the writer and the names
    # For an entry no spec recognises: why it looks like this layout being written, or None.
    pending: Callable[[Path], str | None] = never_pending
    # Names never a checkpoint wherever they appear (skipped by discovery and inside folders by
    # the load test).
    never: frozenset[str] = frozenset()
    # Names among a dir's entries that are not checkpoints when this layout is present there.
    shadows: Callable[[Sequence[Path]], frozenset[str]] = shadows_nothing
    # Files beside the checkpoint that move with it into quarantine/, each named <its name><suffix>
    # (the suffix is kept on the moved name).
    sidecars: Callable[[Path], tuple[Path, ...]] = manifest_only
    # One file the job overwrites at every save: each verified version is kept in last_good/.
    keeps_last_good: bool = False
    # The entries of a torch checkpoint that hold weights and optimizer state (see TensorScope).
    finite_scope: TensorScope | None = None
