"""Shared fixtures: run the real daemon as a subprocess and read its ledger."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

# One torch CPU thread for every job, daemon-launched or not, and for the tests' own torch: the
# jobs here are tiny models, and with its default (one OpenMP thread per core) torch's idle
# threads spin for a core another test needs: a tiny HF run took 2x the CPU and 3x the wall time
# on a loaded 2-core machine. setdefault: a run that wants more sets it itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "tests" / "helpers"


class Daemon:
    """A real `python -m supervisor` process; stdout/stderr captured to files."""

    def __init__(self, args: list[str], tmp: Path, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.stdout_path = tmp / "daemon.stdout"
        self.stderr_path = tmp / "daemon.stderr"
        e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        e.pop("JOURNAL_STREAM", None)
        e.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor", "--log-format", "logfmt", *args],
                                     cwd=str(ROOT), env=e, stdout=open(self.stdout_path, "wb"),
                                     stderr=open(self.stderr_path, "wb"), start_new_session=True)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"daemon did not exit within {timeout}s; stderr:\n{self.stderr()[-3000:]}") from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """Stop a daemon a test left running: SIGTERM first, so it stops its job's group (the job
        runs in a session of its own and would outlive a SIGKILLed daemon), then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def events(self) -> list[str]:
        return [l for l in self.stderr().splitlines() if l.startswith("event=")]


def history(state_dir: Path) -> dict[str, Any]:
    """What `history --json --state-dir DIR` prints, read in this process: the same ledger read
    and the same JSON encoding as the command, without an interpreter start per call (171 calls,
    ~40 CPU seconds of the suite as subprocesses; tests poll it). The command itself is tested in
    tests/cli/ (test_history_json_is_what_the_helper_reads checks they agree)."""
    from supervisor import strictjson
    from supervisor.ledger.store import Ledger

    led = Ledger(state_dir, readonly=True)
    try:
        h = led.history(None)
    finally:
        led.close()
    return json.loads(strictjson.dumps(h, indent=2, default=str))


@contextlib.contextmanager
def started_daemons(factory: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """The body of every daemon fixture: ``start(...)`` builds one through ``factory``; at
    teardown each one still running is stopped (SIGTERM first, see ``kill``)."""
    started: list[Any] = []

    def start(*args: Any, **kwargs: Any) -> Any:
        d = factory(*args, **kwargs)
        started.append(d)
        return d

    try:
        yield start
    finally:
        for d in started:
            if d.proc.poll() is None:
                d.kill()


@pytest.fixture
def daemons(tmp_path: Path):
    def make(args: list[str], env: dict[str, str] | None = None) -> Daemon:
        return Daemon(args, tmp_path, env)

    with started_daemons(make) as start:
        yield start


def helper(name: str) -> str:
    return str(HELPERS / name)


def pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.fixture(autouse=True)
def _structlog_restored():
    """A test that runs a CLI entry point in-process configures structlog onto that test's
    captured stream; later tests must not log into a closed file. A runner run in-process binds
    its run id into the context: later tests must not see it in their lines either."""
    import structlog

    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
    structlog.contextvars.clear_contextvars()


def pytest_collection_modifyitems(config, items):
    """Under xdist, every worker's slice starts with its share of the heavy modules
    (tests/helpers/schedule.py: why, and where the costs come from)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        return
    from tests.helpers import schedule

    costs = schedule.read_costs(ROOT / "tests" / "durations.tsv")
    tests = [schedule.Test(it.nodeid, schedule.guess(it.nodeid, {m.name for m in it.iter_markers()}, costs))
             for it in items]
    items[:] = [items[i] for i in schedule.arrange(tests, workers)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed fuzz test names the seed its inputs came from (tests/helpers/fuzzseed.py)."""
    outcome = yield
    rep = outcome.get_result()
    used = getattr(getattr(item, "obj", None), "_hypothesis_internal_use_seed", None)
    if rep.failed and used is not None:
        rep.sections.append(("fuzz seed", f"this run's inputs came from seed {used}; TSUP_FUZZ_SEED={used} "
                                          f"tries them again\n"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """TSUP_TEST_CPU=FILE: append each test's CPU seconds (this process and the children it
    reaped: daemons, jobs, load tests) to FILE, to find what makes the suite CPU-bound; then its
    wall seconds, the xdist worker and the wall-clock start and end (to see which worker's tail
    made the run long): `cpu wall worker start end nodeid`, tab-separated."""
    path = os.environ.get("TSUP_TEST_CPU")
    if not path:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    before, start = cpu(), time.time()
    yield
    end = time.time()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(path, "a") as f:
        f.write(f"{cpu() - before:.2f}\t{end - start:.2f}\t{worker}\t{start:.2f}\t{end:.2f}\t{item.nodeid}\n")

