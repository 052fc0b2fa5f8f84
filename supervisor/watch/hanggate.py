"""Look before you kill: between a hang the heartbeat monitor judged and its detection.

:class:`HangGate` sits in :meth:`HeartbeatMonitor.poll <supervisor.watch.heartbeat.HeartbeatMonitor.poll>`
(the main loop, every ``check_interval_s``). The monitor offers it what it judged each poll:

- a hang, first time: the gate starts a look (:func:`supervisor.watch.look.take_look`) on a
  thread of its own (the look waits ``look_s`` between two stack samples; the main loop must
  not) and holds the detection back;
- the look's verdict, fed back on a later poll: **hung** -> the detection goes out, with the
  look's reason in its evidence and the stacks file in its details; **busy** -> ``on_busy`` is
  told (the daemon records ``hang_suspected``) and the gate looks again after the timeout that
  fired (at most what is left of ``max_busy_s``);
- still silent ``max_busy_s`` after the first suspicion: a hang anyway, busy or not.
- no hang any more (the job printed a step, a heartbeat came): the suspicion is over.

The bound: a hung job is detected within timeout + ``look_s`` + two py-spy samples (each at
most ``dump_stacks_timeout_s``, typically under half a second) + ``check_interval_s``; a busy
one within timeout + ``max_busy_s`` (+ one look).
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Callable

import structlog

from ..events import AttemptContext
from ..core.observations import Detection
from .config import HeartbeatConfig
from .look import LookResult, ProcessProbe, SystemProbe, take_look

log = structlog.get_logger("supervisor.watch")

OnBusy = Callable[[Detection, LookResult, float], None]  # (the held detection, the look, busy for s)


class HangGate:
    def __init__(self, cfg: HeartbeatConfig, *, probe: ProcessProbe | None = None,
                 on_busy: OnBusy | None = None) -> None:
        self.cfg = cfg
        self.probe = probe
        self.on_busy = on_busy
        self._ctx: AttemptContext | None = None
        self._cancel = threading.Event()
        self._look: Future[LookResult] | None = None
        self._suspect_since: float | None = None
        self._next_look = 0.0
        self.last: LookResult | None = None

    @property
    def enabled(self) -> bool:
        return self.probe is not None and self.cfg.look_s > 0

    def start(self, ctx: AttemptContext) -> None:
        self.stop()
        self._ctx = ctx
        self._cancel = threading.Event()
        self._look = None
        self._suspect_since = None
        self.last = None

    def stop(self) -> None:
        self._cancel.set()  # a look under way ends its wait at once; its verdict is dropped

    def offer(self, now: float, det: Detection | None) -> Detection | None:
        """What the monitor judged now -> the detection to emit now (None: nothing, or held)."""
        if det is None or not self.enabled or self._ctx is None:
            if det is None and self._suspect_since is not None:
                if self._look is not None and not self._look.done():
                    return None  # it ends within the look; its verdict is then dropped
                self._look = None
                log.info("hang_suspicion_over", busy_for_s=round(now - self._suspect_since, 1),
                         next="the job shows progress again; hang detection goes on as before")
                self._suspect_since = None
            return det
        if self._suspect_since is None:
            self._suspect_since = now
            self._next_look = now
        busy_for = now - self._suspect_since
        if self._look is not None:
            if not self._look.done():
                return None
            look, self._look = self._look, None
            try:
                res = look.result()
            except Exception as exc:  # a failed look must not hide the hang
                log.warning("hang_look_failed", error=repr(exc), next="the hang is reported without a look")
                return det
            self.last = res
            if not res.look.procs:  # nobody left to be hung: the job ended, its exit (not a silence) decides
                self._next_look = now + self.cfg.look_s
                return None
            if not res.verdict.busy:
                return self._with_look(det, res, "hung")
            if busy_for >= self.cfg.max_busy_s:
                return self._bounded(det, busy_for)
            timeout = det.details.get("timeout_s")
            again = float(timeout) if isinstance(timeout, (int, float)) else self.cfg.learn_floor_s
            self._next_look = now + max(self.cfg.look_s, min(again, self.cfg.max_busy_s - busy_for))
            if self.on_busy is not None:
                self.on_busy(det, res, busy_for)
            return None
        if busy_for >= self.cfg.max_busy_s:
            return self._bounded(det, busy_for)
        if now >= self._next_look:
            self._look = self._start_look()
        return None

    def _start_look(self) -> Future[LookResult]:
        ctx, probe, cfg, cancel = self._ctx, self.probe, self.cfg, self._cancel
        assert ctx is not None and probe is not None
        fut: Future[LookResult] = Future()
        stacks_dir: Path | None = ctx.state_dir / "stacks" if cfg.dump_stacks else None

        def run() -> None:
            try:
                fut.set_result(take_look(probe, ctx.pid, window_s=cfg.look_s,
                                         sample_timeout_s=min(cfg.dump_stacks_timeout_s, 5.0),
                                         stacks_dir=stacks_dir, label=f"attempt{ctx.attempt}-look",
                                         wait=cancel.wait))
            except BaseException as exc:  # handed to the main loop, never raised here
                fut.set_exception(exc)

        log.info("hang_look_started", window_s=cfg.look_s, pid=ctx.pid,
                 next="CPU time and stack samples decide: busy (extend) or hung (stop)")
        threading.Thread(target=run, name="hang-look", daemon=True).start()
        return fut

    def _with_look(self, det: Detection, res: LookResult, verdict: str) -> Detection:
        evidence = f"{det.evidence or det.summary}; looked {res.look.window_s:.1f} s: {verdict}: {res.verdict.reason}"
        details = {**det.details, "look": res.to_json(), "stacks": str(res.stacks_file) if res.stacks_file else None}
        return replace(det, evidence=evidence, details=details)

    def _bounded(self, det: Detection, busy_for: float) -> Detection:
        summary = f"{det.summary}; busy but silent for {busy_for:.0f} s (max_busy_s {self.cfg.max_busy_s:g})"
        if self.last is not None:
            det = self._with_look(det, self.last, "busy")
            det = replace(det, details={**det.details, "stacks": None})  # old: a fresh dump is taken
        return replace(det, summary=summary, evidence=f"{summary}; {det.evidence or ''}".rstrip("; "),
                       details={**det.details, "busy_for_s": round(busy_for, 1), "max_busy_s": self.cfg.max_busy_s})


def system_gate(cfg: HeartbeatConfig, on_busy: OnBusy | None) -> HangGate:
    """The daemon's gate: psutil and py-spy."""
    return HangGate(cfg, probe=SystemProbe(), on_busy=on_busy)
