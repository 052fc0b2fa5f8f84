"""PyTorch Lightning ``epoch=0-step=500.ckpt`` and ``last.ckpt`` (``last-v1.ckpt``); the step of
``last.ckpt`` comes from its manifest or the load test (``global_step`` inside).

The finite check looks at ``state_dict`` and ``optimizer_states`` only: the stock
``ModelCheckpoint`` stores ``kth_value`` / ``best_model_score`` = ``inf`` in ``callbacks``
(no score yet, or mode="min"), and the loops, schedulers and hparams are bookkeeping, not the
model; judged as a whole every stock checkpoint looked non-finite and a NaN rollback went back to
step 0."""
from __future__ import annotations

import re
from pathlib import Path

from .names import checkpoint_file
from .spec import Found, Layout, LayoutSpec, LoadKind, TensorScope

_STEP = re.compile(r"(?:^|[-_])step=(\d+)")


def recognise(path: Path) -> Found | None:
    name = path.name
    if not (checkpoint_file(path) and name.endswith(".ckpt")):
        return None
    m = _STEP.search(name)
    if m is None and name != "last.ckpt" and not name.startswith("last-v"):
        return None
    return Found(int(m.group(1)) if m else None)


# Every Lightning checkpoint (pytorch_lightning and lightning.pytorch alike) has this key.
WEIGHTS = TensorScope(marker="pytorch-lightning_version", keys=("state_dict", "optimizer_states"))

SPEC = LayoutSpec(layout=Layout.LIGHTNING, folder=False, load=LoadKind.TORCH, recognise=recognise,
                  finite_scope=WEIGHTS, doc="Lightning epoch=0-step=500.ckpt and last.ckpt")
