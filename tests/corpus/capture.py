"""Regenerate the parser corpus: real output of real trainers, captured raw.

Usage (from the repository root)::

    .venv/bin/python tests/corpus/capture.py                       # HF 5.x, Lightning, torch loop, llm.c, nanotron
    .venv/bin/python tests/corpus/capture.py --hf4-python /tmp/hf4/bin/python --only hf4

``--hf4-python`` is an interpreter with ``transformers<5`` (see README.md for the throwaway venv).
Every run is a child process of this script, run with ``HF_HUB_OFFLINE=1`` and
``PYTHONUNBUFFERED=1`` (what the supervisor sets for a Python job by default), on the CPU, with a
tiny randomly initialised GPT-2 and a random-token dataset built here (nothing is downloaded).
Each run is captured twice: stdout and stderr to separate files (``NAME.stdout``,
``NAME.stderr``), and once more with stderr merged into stdout (``NAME.merged``, as ``2>&1``).
The bytes are kept as the process wrote them (``\\r`` redraws and ANSI escapes included).
``manifest.json`` records each run's parameters; the tests derive their expectations from it.

llm.c and nanotron cannot run here (CUDA / multi-process torch.distributed); their lines are built
from the exact format strings of their source code (see README.md): ``llmc.stdout``, ``llmc_main.log``,
``llmc_cpu.stdout``, ``llmc_formats.stdout`` and ``nanotron.stdout``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Shared parameters of the HF runs (the tests read them back from manifest.json).
HF = {"max_steps": 30, "logging_steps": 5, "eval_steps": 10, "save_steps": 15, "nan_step": 12,
      "batch_size": 4, "eval_samples": 8, "seed": 0}
# The resume run: first run to resume_from steps with a checkpoint there, then resume to max_steps.
HF_RESUME = {"max_steps": 30, "logging_steps": 5, "resume_from": 10, "batch_size": 4, "seed": 0}
# Lightning: batches per epoch, epochs, logging interval; the parameters are filled with NaN after
# this many training batches (= optimizer steps without gradient accumulation).
PL = {"train_batches": 10, "val_batches": 2, "max_epochs": 3, "log_every_n_steps": 5, "nan_after_batches": 17,
      "batch_size": 4, "seed": 0}
# tests/trainer_scripts/loop_logging_train.py and loop_tqdm_train.py (the e2e jobs), run as they are with a NaN
# injected (FAULT=nan@N: the weights are NaN after step N, see each script for what N counts).
JOBS = {"loop_logging": {"script": "loop_logging_train.py", "steps": 100, "save_every": 20, "log_every": 10,
                         "nan_step": 58},
        "loop_tqdm": {"script": "loop_tqdm_train.py", "steps": 80, "save_every": 25, "nan_step": 57}}
# A plain torch loop printing the generic "step N ... loss X" forms.
LOOP = {"steps": 12, "nan_step": 8, "seed": 0}
STEP_SLEEP_S = 0.12


# --------------------------------------------------------------------------------------- children

def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


class _RandomTokens:
    """A map-style dataset of random token sequences (input_ids == labels: causal LM)."""

    def __init__(self, n: int, seq: int = 16, seed: int = 0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, 64, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        x = self.data[i]
        return {"input_ids": x, "labels": x.clone()}


def _poison(model) -> None:
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))


def child_hf(variant: str, out_dir: str) -> None:
    """One Trainer run. variant: filter_on | filter_off | printer | logprefix | resume."""
    import logging

    import torch
    import transformers
    from transformers import Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    transformers.set_seed(0)

    class Pace(TrainerCallback):
        """Steps of a tiny model take ~5 ms; tqdm redraws at most every 0.1 s (mininterval). A real step
        takes longer than that, so every step is drawn: sleep to get the same."""

        def on_step_end(self, args, state, control, **kw):
            time.sleep(STEP_SLEEP_S)

    class InjectNaN(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step == HF["nan_step"]:
                _poison(model)

    class LogThroughLogger(TrainerCallback):
        """What custom callbacks commonly do: log the dict through the script's logger."""

        def on_log(self, args, state, control, logs=None, **kw):
            logging.getLogger("__main__").info(logs)

    callbacks: list = []
    extra: dict = {}
    if variant == "resume":
        p = HF_RESUME
        model = _tiny_gpt2()
        common = dict(output_dir=out_dir, per_device_train_batch_size=p["batch_size"], logging_steps=p["logging_steps"],
                      report_to="none", use_cpu=True, seed=p["seed"], save_strategy="steps",
                      save_steps=p["resume_from"], dataloader_num_workers=0)
        train = _RandomTokens(p["max_steps"] * p["batch_size"], seed=1)
        # First attempt (its output is not part of the corpus): stop at resume_from with a checkpoint there.
        first = TrainingArguments(max_steps=p["max_steps"], disable_tqdm=True, **common)

        class StopAt(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step == p["resume_from"]:
                    control.should_training_stop = True
                    control.should_save = True

        saved_out, saved_err = sys.stdout, sys.stderr
        with open(os.devnull, "w") as null:
            sys.stdout = sys.stderr = null
            try:
                Trainer(model=model, args=first, train_dataset=train, callbacks=[StopAt()]).train()
            finally:
                sys.stdout, sys.stderr = saved_out, saved_err
        print(f"=== resuming from checkpoint-{p['resume_from']} ===", flush=True)
        args = TrainingArguments(max_steps=p["max_steps"], **common)
        Trainer(model=_tiny_gpt2(), args=args, train_dataset=train, callbacks=[Pace()]).train(
            resume_from_checkpoint=os.path.join(out_dir, f"checkpoint-{p['resume_from']}"))
        return

    if variant == "filter_off":
        extra["logging_nan_inf_filter"] = False
    if variant == "printer":
        extra["disable_tqdm"] = True
    if variant == "logprefix":
        # The HF example scripts' logging setup (examples/pytorch/language-modeling/run_clm.py).
        logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                            datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
        logging.getLogger("__main__").setLevel(logging.INFO)
        transformers.utils.logging.set_verbosity_info()
        transformers.utils.logging.enable_default_handler()
        transformers.utils.logging.enable_explicit_format()
        callbacks.append(LogThroughLogger())
        extra["log_level"] = "info"
    args = TrainingArguments(
        output_dir=out_dir, max_steps=HF["max_steps"], per_device_train_batch_size=HF["batch_size"],
        per_device_eval_batch_size=HF["batch_size"], logging_steps=HF["logging_steps"], eval_strategy="steps",
        eval_steps=HF["eval_steps"], save_strategy="steps", save_steps=HF["save_steps"], report_to="none",
        use_cpu=True, seed=HF["seed"], dataloader_num_workers=0, **extra)
    trainer = Trainer(model=_tiny_gpt2(), args=args,
                      train_dataset=_RandomTokens(HF["max_steps"] * HF["batch_size"], seed=1),
                      eval_dataset=_RandomTokens(HF["eval_samples"], seed=2),
                      callbacks=[Pace(), InjectNaN(), *callbacks])
    trainer.train()
    if variant in ("filter_on", "filter_off"):
        # What run_clm.py does after training: a standalone evaluate(). Its bar is not nested (no
        # training bar any more) and has no description: it looks like a training bar with total=2.
        trainer.evaluate()


def child_lightning(variant: str, out_dir: str) -> None:
    """variant: train_loss (self.log("train_loss", prog_bar=True), CSVLogger, TQDMProgressBar) | loss (logs
    "loss", no logger, accumulate_grad_batches=2, TQDMProgressBar) | rich (Lightning's default bar, which is
    RichProgressBar whenever `rich` is installed, as it is in this venv)."""
    import torch
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.loggers import CSVLogger
    from torch.utils.data import DataLoader

    pl.seed_everything(PL["seed"], verbose=False)
    name = "train_loss" if variant == "train_loss" else "loss"

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _tiny_gpt2()
            self.batches_seen = 0

        def training_step(self, batch, idx):
            loss = self.model(**batch).loss
            self.log(name, loss, prog_bar=True)
            return loss

        def on_train_batch_end(self, outputs, batch, idx):
            time.sleep(STEP_SLEEP_S)  # as in child_hf: every batch is drawn, as in a real run
            self.batches_seen += 1
            if self.batches_seen == PL["nan_after_batches"]:
                _poison(self.model)

        def validation_step(self, batch, idx):
            self.log("val_loss", self.model(**batch).loss, prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    train = DataLoader(_RandomTokens(PL["train_batches"] * PL["batch_size"], seed=1), batch_size=PL["batch_size"])
    val = DataLoader(_RandomTokens(PL["val_batches"] * PL["batch_size"], seed=2), batch_size=PL["batch_size"])
    kw: dict = dict(max_epochs=PL["max_epochs"], accelerator="cpu", devices=1, log_every_n_steps=PL["log_every_n_steps"],
                    enable_checkpointing=False, enable_model_summary=False, default_root_dir=out_dir)
    if variant != "rich":
        kw["callbacks"] = [TQDMProgressBar()]
    if variant in ("train_loss", "rich"):
        kw["logger"] = CSVLogger(out_dir, name="csv", version=0)
    else:
        kw["logger"] = False
        kw["accumulate_grad_batches"] = 2
    pl.Trainer(**kw).fit(Module(), train, val)


def child_loop(variant: str, out_dir: str) -> None:
    """A hand-written torch loop printing the generic forms (one per variant)."""
    import torch

    torch.manual_seed(LOOP["seed"])
    model = _tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = _RandomTokens(LOOP["steps"] * 4, seed=1)
    for step in range(1, LOOP["steps"] + 1):
        batch = {k: torch.stack([data[i][k] for i in range((step - 1) * 4, step * 4)]) for k in ("input_ids", "labels")}
        loss = model(**batch).loss
        loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        opt.zero_grad()
        lr = opt.param_groups[0]["lr"]
        if step == LOOP["nan_step"]:
            _poison(model)
        lv = loss.item()
        if variant == "pipes":
            print(f"step {step} | loss {lv:.4f} | lr {lr:.2e} | grad_norm {gn:.3f}")
        elif variant == "colon":
            print(f"Step {step}: loss={lv:.4f}, lr={lr:.2e}")
        else:  # "equals"
            print(f"step={step} loss={lv:.4f} grad_norm={gn:.4f} lr={lr:g}")


# ---------------------------------------------------------------------- llm.c / nanotron (synthetic)

# karpathy/llm.c @ f1e2ace651495b74ae22d45d1723443fd00ecd3a (train_gpt2.cu:1872, 1728; train_gpt2.c:1171, 1122;
# llmc/logger.h:37, 45, 53)
LLMC_CU_STEP = "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n"
LLMC_CU_VAL = "val loss %f\n"
LLMC_C_STEP = "step %d: train loss %f (took %f ms)\n"
LLMC_LOG_TRAIN = "s:%d trl:%.4f lr:%.6f norm:%.2f\n"
LLMC_LOG_VAL = "s:%d tel:%.4f\n"
LLMC_LOG_EVAL = "s:%d eval:%.4f\n"
LLMC = {"train_num_batches": 20, "val_loss_every": 5, "nan_step": 13, "c_steps": 12}
# Every step-line format train_gpt2.cu has printed (git log -G 'printf0?\("step %' -- train_gpt2.cu), with the
# commit that introduced it and the arguments in the order of its call.
LLMC_HISTORY = [
    ("5983036", LLMC_CU_STEP, ("step", "total", "loss", "z", "norm", "z", "lr", "ms", "mfu", "toks")),
    ("569f9f1", "step %4d/%d | loss %7.6f (z %+.2f)| norm %6.4f | lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n",
     ("step", "total", "loss", "z", "norm", "lr", "ms", "mfu", "toks")),
    ("9374d75", "step %4d/%d | train loss %7.6f | norm %6.4f | lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n",
     ("step", "total", "loss", "norm", "lr", "ms", "mfu", "toks")),
    ("c6680a2", "step %4d/%d | train loss %7.6f | norm %6.4f | lr %.2e | %.2f ms | %.1f%% A100 fp16 MFU | %.0f tok/s\n",
     ("step", "total", "loss", "norm", "lr", "ms", "mfu", "toks")),
    ("90a745c", "step %4d/%d | train loss %7.4f | norm %6.4f | lr %.2e | %.2f ms | %.1f%% A100 fp16 MFU | %.0f tok/s\n",
     ("step", "total", "loss", "norm", "lr", "ms", "mfu", "toks")),
    ("661975c", "step %4d/%d: train loss %f norm %.4f lr %.2e (%.2f ms, %.0f tok/s)\n",
     ("step", "total", "loss", "norm", "lr", "ms", "toks")),
    ("bc58cd1", "step %4d/%d: train loss %f norm %.4f (%.2f ms, %.0f tok/s)\n",
     ("step", "total", "loss", "norm", "ms", "toks")),
    ("ce333de", "step %4d/%d: train loss %f (acc %f) (%f ms, %0f tok/s)\n", ("step", "total", "loss", "loss", "ms", "toks")),
    ("bcf7d4f", "step %4d/%d: train loss %f (acc %f) (%f ms, %d tok/s)\n", ("step", "total", "loss", "loss", "ms", "itoks")),
    ("48f2170", "step %4d/%d: train loss %f (%f ms, %d tok/s)\n", ("step", "total", "loss", "ms", "itoks")),
    ("e55ed0a", "step %d/%d: train loss %f (%f ms, %d tok/s)\n", ("step", "total", "loss", "ms", "itoks")),
    ("fdd6608", "step %d/%d: train loss %f (%f ms)\n", ("step", "total", "loss", "ms")),
    ("80f52e5", LLMC_C_STEP, ("step0", "loss", "ms")),
]

_CONV = re.compile(r"%[-+ 0#]*\d*(?:\.\d+)?[dfe%]")


def c_printf(fmt: str, *args, neg_nan: bool = True) -> str:
    """``fmt % args`` as glibc prints it: a NaN is ``-nan`` when its sign bit is set (what CUDA's
    0/0 and most NaN-producing kernels give), ``nan`` otherwise; widths are honoured."""
    out, pos, it = [], 0, iter(args)
    for m in _CONV.finditer(fmt):
        out.append(fmt[pos:m.start()])
        spec = m.group(0)
        if spec == "%%":
            out.append("%")
        else:
            v = next(it)
            s = spec % v
            if isinstance(v, float) and v != v and neg_nan:
                s = "-nan".rjust(len(s)) if s.strip() in ("nan", "+nan") else s
            out.append(s)
        pos = m.end()
    out.append(fmt[pos:])
    return "".join(out)


def write_llmc() -> dict:
    """train_gpt2.cu's loop (train_gpt2.cu:1712-1880) with its prints, a NaN from step nan_step on."""
    import math
    import random

    rnd = random.Random(0)
    p = LLMC
    out: list[str] = []
    log: list[str] = []
    loss = 4.5
    for step in range(0, p["train_num_batches"] + 1):
        last = step == p["train_num_batches"]
        broken = step >= p["nan_step"]
        if step % p["val_loss_every"] == 0 or last:
            val = math.nan if broken else loss + 0.1
            out.append(c_printf(LLMC_CU_VAL, val))
            log.append(c_printf(LLMC_LOG_VAL, step, val))
            if step > 0:
                log.append(LLMC_LOG_EVAL % (step, 0.25))  # HellaSwag accuracy: not a loss
        if last:
            break
        loss = max(0.5, loss - 0.1 + rnd.uniform(-0.02, 0.02))
        lv = math.nan if broken else loss
        norm = math.nan if broken else 1.0 + rnd.uniform(0, 0.5)
        ms = 30 + rnd.uniform(0, 2)
        out.append(c_printf(LLMC_CU_STEP, step + 1, p["train_num_batches"], lv, lv - 4, norm, 0.1, 6e-4, ms, 41.3,
                            8 * 1024 / ms * 1000))
        log.append(c_printf(LLMC_LOG_TRAIN, step, lv, 6e-4, norm))
    out.append("total average iteration time: %f ms\n" % 31.0)
    (HERE / "llmc.stdout").write_bytes("".join(out).encode())
    (HERE / "llmc_main.log").write_bytes("".join(log).encode())
    # The CPU reference trainer (train_gpt2.c:1110-1172): 0-based steps, val loss every 10 steps.
    c_out = []
    for step in range(p["c_steps"]):
        if step % 10 == 0:
            c_out.append(c_printf(LLMC_CU_VAL, 4.6))
        c_out.append(c_printf(LLMC_C_STEP, step, 4.5 - 0.1 * step, 1900.0 + step))
    (HERE / "llmc_cpu.stdout").write_bytes("".join(c_out).encode())
    # One finite, one "-nan" and one "nan" line per historical format: step 7, then 8 and 9 non-finite.
    hist = []
    for _commit, fmt, fields in LLMC_HISTORY:
        for step, lv, neg in ((7, 3.25, True), (8, math.nan, True), (9, math.nan, False)):
            vals = {"step": step, "step0": step, "total": 74, "loss": lv, "z": 0.5 if lv == lv else lv,
                    "norm": 1.25 if lv == lv else lv, "lr": 1e-4, "ms": 12.3, "mfu": 41.3, "toks": 45000.0,
                    "itoks": 45000}
            hist.append(c_printf(fmt, *[vals[f] for f in fields], neg_nan=neg))
    (HERE / "llmc_formats.stdout").write_bytes("".join(hist).encode())
    return dict(p, history_steps=[7, 8, 9], history_nan_from=8, history_formats=[c for c, _, _ in LLMC_HISTORY])


# huggingface/nanotron @ 2411b022a75fb7f7561a1bb4166706da5e1b76de, src/nanotron/logging/base.py
def human_format(num: float, billions: bool = False, divide_by_1024: bool = False) -> str:  # verbatim copy
    if abs(num) < 1:
        return "{:.3g}".format(num)
    SIZES = ["", "K", "M", "B", "T", "P", "E"]
    num = float("{:.3g}".format(num))
    magnitude = 0
    i = 0
    while abs(num) >= 1000 and i < len(SIZES) - 1:
        magnitude += 1
        num /= 1000.0 if not divide_by_1024 else 1024.0
        i += 1
    return "{}{}".format("{:f}".format(num).rstrip("0").rstrip("."), SIZES[magnitude])


NANOTRON = {"train_steps": 20, "nan_step": 14, "inf_step": 12, "grad_norm": True, "ranks": "|DP=0|PP=0|TP=0"}


def write_nanotron() -> dict:
    """Lines as LoggerWriter.add_scalars_from_list formats them, through nanotron's SafeFormatter format."""
    import datetime
    import logging
    import math

    p = NANOTRON
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record) + "\n")

    h = Collect()
    # set_logger_verbosity_format: the INFO prefix/suffix it applies to the metadata part.
    h.setFormatter(logging.Formatter(f"\033[2;3m%(asctime)s [%(levelname)s{p['ranks']}]\033[0m: %(message)s",
                                     datefmt="%m/%d %H:%M:%S"))
    lg = logging.getLogger("nanotron_corpus")
    lg.propagate = False
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    gbs, seq = 8, 256
    for it in range(1, p["train_steps"] + 1):
        loss = math.nan if it >= p["nan_step"] else 10.8 - 0.2 * it
        gn = math.inf if it == p["inf_step"] else (math.nan if it >= p["nan_step"] else 0.9 + 0.01 * it)
        ms = 1234.5 + it
        entries = [("consumed_tokens", it * gbs * seq), ("time_per_iteration_ms", ms),
                   ("tokens_per_sec", gbs * seq / (ms / 1000)), ("tokens_per_sec_per_gpu", gbs * seq / (ms / 1000) / 8),
                   ("global_batch_size", gbs * seq), ("lm_loss", loss), ("lr", 3e-4 * min(1, it / 5)),
                   ("model_tflops_per_gpu", 123.4)]
        if p["grad_norm"]:
            entries.insert(5, ("grad_norm", gn))
        strs = [f"iteration: {it} / {p['train_steps']}"] + [f"{k}: {human_format(v)}" for k, v in entries]
        strs.append(f"eta: {datetime.timedelta(seconds=int((p['train_steps'] - it) * ms / 1000))}")
        lg.info(" | ".join(strs))
    (HERE / "nanotron.stdout").write_bytes("".join(records).encode())
    return dict(p)


# ------------------------------------------------------------------------------------------ parent

def _run(python: str, kind: str, variant: str, name: str, manifest: dict, params: dict,
         job: list[str] | None = None, job_env: dict[str, str] | None = None) -> None:
    """One run, captured split and merged. ``job``: a script's argv to run instead of a child of this
    file (``{out}`` replaced by the run's temp dir), with ``job_env`` added to its environment."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("TERM", None)
    env.pop("FAULT", None)
    env.pop("FAULT_MARKER", None)
    env.update(job_env or {})
    versions = subprocess.run([python, "-c", "import importlib.metadata as m, json, sys\n"
                               "out = {'python': sys.version.split()[0]}\n"
                               "for d in ('torch', 'transformers', 'accelerate', 'pytorch-lightning', 'tqdm'):\n"
                               "    try: out[d] = m.version(d)\n"
                               "    except Exception: pass\n"
                               "print(json.dumps(out))"], capture_output=True, text=True, check=True).stdout
    for mode in ("split", "merged"):
        with tempfile.TemporaryDirectory() as d:
            cmd = [python, str(Path(__file__).resolve()), "--child", kind, "--variant", variant, "--out-dir", d]
            if job:
                cmd = [python, *(a.replace("{out}", d) for a in job)]
            if mode == "split":
                r = subprocess.run(cmd, env=env, capture_output=True, cwd=d, timeout=900)
                (HERE / f"{name}.stdout").write_bytes(r.stdout)
                (HERE / f"{name}.stderr").write_bytes(r.stderr)
                if kind == "lightning" and variant == "train_loss":
                    (HERE / f"{name}.metrics.csv").write_bytes((Path(d) / "csv" / "version_0" / "metrics.csv").read_bytes())
            else:
                r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=d, timeout=900)
                (HERE / f"{name}.merged").write_bytes(r.stdout)
            if r.returncode != 0 and not job:  # a job with a NaN and no supervisor ends non-finite: exit 1
                sys.stderr.write((r.stderr or r.stdout or b"").decode(errors="replace")[-4000:])
                raise SystemExit(f"{name} ({mode}) failed with {r.returncode}")
    manifest[name] = {"kind": kind, "variant": variant, "params": params, "versions": json.loads(versions)}
    print(f"captured {name}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--variant")
    ap.add_argument("--out-dir")
    ap.add_argument("--hf4-python", help="an interpreter with transformers<5")
    ap.add_argument("--only", help="comma-separated: hf5, hf4, lightning, loop, jobs, synthetic")
    a = ap.parse_args()
    if a.child:
        {"hf": child_hf, "lightning": child_lightning, "loop": child_loop}[a.child](a.variant, a.out_dir)
        return
    only = set((a.only or "hf5,hf4,lightning,loop,jobs,synthetic").split(","))
    mpath = HERE / "manifest.json"
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {}
    me = sys.executable
    if "hf5" in only:
        for v in ("filter_on", "filter_off", "printer", "logprefix"):
            _run(me, "hf", v, f"hf5_{v}", manifest, HF)
        _run(me, "hf", "resume", "hf5_resume", manifest, HF_RESUME)
    if "hf4" in only and a.hf4_python:
        for v in ("filter_on", "filter_off"):
            _run(a.hf4_python, "hf", v, f"hf4_{v}", manifest, HF)
        _run(a.hf4_python, "hf", "resume", "hf4_resume", manifest, HF_RESUME)
    if "lightning" in only:
        for v in ("train_loss", "loss", "rich"):
            _run(me, "lightning", v, f"pl_{v}", manifest, PL)
    if "loop" in only:
        for v in ("pipes", "colon", "equals"):
            _run(me, "loop", v, f"loop_{v}", manifest, LOOP)
    if "jobs" in only:
        jobs_dir = HERE.parent / "trainer_scripts"
        for name, p in JOBS.items():
            args = [str(jobs_dir / p["script"]), "--out_dir", "{out}", "--steps", str(p["steps"]),
                    "--save_every", str(p["save_every"])]
            if "log_every" in p:
                args += ["--log_every", str(p["log_every"])]
            _run(me, "job", "nan", name, manifest, p, job=args, job_env={"FAULT": f"nan@{p['nan_step']}"})
    if "synthetic" in only:
        manifest["llmc"] = {"kind": "llmc", "variant": "from-source", "params": write_llmc(), "versions": {
            "llm.c": "karpathy/llm.c@f1e2ace651495b74ae22d45d1723443fd00ecd3a"}}
        manifest["nanotron"] = {"kind": "nanotron", "variant": "from-source", "params": write_nanotron(), "versions": {
            "nanotron": "huggingface/nanotron@2411b022a75fb7f7561a1bb4166706da5e1b76de"}}
    mpath.write_text(json.dumps(dict(sorted(manifest.items())), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
