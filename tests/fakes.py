"""Small fakes behind the daemon's ports (``supervisor/daemon/ports.py``), so the runner's wiring
is tested in milliseconds: no process, no socket, no SQLite, a clock the test moves."""
from __future__ import annotations

import json

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from supervisor.config.model import Config, config_from_table
from supervisor.core.messages import ExitInfo, Resume
from supervisor.daemon.checkpointstore import Booked, Chosen
from supervisor.daemon.plugin import Plugin
from supervisor.daemon.progress import GoodputPlugin, ValidationPlugin
from supervisor.daemon.watchconcern import WatchPlugin
from supervisor.daemon.ports import Ports
from supervisor.events import Action, Cause
from supervisor.core.observations import MetricRecord
from supervisor.health.gate import GateVerdict
from supervisor.ledger.store import AttemptRow
from supervisor.job.osapi import OsApi, ProcRef, signal_name
from supervisor.job.catchup import OutputLag
from supervisor.job.output import SinkFanout
from supervisor.daemon.runner import Runner


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t
        self.wall0 = 1_700_000_000.0 - t

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.wall0 + self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass(frozen=True)
class _Ref(ProcRef):
    create_time: float = 1.0

    def alive(self) -> bool:
        return True


class FakeJob:
    """A job that runs until told to exit, or until it gets a signal it does not ignore."""

    def __init__(self, pid: int, ignore: Sequence[int] = ()) -> None:
        self.pid = self.pgid = pid
        self.leader: ProcRef = _Ref(pid)
        self.known: dict[int, ProcRef] = {pid: self.leader}
        self.status: int | None = None
        self.exit: ExitInfo | None = None
        self.ignore = set(ignore)
        self.signals: list[int] = []
        self.leftovers = False  # processes of the group outlive the leader
        self.closed = False

    # -- what the test does ---------------------------------------------------------------
    def exits(self, code: int = 0, killed_by: int | None = None) -> None:
        if killed_by is not None:
            name = signal_name(killed_by)
            self.exit = ExitInfo(None, name, Cause.CRASH, f"killed by {name}")
        elif code == 0:
            self.exit = ExitInfo(0, None, None, "exited 0")
        else:
            self.exit = ExitInfo(code, None, Cause.CRASH, f"exit {code}")
        self.status = code if killed_by is None else 128 + killed_by

    # -- the Job port ---------------------------------------------------------------------
    def refresh_tree(self, now: float) -> None:
        pass

    def reap_orphans(self) -> None:
        pass

    def poll(self) -> int | None:
        return self.status

    def group_alive(self) -> bool:
        return self.status is None or self.leftovers

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self.leftovers = False
        if sig in (signal.SIGTERM, signal.SIGKILL) and sig not in self.ignore and self.status is None:
            self.exits(killed_by=sig)

    def pids(self) -> list[int]:
        return [self.pid] if self.group_alive() else []

    def pumps_done(self, timeout: float = 0.0) -> bool:
        return True

    def output_lag(self) -> OutputLag:
        return OutputLag()  # no keeper, nothing behind

    def cut_output(self) -> OutputLag:
        return OutputLag()

    def close(self) -> None:
        self.closed = True


class FakeLauncher:
    def __init__(self) -> None:
        self.specs: list[Any] = []
        self.jobs: list[FakeJob] = []
        self.fail_with: OSError | None = None
        self.ignore: Sequence[int] = ()
        self.progressed_at: list[float] = []  # each turn that saw an attempt's training step

    def launch(self, spec: Any, log_path: Path | None, on_eof: Callable[[str], None]) -> FakeJob:
        self.specs.append(spec)
        if self.fail_with is not None:
            raise self.fail_with
        job = FakeJob(4000 + len(self.jobs), self.ignore)
        self.jobs.append(job)
        return job

    def exit_info(self, job: Any, *, evidence: bool) -> ExitInfo:
        assert job.exit is not None
        return job.exit

    def close(self) -> None:
        self.closed = True

    def discard_standby(self) -> None:
        self.standby_discarded = True

    def progressed(self, now: float) -> None:
        self.progressed_at.append(now)

    def standby_status(self) -> dict[str, Any]:
        return {"state": "off"}

    @property
    def job(self) -> FakeJob:
        return self.jobs[-1]


class FakeLedger:
    """The ledger's port in memory."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.rows: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.metric_rows: list[dict[str, Any]] = []
        self.updates: list[tuple[int, dict[str, Any], int]] = []  # (attempt, fields, writing thread) in order
        self.closed = False
        self.continued_config: Any = None  # a new run each time

    def open_run(self, name: str, config_json: Mapping[str, Any]) -> tuple[str, bool]:
        self.runs["run-1"] = {"name": name, "state": "running"}
        return "run-1", False

    def end_run(self, run_id: str, state: str, exit_code: int, reason: str) -> None:
        self.runs[run_id].update(state=state, exit_code=exit_code, reason=reason)

    def next_attempt_number(self, run_id: str) -> int:
        return max(self.rows, default=-1) + 1

    def begin_attempt(self, run_id: str, attempt: int, argv: list[str], cwd: str, env: Mapping[str, str],
                      snapshot: Any, checkpoint: str | None, resume_step: int | None, remedies: list[Any],
                      gate: Any) -> None:
        self.rows[attempt] = {"argv": argv, "cwd": cwd, "env": dict(env), "checkpoint": checkpoint,
                              "resume_step": resume_step, "remedies": remedies, "gate": gate, "started_at": time.time(),
                              "ended_at": None}

    def set_attempt_process(self, run_id: str, attempt: int, pid: int, pgid: int, ctime: float) -> None:
        self.rows[attempt].update(pid=pid, pgid=pgid)

    def update_attempt(self, run_id: str, attempt: int, **fields: Any) -> None:
        self.updates.append((attempt, dict(fields), threading.get_ident()))
        self.rows[attempt].update(fields)

    def end_attempt(self, run_id: str, attempt: int, **fields: Any) -> None:
        self.rows.setdefault(attempt, {}).update(fields, ended_at=time.time())

    def attempts(self, run_id: str) -> list[AttemptRow]:
        return [AttemptRow(a, r.get("argv", []), r.get("cwd", ""), r.get("started_at", 0.0), r.get("ended_at"),
                           r.get("pid"), r.get("pgid"), None, r.get("exit_code"), r.get("signal"), r.get("cause"),
                           r.get("action"), r.get("checkpoint"), r.get("counted", True), r.get("resume_step"),
                           r.get("repeat"), r.get("progressed", False))
                for a, r in sorted(self.rows.items())]

    def event(self, run_id: str, attempt: int | None, event: str, level: str, message: str | None,
              data: Mapping[str, Any] | None = None) -> None:
        self.events.append({"attempt": attempt, "event": event, "level": level, "message": message,
                            "data": dict(data or {})})

    def metrics_batch(self, run_id: str, attempt: int, rows: list[tuple[Any, ...]]) -> None:
        for at, step, *_ in rows:
            self.metric_rows.append({"attempt": attempt, "at": at, "step": step})

    def metrics(self, run_id: str) -> Iterator[Any]:
        return iter(list(self.metric_rows))

    def failure_record(self) -> tuple[float, int, list[float]]:
        done = [r for r in self.rows.values() if r.get("ended_at") is not None]
        return (sum(r["ended_at"] - r.get("started_at", r["ended_at"]) for r in done),
                sum(1 for r in done if r.get("cause") and r.get("cause") != "manual" and r.get("counted", True)), [])

    def recent_step_times(self, run_id: str, limit: int = 5000) -> list[float]:
        return sorted(r["at"] for r in self.metric_rows if r["step"] is not None)[-limit:]

    def close(self) -> None:
        self.closed = True

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]


@dataclass
class FakeCheckpoints:
    """Checkpoints at the given steps, all ready: restart takes the newest, rollback the newest
    before the onset. Records what it was asked."""

    steps: Sequence[int] = ()
    calls: list[tuple[Action, int | None, str | None]] = field(default_factory=list)
    no_progress: str | None = None

    def book_last_attempt(self) -> Booked:
        return Booked(no_progress=self.no_progress)

    def choose(self, cfg: Config, action: Action, onset_step: int | None, explicit: str | None,
               metrics: Sequence[MetricRecord]) -> Chosen:
        self.calls.append((action, onset_step, explicit))
        if explicit:
            return Chosen(Resume(explicit, None, "the operator's choice"))
        ok = [s for s in self.steps if action is not Action.ROLLBACK or onset_step is None or s < onset_step]
        if not ok:
            return Chosen(Resume(None, None, "no ready checkpoint"))
        return Chosen(Resume(f"ckpt/step_{max(ok)}.pt", max(ok), "newest ready"))

    def emergency_checkpoint_probe(self) -> Callable[[], bool] | None:
        return None

    def ready_steps(self) -> dict[int, str]:
        return {s: f"ckpt/step_{s}.pt" for s in self.steps}


class FakeGate:
    def __init__(self, verdict: GateVerdict | None = None) -> None:
        self.verdict = verdict
        self.previous: list[list[int]] = []

    def check(self, cfg: Config, previous_pids: Sequence[int]) -> GateVerdict | None:
        self.previous.append(list(previous_pids))
        return self.verdict


class FakeNotifier:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def ready(self, status: str | None = None) -> bool:
        self.calls.append("ready")
        return True

    def reloading(self) -> bool:
        self.calls.append("reloading")
        return True

    def stopping(self, status: str | None = None) -> bool:
        self.calls.append("stopping")
        return True

    def status(self, text: str) -> bool:
        return True

    def watchdog(self, *, force: bool = False) -> bool:
        return True

    def extend_timeout(self, seconds: float) -> bool:
        return True


class FakeEnvironment:
    def start(self, cfg: Config) -> None:
        pass

    def probed(self, wait: float = 0.0) -> Mapping[str, Any] | None:
        return {"python": "fake"}

    def of_attempt(self, spec: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
        return dict(extra)


def config(tmp: Path, **sections: Any) -> Config:
    table: dict[str, Any] = {"job": {"command": ["python", "train.py"], "workdir": str(tmp)},
                             "state": {"dir": str(tmp / "state")},
                             "policy": {"backoff_initial_s": 2.0, "backoff_jitter": 0.0},
                             # The fake launcher's jobs are no processes to look at (CPU, stacks):
                             # a hang goes out at the timeout, as it does with look_s = 0.
                             "heartbeat": {"look_s": 0.0}}
    for k, v in sections.items():
        table[k] = {**table.get(k, {}), **v}
    return config_from_table(table)


@dataclass
class Daemon:
    """A runner on fakes, and the handles a test drives it with."""

    runner: Runner
    clock: FakeClock
    launcher: FakeLauncher
    ledger: FakeLedger
    checkpoints: FakeCheckpoints
    gate: FakeGate
    watch: WatchPlugin

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.runner.step()

    def settle(self, timeout: float = 10.0) -> None:
        """Step until no launch is being prepared (the preparation runs on a thread)."""
        deadline = time.monotonic() + timeout
        self.step()
        while self.runner.preparing is not None:
            assert time.monotonic() < deadline, "the launch preparation did not finish"
            self.step()
        self.step()

    def lines(self, *lines: str, source: str = "stdout") -> None:
        """The job prints ``lines`` (through the real log watcher and detectors)."""
        assert self.watch.logwatch is not None
        self.watch.logwatch.feed(source, list(lines))
        self.step()

    def events(self) -> list[str]:
        return [e["event"] for e in self.ledger.events]


def daemon(tmp: Path, cfg: Config | None = None, *, steps: Sequence[int] = (), gate: GateVerdict | None = None,
           concerns: Sequence[Plugin] = ()) -> Daemon:
    """A daemon on fakes, started: the first attempt launched (from scratch), then checkpoints
    at ``steps`` appear."""
    cfg = cfg or config(tmp)
    clock, launcher, ledger = FakeClock(), FakeLauncher(), FakeLedger()
    checkpoints, fake_gate = FakeCheckpoints(), FakeGate(gate)
    watch, goodput, fanout = WatchPlugin(clock), GoodputPlugin(), SinkFanout()
    ports = Ports(clock=clock, launcher=launcher, ledger=ledger, checkpoints=checkpoints, gate=fake_gate,
                  notifier=FakeNotifier(), osapi=OsApi(), environment=FakeEnvironment())
    runner = Runner(cfg, ports, [watch, goodput, ValidationPlugin(goodput.tracks), *concerns], fanout=fanout, tick_s=0.002)
    fanout.add(watch.lines)  # as the wiring does
    d = Daemon(runner, clock, launcher, ledger, checkpoints, fake_gate, watch)
    assert runner.start()
    _OPEN.append(runner)
    d.settle()
    checkpoints.steps = list(steps)
    return d


_OPEN: list[Runner] = []


def close_all() -> None:
    while _OPEN:
        _OPEN.pop().close()


def step_line(step: int, loss: float | str, gn: float = 1.0, tps: float | None = None) -> str:
    """A JSON metric line as a job prints it ("nan" as the bare NaN a json.dumps of float('nan') writes)."""
    rec: dict[str, Any] = {"step": step, "loss": loss, "grad_norm": gn}
    if tps is not None:
        rec["tokens_per_sec"] = tps
    return json.dumps(rec).replace('"nan"', "NaN")


