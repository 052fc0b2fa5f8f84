"""The demo training job: a tiny character-level GPT trained on the CPU, with injectable faults.

Run standalone (``python -m supervisor.demo.train --faults none``) or under the supervisor
(``transformer-supervisor demo``). It behaves like a well-mannered real training script:

- heartbeats every step and reports metrics through ``supervisor.client``; also prints a JSON
  metric line every ``--print-every`` steps (and at any non-finite loss) on stdout;
- saves ``step_NNNNNN.pt`` every ``--checkpoint-every`` steps with the client's atomic save
  (model, optimizer, step, RNG state, all plain tensors so ``torch.load(weights_only=True)`` works)
  plus a validation loss recorded with its step;
- resumes from ``--resume`` or ``TSUP_RESUME_FROM`` and skips ``resume_info().skip_batches``;
- polls ``should_checkpoint()`` (emergency checkpoint) and ``should_stop()`` (checkpoint, exit 0)
  at every step boundary;
- is deterministic: the batch used at step ``s`` depends only on ``(seed, s + batches_skipped)``,
  so a resumed run continues exactly like an uninterrupted one (same loss to the last bit on the
  same machine and thread count).

Faults (``--faults`` or ``TSUP_DEMO_FAULTS``, comma list of ``name`` or ``name@step``) live in
:mod:`.faults` and nowhere in the supervisor. Each fires once per run: fired faults are recorded in
``<checkpoint_dir>/.demo_faults_fired`` before they take effect, so a relaunched attempt does not
repeat them. See ``supervisor.demo.FAULT_HELP``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import torch

from . import DEFAULT_FAULTS, FAULT_HELP, FAULTS_ENV, FAULTS_FIRED_FILE
from .faults import BAD_RESUME_LR_FACTOR, SPIKE_LR_FACTOR, SPIKE_STEPS, FaultBook, parse_faults, raise_fake_oom
from .jobclient import Client, resume_fields
from .model import CORPUS_PATH, Corpus, ModelConfig, TinyGPT


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}.pt"


def newest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("step_*.pt"))
    return found[-1] if found else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m supervisor.demo.train",
        description="Tiny character-level GPT on CPU, the job the supervisor demo watches.",
        epilog="faults: " + "; ".join(f"{k}: {v}" for k, v in FAULT_HELP.items()),
    )
    p.add_argument("--steps", type=int, default=600, help="optimizer steps in total")
    p.add_argument("--seed", type=int, default=0, help="model init and data order")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (x LR_SCALE env)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--warmup", type=int, default=20, help="linear LR warm-up steps")
    p.add_argument("--checkpoint-dir", default=None, help="default: TSUP_CHECKPOINT_DIR or ./checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--print-every", type=int, default=10, help="JSON metric line on stdout every N steps")
    p.add_argument("--eval-batches", type=int, default=4, help="validation batches per checkpoint")
    p.add_argument("--resume", default=None, help="checkpoint to resume from (default TSUP_RESUME_FROM)")
    p.add_argument("--faults", default=None,
                   help="comma list of name or name@step; 'none' for no faults "
                        f"(default: TSUP_DEMO_FAULTS, else {','.join(DEFAULT_FAULTS)})")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--corpus", default=str(CORPUS_PATH))
    p.add_argument("--summary-file", default=None, help="write the final step/loss/val_loss here as JSON")
    return p


def lr_at(step: int, base: float, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak: a function of the step only."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def emit(record: Mapping[str, Any]) -> None:
    # NaN/Inf are printed as JSON's usual extension (NaN, Infinity): what real scripts print.
    print(json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    client = Client()
    if client.missing:
        print(f"demo: supervisor.client lacks {', '.join(client.missing)}; using local fallbacks",
              file=sys.stderr, flush=True)

    ckpt_dir = Path(args.checkpoint_dir or os.environ.get("TSUP_CHECKPOINT_DIR") or "checkpoints")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    info = resume_fields(client.resume_info())
    resume_path = args.resume or info.path
    run_id = os.environ.get("TSUP_RUN_ID", "")
    fault_spec = args.faults if args.faults is not None else os.environ.get(FAULTS_ENV)
    faults = {f.name: f for f in parse_faults(fault_spec, args.steps)}
    book = FaultBook(ckpt_dir / FAULTS_FIRED_FILE, run_id, fresh=(resume_path is None and info.attempt == 0))
    lr_scale = float(os.environ.get("LR_SCALE", "1") or 1)

    corpus = Corpus(Path(args.corpus))
    mcfg = ModelConfig(len(corpus.chars), args.context, args.d_model, args.layers, args.heads)
    torch.manual_seed(args.seed)
    model = TinyGPT(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    config = {
        "seed": args.seed, "lr": args.lr, "lr_scale": lr_scale, "steps": args.steps,
        "batch_size": args.batch_size, "context": args.context, "d_model": args.d_model,
        "layers": args.layers, "heads": args.heads, "warmup": args.warmup, "vocab": mcfg.vocab,
    }

    step = 0  # optimizer steps completed
    skipped = 0  # batches skipped by rollbacks so far (kept in checkpoints)
    lr_factor = 1.0  # fault-injected LR factor for this attempt (bad_resume)
    if resume_path:
        t0 = time.perf_counter()
        try:
            state = torch.load(resume_path, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        except Exception as exc:
            print(f"demo: failed to load checkpoint {resume_path}: {exc}", file=sys.stderr, flush=True)
            raise
        step = int(state["step"])
        skipped = int(state.get("batches_skipped", 0)) + info.skip_batches
        torch.set_rng_state(state["rng"]["torch"])
        print(f"demo: resumed from {resume_path} at step {step} in {time.perf_counter() - t0:.2f}s"
              + (f", skipping {info.skip_batches} batches" if info.skip_batches else ""),
              file=sys.stderr, flush=True)
        bad = faults.get("bad_resume")
        if bad and "bad_resume" not in book.fired and step >= bad.step:
            book.fire("bad_resume", step)
            lr_factor = BAD_RESUME_LR_FACTOR

    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            losses = [
                model(*corpus.batch(corpus.val, args.seed + 7919, i, args.batch_size, args.context)).item()
                for i in range(args.eval_batches)
            ]
        model.train()
        return sum(losses) / len(losses)

    try:  # the real client records the seed in the manifest's environment snapshot
        save_takes_seed = "seed" in inspect.signature(client.save_checkpoint).parameters
    except (TypeError, ValueError):
        save_takes_seed = False

    def save(reason: str) -> Path:
        val = evaluate()
        obj = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "batches_skipped": skipped,
            "rng": {"torch": torch.get_rng_state()},
            "config": config,
        }
        path = ckpt_dir / checkpoint_name(step)
        extra = {"seed": args.seed} if save_takes_seed else {}
        with client.checkpointing():
            client.save_checkpoint(obj, path, step=step, config=config,
                                   metrics={"val_loss": {"value": val, "step": step}}, **extra)
        emit({"step": step, "val_loss": val, "checkpoint": str(path), "reason": reason})
        return path

    last_saved = step if resume_path else -1
    loss_value = float("nan")
    spike = faults.get("spike")
    t_last = time.perf_counter()
    client.heartbeat(step)
    while step < args.steps:
        # Step boundary: honour the supervisor's flags before starting the next step.
        if client.should_stop():
            if last_saved != step:
                save("stop")
            print(f"demo: stop requested; checkpoint at step {step} written, exiting 0",
                  file=sys.stderr, flush=True)
            return 0
        if client.should_checkpoint() and last_saved != step:
            save("emergency")
            last_saved = step

        n = step + 1  # the step being computed, as printed
        for name in ("hang", "crash", "oom", "nan"):
            f = faults.get(name)
            if f and n >= f.step and name not in book.fired:
                book.fire(name, n)
                if name == "hang":
                    while True:  # a hang ignores every flag: only SIGKILL ends it
                        time.sleep(3600)
                if name == "crash":
                    raise RuntimeError(f"demo: simulated crash at step {n}")
                if name == "oom":
                    raise_fake_oom()
                if name == "nan":
                    with torch.no_grad():
                        model.head.weight[0, 0] = float("nan")
        factor = lr_factor
        if spike and n >= spike.step and spike.name not in book.fired:
            book.fire("spike", n)
        if spike and "spike" in book.fired and spike.step <= n < spike.step + SPIKE_STEPS:
            factor *= SPIKE_LR_FACTOR

        lr = lr_at(step, args.lr, args.warmup, args.steps) * lr_scale * factor
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = corpus.batch(corpus.train, args.seed, step + skipped, args.batch_size, args.context)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        step = n
        loss_value = float(loss.item())

        now = time.perf_counter()
        tps = args.batch_size * args.context / max(now - t_last, 1e-9)
        t_last = now
        client.heartbeat(step)
        client.report(step=step, loss=loss_value, grad_norm=grad_norm, tokens_per_sec=tps, lr=lr)
        if step % args.print_every == 0 or step == 1 or not math.isfinite(loss_value):
            emit({"step": step, "loss": loss_value, "grad_norm": grad_norm,
                  "tokens_per_sec": round(tps, 1), "lr": lr})

        if step % args.checkpoint_every == 0 or step == args.steps:
            save("periodic" if step < args.steps else "final")
            last_saved = step
            f = faults.get("corrupt_ckpt")
            if f and step >= f.step and "corrupt_ckpt" not in book.fired:
                book.fire("corrupt_ckpt", step)
                victim = newest_checkpoint(ckpt_dir)
                if victim is not None:
                    size = victim.stat().st_size
                    os.truncate(victim, size // 2)
                    print(f"demo: truncated {victim} from {size} to {size // 2} bytes",
                          file=sys.stderr, flush=True)
                raise RuntimeError(f"demo: simulated crash right after checkpoint at step {step}")

    val = evaluate()
    summary = {"step": step, "loss": loss_value, "val_loss": val, "done": True}
    emit(summary)
    if args.summary_file:
        Path(args.summary_file).write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
