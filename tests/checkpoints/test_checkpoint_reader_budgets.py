"""The small files a checkpoint dir holds, which the job (or anyone) writes, are read within a
bound (issue 34): a manifest, Megatron's tracker file, a safetensors header. Each is fed a sparse
file 100x or more past its bound, or a FIFO in its place; memory stays bounded, nothing hangs,
and the reason is said."""
from __future__ import annotations

import os
import struct
from pathlib import Path

from supervisor.checkpoints.layouts import megatron
from supervisor.checkpoints.manifest import MAX_MANIFEST_BYTES, manifest_path, read_manifest
from supervisor.checkpoints.structure import MAX_SAFETENSORS_HEADER, structure_problem
from tests.test_child_budgets import peak_of


def sparse(path: Path, size: int, head: bytes = b"") -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def test_a_manifest_of_100_mib_is_not_read_and_says_why(tmp_path: Path) -> None:
    ck = sparse(tmp_path / "step_10.pt", 16)
    sparse(manifest_path(ck), 100 * MAX_MANIFEST_BYTES, b"{")
    got, used = peak_of(lambda: read_manifest(ck))
    assert got.manifest is None and got.present and "larger than" in (got.problem or ""), got
    assert used < 3 * MAX_MANIFEST_BYTES, used


def test_a_fifo_in_place_of_a_manifest_is_unreadable_not_a_hang(tmp_path: Path) -> None:
    ck = sparse(tmp_path / "step_10.pt", 16)
    os.mkfifo(manifest_path(ck))  # nobody ever writes to it: a blocking open would wait forever
    got = read_manifest(ck)
    assert got.manifest is None and "unreadable" in (got.problem or ""), got


def test_a_megatron_tracker_of_1_gb_is_not_read_whole(tmp_path: Path) -> None:
    sparse(tmp_path / megatron.TRACKER, 1 << 30, b"1000")
    got, used = peak_of(lambda: megatron.latest(tmp_path))
    assert got is None and used < 1 << 20, (got, used)
    (tmp_path / megatron.TRACKER).write_text("1000\n")
    assert megatron.latest(tmp_path) == 1000


def test_a_safetensors_header_claiming_10_gb_is_refused_before_any_read(tmp_path: Path) -> None:
    claim = 100 * MAX_SAFETENSORS_HEADER
    p = sparse(tmp_path / "model.safetensors", claim + 64, struct.pack("<Q", claim) + b"{")
    got, used = peak_of(lambda: structure_problem(p))
    assert got is not None and "more than the format allows" in got, got
    assert used < 1 << 20, used


def test_a_kept_copy_goes_without_a_manifest_of_100_mib_or_one_that_is_not_json(tmp_path: Path) -> None:
    """preserve_last_good carries the manifest along: one past the bound, or garbage, is left
    behind (the copy is still kept) instead of being read whole or raising."""
    from supervisor.checkpoints.quarantine import preserve_last_good

    ck = tmp_path / "ck"
    ck.mkdir()
    p = ck / "ckpt.pt"
    p.write_bytes(b"a" * 1000)
    sparse(manifest_path(p), 100 * MAX_MANIFEST_BYTES, b"{")
    kept, used = peak_of(lambda: preserve_last_good(p))
    assert kept is not None and kept.read_bytes() == p.read_bytes()
    assert not manifest_path(kept).exists() and used < 3 * MAX_MANIFEST_BYTES, used
    manifest_path(p).write_text("not json")
    kept = preserve_last_good(p)
    assert kept is not None and not manifest_path(kept).exists()
