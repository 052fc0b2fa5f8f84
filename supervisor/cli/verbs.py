"""The client verbs' work for ``supervisor.cli.main``: ``stop``/``restart`` with ``--wait`` and
``--json``, ``checkpoints`` with the ones still being written and hashing progress. Nothing here
imports the daemon."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

from ..humanize import duration, size
from ..textescape import escaped
from .parser import EXIT_FAILED, EXIT_GAVE_UP, EXIT_OK, EXIT_USAGE
from .. import strictjson


# -- stop / restart / checkpoint-now / reload -------------------------------------------------

def _request(sd: Path, verb: str, payload: Mapping[str, Any] | None = None, timeout: float = 30.0) -> Any:
    from ..ops.controlclient import request

    return request(sd, verb, payload or {}, timeout=timeout)


def _final_run(sd: Path, run_id: str | None) -> dict[str, Any]:
    try:
        from ..ledger.store import Ledger

        led = Ledger(sd, readonly=True)
    except Exception:
        return {}
    try:
        h = led.history(run_id)
        return {k: h.get(k) for k in ("run_id", "state", "exit_code", "reason")}
    except Exception:
        return {}
    finally:
        led.close()


def wait_stopped(sd: Path, before: Mapping[str, Any], timeout: float, poll: float = 0.2,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Wait until the daemon of ``sd`` has exited (its control socket no longer answers)."""
    from ..ops.control import ControlError, DaemonNotRunning

    t0 = time.monotonic()
    while True:
        try:
            st = _request(sd, "status", timeout=min(5.0, max(poll, timeout)))
        except DaemonNotRunning:
            run = _final_run(sd, before.get("run_id"))
            return {"done": True, "waited_s": round(time.monotonic() - t0, 3), "state": run.get("state", "stopped"),
                    "exit_code": run.get("exit_code"), "reason": run.get("reason")}
        except ControlError:
            st = {}
        if time.monotonic() - t0 >= timeout:
            return {"done": False, "waited_s": round(time.monotonic() - t0, 3),
                    "state": st.get("state") if isinstance(st, Mapping) else None}
        sleep(poll)


def wait_restarted(sd: Path, before: Mapping[str, Any], timeout: float, poll: float = 0.2,
                   sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Wait until a newer attempt than ``before``'s runs (launched, with a live process)."""
    from ..core.machine import State  # the daemon's states, named once (a status carries their values)
    from ..ops.control import ControlError, DaemonNotRunning

    a0 = before.get("attempt")
    a0 = a0 if isinstance(a0, int) else -1
    t0 = time.monotonic()
    st: Any = {}
    while True:
        try:
            st = _request(sd, "status", timeout=min(5.0, max(poll, timeout)))
        except DaemonNotRunning:
            run = _final_run(sd, before.get("run_id"))
            return {"done": False, "waited_s": round(time.monotonic() - t0, 3), "daemon_exited": True,
                    "state": run.get("state"), "exit_code": run.get("exit_code"), "reason": run.get("reason")}
        except ControlError:
            st = {}
        if isinstance(st, Mapping):
            attempt, state = st.get("attempt"), st.get("state")
            if isinstance(attempt, int) and attempt > a0 and state in (State.STARTING, State.RUNNING) and st.get("pids"):
                return {"done": True, "waited_s": round(time.monotonic() - t0, 3), "attempt": attempt,
                        "state": state, "pids": st.get("pids"), "checkpoint": st.get("checkpoint")}
            if state in (State.GAVE_UP, State.STOPPED):
                return {"done": False, "waited_s": round(time.monotonic() - t0, 3), "state": state,
                        "attempt": attempt}
        if time.monotonic() - t0 >= timeout:
            return {"done": False, "waited_s": round(time.monotonic() - t0, 3),
                    "state": st.get("state") if isinstance(st, Mapping) else None}
        sleep(poll)


def _text(e: Exception) -> str:
    return str(getattr(e, "message", None) or e)


# `restart --from` is answered after the checkpoint's load test (bounded by the daemon's
# checkpoints.load_timeout_s, 300 s by default): waiting only the usual 30 s, a busy machine made
# the CLI report a failure for a restart the daemon then carried out.
RESTART_FROM_ANSWER_S = 330.0


def _answer_timeout(verb: str, payload: Mapping[str, Any] | None) -> float:
    p = payload or {}
    return RESTART_FROM_ANSWER_S if verb == "restart" and p.get("from") and not p.get("force") else 30.0


def control_verb(sd: Path, verb: str, payload: Mapping[str, Any] | None = None, *, wait: bool = False,
                 timeout: float = 600.0, json_out: bool = False, out: TextIO | None = None,
                 err: TextIO | None = None) -> int:
    """``stop``/``restart``/``checkpoint-now``/``reload``: send, print the answer, optionally wait.

    Exit 0 when accepted (and, with ``wait``, done); 1 when no daemon answers, the request was
    refused or the wait timed out; 3 when ``restart --wait`` saw the daemon give up."""
    from ..ops.control import ControlError, DaemonNotRunning

    out = out or sys.stdout
    err = err or sys.stderr
    before: Any = {}
    try:
        if wait:
            before = _request(sd, "status")
        res = _request(sd, verb, payload, timeout=_answer_timeout(verb, payload))
    except DaemonNotRunning as e:
        if json_out:
            out.write(json.dumps({"ok": False, "error": {"code": "not_running", "message": _text(e)}}) + "\n")
        print(f"transformer-supervisor: {escaped(e)}", file=err)
        return EXIT_FAILED
    except ControlError as e:
        if json_out:
            out.write(json.dumps({"ok": False, "error": {"code": e.code, "message": _text(e)}}) + "\n")
        print(f"transformer-supervisor: {verb} failed: {escaped(e)}", file=err)
        return EXIT_FAILED
    reply: dict[str, Any] = dict(res) if isinstance(res, Mapping) else {"result": res}
    code = EXIT_OK
    if not json_out:
        print(reply.get("message") or strictjson.dumps(res), file=out, flush=True)
    if wait and verb in ("stop", "restart"):
        from ..core.machine import State  # the daemon's states, named once (only when waiting)

        before = before if isinstance(before, Mapping) else {}
        if verb == "stop":
            w = wait_stopped(sd, before, timeout)
            if not json_out:
                if w["done"]:
                    ex = f" with exit code {w['exit_code']}" if w.get("exit_code") is not None else ""
                    print(f"the daemon exited{ex} after {duration(w['waited_s'])}"
                          + (f": {w['reason']}" if w.get("reason") else ""), file=out)
                else:
                    print(f"transformer-supervisor: the daemon is still running after {duration(timeout)} "
                          f"(state {w.get('state')})", file=err)
        else:
            w = wait_restarted(sd, before, timeout)
            if not json_out:
                if w["done"]:
                    print(f"attempt {w['attempt']} is {w['state']} (pid {' '.join(map(str, w.get('pids') or []))})"
                          + (f", from {w['checkpoint']}" if w.get("checkpoint") else ", from scratch")
                          + f", after {duration(w['waited_s'])}", file=out)
                elif w.get("state") == State.GAVE_UP:
                    print("transformer-supervisor: the daemon gave up instead of restarting the job; "
                          "see `transformer-supervisor history`", file=err)
                elif w.get("daemon_exited"):
                    print("transformer-supervisor: the daemon exited instead of restarting the job", file=err)
                else:
                    print(f"transformer-supervisor: no new attempt running after {duration(w['waited_s'])} "
                          f"(state {w.get('state')})", file=err)
        reply["wait"] = w
        if not w["done"]:
            code = EXIT_GAVE_UP if w.get("state") == State.GAVE_UP else EXIT_FAILED
    if json_out:
        out.write(strictjson.dumps({"ok": code == EXIT_OK, **reply}, indent=2, sort_keys=True, default=str) + "\n")
    return code


# -- checkpoints ------------------------------------------------------------------------------

#: files smaller than this hash in a blink: no progress shown for them
PROGRESS_MIN_BYTES = 64 * 1024 * 1024


class HashProgress:
    """Shows hashing progress of large files on ``stream``: a line rewritten in place on a
    terminal (at most 5 times a second), else one line when a file starts and one when it ends."""

    def __init__(self, stream: TextIO, min_bytes: int = PROGRESS_MIN_BYTES,
                 clock_fn: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.min_bytes = min_bytes
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.clock = clock_fn
        self._current: Path | None = None
        self._started = 0.0
        self._last_draw = -math.inf
        self._width = 0

    def __call__(self, path: Path, done: int, total: int) -> None:
        if total < self.min_bytes:
            return
        now = self.clock()
        if path != self._current:
            self._current, self._started, self._last_draw = path, now, -math.inf
            if not self.tty:
                self.stream.write(f"hashing {escaped(path.name)} ({size(total)}) ...\n")
                self.stream.flush()
        finished = done >= total
        if self.tty and (finished or now - self._last_draw >= 0.2):
            self._last_draw = now
            rate = done / max(1e-6, now - self._started)
            eta = (total - done) / rate if rate > 0 and not finished else 0.0
            line = (f"hashing {escaped(path.name)}: {size(done)} of {size(total)} ({100 * done / total:.0f} %)"
                    + (f", {duration(eta)} left" if eta >= 1 else ""))
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
            if finished:
                self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        if finished:
            if not self.tty:
                self.stream.write(f"hashed {escaped(path.name)} ({size(total)}) in {duration(now - self._started)}\n")
                self.stream.flush()
            self._current = None


def recorded_job(sd: Path) -> tuple[list[str], Path | None, str | None, str | None] | None:
    """The job command, workdir, job config file and python the state dir's newest run was started with
    (from the ledger, read-only), so ``checkpoints`` outside the daemon compares manifests'
    config snapshots against what the daemon compared them with. None when nothing is recorded."""
    from ..ledger.store import Ledger, LedgerError

    if not (sd / "ledger.sqlite").exists():
        return None
    try:
        led = Ledger(sd, readonly=True)
    except FileNotFoundError:
        return None
    except LedgerError as e:  # a FIFO, a folder or a link there: said, and nothing recorded is known
        print(f"checkpoints: {escaped(e)}; no recorded command to compare against", file=sys.stderr)
        return None
    try:
        run_id = led.latest_run_id()
        table = led.run_config(run_id) if run_id else {}
    except LedgerError:  # a garbled page: as if nothing were recorded ("no command known")
        return None
    finally:
        led.close()
    job = table.get("job") if isinstance(table, dict) else None
    if not isinstance(job, dict):
        return None
    command = job.get("command")
    if not isinstance(command, list) or not command:
        return None
    workdir = job.get("workdir")
    ck = table.get("checkpoints")
    jcf = ck.get("job_config_file") if isinstance(ck, dict) else None
    python = job.get("python")
    return ([str(a) for a in command], Path(workdir) if workdir else None, str(jcf) if jcf else None,
            str(python) if python else None)


def _verdict(row: Any) -> str:
    if row.ready:
        lt = row.load_test
        return "ready" + ("" if lt is None else f" on its structural checks (not load-tested: {lt.untested})"
                          if lt.untested else f" (load test {lt.seconds:.2f} s)")
    return "not ready: " + (row.reasons[0] if row.reasons else "see the table")


def checkpoints_verb(checkpoint_dir: Path, cfg: Any, json_out: bool, state_dir: Path, *,
                     job_argv: Sequence[str] = (), job_cwd: Path | None = None, out: TextIO | None = None,
                     err: TextIO | None = None, progress_min_bytes: int = PROGRESS_MIN_BYTES,
                     load_test: bool = True) -> int:
    """``transformer-supervisor checkpoints [--json] [--no-load-test]``: the quicklist, plus the
    checkpoints still being written (never "no checkpoints found" while one is being saved), with
    a progress line per checkpoint (and hashing progress of large files) on stderr. Load tests run
    on one warm process (torch imported once). Without a job command, the one the state dir's
    ledger recorded is compared against; with neither, "no command known" (never "differs").
    Read-only: writes no manifests and moves nothing (the digest cache aside). 0, or 2 for a bad dir."""
    import dataclasses

    from ..checkpoints import hashing
    from ..checkpoints.inprogress import in_progress, render as render_writing
    from ..checkpoints.quicklist import render_table
    from ..checkpoints.discovery import sort_newest_first
    from ..checkpoints.service import CheckpointService
    from ..redact import redact_data

    out = out or sys.stdout
    err = err or sys.stderr
    # Where the operator typed them, once: the load tests run in the job's recorded workdir.
    checkpoint_dir, state_dir = Path(os.path.abspath(checkpoint_dir)), Path(os.path.abspath(state_dir))
    if not Path(checkpoint_dir).is_dir():
        print(f"checkpoints: no checkpoint dir {escaped(checkpoint_dir)} (not a directory)", file=err)
        return EXIT_USAGE
    job_python = None
    if not job_argv:
        recorded = recorded_job(Path(state_dir))
        if recorded is not None:
            job_argv, job_cwd, jcf, job_python = recorded
            if jcf and not cfg.job_config_file:
                cfg = dataclasses.replace(cfg, job_config_file=jcf)
    # The CLI's warm verifier: one torch import for the whole list, whatever the config says.
    cfg = dataclasses.replace(cfg, load_test=cfg.load_test and load_test, warm_verifier=True)
    svc = CheckpointService(cfg, Path(checkpoint_dir), Path(state_dir), job_python, list(job_argv), job_cwd,
                            write_manifests=False)
    rows = []
    try:
        with hashing.progress(HashProgress(err, progress_min_bytes)):
            cands = svc.scan()
            current = svc._current_config()
            for i, cand in enumerate(cands, 1):
                row = svc.evaluate(cand, None, current)
                rows.append(row)
                err.write(f"checkpoints: [{i}/{len(cands)}] {escaped(redact_data(f'{cand.path.name}: {_verdict(row)}'))}\n")
                err.flush()
    finally:
        svc.close()
    rows = sort_newest_first(rows)
    writing = in_progress(Path(checkpoint_dir), getattr(svc.discovery, "unsettled", ()))
    if json_out:  # through the gate: a checkpoint's file name can carry a secret (step_1_hf_token=x.pt)
        text = strictjson.dumps(redact_data([w.to_json() for w in writing] + [r.to_json() for r in rows]), indent=2)
    else:
        parts = [render_table(rows) if rows or not writing else "no complete checkpoint yet"]
        text = redact_data("\n".join(parts + ([render_writing(writing)] if writing else [])))
    out.write(text + "\n")
    return EXIT_OK


def log_tail(path: Path, n: int = 10) -> list[str]:
    """The last ``n`` lines of the job log (systemctl status shows the journal's last lines) as a
    terminal shows them (:func:`.logs.terminal_lines`); empty when there is no log. Read from the
    end, at most ``n`` x 256 KiB (a line cut to its last 64 KiB, said), however large the log or its
    last line; from the rotated job.log.1 too when job.log was just rotated."""
    import io

    from .logs import copy_last_lines, terminal_lines

    from ..regularfile import open_regular_binary

    buf = io.BytesIO()
    try:
        with open_regular_binary(path, "a job log") as f:  # a FIFO would hang, a link print any file
            copy_last_lines(path, f, f.seek(0, 2), n, buf)
    except OSError:
        return []
    return terminal_lines(buf.getvalue(), n)


def last_run_status(sd: Path, config: str | None = None) -> dict[str, Any] | None:
    """What ``status`` says when no daemon answers but the state dir holds a run (SPEC: exit 3),
    as supervisorctl shows ``EXITED`` and systemctl ``inactive (dead)``: the last run's state, exit,
    reason and when, from the ledger (read-only). None when there is no ledger or no run in it."""
    from ..ledger.store import Ledger, LedgerError
    from ..regularfile import refused
    from .logs import job_log_path

    if not (sd / "ledger.sqlite").exists():
        return None
    problems: list[str] = []
    log = job_log_path(sd, config, problems)
    why = refused(log, "a job log")  # a FIFO or a link there is not read, and said
    log_note = {"log_error": why} if why else {}
    try:
        led = Ledger(sd, readonly=True)
    except FileNotFoundError:
        return None
    except LedgerError as e:
        return {**_unreadable_run(e.message, log), **log_note}
    try:
        h = led.history()
    except LedgerError as e:
        return {**_unreadable_run(e.message, log), **log_note}
    finally:
        led.close()
    if h.get("run_id") is None:
        return None
    attempts = h.get("attempts") or []
    restarts: dict[str, int] = {}
    for a in attempts[:-1]:  # every attempt but the last was followed by a relaunch
        if a.get("cause"):
            restarts[a["cause"]] = restarts.get(a["cause"], 0) + 1
    last = attempts[-1] if attempts else {}
    ended = h.get("ended_at") or last.get("ended_at")
    return {
        "state": h.get("state"),
        "daemon": False,
        "run_id": h["run_id"],
        "name": h.get("name"),
        "attempt": last.get("attempt"),
        "pids": [],
        "restarts_by_cause": restarts,
        "exit_code": h.get("exit_code"),
        "reason": h.get("reason"),
        "ended_at": ended,
        "checkpoint": last.get("checkpoint"),
        "last_metric": None,
        "heartbeats": {},
        "gpus": None,
        "goodput": None,
        "log_tail": log_tail(log),
        **({"ledger_error": "; ".join((h.get("unreadable") or {}).values())} if h.get("unreadable") else {}),
        **log_note,
    }


def _unreadable_run(error: str, log: Path) -> dict[str, Any]:
    """``status`` of a state dir whose ledger cannot be read: what the ledger would have said is
    unknown, the job's log (kept apart from the ledger) is still shown, and the error is named."""
    return {"state": "unknown", "daemon": False, "run_id": None, "name": None, "attempt": None, "pids": [],
            "restarts_by_cause": {}, "exit_code": None, "reason": None, "ended_at": None, "checkpoint": None,
            "last_metric": None, "heartbeats": {}, "gpus": None, "goodput": None, "log_tail": log_tail(log),
            "ledger_error": error}


def render_last_run(st: Mapping[str, Any]) -> str:
    """``status`` of a run whose daemon has exited, for people: like systemctl's ``inactive (dead)``
    block, the end first (state, exit, reason, when), then the last lines of the job's log."""
    from ..textescape import Mode, escape
    from .render import ended_text, escaped_lines

    code = st.get("exit_code")
    restarts = st.get("restarts_by_cause") or {}
    rows = [("state", f"{st.get('state')}" + (f" (exit {code})" if code is not None else "")),
            ("reason", st.get("reason") or "-"),
            ("ended", ended_text(st.get("ended_at"))),
            ("attempts", ("unknown" if st.get("attempt") is None and st.get("ledger_error") else
                          f"{(st.get('attempt') or 0) + 1}")
             + (f", restarts {', '.join(f'{k} {v}' for k, v in sorted(restarts.items()))}" if restarts else "")),
            ("resumed from", st.get("checkpoint")
             or ("unknown" if st.get("ledger_error") else "(nothing: a fresh start)"))]
    lines = [f"no daemon is running: the last run ({st.get('name')}, {st.get('run_id')}) has ended"
             if st.get("run_id") else "no daemon is running, and the ledger does not say which run was last"]
    if st.get("ledger_error"):
        lines.append(f"  the ledger could not be read, so what follows is partial: {st['ledger_error']}")
    lines.extend(f"  {label:<12}  {value}" for label, value in rows)
    if st.get("log_error"):
        lines.append(f"  the job's log was not read: {st['log_error']}")
    tail = st.get("log_tail") or []
    if tail:
        lines.append(f"last {len(tail)} lines of the job's log (all of it: transformer-supervisor logs):")
        # The job's own lines, said as the console says them (colours dropped, a redrawn line as
        # its last state); every line, and each value from the ledger above, kept one line.
        lines.extend(f"  {escape(line, Mode.TERMINAL)}" for line in tail)
    lines.append("every attempt: transformer-supervisor history")
    return escaped_lines(lines)
