"""Prints training metric lines in one trainer's format, NaN from step NAN_AT on, then exits 1.

Usage: watch_nan_child.py FORMAT NAN_AT   (FORMAT: json hf nanogpt torchtitan megatron)
"""
from __future__ import annotations

import sys


def line(fmt: str, step: int, loss: float) -> str:
    ls = "nan" if loss != loss else f"{loss:.4f}"
    if fmt == "json":
        return '{"step": %d, "loss": %s, "lr": 0.0003}' % (step, "NaN" if loss != loss else f"{loss:.4f}")
    if fmt == "hf":
        return "{'loss': %s, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': %.2f}" % (ls, step / 1000)
    if fmt == "nanogpt":
        return f"iter {step}: loss {ls}, time 12.34ms, mfu 1.20%"
    if fmt == "torchtitan":
        return (f"[rank0]:[titan] 2025-03-01 10:00:00,123 - root - INFO - \x1b[31mstep: {step:2d}  "
                f"\x1b[32mloss: {ls:>7}  \x1b[33mmemory: 30.12GiB(38.02%)  \x1b[34mtps: 5,678  \x1b[35mmfu: 14.1%\x1b[39m")
    if fmt == "megatron":
        return (f" iteration {step:8d}/  500000 | consumed samples: {step * 512:12d} | learning rate: 1.500E-04 | "
                f"lm loss: {ls if loss != loss else format(loss, '.6E')} | grad norm: 2.103 | "
                f"number of skipped iterations:   0 | number of nan iterations:   {1 if loss != loss else 0} |")
    raise SystemExit(f"unknown format {fmt}")


def main() -> None:
    fmt, nan_at = sys.argv[1], int(sys.argv[2])
    for step in range(0, nan_at + 3, 10 if fmt != "hf" else 10):
        loss = float("nan") if step >= nan_at else 3.0 - step / 1000
        print(line(fmt, step, loss), flush=True)
        if step % 50 == 0:
            print(f"[info] step {step} done, data loader healthy", flush=True)
    print("Traceback (most recent call last):\nRuntimeError: training diverged", file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
