"""numpy files and compressed pickles that run code when loaded carelessly (issue 34 D6).

Run as a script with the venv's Python (``python hostile_numpy.py OUT``), as hostile_pickles.py is:
each hostile file's payload creates its own marker (``os.system("touch ...")``); each is then loaded
the way a careless job would (``np.load(..., allow_pickle=True)`` and its members, ``pickle.load``
through ``gzip`` / ``bz2`` / ``lzma``), the marker checked and removed, and ``OUT/index.json`` written:
``{name: {"marker": path, "ran": bool}}``. Files without a payload are written beside them as
``good_*``: numeric ``.npy`` / ``.npz`` (compressed too), an object array of plain values (what
``np.save`` makes of ``np.random.get_state()``) and a compressed pickle of plain data.
"""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np


class Payload:
    """Unpickling this runs ``os.system``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def write_all(out: Path) -> dict[str, dict[str, object]]:
    out.mkdir(parents=True, exist_ok=True)
    m = {name: str(out / f"ran-{name}") for name in (
        "object.npy", "rng_object.npy", "arrays.npz", "arrays_compressed.npz", "optimizer.pt.gz", "state.pkl.bz2",
        "state.pkl.xz")}
    np.save(out / "object.npy", np.array([Payload(m["object.npy"])], dtype=object))
    rng = list(np.random.get_state())
    np.save(out / "rng_object.npy", np.array(rng + [Payload(m["rng_object.npy"])], dtype=object))
    np.savez(out / "arrays.npz", w=np.zeros(3), rng=np.array([Payload(m["arrays.npz"])], dtype=object))
    np.savez_compressed(out / "arrays_compressed.npz", w=np.zeros(3),
                        x=np.array([1, Payload(m["arrays_compressed.npz"])], dtype=object))
    for name, opener in (("optimizer.pt.gz", gzip.open), ("state.pkl.bz2", bz2.open), ("state.pkl.xz", lzma.open)):
        with opener(out / name, "wb") as f:
            pickle.dump({"state": Payload(m[name])}, f, protocol=2)
    index: dict[str, dict[str, object]] = {}
    for name, marker in m.items():
        try:
            if name.endswith(".npy"):
                np.load(out / name, allow_pickle=True)
            elif name.endswith(".npz"):
                with np.load(out / name, allow_pickle=True) as z:
                    for key in z.files:
                        z[key]
            else:
                reader: Any = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}[Path(name).suffix]
                with reader(out / name, "rb") as f:
                    pickle.load(f)
        except Exception:
            pass  # what it ran before it failed is what counts
        index[name] = {"marker": marker, "ran": os.path.exists(marker)}
        if os.path.exists(marker):
            os.unlink(marker)
    np.save(out / "good_numeric.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    np.save(out / "good_structured.npy", np.zeros(2, dtype=[("Obj", "<f8"), ("n", "<i4", (2,))]))
    np.save(out / "good_rng_state.npy", np.array(np.random.get_state(), dtype=object))
    np.savez(out / "good_arrays.npz", w=np.ones(4), b=np.arange(3))
    np.savez_compressed(out / "good_arrays_compressed.npz", w=np.ones(4))
    with gzip.open(out / "good_optimizer.pt.gz", "wb") as f:
        pickle.dump({"lr": 1e-3, "step": 7}, f, protocol=2)
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return index


if __name__ == "__main__":
    write_all(Path(sys.argv[1]))
