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

Faults (``--faults`` or ``TSUP_DEMO_FAULTS``, comma list of ``name`` or ``name@step``) live here and
nowhere in the supervisor. Each fires once per run: fired faults are recorded in
``<checkpoint_dir>/.demo_faults_fired`` before they take effect, so a relaunched attempt does not
repeat them. See ``FAULT_HELP``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
FIRED_FILE = ".demo_faults_fired"

FAULT_HELP: Mapping[str, str] = {
    "nan": "a weight becomes NaN at the step, so the loss printed at that step is nan",
    "hang": "at the step, stop heartbeating and printing and sleep forever (ignores the stop flag)",
    "crash": "raise RuntimeError during the step (exit 1 with a traceback)",
    "oom": "raise torch.OutOfMemoryError with CUDA's message during the step (exit 1)",
    "corrupt_ckpt": "after the first checkpoint at or after the step, truncate the newest "
    "checkpoint file to half its size, then crash",
    "bad_resume": "on the first resume at or after the step, train with the LR x100 for that attempt",
    "spike": "LR x50 for 30 steps from the step (a loss spike)",
}
# Where each fault fires by default, as a fraction of --steps: spread over the run, each after a
# checkpoint so that a rollback has somewhere to go, and (for the default 600 steps, checkpoint
# every 50) 10-20 steps past one, so that little work is redone: 120, 210, 312, 414, 480->500.
DEFAULT_FAULT_FRACTIONS: Mapping[str, float] = {
    "nan": 0.20,
    "hang": 0.35,
    "crash": 0.52,
    "oom": 0.69,
    "corrupt_ckpt": 0.80,
    "spike": 0.30,
    "bad_resume": 0.0,
}
DEFAULT_FAULTS = ("nan", "hang", "crash", "oom", "corrupt_ckpt")
SPIKE_STEPS = 30
SPIKE_LR_FACTOR = 50.0
BAD_RESUME_LR_FACTOR = 100.0


# --------------------------------------------------------------------------------------------
# The client library, with a local fallback for any piece that is missing, so the script runs
# even where ``supervisor.client`` is absent or older than this script.
# --------------------------------------------------------------------------------------------


class ResumeInfo(NamedTuple):
    path: str | None
    step: int | None
    skip_batches: int
    attempt: int


class _FallbackClient:
    """Enough of ``supervisor.client`` for the demo: env-driven, no-op outside supervision."""

    def __init__(self) -> None:
        self._stop = False
        self._ckpt = False
        self._hb_path: Path | None = None
        hb_dir = os.environ.get("TSUP_HEARTBEAT_DIR")
        if hb_dir:
            rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
            self._hb_path = Path(hb_dir) / f"rank{rank}.json"
            self._hb_path.parent.mkdir(parents=True, exist_ok=True)

    def install_signals(self) -> None:
        # Handlers only record; the loop acts at a step boundary.
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "_ckpt", True))

    def heartbeat(self, step: int | None = None) -> None:
        if self._hb_path is None:
            return
        tmp = self._hb_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"time": time.time(), "step": step, "pid": os.getpid()}))
        os.replace(tmp, self._hb_path)

    def report(self, step: int | None = None, **metrics: float) -> None:
        return None

    def should_stop(self) -> bool:
        return self._stop

    def should_checkpoint(self) -> bool:
        flag, self._ckpt = self._ckpt, False
        return flag

    def checkpointing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def resume_info(self) -> ResumeInfo:
        path = os.environ.get("TSUP_RESUME_FROM") or None
        return ResumeInfo(
            path=path,
            step=None,
            skip_batches=int(os.environ.get("TSUP_SKIP_BATCHES", "0") or 0),
            attempt=int(os.environ.get("TSUP_ATTEMPT", "0") or 0),
        )

    def save_checkpoint(
        self,
        obj: Any,
        path: str | os.PathLike[str],
        *,
        step: int,
        config: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> Path:
        # Atomic: temp file, fsync, rename, fsync the directory.
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return path


class Client:
    """The calls the demo makes, bound to ``supervisor.client`` where it has them."""

    def __init__(self) -> None:
        self.fallback = _FallbackClient()
        self.missing: list[str] = []
        try:
            from supervisor import client as real  # noqa: PLC0415 (optional at run time)
        except Exception:  # noqa: BLE001 (any import failure means: use the fallback)
            real = None
        names = ("heartbeat", "report", "should_stop", "should_checkpoint", "checkpointing",
                 "resume_info", "save_checkpoint")
        for name in names:
            fn = getattr(real, name, None) if real is not None else None
            if fn is None:
                self.missing.append(name)
                fn = getattr(self.fallback, name)
            setattr(self, name, fn)
        # The fallback flags need their own signal handlers; the real client installs its own,
        # early, so a stop request that arrives before the first should_stop() is not lost.
        if "should_stop" in self.missing or "should_checkpoint" in self.missing:
            self.fallback.install_signals()
        elif callable(getattr(real, "install", None)):
            real.install()

    heartbeat: Callable[..., None]
    report: Callable[..., None]
    should_stop: Callable[[], bool]
    should_checkpoint: Callable[[], bool]
    checkpointing: Callable[[], contextlib.AbstractContextManager[Any]]
    resume_info: Callable[[], Any]
    save_checkpoint: Callable[..., Any]


def _resume_fields(info: Any) -> ResumeInfo:
    """Accept a tuple, a NamedTuple or a dataclass from the client's ``resume_info()``."""
    if isinstance(info, tuple) and not hasattr(info, "_fields"):
        path, step, skip, attempt = (list(info) + [None, None, 0, 0])[:4]
    else:
        path = getattr(info, "path", None)
        step = getattr(info, "step", None)
        skip = getattr(info, "skip_batches", 0)
        attempt = getattr(info, "attempt", 0)
    return ResumeInfo(
        path=str(path) if path else None,
        step=int(step) if step is not None else None,
        skip_batches=int(skip or 0),
        attempt=int(attempt or 0),
    )


# --------------------------------------------------------------------------------------------
# The model: a minimal GPT (pre-norm blocks, causal attention, tied nothing, no dropout so the
# run is deterministic without RNG bookkeeping).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    context: int
    d_model: int
    layers: int
    heads: int


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# --------------------------------------------------------------------------------------------
# Data: the corpus split 90/10; the batch for index i is drawn from a generator seeded by
# (seed, i), so the data order is a pure function of the step.
# --------------------------------------------------------------------------------------------


class Corpus:
    def __init__(self, path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        lookup = {c: i for i, c in enumerate(self.chars)}
        data = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        cut = int(len(data) * 0.9)
        self.train, self.val = data[:cut], data[cut:]

    def batch(self, split: torch.Tensor, seed: int, index: int, size: int, context: int):
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        ix = torch.randint(len(split) - context - 1, (size,), generator=g)
        x = torch.stack([split[i : i + context] for i in ix.tolist()])
        y = torch.stack([split[i + 1 : i + context + 1] for i in ix.tolist()])
        return x, y


# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    name: str
    step: int


def parse_faults(spec: str | None, steps: int) -> tuple[Fault, ...]:
    """``"nan,crash@120"`` -> faults; ``None`` -> the default set; ``""``/``"none"`` -> none."""
    names = DEFAULT_FAULTS if spec is None else tuple(
        s.strip() for s in spec.split(",") if s.strip() and s.strip().lower() != "none"
    )
    faults: list[Fault] = []
    for item in names:
        name, _, at = item.partition("@")
        if name not in FAULT_HELP:
            raise SystemExit(f"unknown demo fault {name!r}; known: {', '.join(FAULT_HELP)}")
        step = int(at) if at else max(1, int(round(DEFAULT_FAULT_FRACTIONS[name] * steps)))
        faults.append(Fault(name, step))
    return tuple(faults)


class FaultBook:
    """Which faults have fired in this run, persisted beside the checkpoints."""

    def __init__(self, path: Path, run_id: str, fresh: bool) -> None:
        self.path = path
        self.run_id = run_id
        self.fired: set[str] = set()
        if path.exists() and not fresh:
            try:
                data = json.loads(path.read_text())
                if data.get("run_id") == run_id:
                    self.fired = set(data.get("fired", []))
            except (OSError, ValueError):
                pass  # an unreadable book only means a fault may fire again; not fatal
        self._write()

    def fire(self, name: str, step: int) -> None:
        # Recorded before the fault takes effect: a crash or kill must not make it fire again.
        self.fired.add(name)
        self._write()
        # Announced in words the detectors do not react to: the evidence must be the fault itself.
        print(f"demo: injecting the {name!r} fault at step {step}: {FAULT_HELP[name].replace('OutOfMemoryError', 'out-of-memory error')}",
              file=sys.stderr, flush=True)

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"run_id": self.run_id, "fired": sorted(self.fired)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}.pt"


def newest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("step_*.pt"))
    return found[-1] if found else None


def raise_fake_oom() -> None:
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
        "76.20 GiB already allocated; 1.05 GiB free; 77.48 GiB reserved in total by PyTorch) "
        "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
        "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
    )


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


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
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--layers", type=int, default=3)
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
    info = _resume_fields(client.resume_info())
    resume_path = args.resume or info.path
    run_id = os.environ.get("TSUP_RUN_ID", "")
    fault_spec = args.faults if args.faults is not None else os.environ.get("TSUP_DEMO_FAULTS")
    faults = {f.name: f for f in parse_faults(fault_spec, args.steps)}
    book = FaultBook(ckpt_dir / FIRED_FILE, run_id, fresh=(resume_path is None and info.attempt == 0))
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
