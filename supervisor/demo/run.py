"""``transformer-supervisor demo``: the main job, narrated.

A tiny character-level GPT (``supervisor/demo/train.py``, run with this Python, which has torch)
trains on the CPU under the real daemon (the same daemon as ``run``), with faults injected
*by the job itself* (``--faults``). The daemon's own event lines go to ``OUT/daemon.log``; the
console gets one plain sentence per detection, decision and recovery, a progress line every
100 steps, and at the end a summary and the report (``OUT/report/report.html`` + PNG).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping, MutableMapping, TextIO

import structlog

from ..config.model import config_from_table
from . import DEFAULT_STEPS, DemoLayout, demo_job_argv, format_faults
from ..daemon.wiring import build_daemon
from .progress import DemoProgress
from ..eventnames import EventName
from ..logsetup import logfmt_line, mask_secrets, quiet_library_logs
from ..narration import narrate, stamp



class Narrator:
    """A structlog processor: every event to the daemon log (logfmt), the important ones to the
    console as sentences. It ends the chain (DropEvent), so nothing else prints."""

    def __init__(self, log_path: Path, console: TextIO, t0: float) -> None:
        self.log = open(log_path, "a", buffering=1)
        self.console = console
        self.t0 = t0

    def say(self, text: str) -> None:
        m, s = divmod(int(time.monotonic() - self.t0), 60)
        self.console.write(stamp(f"{m:02d}:{s:02d}", text) + "\n")
        self.console.flush()

    def __call__(self, _logger: Any, _name: str, ed: MutableMapping[str, Any]) -> Any:
        line = logfmt_line(dict(ed))
        self.log.write(line + "\n")
        text = narrate(ed)
        if text:
            self.say(text)
        raise structlog.DropEvent


def demo_config(out: Path, faults: str, steps: int, seed: int) -> Any:
    layout = DemoLayout(out)
    return config_from_table({
        "job": {"name": "demo", "command": demo_job_argv(sys.executable, out, faults, seed, steps),
                "workdir": str(out), "log_file": str(out / "job.log"),
                # Only the demo's own faults: never inherit a user's LR_SCALE or similar.
                "env": {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}},
        "checkpoints": {"dir": str(layout.checkpoint_dir)},
        "state": {"dir": str(out / "state")},
        # Short attempts are normal here (a fault every ~100 steps): 20 s of training counts as a
        # healthy run, so the backoff does not keep growing across unrelated faults.
        "policy": {"max_restarts": 10, "backoff_initial_s": 1.0, "backoff_max_s": 2.0, "healthy_after_s": 20.0},
        "shutdown": {"mode": "graceful", "grace_s": 20.0, "hang_grace_s": 2.0},
        "heartbeat": {"timeout_s": 5.0, "startup_timeout_s": 120.0},
        # This CPU is shared (2 cores, other processes): throughput swings more than on a GPU node.
        "validation": {"steps": 20, "first_step_timeout_s": 120.0, "throughput_tolerance": 0.5},
        "gpu": {"backend": "none"},
    })


def run_demo(out: Path, faults: str | None, steps: int | None, seed: int, quiet: bool = True,
             log_format: str | None = None, console: TextIO | None = None) -> int:
    console = console or sys.stdout
    out = out.resolve()
    if out.exists() and any(out.iterdir()):
        # Never delete a previous run's checkpoints: keep it beside, renamed.
        old = out.with_name(f"{out.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.move(str(out), str(old))
        console.write(f"(the previous demo output was moved to {old})\n")
    out.mkdir(parents=True)
    steps = steps or DEFAULT_STEPS
    fault_list = format_faults(faults)
    cfg = demo_config(out, fault_list, steps, seed)
    t0 = time.monotonic()
    narrator = Narrator(out / "daemon.log", console, t0)
    quiet_library_logs()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                                    mask_secrets, structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                                    narrator], cache_logger_on_first_use=False)
    narrator.say(f"transformer-supervisor demo: a tiny GPT, {steps} steps on the CPU, faults: {fault_list}")
    narrator.say(f"   output in {out} (daemon events in daemon.log, the job's output in job.log)")
    passthrough = None if quiet else sys.stdout.buffer
    devnull = open(os.devnull, "wb") if quiet else None
    runner = build_daemon(cfg, passthrough=devnull or passthrough, extra=[DemoProgress(narrator.say)])
    code = runner.run()
    wall = time.monotonic() - t0
    facts, attempts = _summary(out, cfg, wall)
    from ..report.collect import write_run_report

    html, png = write_run_report(cfg.state_dir(), out / "report", summary=facts)
    narrator.say(f"== finished in {wall:.0f} s with exit code {code}: {runner.run_view().exit_reason}")
    for line in attempts + [f"{k}: {v}" for k, v in facts.items()]:
        narrator.say("   " + line)
    narrator.say(f"== report: {html}" + (f"  (loss curve: {png})" if png else ""))
    return code


def _summary(out: Path, cfg: Any, wall: float) -> tuple[dict[str, str], list[str]]:
    """The run's facts in words and units (the console's last lines and the report's summary), and
    one line per attempt."""
    from ..humanize import duration, durations_by
    from ..ledger.store import Ledger
    from ..report.collect import goodput_from_ledger

    facts: dict[str, str] = {"wall time": duration(wall)}
    try:
        js = json.loads((DemoLayout(out).summary_file).read_text())
    except (OSError, ValueError):
        js = {}
    for key, label in (("step", "final step"), ("loss", "final loss"), ("val_loss", "final val loss")):
        v = js.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            facts[label] = f"{v:.4f}" if isinstance(v, float) else str(v)
    led = Ledger(cfg.state_dir(), readonly=True)
    try:
        h = led.history()
        attempts = [_attempt_line(a) for a in h["attempts"]]
        gp = goodput_from_ledger(led, h["run_id"])
        if gp:
            facts["goodput"] = f"{gp['ratio']:.1%} of the wall time was training that was kept"
            facts["lost time by cause"] = durations_by(gp["lost_by_cause"]) or "none"
        quarantined = [Path(str(e["data"]["source"])).name for e in h["events"]
                       if e["event"] == EventName.CHECKPOINT_QUARANTINED and e.get("data")]
        if quarantined:
            facts["quarantined"] = ", ".join(quarantined)
    finally:
        led.close()
    return facts, attempts


def _attempt_line(a: Mapping[str, Any]) -> str:
    rstep, cause, verdict = a["resume_step"], a["cause"], (a.get("validation") or {}).get("verdict")
    return (f"attempt {a['attempt']}: " + (f"resumed at step {rstep}, " if rstep is not None else "fresh, ")
            + (f"ended by {cause} -> {a['action']}" if cause else "finished")
            + (f", validation {verdict}" if verdict else ""))
