"""Hang detection: per-rank heartbeats from ``supervisor.client``, plus output / progress stalls.

The client rewrites ``TSUP_HEARTBEAT_DIR/heartbeat-rank<R>.json`` at most every
``client_interval_s`` while the job calls ``heartbeat()`` (see ``supervisor/client/_heartbeat.py``
for the record). :class:`HeartbeatMonitor` reads those files every ``check_interval_s`` from the
main loop's ``poll(now)`` and emits one ``hang`` detection per attempt when:

- a rank's heartbeat is older than its timeout: ``timeout_s`` when set; otherwise *learned*:
  ``initial_timeout_s`` until ``learn_after`` intervals were seen, then ``max(learn_floor_s,
  longest interval x learn_factor)``, as NVIDIA's resiliency extension does. Intervals measured
  around a checkpoint do not count; what was learned carries over to later attempts of the run;
- a rank says it is checkpointing (``client.checkpointing()``) for longer than
  ``checkpoint_timeout_s``;
- a rank never sent its first heartbeat within ``startup_timeout_s`` of the launch. This applies
  only when the job is known to use the client (``expect_heartbeats``, or an earlier attempt of
  the run sent heartbeats), since any command may be supervised without it; ranks missing from a
  known ``WORLD_SIZE`` count too;
- (jobs without the client, on by default) the job's output says it stopped: see
  :class:`~supervisor.watch.liveness.OutputLiveness` (no new step and no line for the learned or
  configured timeout). A job with heartbeats keeps being judged by them alone;
- (explicit extras) no output line for ``output_stall_timeout_s`` or no new training step for
  ``progress_stall_timeout_s``, even while heartbeats flow.

Each hang judged so goes through the :class:`~supervisor.watch.hanggate.HangGate` first: it
looks at the job (CPU time, two stack samples) and holds a busy job's detection back, up to
``max_busy_s`` (see that module for the bound).

The log watcher reports activity through ``note_output`` / ``note_step`` (pass this monitor as
``LogWatcher(..., progress=monitor)``).

Clocks: ``poll(now)`` gets the main loop's monotonic time; heartbeat records carry the writer's
wall-clock time, compared once, when a record is first seen, with the injected ``wall()``; from
then on ages are measured on the monotonic clock (immune to wall-clock jumps).

Client metric reports (``metrics-rank<R>.jsonl`` in the same directory) are tailed by an internal
:class:`~supervisor.watch.tail.FileTailer` and fed to ``metrics_sink`` (the LogWatcher), where
they become ``fmt="client"`` records that the same detectors judge.

The folder is the job's to write: it is listed and read within the bounds of
:mod:`~supervisor.watch.hbfiles` (a bounded listing a check, at most ``MAX_RANK_FILES`` files
followed, 4 KiB of each, no link or FIFO opened); a record counts only for the rank its file is
named after.
"""

from __future__ import annotations

import glob as globlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import structlog

from ..checkpoints.discovery import written_by_supervisor
from ..events import AttemptContext, Cause, Emit, LineSink
from ..core.observations import Detection
from ..redact import redact_line
from .config import HeartbeatConfig, client_env as client_env  # client_env: its old home
from .hanggate import HangGate
from .hbfiles import MAX_RANK_FILES, HeartbeatDir, missing_ranks, positive_int
from .liveness import Cadence, OutputLiveness, Silence
from .quiet import QuietLog
from .tail import FileTailer

log = structlog.get_logger("supervisor.watch")


@dataclass
class _Rank:
    rank: int
    seq: int
    t: float  # writer's wall time of the current record
    changed_mono: float  # our monotonic estimate of when the current record was written
    step: int | None
    state: str
    pid: int | None
    world_size: int | None


class HeartbeatMonitor:
    """A :class:`~supervisor.events.Monitor`; also the ``progress`` sink of the LogWatcher.

    One instance per run (learned timeouts carry over); ``start`` / ``stop`` per attempt.
    """

    name = "heartbeat"

    def __init__(self, cfg: HeartbeatConfig, *, metrics_sink: LineSink | None = None,
                 wall: Callable[[], float] = time.time, tail_poll_interval_s: float = 0.5,
                 gate: HangGate | None = None) -> None:
        self.cfg = cfg
        self._gate = gate or HangGate(cfg)  # without a probe: no look, a hang goes out at once
        self._wall = wall
        self._metrics_sink = metrics_sink
        self._tail_poll = tail_poll_interval_s
        self._tailer: FileTailer | None = None
        self._ctx: AttemptContext | None = None
        self._emit: Emit | None = None
        self._ranks: dict[int, _Rank] = {}
        self._fired: Detection | None = None
        self._started = 0.0
        self._start_wall = 0.0
        self._last_check = -math.inf
        self._last_now = 0.0
        self._last_output: float | None = None
        self._last_metric: float | None = None
        self._seen_heartbeats = False  # any attempt of this run
        self._cadence = Cadence(cfg)
        self._learned_logged = False
        self._output = OutputLiveness(cfg)
        self._output_learned_logged = False
        self._output_off_logged: bool | str = False  # True: the notice went out; "on": and was taken back
        self._silence: Silence | None = None  # the output silence judged last (learned once it fires)
        self._dir_problem: str | None = None
        self._dir: HeartbeatDir | None = None
        self._quiet = QuietLog(log)  # refused files: once per 300 s a name

    # -- Monitor --------------------------------------------------------------------------

    def start(self, ctx: AttemptContext, emit: Emit) -> None:
        self._ctx = ctx
        self._emit = emit
        self._ranks.clear()
        self._fired = None
        self._started = ctx.started_monotonic
        self._start_wall = self._wall()
        self._last_check = -math.inf
        self._last_output = None
        self._last_metric = None
        self._output.start(ctx.started_monotonic, ctx.resume_step)
        self._gate.start(ctx)
        new_dir = self._dir is None or self._dir.path != str(ctx.heartbeat_dir)
        if new_dir:
            if self._dir is not None:
                self._dir.close()
            self._dir = HeartbeatDir(str(ctx.heartbeat_dir), self._quiet)
        if self._metrics_sink is not None:
            if self._tailer is not None and new_dir:
                # A new heartbeat directory for this attempt: follow that one (from its start).
                self._tailer.close()
                self._tailer = None
            if self._tailer is None:
                # The folder is the attempt's own: what is in it when we start was written by this
                # attempt (before the monitors started), not history. Its files are named to the
                # tailer as the bounded listing finds them (no glob over the job's folder).
                self._tailer = FileTailer([], Path(ctx.heartbeat_dir), self._metrics_sink,
                                          poll_interval_s=self._tail_poll, history_at_start=False,
                                          follow_links=False)
            self._tailer.start(ctx, emit)

    def stop(self) -> None:
        self._gate.stop()
        if self._tailer is not None:
            self._tailer.stop()

    def close(self) -> None:
        if self._dir is not None:
            self._dir.close()
        if self._tailer is not None:
            self._tailer.close()
            self._tailer = None

    def note_output(self, now: float, line: str | None = None) -> None:
        """Any output line (``line``: the last of the batch, for the hang evidence)."""
        self._last_output = now
        if line is not None:
            self._output.line(now, line)

    def note_step(self, now: float, step: int | None, origin: str = "", lag: float = 0.0) -> None:
        """A new training step was printed (``step`` None: a metric line that names no step), seen in
        ``origin``, read ``lag`` seconds after it was written (a metric file)."""
        self._last_metric = now
        self._output.step(now, step, origin, lag)

    def poll(self, now: float) -> None:
        if self._ctx is None:
            return
        self._last_now = now
        if now - self._last_check < self.cfg.check_interval_s:
            return
        self._last_check = now
        self._read(now)
        if self._fired is None:
            self._silence = None
            det = self._gate.offer(now, self._evaluate(now))
            if det is not None:
                self._fired = det
                if det.source == "output" and self._silence is not None:
                    self._output.fired(self._silence)  # learned only from a silence that was a hang
                log.warning("hang_detected", summary=det.summary, **{k: v for k, v in det.details.items()
                                                                      if isinstance(v, (int, float, str))},
                            next="the runner dumps stacks (if enabled) and stops the job")
                assert self._emit is not None
                self._emit(det)

    # -- reading ---------------------------------------------------------------------------

    def _read(self, now: float) -> None:
        assert self._ctx is not None and self._dir is not None
        hb_dir = self._dir
        heads = hb_dir.read()
        self._dir_problem = hb_dir.problem
        if self._tailer is not None:
            # escaped: the tailer globs its patterns, and a state dir's path may hold "[" or "*"
            self._tailer.add_paths([globlib.escape(p) for p in hb_dir.new_metric_files()])
        wall = self._wall()
        for name, named_rank, raw in heads:
            try:
                rec = json.loads(raw.decode("utf-8", "replace").strip() or "null")
                rank = int(rec["rank"])
                seq = int(rec.get("seq", 0))
                t = float(rec["t"])
                if not math.isfinite(t) or rank != named_rank:
                    raise ValueError("not this file's rank's record")  # one file, one rank: _ranks stays bounded
            except (ValueError, KeyError, TypeError, OverflowError):
                hb_dir.rejected(name)
                continue  # a torn or foreign file: judged on the next read
            attempt = rec.get("attempt")
            if attempt is not None and attempt != self._ctx.attempt:
                hb_dir.rejected(name)
                continue  # left over from an earlier attempt
            cur = self._ranks.get(rank)
            step = rec.get("step") if isinstance(rec.get("step"), int) else None
            state = str(rec.get("state", "running"))[:32]
            if cur is None:
                if t < self._start_wall - 2.0 or len(self._ranks) >= MAX_RANK_FILES:
                    hb_dir.rejected(name)
                    continue  # written before this attempt started (an earlier run): not ours
                hb_dir.accepted(name)
                changed = max(self._started, now - max(0.0, wall - t))
                self._ranks[rank] = _Rank(rank, seq, t, changed, step, state, positive_int(rec.get("pid")),
                                          positive_int(rec.get("world_size")))
                if not self._seen_heartbeats:
                    self._seen_heartbeats = True
                    log.info("heartbeat_first", rank=rank, attempt=self._ctx.attempt,
                             next="hang detection by heartbeat age is on for this run")
                continue
            hb_dir.accepted(name)  # a known rank's file (found again after it was re-made)
            if seq != cur.seq or t != cur.t:
                interval = t - cur.t
                if cur.state != "checkpointing" and state != "checkpointing":
                    self._cadence.add(interval)
                cur.seq, cur.t, cur.step, cur.state = seq, t, step, state
                cur.changed_mono = min(now, now - max(0.0, wall - t))
                cur.pid = positive_int(rec.get("pid")) or cur.pid
                cur.world_size = positive_int(rec.get("world_size")) or cur.world_size

    # -- judging ----------------------------------------------------------------------------

    def timeout(self) -> tuple[float, str]:
        """The heartbeat timeout in force and where it comes from (config, learned, initial)."""
        value, source = self._cadence.timeout()
        if source == "learned" and not self._learned_logged:
            self._learned_logged = True
            log.info("heartbeat_timeout_learned", timeout_s=round(value, 3), intervals=self._cadence.intervals,
                     max_interval_s=round(self._cadence.max_interval, 3),
                     next="a rank silent for longer than this is reported as hung")
        return value, source

    def _evaluate(self, now: float) -> Detection | None:
        cfg = self.cfg
        since_start = now - self._started
        expect = cfg.expect_heartbeats or self._seen_heartbeats
        if expect and since_start > cfg.startup_timeout_s:
            world = max((r.world_size or 0 for r in self._ranks.values()), default=0)
            missing = missing_ranks(world, self._ranks)
            if not self._ranks:
                return self._hang("startup", None, since_start, cfg.startup_timeout_s, "config",
                                  f"no rank sent a heartbeat within {cfg.startup_timeout_s:g} s of the launch")
            if missing:
                shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
                return self._hang("startup", None, since_start, cfg.startup_timeout_s, "config",
                                  f"rank(s) {shown} of {world} sent no heartbeat within "
                                  f"{cfg.startup_timeout_s:g} s of the launch")
        limit, how = self.timeout()
        worst: tuple[float, _Rank, float, str] | None = None
        for r in self._ranks.values():
            age = now - r.changed_mono
            lim, src = (cfg.checkpoint_timeout_s, "checkpointing") if r.state == "checkpointing" else (limit, how)
            if age > lim and (worst is None or age - lim > worst[0] - worst[2]):
                worst = (age, r, lim, src)
        if worst is not None:
            age, r, lim, src = worst
            doing = "checkpointing for" if r.state == "checkpointing" else "no heartbeat for"
            return self._hang("checkpointing" if r.state == "checkpointing" else "heartbeat", r, age, lim, src,
                              f"rank {r.rank} {doing} {age:.1f} s (timeout {lim:g} s, {src})"
                              + (f"; last step {r.step}" if r.step is not None else ""))
        if not self._seen_heartbeats and cfg.output_liveness:
            det = self._judge_output(now)
            if det is not None:
                return det
        if cfg.output_stall_timeout_s is not None:
            last = self._last_output if self._last_output is not None else self._started
            if now - last > cfg.output_stall_timeout_s:
                return self._hang("output_stall", None, now - last, cfg.output_stall_timeout_s, "config",
                                  f"the job printed nothing for {now - last:.1f} s "
                                  f"(output_stall_timeout_s {cfg.output_stall_timeout_s:g})")
        if cfg.progress_stall_timeout_s is not None:
            last = self._last_metric if self._last_metric is not None else self._started
            if now - last > cfg.progress_stall_timeout_s:
                return self._hang("progress_stall", None, now - last, cfg.progress_stall_timeout_s, "config",
                                  f"no new training step logged for {now - last:.1f} s "
                                  f"(progress_stall_timeout_s {cfg.progress_stall_timeout_s:g})")
        return None

    def _judge_output(self, now: float) -> Detection | None:
        out = self._output
        if self._output_off_logged is True and out.run_has_steps:
            self._output_off_logged = "on"  # once: the notice below no longer holds
            log.info("output_liveness_on", next="training steps are seen now: a job that stops printing "
                     "them is judged by the learned timeout (the notice 'output_liveness_off' no longer holds)")
        if out.signal == "none":
            # Only when no progress signal was seen at all: no parsed step (output or metric file),
            # no heartbeat (this is not reached with heartbeats), no metric-file record with a step.
            if (out.run_has_output and self._last_metric is None and not self._output_off_logged
                    and now - self._started > 60):
                self._output_off_logged = True
                log.info("output_liveness_off", next="this job sends no heartbeats and prints no training step "
                         "we can parse, so a hang is detected only with [heartbeat] timeout_s "
                         "(wrap --heartbeat-timeout), a [detectors.parsers] regex, or supervisor.client")
            return None
        if out.steps.learned and out.cfg.timeout_s is None and not self._output_learned_logged:
            self._output_learned_logged = True
            value, _ = out.steps.timeout()
            log.info("step_timeout_learned", timeout_s=round(value, 3), intervals=out.steps.intervals,
                     max_interval_s=round(out.steps.max_interval, 3), timeout_from=out.basis(),
                     next="a job printing no new step and no line for longer than this is reported as hung")
        silence = out.check(now)
        if silence is not None and silence.kind != "startup":
            written = self._checkpoint_written_since(now, silence.silent_s)
            if written is not None:
                out.activity(written)  # a long, silent save: the job is at work
                silence = out.check(now)
        if silence is None:
            return None
        self._silence = silence
        return self._silence_detection(silence)

    def _checkpoint_written_since(self, now: float, silent_s: float) -> float | None:
        """Monotonic time of the newest write in the checkpoint dir, when it is within the silence.

        Only looked at when a hang is about to be declared, so its cost (a bounded scan, two
        levels deep: HF checkpoint-N/ and DCP step-N/ folders) is paid rarely.
        """
        assert self._ctx is not None
        root = self._ctx.checkpoint_dir
        if root is None:
            return None
        newest = 0.0
        seen = 0
        stack: list[tuple[str, int]] = [(str(root), 0)]
        try:
            while stack and seen < 5000:
                path, depth = stack.pop()
                with os.scandir(path) as it:
                    for e in it:
                        seen += 1
                        if written_by_supervisor(e.name):
                            continue  # our own manifests and notes land seconds after each save
                        if e.is_dir(follow_symlinks=False):
                            if depth < 2:
                                stack.append((e.path, depth + 1))
                            continue  # a folder's mtime moves when we add a note inside: files only
                        try:
                            newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
                        except OSError:
                            continue
        except OSError:
            return None
        if not newest:
            return None
        age = max(0.0, self._wall() - newest)
        return now - age if age < silent_s else None

    def _silence_detection(self, s: Silence) -> Detection:
        summary = f"the job printed {s.summary()}"
        last_line = redact_line(s.last_line, limit=200) if s.last_line else None  # stored: no secret, bounded
        details: dict[str, object] = {"kind": "output_startup" if s.kind == "startup" else "output_silence",
                                      "signal": s.kind,
                                      "age_s": round(s.silent_s, 3), "timeout_s": s.timeout_s,
                                      "timeout_source": s.timeout_source, "last_step": s.last_step,
                                      "last_line": last_line}
        evidence = summary + (f"; last line: {last_line!r}" if last_line else "")
        return Detection(at=self._wall(), cause=Cause.HANG, summary=summary, source="output", step=s.last_step,
                         onset_step=s.last_step, value=round(s.silent_s, 3), evidence=evidence, details=details)

    def _hang(self, kind: str, r: _Rank | None, age: float, limit: float, src: str, summary: str) -> Detection:
        details: dict[str, object] = {"kind": kind, "age_s": round(age, 3), "timeout_s": limit,
                                      "timeout_source": src}
        if r is not None:
            details.update(rank=r.rank, pid=r.pid, state=r.state)
        return Detection(at=self._wall(), cause=Cause.HANG, summary=summary, source="heartbeat",
                         step=r.step if r else None, onset_step=r.step if r else None, value=round(age, 3),
                         evidence=summary, details=details)

    # -- status ------------------------------------------------------------------------------

    def fired_stacks(self) -> str | None:
        """The stacks file of the look that judged the fired hang (None: no look, or an old one)."""
        stacks = self._fired.details.get("stacks") if self._fired is not None else None
        return stacks if isinstance(stacks, str) else None

    def heartbeats(self) -> dict[int, float]:
        """{rank: seconds since its last heartbeat} as of the last poll (``status --json``)."""
        return {r.rank: round(max(0.0, self._last_now - r.changed_mono), 3) for r in sorted(
            self._ranks.values(), key=lambda r: r.rank)}

    def timeout_in_force(self) -> dict[str, object]:
        """``status``'s ``hang_timeout``: the timeout that judges the job now and where it came from."""
        if self._seen_heartbeats or not self.cfg.output_liveness:
            limit, how = self._cadence.timeout()
            return {"signal": "heartbeats", "timeout_s": round(limit, 3), "timeout_source": how,
                    "timeout_from": self._cadence.basis()}
        out = self._output.status(self._last_now)
        return {k: out[k] for k in ("signal", "timeout_s", "timeout_source", "timeout_from", "silent_s")}

    def status(self) -> Mapping[str, object]:
        limit, how = self.timeout()
        return {
            "heartbeats": self.heartbeats(),
            "timeout_s": limit,
            "timeout_source": how,
            "intervals_seen": self._cadence.intervals,
            "output_liveness": None if self._seen_heartbeats or not self.cfg.output_liveness
            else self._output.status(self._last_now),
            "checkpointing": [r.rank for r in self._ranks.values() if r.state == "checkpointing"],
            "problem": self._dir_problem,
            "fired": None if self._fired is None else self._fired.summary,
            "look": None if self._gate.last is None else self._gate.last.to_json(),
            "metrics_tail": None if self._tailer is None else self._tailer.status(),
        }
