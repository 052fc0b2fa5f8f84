"""A tiny GPT-2 trained with the Hugging Face Trainer on random tokens, on the CPU, offline.

What a user would write: TrainingArguments from the command line (HfArgumentParser), the
Trainer's own checkpoint-N/ folders in --output_dir, and resuming with
``--resume_from_checkpoint PATH``. Faults come from FAULT / FAULT_MARKER (see _faults.py).

    python hf_train.py --output_dir out --max_steps 40 --save_steps 5 --logging_steps 5 \
        [--resume_from_checkpoint out/checkpoint-20] [--step_s 0.1]
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faults import Fault


@dataclass
class DataArguments:
    seq_len: int = field(default=32)
    train_samples: int = field(default=512)
    eval_samples: int = field(default=32)
    dataset_seed: int = field(default=1234)
    step_s: float = field(default=0.0)  # a pause after each step: a real step's compute, without the CPU


class RandomTokens(torch.utils.data.Dataset):
    """Random token sequences with a learnable pattern (each token is often the previous + 1)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        noise = (torch.rand(n, seq_len, generator=g) < 0.2).long() * torch.randint(0, vocab, (n, seq_len), generator=g)
        self.data = (start + torch.arange(seq_len) + noise) % vocab

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class PauseAfterStep(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


class FaultCallback(TrainerCallback):
    def __init__(self, fault: Fault) -> None:
        self.fault = fault

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.fault.inject(state.global_step, list(model.parameters()) if model is not None else [])


def main() -> None:
    parser = HfArgumentParser((DataArguments, TrainingArguments))
    parser.set_defaults(use_cpu=True, report_to="none", per_device_train_batch_size=8,
                        per_device_eval_batch_size=8, learning_rate=1e-3)
    data_args, args = parser.parse_args_into_dataclasses()
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(config)
    train = RandomTokens(data_args.train_samples, data_args.seq_len, config.vocab_size, data_args.dataset_seed)
    evals = RandomTokens(data_args.eval_samples, data_args.seq_len, config.vocab_size, data_args.dataset_seed + 1)
    trainer = Trainer(model=model, args=args, train_dataset=train,
                      eval_dataset=evals if args.eval_strategy != "no" else None,
                      callbacks=[FaultCallback(Fault(args.output_dir))]
                      + ([PauseAfterStep(data_args.step_s)] if data_args.step_s else []))
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
