"""``restart --from CKPT``: the operator's checkpoint gets the same quicklist as any other
(exists, complete, sha256 against its manifest, config match, load test without running
pickled code) before the daemon accepts the request; refused with the reasons unless
``--force``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..errors import Conflict

if TYPE_CHECKING:  # the checkpoint service is imported only when a restart --from is checked
    from ..checkpoints.service import CheckpointService
    from ..config.model import Config


def from_reasons(cfg: Config, state_dir: Path, svc: CheckpointService | None, path_str: str) -> list[str]:
    """Why ``path_str`` is not a ready checkpoint (empty when it is)."""
    from ..checkpoints.discovery import Candidate, Layout, classify
    from ..checkpoints.service import CheckpointService

    p = Path(path_str)
    if not p.is_absolute():
        p = (cfg.workdir() or Path.cwd()) / p
    if not p.exists():
        return [f"{p} does not exist"]
    if svc is None:  # no checkpoint dir configured: a throwaway service for this one check
        svc = CheckpointService(cfg.checkpoints, p.parent, state_dir, cfg.job.python, list(cfg.job.command),
                                cfg.workdir(), write_manifests=False)
    layout, step = classify(p) or (Layout.SINGLE, None)
    st = os.stat(p)
    size = st.st_size if not p.is_dir() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    row = svc.evaluate(Candidate(p, step, layout, st.st_mtime, size))
    if row.ready:
        return []
    return list(row.reasons) or ["not ready (no reason given)"]


def not_a_checkpoint(cfg: Config, svc: CheckpointService | None, path_str: str) -> str | None:
    """Why ``path_str`` is not something discovery would call a checkpoint (None when it is).
    Checked even with ``--force``: force overrides a failed check of a checkpoint, it does not
    make the checkpoint dir itself, or a random folder or file, one."""
    from ..checkpoints.discovery import classify

    p = Path(path_str)
    if not p.is_absolute():
        p = (cfg.workdir() or Path.cwd()) / p
    if not p.exists():
        return None  # from_reasons says "does not exist"
    ck_dir = svc.dir if svc is not None else None
    if ck_dir is not None and (p.resolve() == Path(ck_dir).resolve() or p.resolve() in Path(ck_dir).resolve().parents):
        return (f"{p} is the checkpoint dir (or above it), not one checkpoint in it; name one checkpoint "
                "(see `transformer-supervisor checkpoints`)")
    if classify(p) is None:
        return (f"{p} is not a checkpoint discovery recognises (a complete torch/safetensors file or a "
                "checkpoint folder of a known layout); name one listed by `transformer-supervisor checkpoints`")
    return None


def gate_restart_from(handler: Callable[..., Any], cfg_of: Callable[[], Config], state_dir: Path,
                      svc_of: Callable[[], CheckpointService | None]) -> Callable[..., Any]:
    """Wrap the control handler: a ``restart`` with ``from`` is verified first unless ``force``."""

    def gated(verb: str, args: Mapping[str, Any], *a: Any, **kw: Any) -> Any:
        if verb == "restart":
            args = dict(args)
            force = bool(args.pop("force", False))
            src = args.get("from")
            if src:
                why = not_a_checkpoint(cfg_of(), svc_of(), str(src))
                if why:
                    raise Conflict(f"restart --from {src} refused: {why}; nothing was restarted")
            if src and not force:
                reasons = from_reasons(cfg_of(), state_dir, svc_of(), str(src))
                if reasons:
                    raise Conflict(f"restart --from {src} refused, the checkpoint is not ready: "
                                   + "; ".join(reasons) + " (--force to use it anyway)")
        return handler(verb, args, *a, **kw)

    return gated
