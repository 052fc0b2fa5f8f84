"""The checkpoint layouts in the order they are tried: the one place that lists them.

An entry of a checkpoint dir is the first layout in ``SPECS`` (of its kind, file or folder) that
recognises it. DCP comes first among folders: a folder with ``.metadata`` is a DCP save whatever
its name (Megatron-core's torch_dist writes ``iter_N/`` so). Among files, the ones that say
their step in a special way come before the plain ``step_N.pt`` and the stepless ``ckpt.pt``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from . import dcp, deepspeed, hf, lightning, megatron, safetensors_file, single, torch_file
from .spec import Layout, LayoutSpec, LoadKind, TensorScope, manifest_only

SPECS: tuple[LayoutSpec, ...] = (
    dcp.SPEC,
    hf.SPEC,
    megatron.SPEC,
    deepspeed.SPEC,
    lightning.SPEC,
    safetensors_file.SPEC,
    torch_file.SPEC,
    single.SPEC,
)

BY_LAYOUT: Mapping[Layout, LayoutSpec] = {s.layout: s for s in SPECS}
# Names never a checkpoint wherever they appear (HF's training_args.bin).
NEVER: frozenset[str] = frozenset().union(*(s.never for s in SPECS))
# Where each layout that says so keeps its weights; sent to every load test, which applies the one
# whose marker the loaded object has (by content: the file's name may be anything).
FINITE_SCOPES: tuple[TensorScope, ...] = tuple(s.finite_scope for s in SPECS if s.finite_scope is not None)


@dataclass(frozen=True)
class Entry:
    """A recognised entry; ``missing`` says what its writer has not written yet (None: complete)."""

    spec: LayoutSpec
    step: int | None
    missing: str | None

    @property
    def complete(self) -> bool:
        return self.missing is None


def recognise(path: Path) -> Entry | None:
    """The layout of one directory entry, complete or still being written; None for anything
    else. Temp names and the supervisor's own files are for the caller to skip first."""
    if path.name in NEVER:
        return None
    folder = path.is_dir()
    if not folder and not path.is_file():
        return None
    for spec in SPECS:
        if spec.folder != folder:
            continue
        found = spec.recognise(path)
        if found is not None:
            return Entry(spec, found.step, found.missing)
    return None


def pending_reason(path: Path) -> str | None:
    """Why an entry that no layout recognises looks like one being written (a DCP step folder
    before its .metadata), or None."""
    folder = path.is_dir()
    for spec in SPECS:
        if spec.folder == folder and (why := spec.pending(path)):
            return why
    return None


def not_checkpoints(children: Iterable[Path]) -> frozenset[str]:
    """Names among a dir's entries that are not checkpoints there (HF's final export beside
    its checkpoint-N/ folders)."""
    kids = list(children)
    return frozenset().union(*(s.shadows(kids) for s in SPECS))


def spec_of(layout: Layout | str | None) -> LayoutSpec | None:
    """The spec of a format layout; None for custom, last_good and unknown names."""
    try:
        return BY_LAYOUT.get(Layout(layout)) if layout is not None else None
    except ValueError:
        return None


def load_kind(path: Path, layout: Layout | str | None = None) -> LoadKind:
    """What the load-test child does for ``path``: its layout's loader; for an entry without a
    format layout (a custom glob's, a last_good copy, ``restart --from``) the loader of the
    layout it is recognised as, else by what it is (a folder with .metadata is DCP, any other
    folder is loaded file by file, a .safetensors file by its header, anything else with torch)."""
    folder = path.is_dir()
    spec = spec_of(layout)
    if spec is None or spec.folder != folder:
        entry = recognise(path)
        spec = entry.spec if entry is not None else None
    if spec is not None:
        return spec.load
    if folder:
        return LoadKind.DCP if (path / dcp.METADATA).is_file() else LoadKind.FOLDER
    return LoadKind.SAFETENSORS if path.name.endswith(".safetensors") else LoadKind.TORCH


def sidecars(path: Path, layout: Layout | str | None = None) -> tuple[Path, ...]:
    """Files beside ``path`` that belong to it and move with it when it is quarantined."""
    spec = spec_of(layout)
    if spec is None:
        entry = recognise(path)
        spec = entry.spec if entry is not None else None
    return spec.sidecars(path) if spec is not None else manifest_only(path)


def keeps_last_good(layout: Layout | str | None) -> bool:
    spec = spec_of(layout)
    return spec is not None and spec.keeps_last_good
