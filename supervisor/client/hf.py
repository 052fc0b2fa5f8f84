"""The one-line upgrade for the Hugging Face Trainer::

    from supervisor.client.hf import SupervisorCallback

    trainer = Trainer(model=model, args=args, ..., callbacks=[SupervisorCallback()])

What it does under the supervisor (outside supervision, ``TSUP_RUN_ID`` unset, it does nothing):

- a heartbeat with the real ``state.global_step`` at every optimizer step (every rank), and during
  gradient-accumulation substeps and evaluation / prediction batches, so a long eval is not a hang;
- the heartbeat state ``checkpointing`` from the step that decides to save until ``on_save``, so
  a slow save gets ``[heartbeat] checkpoint_timeout_s``;
- ``loss`` / ``grad_norm`` / ``learning_rate`` / ``eval_loss`` from each ``on_log`` reported with
  the real step (rank 0) to ``metrics-rank0.jsonl``;
- the supervisor's stop request (``TSUP_STOP_SIGNAL``): save ``checkpoint-<step>`` now and stop
  training; its checkpoint-now request (``TSUP_CHECKPOINT_SIGNAL``): save now and go on. With
  several processes the ranks agree on both (one tiny all-reduce per step) so all save the same step;
- a manifest beside every ``checkpoint-<step>/`` the Trainer writes (rank 0; hashed in a background
  thread), with the step and the last logged loss and eval loss, which the supervisor verifies.

This module imports transformers; nothing else in ``supervisor`` imports this module, so
``import supervisor.client`` stays light.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

from transformers import TrainerCallback

from . import _checkpoint, _signals
from ._env import supervised, warn
from ._heartbeat import checkpointing, heartbeat
from ._metrics import as_number, report

__all__ = ["SupervisorCallback"]

# on_log key -> report() name
_LOG_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "eval_loss": "val_loss"}


class SupervisorCallback(TrainerCallback):
    """Heartbeats, metric reports, graceful stop / checkpoint-now and manifests for ``Trainer``.

    ``config``: a mapping stored in every checkpoint's manifest (the supervisor compares it with the
    job's current config before resuming; leave it None unless ``[checkpoints] job_config_file``
    describes the same keys). ``hash_in_background``: hash checkpoints for their manifests in a
    worker thread (default) instead of stalling the training loop.
    """

    def __init__(self, *, config: Mapping[str, Any] | None = None, hash_in_background: bool = True) -> None:
        self.config = dict(config) if config is not None else None
        self.hash_in_background = hash_in_background
        self._active = supervised()  # again at on_train_begin; heartbeats in an evaluate()-only job too
        self._training = False
        self._saving: Any = None  # the open checkpointing() context
        self._saved_step: int | None = None  # step of the last save (ours or the Trainer's own)
        self._stopping = False
        self._announced: int | None = None
        self._want_save = False  # a checkpoint-now request not yet served
        self._last: dict[str, tuple[float, int]] = {}  # manifest metrics: name -> (value, step)

    # -- training lifecycle ---------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._active = supervised()
        if not self._active:
            return
        self._training = True
        world = int(getattr(args, "world_size", 1) or 1)
        if world > 1:  # the heartbeat file is per rank; launchers normally set these already
            os.environ.setdefault("RANK", str(getattr(args, "process_index", 0)))
            os.environ.setdefault("WORLD_SIZE", str(world))
        if threading.current_thread() is threading.main_thread():
            _signals.install()
            self._check_handler()
        else:
            warn("SupervisorCallback: training runs outside the main thread, so the stop / checkpoint "
                 "signal handlers cannot be installed here; call supervisor.client.install() at startup")
        heartbeat(state.global_step)
        if state.is_world_process_zero:
            self._check_dir(args)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_saving()  # a save announced but never made (e.g. skipped by the Trainer)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._active:
            heartbeat(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._boundary(args, state, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._boundary(args, state, control)

    def _boundary(self, args: Any, state: Any, control: Any) -> None:
        """A step or epoch ended: heartbeat, serve the supervisor's requests, announce a save."""
        if not self._active:
            return
        heartbeat(state.global_step)
        self._requests(args, state, control)
        # With an evaluation first, the save is announced after it (on_evaluate).
        if control.should_save and not control.should_evaluate:
            self._begin_saving()

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._active:
            heartbeat(state.global_step)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Mapping[str, Any] | None = None,
                    **kwargs: Any) -> None:
        if not self._active:
            return
        heartbeat(state.global_step)
        loss = as_number((metrics or {}).get("eval_loss"))
        if loss is not None:
            self._last["val_loss"] = (loss, state.global_step)
        if not self._training:
            return  # trainer.evaluate() on its own: nothing to save
        self._requests(args, state, control)  # a stop that came during a long evaluation
        strategy = getattr(args.save_strategy, "value", args.save_strategy)
        if control.should_save or strategy == "best":
            self._begin_saving()

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not self._active or not state.is_world_process_zero or not logs:
            return
        values: dict[str, float] = {}
        for key, name in _LOG_KEYS.items():
            v = as_number(logs.get(key))
            if v is not None:
                values[name] = v
        if not values:
            return  # e.g. the final summary (train_runtime, train_loss averaged over the run)
        step = state.global_step
        for name in ("loss", "val_loss"):
            if name in values:
                self._last[name] = (values[name], step)
        report(step, **values)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._active:
            return
        step = state.global_step
        self._saved_step = step
        self._want_save = False
        try:
            # Every rank writes its part of the folder (RNG state, optimizer shards): hash it once all have.
            _barrier(args)
            if state.is_world_process_zero:
                self._record(Path(args.output_dir), step)
        finally:
            self._end_saving()
            heartbeat(step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._active:
            return
        self._training = False
        self._end_saving()
        heartbeat(state.global_step)
        _checkpoint._wait_recorded()  # the manifests are there when train() returns

    # -- the supervisor's requests ----------------------------------------------------------------

    def _requests(self, args: Any, state: Any, control: Any) -> None:
        stop, now = _signals.agree(args.device, _signals.should_stop(), _signals.should_checkpoint())
        step = state.global_step
        # Kept until a save happens: save_strategy="best" may override should_save after an eval.
        self._want_save = (self._want_save or now) and self._saved_step != step
        save = (stop or self._want_save) and self._saved_step != step
        if state.is_world_process_zero and (save or stop and not self._stopping) and self._announced != step:
            self._announced = step  # once: a step with an evaluation asks twice (on_step_end, on_evaluate)
            what = f"saving checkpoint-{step}" if save else f"checkpoint-{step} is saved already"
            warn(f"the supervisor asked the job to stop: {what}, stopping" if stop
                 else f"the supervisor asked for a checkpoint: {what}")
        if save:
            control.should_save = True
        if stop:
            self._stopping = True
            control.should_training_stop = True

    # -- checkpoints ------------------------------------------------------------------------------

    def _begin_saving(self) -> None:
        if self._saving is None:
            cm = checkpointing()
            cm.__enter__()
            self._saving = cm

    def _end_saving(self) -> None:
        cm, self._saving = self._saving, None
        if cm is not None:
            cm.__exit__(None, None, None)

    def _record(self, output_dir: Path, step: int) -> None:
        folder = output_dir / f"checkpoint-{step}"
        if not folder.is_dir():
            return  # a hyperparameter-search run dir, or a custom save: the supervisor hashes it itself
        _checkpoint.record_trainer_save(folder, step=step, last=self._last, config=self.config,
                                        background=self.hash_in_background,
                                        siblings=lambda name: name.startswith("checkpoint-"))

    # -- start-up checks -------------------------------------------------------------------------

    def _check_handler(self) -> None:
        try:
            stop_sig = _signals._signum("TSUP_STOP_SIGNAL", signal.SIGTERM)
        except ValueError:
            return
        current = signal.getsignal(stop_sig)
        if current is not _signals._on_stop:
            warn(f"another handler ({current!r}) has replaced the supervisor's {signal.Signals(stop_sig).name} "
                 "handler (TrainingArguments(enable_jit_checkpoint=True)?): the stop request will not "
                 "save a checkpoint through this callback")

    def _check_dir(self, args: Any) -> None:
        ckdir = os.environ.get("TSUP_CHECKPOINT_DIR")
        if not ckdir or not args.output_dir:
            return
        if os.path.realpath(args.output_dir) != os.path.realpath(ckdir):
            warn(f"the Trainer saves its checkpoints in {args.output_dir} but the supervisor looks for them in "
                 f"{ckdir} ([checkpoints] dir): it will not resume from them")


def _barrier(args: Any) -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
