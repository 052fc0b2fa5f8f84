"""The one-line upgrade for PyTorch Lightning::

    from supervisor.client.lightning import SupervisorCallback

    trainer = L.Trainer(..., callbacks=[SupervisorCallback()])

What it does under the supervisor (outside supervision, ``TSUP_RUN_ID`` unset, it does nothing):

- a heartbeat with the real ``trainer.global_step`` after every training batch (every rank) and
  every validation batch, so a long validation is not a hang; ``checkpointing`` while any
  ``trainer.save_checkpoint`` runs (``ModelCheckpoint``'s too);
- at Lightning's logging steps (``log_every_n_steps``) the loss from ``trainer.callback_metrics``
  (else the training step's returned loss), the learning rate and a logged grad norm, and after
  each validation the validation loss, reported with the real step (rank 0);
- the supervisor's stop request (``TSUP_STOP_SIGNAL``): save ``epoch=E-step=S.ckpt`` now and
  stop (``trainer.should_stop``); its checkpoint-now request (``TSUP_CHECKPOINT_SIGNAL``): save
  now and go on. With several processes the ranks agree first (one tiny all-reduce per step);
- a manifest beside every checkpoint file written through ``trainer.save_checkpoint`` (rank 0,
  hashed in a background thread), with the step and the last losses.

Checkpoints the callback saves go to ``dirpath``, else ``TSUP_CHECKPOINT_DIR``, else the
``ModelCheckpoint``'s directory, else ``<default_root_dir>/checkpoints``.

Lightning itself also reacts to SIGTERM (the default stop signal): it ends ``fit`` with
``SIGTERMException`` at the end of the batch, after this callback has saved. A stop that arrives
during validation is saved from ``on_exception`` (single process). Uses ``lightning.pytorch``
when that is the Lightning the script imported (or the only one installed), else
``pytorch_lightning``. This module imports Lightning; nothing else in ``supervisor`` imports it.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

from . import _checkpoint, _signals
from ._env import supervised, warn
from ._heartbeat import checkpointing, heartbeat
from ._metrics import as_number, report


def _import_lightning() -> Any:
    if "lightning.pytorch" in sys.modules or "pytorch_lightning" not in sys.modules:
        try:
            import lightning.pytorch as pl

            return pl
        except ImportError:
            pass
    import pytorch_lightning as pl

    return pl


pl = _import_lightning()

__all__ = ["SupervisorCallback"]

_TRAIN_LOSS = ("train_loss_step", "train/loss_step", "loss_step", "train_loss", "train/loss", "loss")
_VAL_LOSS = ("val_loss", "val/loss", "valid_loss", "validation_loss", "val_loss_epoch", "val/loss_epoch")
_NOT_TRAIN = ("val", "valid", "test", "predict")


def _pick(metrics: Mapping[str, Any], preferred: tuple[str, ...], accept: Any) -> float | None:
    for key in preferred:
        if key in metrics and (v := as_number(metrics[key])) is not None:
            return v
    for key in sorted(metrics):
        if accept(key.lower()) and (v := as_number(metrics[key])) is not None:
            return v
    return None


def _is_train_loss(key: str) -> bool:
    return "loss" in key and not key.startswith(_NOT_TRAIN) and not key.endswith("_epoch")


def _is_val_loss(key: str) -> bool:
    return "loss" in key and key.startswith(("val", "valid")) and not key.endswith("_step")


def _is_grad_norm(key: str) -> bool:
    return key in ("grad_norm", "train/grad_norm") or (key.startswith("grad_") and key.endswith("norm_total"))


class SupervisorCallback(pl.Callback):  # type: ignore[name-defined]
    """Heartbeats, metric reports, graceful stop / checkpoint-now and manifests for ``Trainer``.

    ``dirpath``: where the callback's own checkpoints go (see the module docstring for the
    default). ``config``: a mapping stored in every manifest (leave None unless the supervisor's
    ``[checkpoints] job_config_file`` describes the same keys). ``hash_in_background``: hash
    checkpoints for their manifests in a worker thread (default) instead of in the training loop.
    """

    def __init__(self, *, dirpath: str | os.PathLike[str] | None = None, config: Mapping[str, Any] | None = None,
                 hash_in_background: bool = True) -> None:
        self.dirpath = dirpath
        self.config = dict(config) if config is not None else None
        self.hash_in_background = hash_in_background
        self._active = supervised()
        self._fitting = False
        self._step_seen: int | None = None
        self._saved_step: int | None = None
        self._stopping = False
        self._last: dict[str, tuple[float, int]] = {}  # manifest metrics: name -> (value, step)
        if self._active and threading.current_thread() is threading.main_thread():
            # Before Trainer.fit registers Lightning's SIGTERM handler, which then calls ours too.
            _signals.install()

    # -- lifecycle ----------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._active = supervised()
        if not self._active:
            return
        if trainer.world_size > 1:  # the heartbeat file is per rank; launchers normally set these already
            os.environ.setdefault("RANK", str(trainer.global_rank))
            os.environ.setdefault("WORLD_SIZE", str(trainer.world_size))
        if threading.current_thread() is threading.main_thread():
            _signals.install()
        elif stage == "fit":
            warn("SupervisorCallback: fit runs outside the main thread, so the stop / checkpoint signal "
                 "handlers cannot be installed here; call supervisor.client.install() at startup")
        self._wrap(trainer)
        heartbeat(trainer.global_step)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if getattr(trainer.__dict__.get("save_checkpoint"), "_tsup_callback", None) is self:
            del trainer.save_checkpoint  # back to the Trainer's own method
        if self._active:
            _checkpoint._wait_recorded()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._active:
            return
        self._fitting = True
        self._step_seen = trainer.global_step
        heartbeat(trainer.global_step)
        if trainer.is_global_zero:
            ckdir = os.environ.get("TSUP_CHECKPOINT_DIR")
            mc = getattr(trainer.checkpoint_callback, "dirpath", None)
            if ckdir and mc and os.path.realpath(mc) != os.path.realpath(ckdir):
                warn(f"ModelCheckpoint saves in {mc} but the supervisor looks for checkpoints in {ckdir} "
                     "([checkpoints] dir): it will not resume from them")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._active:
            return
        self._fitting = False
        heartbeat(trainer.global_step)
        _checkpoint._wait_recorded()  # the manifests are there when fit() returns

    # -- steps --------------------------------------------------------------------------------------

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._active:
            return
        step = trainer.global_step
        heartbeat(step)
        if step == self._step_seen:
            return  # accumulating gradients: not a step boundary
        self._step_seen = step
        every = getattr(trainer, "log_every_n_steps", 0) or 0
        if trainer.is_global_zero and every and step % every == 0:
            self._report_train(trainer, outputs, step)
        stop, now = _signals.agree(trainer.strategy.root_device, _signals.should_stop(), _signals.should_checkpoint())
        first_stop = stop and not self._stopping  # once: with min_steps unmet Lightning trains on
        save = (now or first_stop) and self._saved_step != step
        if trainer.is_global_zero and (save or first_stop):
            what = f"saving a checkpoint at step {step}" if save else f"step {step} is saved already"
            warn(f"the supervisor asked the job to stop: {what}, stopping" if stop
                 else f"the supervisor asked for a checkpoint: {what}")
        if save:
            self._save(trainer)
        if stop:
            self._stopping = True
            trainer.should_stop = True

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if self._active:
            heartbeat(trainer.global_step)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._active or trainer.sanity_checking or not self._fitting:
            return
        heartbeat(trainer.global_step)
        if not trainer.is_global_zero:
            return
        val = _pick(trainer.callback_metrics, _VAL_LOSS, _is_val_loss)
        if val is not None:
            self._last["val_loss"] = (val, trainer.global_step)
            report(trainer.global_step, val_loss=val)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # Lightning ends fit with SIGTERMException when SIGTERM arrives during validation, before a
        # training step boundary where this callback would have saved: save here instead (one
        # process only: with several, the ranks may not all be here and a save would deadlock).
        if (not self._active or not self._fitting or type(exception).__name__ != "SIGTERMException"
                or trainer.world_size > 1 or not _signals.should_stop()
                or self._saved_step == trainer.global_step):
            return
        warn(f"the supervisor asked the job to stop: saving a checkpoint at step {trainer.global_step}")
        try:
            self._save(trainer)
        except Exception as exc:  # the job is ending anyway; say why nothing was saved
            warn(f"could not save a checkpoint while stopping: {exc}")

    # -- checkpoints --------------------------------------------------------------------------------

    def _directory(self, trainer: Any) -> Path:
        d = self.dirpath or os.environ.get("TSUP_CHECKPOINT_DIR") or getattr(trainer.checkpoint_callback, "dirpath", None)
        return Path(d) if d else Path(trainer.default_root_dir) / "checkpoints"

    def _save(self, trainer: Any) -> None:
        path = self._directory(trainer) / f"epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt"
        trainer.save_checkpoint(str(path))  # wrapped: marks checkpointing, then records the manifest

    def _wrap(self, trainer: Any) -> None:
        """Route every ``trainer.save_checkpoint`` (ModelCheckpoint's, the script's, ours) through us."""
        if getattr(trainer.__dict__.get("save_checkpoint"), "_tsup_callback", None) is not None:
            return
        original = trainer.save_checkpoint

        def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> None:
            step = trainer.global_step
            with checkpointing():
                original(filepath, *args, **kwargs)
            self._saved(trainer, filepath, step)

        save_checkpoint._tsup_callback = self  # type: ignore[attr-defined]
        trainer.save_checkpoint = save_checkpoint

    def _saved(self, trainer: Any, filepath: Any, step: int) -> None:
        self._saved_step = step
        if not self._active or not trainer.is_global_zero:
            return
        text = os.fspath(filepath)
        if "://" in text:
            return  # remote storage: nothing local to hash
        io = getattr(trainer.strategy, "checkpoint_io", None)
        if type(io).__name__ == "AsyncCheckpointIO":
            return  # still being written when save_checkpoint returns: the supervisor hashes it once settled
        path = Path(text)
        if not path.exists():
            return
        _checkpoint.record_trainer_save(path, step=step, last=self._last, config=self.config,
                                        background=self.hash_in_background,
                                        siblings=lambda name: name.endswith(".ckpt"))

    # -- metrics ------------------------------------------------------------------------------------

    def _report_train(self, trainer: Any, outputs: Any, step: int) -> None:
        cm = trainer.callback_metrics
        values: dict[str, float] = {}
        loss = _pick(cm, _TRAIN_LOSS, _is_train_loss)
        if loss is None:  # nothing logged: the loss training_step returned (scaled by accumulation)
            out = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            loss = as_number(out)
            if loss is not None:
                loss *= max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        if loss is not None:
            values["loss"] = loss
            self._last["loss"] = (loss, step)
        gn = _pick(cm, (), _is_grad_norm)
        if gn is not None:
            values["grad_norm"] = gn
        try:
            values["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            pass
        if values:
            report(step, **values)

