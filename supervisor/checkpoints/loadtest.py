"""Run the load test of one checkpoint in a subprocess with the job's python (never in the daemon).

The daemon never imports torch: the test is ``_loadtest_script.py`` run by the interpreter the
job itself uses (so the torch version that will resume is the one that loads), with a timeout.
What the child does (``load``: torch file, safetensors, DCP folder, folder of files) comes from
the checkpoint's layout spec and is sent with the request: the child never guesses it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import structlog

from .. import childio
from ..errors import SupervisorError
from .folderlinks import folder_link_out
from .hashing import StatKey
from .layouts import registry
from .manifest import stat_record
from .pickledeny import scan_verdict
from .scancache import cached_refusal
from .warm import WarmVerifier

log = structlog.get_logger("supervisor.checkpoints")

_SCRIPT = Path(__file__).with_name("_loadtest_script.py")
_MARKER = "TSUP_LOADTEST_RESULT "
#: The bytes kept of each of a load test's streams: the result line (printed last) and the last
#: error lines; what a load prints beyond that is read and counted, never kept.
OUTPUT_TAIL_BYTES = 256 * 1024
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
#: Signals that end a load that crashed on what it read (a bad mmap of a file cut short: SIGBUS)
_LOAD_CRASHES = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL})


class LoadTestCancelled(SupervisorError):
    """The supervisor is exiting: the load test was stopped before its verdict. Not a failure of
    the checkpoint: nothing is cached, manifested or quarantined for it."""

    code = "cancelled"


@dataclass(frozen=True)
class LoadTestRequest:
    path: Path
    expected_keys: tuple[str, ...] = ()
    check_finite: bool = False
    trust_pickles: bool = False
    mmap: bool = True
    layout: str | None = None  # a Layout; None: the registry recognises ``path``


@dataclass(frozen=True)
class LoadTestResult:
    passed: bool
    seconds: float
    error: str | None
    step: int | None = None
    keys: tuple[str, ...] = ()
    needs_pickle: bool = False
    nonfinite: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the torch files (their place in a folder; a single file's name) loaded with weights_only=True
    weights_only: tuple[str, ...] = ()
    # why the test could not run (the job's python has no torch, is missing, died before a
    # verdict): no verdict on the checkpoint, never a reason to quarantine it; never persisted
    untested: str | None = None
    # the pickle scan's refusal of this checkpoint (set on a readiness row, never cached): a load
    # that passed is then not shown as passed (pickledeny.scan_verdict)
    refused: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The SPEC shape of ``load_test`` in ``checkpoints --json`` (+ ``untested``/``refused`` when set)."""
        out: dict[str, Any] = {"passed": self.passed and not self.refused, "seconds": self.seconds,
                               "error": self.refused if self.refused and self.passed else self.error}
        if self.untested:
            out["untested"] = self.untested
        if self.refused:
            out["refused"], out["loaded"] = self.refused, self.passed
        return out


def resolve_job_python(configured: str | None, job_argv: Sequence[str], job_cwd: Path | None = None) -> str:
    """The interpreter the load test runs with.

    ``checkpoints.python`` when set; else the job command's own python when argv[0] is one
    (``python``, ``python3.11``, ``/venv/bin/python``); else the interpreter in the shebang of a
    launcher script (``torchrun``, ``accelerate``, ``deepspeed`` are console scripts of the job's
    python); else the supervisor's own interpreter.
    """
    if configured:
        return configured
    if job_argv:
        exe = job_argv[0]
        found = _which(exe, job_cwd)
        if _PYTHON_NAME.match(os.path.basename(exe)) and found:
            return found
        if found:
            py = _shebang_python(Path(found))
            if py:
                return py
    return sys.executable


def _which(exe: str, cwd: Path | None) -> str | None:
    if os.sep in exe:
        p = Path(exe) if os.path.isabs(exe) or cwd is None else cwd / exe
        return str(p) if os.access(p, os.X_OK) else None
    return shutil.which(exe)


def _shebang_python(script: Path) -> str | None:
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        return shutil.which(parts[1]) if _PYTHON_NAME.match(parts[1]) else None
    return parts[0] if _PYTHON_NAME.match(os.path.basename(parts[0])) else None


def run_load_test(req: LoadTestRequest, *, python: str, timeout_s: float, cwd: Path | None = None,
                  started: Callable[[subprocess.Popen[bytes]], None] | None = None) -> LoadTestResult:
    """Load ``req.path`` in a subprocess; a timeout, crash or garbled output is a failed test.
    ``started`` gets the process (its own session) once it runs: the owner may stop it."""
    payload = request_payload(req)
    argv = [python, "-c", _SCRIPT.read_text(), payload]
    env = dict(os.environ)
    env.setdefault("CUDA_VISIBLE_DEVICES", "")  # a load test must not grab a GPU the job needs
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                                start_new_session=True)
    except OSError as exc:
        why = f"cannot start the load test with {python}: {exc.strerror or exc}"
        return LoadTestResult(False, 0.0, why, untested=why)
    if started is not None:
        started(proc)
    # Both pipes to bounded tails (childio): a checkpoint's load that prints without end costs
    # the daemon OUTPUT_TAIL_BYTES a stream, and the result line is printed last.
    res = childio.drain(proc, timeout_s=timeout_s, keep=OUTPUT_TAIL_BYTES)
    if res.timed_out:
        childio.kill_group(proc)
        log.warning("checkpoint_load_test_timeout", path=str(req.path), timeout_s=timeout_s,
                    next="the checkpoint is not ready; raise checkpoints.load_timeout_s if it is just large")
        return LoadTestResult(False, float(timeout_s), f"load test timed out after {timeout_s:g} s")
    out, err = res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace")
    for line in reversed(out.splitlines()):
        if line.startswith(_MARKER):
            try:
                data = json.loads(line[len(_MARKER):])
            except ValueError:
                break
            if isinstance(data, dict):
                return result_of(data)
            break
    tail = (err.strip().splitlines() or ["no output"])[-1][:300]
    code = res.returncode or 0
    how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    if -code in _LOAD_CRASHES:  # the load itself crashed: a verdict on what it read
        return LoadTestResult(False, 0.0, f"load test process failed ({how}): {tail}")
    # No verdict line otherwise: the script turns every failure of a load into one, so the process
    # was killed (SIGKILL: the OOM killer), its interpreter failed before the script ran, or it
    # printed garbage: nothing said about the checkpoint (not tested, never quarantined for it).
    why = f"the load test process ended without a verdict ({how}): {tail}"
    return LoadTestResult(False, 0.0, why, untested=why)


def request_payload(req: LoadTestRequest) -> str:
    """The JSON request ``_loadtest_script.py`` reads (an argument cold, a line warm)."""
    return json.dumps({"path": str(req.path), "load": str(registry.load_kind(req.path, req.layout)),
                       "skip": sorted(registry.NEVER), "expected_keys": list(req.expected_keys),
                       "finite_scopes": [scope.to_json() for scope in registry.FINITE_SCOPES],
                       "check_finite": req.check_finite, "trust_pickles": req.trust_pickles, "mmap": req.mmap})


def result_of(data: dict[str, Any]) -> LoadTestResult:
    """The script's result line, read back."""
    return LoadTestResult(
        passed=bool(data.get("passed")), seconds=float(data.get("seconds") or 0.0), error=data.get("error"),
        step=data.get("step") if isinstance(data.get("step"), int) else None,
        keys=tuple(data.get("keys") or ()), needs_pickle=bool(data.get("needs_pickle")),
        nonfinite=tuple(data.get("nonfinite") or ()), notes=tuple(data.get("notes") or ()),
        weights_only=tuple(str(x) for x in data.get("weights_only") or ()),
        untested=str(data["untested"]) if data.get("untested") else None)


def run_warm_or_cold(req: LoadTestRequest, warm: WarmVerifier | None, *, python: str, timeout_s: float,
                     cwd: Path | None = None, started: Callable[[Any], None] | None = None,
                     cancelled: Callable[[], bool] = lambda: False) -> LoadTestResult:
    """On the warm process when there is one and it is free; else (busy, off, or it died on this
    request) a cold process of its own, which reports the real error of a crash. ``cancelled``:
    the owner is exiting (it killed the warm process): no cold process is started then, since the
    daemon's exit could stop this thread between that start and its kill, leaving it orphaned."""
    if warm is not None:
        reply = warm.request(request_payload(req), timeout_s, started)
        if reply is not None and reply.timed_out:
            log.warning("checkpoint_load_test_timeout", path=str(req.path), timeout_s=timeout_s,
                        next="the checkpoint is not ready; raise checkpoints.load_timeout_s if it is just large")
            return LoadTestResult(False, float(timeout_s), f"load test timed out after {timeout_s:g} s")
        if reply is not None and reply.data is not None:
            return result_of(reply.data)
    if cancelled():
        raise LoadTestCancelled(f"no load test of {req.path}: the supervisor is exiting")
    return run_load_test(req, python=python, timeout_s=timeout_s, cwd=cwd, started=started)


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group holds what it started
    except (ProcessLookupError, PermissionError):
        pass  # it ended meanwhile


def version_token(path: Path) -> Any:
    """Which version of a checkpoint is on disk: its stat (a folder's summed size, newest mtime
    and file count); a rewrite gives another token."""
    if path.is_dir():
        st = stat_record(path)
        return (st["size"], st["mtime_ns"], st["files"])
    return StatKey.of(path)


class LoadTests:
    """Load tests run with the job's python, their results kept per checkpoint version: a
    result that checked every tensor is finite answers a request that does not need it too, and
    the step a test read (nanoGPT ``iter_num``) belongs to the version it read it from (a single
    overwritten ckpt.pt holds another step after each save, never the old one). Its cache is
    read and written one dict operation at a time, so the service may run a background test
    outside its lock while a restart's choice reads it. A version already under test is not
    tested again beside it: the second caller waits for the first's result (after a kill, the
    background test of the newest save and the one beside the relaunch would otherwise be two
    torch imports competing with the job's own start-up)."""

    def __init__(self, python: str, *, expected_keys: Sequence[str], check_finite: bool, trust_pickles: bool,
                 mmap: bool, timeout_s: float, cwd: Path | None, warm: bool = False, store: Any = None,
                 cgroup: Any = None) -> None:
        self.python, self.cwd, self.timeout_s = python, cwd, timeout_s
        self.cgroup = cgroup  # job.cgroup.VerifierCgroup: where each test's process goes (a low weight), or None
        self.store = store  # verdicts.VerdictStore: verdicts persisted in the state dir, or None
        # The daemon's service runs its tests on a warm process (warm.py); direct users get cold ones.
        self.warm: WarmVerifier | None = WarmVerifier(python, cwd) if warm else None
        self.expected_keys, self.check_finite = tuple(expected_keys), check_finite
        self.trust_pickles, self.mmap = trust_pickles, mmap
        self._results: dict[tuple[str, Any, bool], LoadTestResult] = {}  # (path, version, finite checked)
        self._steps: dict[Path, tuple[Any, int | None]] = {}
        self._running: dict[tuple[str, Any, bool], Future[LoadTestResult]] = {}
        self._running_lock = threading.Lock()
        self._procs: dict[tuple[str, Any, bool], subprocess.Popen[Any]] = {}  # the tests' processes, while they run
        self._cancelled = False
        self._untested_said: set[str] = set()

    def cached(self, path: Path, finite: bool = False) -> LoadTestResult | None:
        """The result for the version on disk now that answers the request, if one ran."""
        return self._hit(path, version_token(path), finite)

    def _hit(self, path: Path, token: Any, finite: bool) -> LoadTestResult | None:
        # The finite-checked result first: it answers a request that does not need the check too,
        # and a version found non-finite must stay not ready (rollback targets skip it).
        for checked in (True, finite or self.check_finite):
            hit = self._results.get((str(path), token, checked))
            if hit is None and self.store is not None:
                hit = self.store.get(path, token, checked)
                if hit is not None:
                    self._results[(str(path), token, checked)] = hit
            if hit is not None:
                return hit
        return None

    def passed_version(self, path: Path) -> Any:
        """The version token of what is on disk now when that version passed its load test, else
        None (it changed since, or failed)."""
        token = version_token(path)
        hit = self._hit(path, token, False)
        return token if hit is not None and hit.passed else None

    def run(self, path: Path, layout: str | None, finite: bool = False) -> LoadTestResult:
        """The (cached) load test; ``finite`` also checks every tensor is finite. Raises
        :class:`LoadTestCancelled` once :meth:`cancel` ran and no result is cached."""
        if linked := folder_link_out(path):  # never a pass (nor "every tensor finite") for what it cannot read
            return LoadTestResult(False, 0.0, linked)
        token = version_token(path)  # one stat (a folder: a walk) for the lookups and the key
        hit = self._hit(path, token, finite)
        if hit is not None:
            return hit
        if self._cancelled:
            raise LoadTestCancelled(f"no load test of {path}: the supervisor is exiting")
        check_finite = self.check_finite or finite
        key = (str(path), token, check_finite)
        with self._running_lock:
            hit = self._hit(path, token, finite)  # one that ended since the first look
            # A finite-checked test under way answers a request that does not need the check too.
            running = self._running.get((str(path), token, True)) or self._running.get(key)
            if hit is None and running is None:
                mine: Future[LoadTestResult] = Future()
                self._running[key] = mine
        if hit is not None:
            return hit
        if running is not None:
            return running.result()
        try:
            res = run_warm_or_cold(LoadTestRequest(path, expected_keys=self.expected_keys, check_finite=check_finite,
                                                   trust_pickles=self.trust_pickles, mmap=self.mmap, layout=layout),
                                   self.warm, python=self.python, timeout_s=self.timeout_s, cwd=self.cwd,
                                   started=lambda proc: self._started(key, proc),
                                   cancelled=lambda: self._cancelled)
            if self._cancelled:
                raise LoadTestCancelled(f"the load test of {path} was stopped: the supervisor is exiting")
        except BaseException as e:
            with self._running_lock:
                self._running.pop(key, None)
                self._procs.pop(key, None)
            mine.set_exception(e)
            raise
        self._said(path, res, check_finite)
        self._results[key] = res  # stored before the entry under way goes: no window for a second test
        if self.store is not None and not res.untested:  # a test that could not run is no verdict to keep
            self.store.put(path, token, check_finite, res)
        self._steps[path] = (token, res.step)
        with self._running_lock:
            self._running.pop(key, None)
            self._procs.pop(key, None)
        mine.set_result(res)
        return res

    def _said(self, path: Path, res: LoadTestResult, check_finite: bool) -> None:
        """The test's log line: never ``passed=True`` for a checkpoint the pickle scan refused (a
        weights-only load of its weights proves nothing about the file refused); a test that could
        not run is said once per reason, with what to do."""
        if res.untested:
            if res.untested not in self._untested_said and len(self._untested_said) < 64:
                self._untested_said.add(res.untested)
                log.warning("checkpoint_load_test_untested", path=str(path), python=self.python, reason=res.untested,
                            next="checkpoints are judged on their structural checks alone and none is quarantined "
                                 "for this; set [checkpoints] python to an interpreter that has torch (or install "
                                 "torch for the job's python) to have them load-tested")
            return
        refused = scan_verdict(cached_refusal(path), res) if res.passed and not self.trust_pickles else None
        log.info("checkpoint_load_test", path=str(path), passed=res.passed and not refused, seconds=res.seconds,
                 error=refused or res.error, check_finite=check_finite,
                 **({"refused": refused, "loaded": res.passed} if refused else {}))

    def _started(self, key: tuple[str, Any, bool], proc: subprocess.Popen[Any]) -> None:
        if self.cgroup is not None:
            self.cgroup.enter(proc.pid)  # the warm process at each request: a no-op once it is there
        with self._running_lock:
            self._procs[key] = proc
            cancelled = self._cancelled
        if cancelled:  # cancel() ran between the first look and the start
            _kill_group(proc)

    def cancel(self) -> list[str]:
        """Stop every load test under way (the supervisor is exiting) and start no more; the
        paths whose tests were stopped. Their callers get :class:`LoadTestCancelled`: a test cut
        short is no verdict on the checkpoint. Without this, a test beside the job's start-up
        outlived the daemon when the job finished first (its torch process left behind)."""
        with self._running_lock:
            self._cancelled = True
            procs = dict(self._procs)
        if self.warm is not None:
            self.warm.close()
        for proc in procs.values():
            _kill_group(proc)
        if self.cgroup is not None:
            self.cgroup.remove()  # empty once the killed ones are gone; else a later sweep removes it
        return sorted({path for path, _token, _finite in procs})

    def carry(self, source: Path, copy: Path) -> None:
        """``copy`` holds the same bytes as ``source``'s version now (a last_good/ link or copy, or
        one restored from it): its results answer for the copy too, so the same bytes are not
        loaded again on the restart path (a second torch import and a full read)."""
        self.alias(source, version_token(source), copy, version_token(copy))

    def alias(self, source: Path, src: Any, copy: Path, dst: Any) -> None:
        """The results of ``source``'s version ``src`` answer for ``copy``'s version ``dst`` (the
        same bytes): a snapshot's verdict for the live file it was taken from, and for its kept name."""
        for (p, token, checked), res in list(self._results.items()):
            if p == str(source) and token == src:
                self._results[(str(copy), dst, checked)] = res
        seen = self._steps.get(source)
        if seen is not None and seen[0] == src:
            self._steps[copy] = (dst, seen[1])

    def step_read(self, path: Path) -> int | None:
        """The step a load test read from the version on disk now, or None."""
        seen = self._steps.get(path)
        return seen[1] if seen is not None and seen[0] == version_token(path) else None
