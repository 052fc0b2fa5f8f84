"""A tiny GPT-2 trained by the Hugging Face Trainer with the supervisor's callback (CPU, offline).

The script a user would have, plus the one line (``callbacks=[SupervisorCallback()]``)::

    python cb_hf_train.py OUTPUT_DIR --max-steps 8 [--save-steps 4] [--logging-steps 2]
        [--eval-steps 4] [--self-signal STEP:SIGNAME] [--self-signal-rank R] [--resume DIR] [--no-callback]
        [--step-s S]

``--self-signal`` sends the signal to this process during step STEP (a deterministic stand-in for the
supervisor's request); under torchrun only to rank R with ``--self-signal-rank`` (a rank that sees the
request a step before the others). ``--step-s`` pauses after each step (a real step's compute): a run that
trains until it is told to stop then does not spend the CPU the rest of the suite needs. At the end it prints ``RESULT {json}``: the final global step and what the
stop signal's handler is.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class PauseAfterStep(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


class SignalAt(TrainerCallback):
    """Signal this process while step ``step`` runs (its handler runs before that step ends)."""

    def __init__(self, step: int, sig: int) -> None:
        self.step, self.sig = step, sig

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1:
            os.kill(os.getpid(), self.sig)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("output_dir")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--save-steps", type=int, default=10_000)
    p.add_argument("--logging-steps", type=int, default=2)
    p.add_argument("--eval-steps", type=int, default=0)
    p.add_argument("--self-signal", action="append", default=[], help="STEP:SIGNAME")
    p.add_argument("--self-signal-rank", type=int, default=None)
    p.add_argument("--resume", default=None, help="a checkpoint-N folder to resume from")
    p.add_argument("--no-callback", action="store_true")
    p.add_argument("--step-s", type=float, default=0.0, help="pause after each step, seconds")
    a = p.parse_args()

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        learning_rate=1e-3, logging_steps=a.logging_steps, save_strategy="steps", save_steps=a.save_steps,
        eval_strategy="steps" if a.eval_steps else "no", eval_steps=a.eval_steps or None,
        use_cpu=True, report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=0,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None)
    callbacks: list[TrainerCallback] = [PauseAfterStep(a.step_s)] if a.step_s else []
    rank = int(os.environ.get("RANK", "0"))
    for spec in a.self_signal if a.self_signal_rank in (None, rank) else []:
        step, name = spec.split(":")
        callbacks.append(SignalAt(int(step), int(getattr(signal, name))))
    if not a.no_callback:
        from supervisor.client.hf import SupervisorCallback

        callbacks.append(SupervisorCallback())
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(4000, 16, 64, 1),
                      eval_dataset=RandomTokens(16, 16, 64, 2) if a.eval_steps else None, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=a.resume)
    stop_sig = getattr(signal, os.environ.get("TSUP_STOP_SIGNAL") or "SIGTERM")
    print("RESULT " + json.dumps({"global_step": trainer.state.global_step, "rank": rank,
                                  "stop_handler": repr(signal.getsignal(stop_sig))}), flush=True)


if __name__ == "__main__":
    main()
