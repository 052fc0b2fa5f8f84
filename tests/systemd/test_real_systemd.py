"""transformer-supervisor under a real systemd, booted in a container (systemd-nspawn).

See tests/systemd/container.py for how (and shared/notes/real-systemd.md for why this way).
Needs root and systemd-nspawn (installed on demand with apt-get); skipped with the reason
otherwise. The checkout and its venv are bind-mounted read-only at the same paths.
"""
from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from supervisor.ops.journal import message_id
from tests.systemd.container import Container, Unavailable, boot
from tests.util import wait_for

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
PY = VENV / "bin" / "python"
UNIT = "transformer-supervisor.service"
CONFIG = "/etc/transformer-supervisor/config.toml"
OPS = "/srv/ops"
STATE = "/var/lib/transformer-supervisor/opsjob"
TSUP = "/usr/local/bin/transformer-supervisor"


def _binds() -> tuple[str, ...]:
    # The venv's interpreter is a symlink to the Python it was built from (pyenv here): bind
    # that installation too, at the same path, so the shebangs resolve inside. A venv built
    # from the system's /usr/bin/python3 needs nothing more: bookworm's python3 is inside.
    binds = [str(REPO)]
    venv = VENV.resolve()
    if not venv.is_relative_to(REPO):
        binds.append(str(venv))
    base = Path(os.path.realpath(PY)).parents[1]
    if base != Path("/usr") and not base.is_relative_to(REPO) and not base.is_relative_to(venv):
        binds.append(str(base))
    return tuple(binds)


@pytest.fixture(scope="module")
def ct() -> Iterator[Container]:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the real-systemd tests need root on Linux (systemd-nspawn)")
    if not PY.exists():
        pytest.skip(f"no venv at {VENV} to bind into the container")
    try:
        c = boot(bind_ro=_binds())
    except Unavailable as e:
        pytest.skip(f"cannot boot systemd in a container here: {e}")
    try:
        yield c
    finally:
        c.shutdown()


def _write(ct: Container, path: str, text: str) -> None:
    ct.exec(["/bin/sh", "-c", f"mkdir -p \"$(dirname '{path}')\" && cat > '{path}'"], input=textwrap.dedent(text))


def test_harness_notify_and_watchdog(ct: Container) -> None:
    """The harness itself: our Notifier talks to a real systemd; a unit that stops pinging dies."""
    _write(ct, "/etc/systemd/system/ping.service", f"""\
        [Service]
        Type=notify
        NotifyAccess=main
        WatchdogSec=2
        Environment=PYTHONPATH={REPO}
        ExecStart={PY} -c "import time; from supervisor.ops.notify import Notifier; n = Notifier(); n.ready('pinging'); [(n.watchdog(), time.sleep(0.1)) for _ in range(30)]; time.sleep(60)"
        """)
    ct.exec(["systemctl", "daemon-reload"])
    ct.exec(["systemctl", "start", "ping.service"])  # returns once READY=1 arrived
    assert ct.show("ping.service", "ActiveState") == "active"
    assert ct.show("ping.service", "StatusText") == "pinging"
    # pings for 3 s, then silent: killed about WatchdogSec after the last ping
    wait_for(lambda: ct.show("ping.service", "Result") == "watchdog", 20, 0.2, "watchdog kill")
    assert ct.show("ping.service", "ActiveState") in ("failed", "inactive")


CONFIG_TEXT = f"""\
    [job]
    name = "opsjob"
    command = ["{PY}", "{REPO}/tests/helpers/ops_job.py"]
    workdir = "{OPS}"
    env = {{ OPS_DIR = "{OPS}" }}

    [checkpoints]
    dir = "{OPS}/ckpt"

    [state]
    dir = "{STATE}"

    [policy]
    max_restarts = MAX_RESTARTS
    backoff_initial_s = 0.5

    [shutdown]
    grace_s = 15
    """

DROP_IN = """\
    # test timings: a wedged daemon is found in seconds, not minutes
    [Service]
    WatchdogSec=3
    TimeoutAbortSec=5
    RestartSec=1
    TimeoutStopSec=40
    """


def _status(ct: Container) -> dict:
    r = ct.exec([TSUP, "status", "--json", "--config", CONFIG], check=False)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}


def _live_jobs(ct: Container) -> list[int]:
    # no procps in the minimal rootfs; "[o]ps" keeps the grep from matching its own command line
    r = ct.sh("grep -l '[o]ps_job[.]py' /proc/[0-9]*/cmdline 2>/dev/null", check=False)
    return sorted(int(p.split("/")[2]) for p in r.stdout.split())


def _launches(ct: Container) -> list[tuple[str, int]]:
    r = ct.exec(["cat", f"{OPS}/launches"], check=False)
    return [(a, int(p)) for a, p in (ln.split() for ln in r.stdout.splitlines() if ln.strip())]


def test_journal_processor_in_a_real_journal(ct: Container) -> None:
    """Our native entries reach journald: matchable by TSUP_* field and MESSAGE_ID, each event
    exactly once, a sentence as MESSAGE, a traceback kept."""
    _write(ct, "/usr/local/lib/jtest.py", """\
        import structlog
        from supervisor import logsetup
        from supervisor.ops.journal import JournalProcessor
        p = JournalProcessor.for_environment()
        assert p is not None, "not under the journal"
        logsetup.add_processor(p)
        logsetup.configure("auto", "info")
        log = structlog.get_logger()
        log.error("restart_scheduled", cause="nan", attempt=3, evidence="a\\nb")
        def tick():
            raise KeyError("missing")
        try:
            tick()
        except KeyError:
            log.exception("runner_tick_failed", message="the main loop raised", attempt=None,
                          next="retrying at the next tick")
        """)
    _write(ct, "/etc/systemd/system/jtest.service", f"""\
        [Service]
        Type=oneshot
        Environment=PYTHONPATH={REPO}
        ExecStart={PY} /usr/local/lib/jtest.py
        """)
    ct.exec(["systemctl", "daemon-reload"])
    ct.exec(["systemctl", "start", "jtest.service"])
    got = wait_for(lambda: ct.journal("-u", "jtest.service", "TSUP_CAUSE=nan", "-o", "json"), 10, 0.2,
                   "the native entry")
    entries = [json.loads(ln) for ln in got.splitlines()]
    assert len(entries) == 1
    e = entries[0]
    assert e["TSUP_EVENT"] == "restart_scheduled" and e["TSUP_ATTEMPT"] == "3" and e["PRIORITY"] == "3"
    assert e["TSUP_EVIDENCE"] == "a\nb" and e["SYSLOG_IDENTIFIER"] == "transformer-supervisor"
    assert e["MESSAGE"].startswith("restart scheduled: cause=nan attempt=3"), e["MESSAGE"]
    assert e["MESSAGE_ID"] == message_id("restart_scheduled")
    assert e["CODE_FILE"] == "/usr/local/lib/jtest.py" and e["CODE_FUNC"] == "<module>" and e["CODE_LINE"] == "9"
    # journalctl MESSAGE_ID=... finds it (the documented way to find every restart)
    by_id = ct.journal("-u", "jtest.service", f"MESSAGE_ID={message_id('restart_scheduled')}", "-o", "json")
    assert [json.loads(ln)["TSUP_CAUSE"] for ln in by_id.splitlines()] == ["nan"]
    # log.exception(): the sentence, its next, then the traceback; the traceback also as a field
    failed = [json.loads(ln) for ln in ct.journal("-u", "jtest.service", "TSUP_EVENT=runner_tick_failed",
                                                   "-o", "json").splitlines()]
    assert len(failed) == 1
    f = failed[0]
    msg = f["MESSAGE"] if isinstance(f["MESSAGE"], str) else bytes(f["MESSAGE"]).decode()
    assert msg.startswith("the main loop raised; next: retrying at the next tick\nTraceback (most recent call last):")
    assert msg.rstrip().endswith("KeyError: 'missing'") and ", in tick" in msg, msg
    assert "KeyError: 'missing'" in f["TSUP_EXCEPTION"] and "TSUP_ATTEMPT" not in f and f["PRIORITY"] == "3"
    text = ct.journal("-u", "jtest.service", "-o", "cat")
    assert text.count("restart scheduled") == 1, text  # not doubled by a stderr line
    assert "event=" not in text, text  # no logfmt line reached stderr


def test_supervisor_under_systemd(ct: Container) -> None:
    try:
        _scenario(ct)
    except AssertionError as e:
        lines = [ln for ln in ct.journal("-u", UNIT).splitlines() if '{"step": ' not in ln]
        tail = "\n".join(lines[-50:])
        raise AssertionError(f"{e}\n--- journalctl -u {UNIT} (last 50, without step lines) ---\n{tail}") from None


def _events(ct: Container, event: str) -> list[dict]:
    """The daemon's native journal entries of one kind (matched by field, not by text)."""
    out = ct.journal("-u", UNIT, f"TSUP_EVENT={event}", "-o", "json")
    return [json.loads(ln) for ln in out.splitlines()]


def _proc_status(ct: Container, pid: int) -> dict[str, str]:
    text = ct.exec(["cat", f"/proc/{pid}/status"]).stdout
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}


CAP_SYS_BOOT, CAP_SYS_TIME, CAP_SYS_PTRACE, CAP_SYS_ADMIN = 22, 25, 19, 21


def _scenario(ct: Container) -> None:
    # -- install: units, the command, a config, the env file ---------------------------------
    ct.exec([f"{REPO}/scripts/install-systemd", "--use-venv", str(VENV)], timeout=120)
    assert ct.exec(["readlink", TSUP]).stdout.strip() == f"{VENV}/bin/transformer-supervisor"
    assert ct.exec(["stat", "-c", "%a", "/etc/transformer-supervisor/env"]).stdout.strip() == "600"
    ct.sh("echo 'TSUP_TEST_FROM_ENV_FILE=node-wide' >> /etc/transformer-supervisor/env")
    _write(ct, CONFIG, CONFIG_TEXT.replace("MAX_RESTARTS", "10"))
    _write(ct, f"/etc/systemd/system/{UNIT}.d/test.conf", DROP_IN)
    ct.exec(["mkdir", "-p", OPS, f"{OPS}/ckpt"])  # the pre-launch gate checks the checkpoint dir
    ct.exec(["systemctl", "daemon-reload"])
    assert ct.exec([TSUP, "check-config", CONFIG], check=False).returncode == 0

    # -- start -> active (READY=1 arrived), the job runs, both outputs in the journal --------
    t0 = time.monotonic()
    ct.exec(["systemctl", "start", UNIT], timeout=60)
    assert ct.show(UNIT, "ActiveState") == "active"
    assert time.monotonic() - t0 < 30
    wait_for(lambda: len(_live_jobs(ct)) == 1, 20, 0.2, "the job runs")
    wait_for(lambda: "ops_job started attempt=0" in ct.journal("-u", UNIT), 20, 0.2, "job output in the journal")
    log = ct.journal("-u", UNIT)
    started = _events(ct, "job_started")
    assert len(started) == 1 and started[0]["MESSAGE"].startswith("attempt 0 started"), log[-3000:]
    assert started[0]["MESSAGE_ID"] == message_id("job_started") and started[0]["CODE_FILE"].endswith(".py")
    assert "event=job_started" not in log  # the journal shows the sentence; the data is in TSUP_* fields
    assert '{"step": 1' in log  # the job's stdout, passed through unchanged

    # -- the unit's GPU-node defaults, as systemd loaded them ---------------------------------
    assert ct.show(UNIT, "OOMPolicy") == "continue"
    assert "remote-fs.target" in ct.show(UNIT, "After").split()
    assert "143" in ct.show(UNIT, "SuccessExitStatus").split()
    assert ct.show(UNIT, "SystemCallArchitectures") == "native"
    assert ct.show(UNIT, "ProtectHostname") == "yes" and ct.show(UNIT, "PrivateMounts") == "yes"
    assert ct.show(UNIT, "EnvironmentFiles").startswith("/etc/transformer-supervisor/env (ignore_errors=yes)")
    # ... and the sandbox as the job got it: the env file's variables, the seccomp filter, no
    # privilege gain, the capabilities training never uses dropped, the ones it may use kept
    job = _live_jobs(ct)[0]
    # ... in a cgroup of its own below the unit's (Delegate=yes, the unit's subtree writable)
    cgroup = ct.exec(["cat", f"/proc/{job}/cgroup"]).stdout
    assert re.search(rf"^0::/.*/{re.escape(UNIT)}/tsup-[^/]+-0$", cgroup, re.M), cgroup
    environ = ct.exec(["cat", f"/proc/{job}/environ"]).stdout.split("\0")
    assert "TSUP_TEST_FROM_ENV_FILE=node-wide" in environ
    st = _proc_status(ct, job)
    assert st["Seccomp"] == "2" and st["NoNewPrivs"] == "1", st
    bnd = int(st["CapBnd"], 16)
    assert not bnd & (1 << CAP_SYS_BOOT) and not bnd & (1 << CAP_SYS_TIME)
    assert bnd & (1 << CAP_SYS_PTRACE) and bnd & (1 << CAP_SYS_ADMIN)
    first_daemon = int(ct.show(UNIT, "MainPID"))
    run_id = wait_for(lambda: _status(ct).get("run_id"), 20, 0.2, "status over the control socket")
    table = ct.exec([TSUP, "status", "--config", CONFIG]).stdout
    assert run_id is not None and "run id" in table and run_id in table
    wait_for(lambda: ct.show(UNIT, "StatusText"), 10, 0.2, "STATUS= in systemctl status")

    # -- the job fails -> restart, in the journal and matchable by field ---------------------
    ct.exec(["touch", f"{OPS}/fail"])
    wait_for(lambda: len(_launches(ct)) == 2 and len(_live_jobs(ct)) == 1, 30, 0.2, "restart after the failure")
    wait_for(lambda: ct.journal("-u", UNIT, "TSUP_CAUSE=crash"), 10, 0.2, "the restart in the journal")
    fields = [json.loads(ln) for ln in ct.journal("-u", UNIT, "TSUP_CAUSE=crash", "-o", "json").splitlines()]
    # a missing native entry is a failure, never a skip: the daemon wires JournalProcessor
    assert fields, "journalctl TSUP_CAUSE=crash found nothing: native journal entries are not arriving"
    assert any(f.get("TSUP_EVENT") == "restart_scheduled" for f in fields), fields
    assert all(f["_SYSTEMD_UNIT"] == UNIT and f["TSUP_SOURCE"] == "daemon" for f in fields)
    # every restart, found by its MESSAGE_ID whatever its text (the docs' recipe)
    restarts = ct.journal("-u", UNIT, f"MESSAGE_ID={message_id('restart_scheduled')}", "-o", "json")
    assert [json.loads(ln)["TSUP_CAUSE"] for ln in restarts.splitlines()] == ["crash"]
    # each daemon event is in the journal once (native entry, no duplicate stderr line)
    assert len(_events(ct, "job_started")) == 2
    assert not [ln for ln in ct.journal("-u", UNIT, "-o", "cat").splitlines() if ln.startswith("event=")]
    assert _status(ct)["restarts_by_cause"].get("crash") == 1

    # -- systemctl reload applies a config change -------------------------------------------
    _write(ct, CONFIG, CONFIG_TEXT.replace("MAX_RESTARTS", "7"))
    ct.exec(["systemctl", "reload", UNIT])
    wait_for(lambda: _status(ct).get("max_restarts") == 7, 20, 0.2, "reloaded config in status")
    assert _events(ct, "config_reloaded")
    assert ct.show(UNIT, "ActiveState") == "active"
    assert int(ct.show(UNIT, "MainPID")) == first_daemon

    # -- kill -STOP the daemon -> watchdog kills it, systemd restarts it, same run, one job ---
    ct.sh(f"kill -STOP {first_daemon}")  # the shell builtin: no procps in the rootfs
    wait_for(lambda: ct.show(UNIT, "MainPID") not in ("0", str(first_daemon))
             and ct.show(UNIT, "ActiveState") == "active", 60, 0.2, "watchdog restart of the daemon")
    assert ct.show(UNIT, "NRestarts") == "1"
    assert "Watchdog timeout" in ct.journal("-u", UNIT, "_PID=1")  # systemd's own line
    wait_for(lambda: len(_launches(ct)) == 3 and len(_live_jobs(ct)) == 1, 30, 0.2, "the job relaunched once")
    assert _status(ct)["run_id"] == run_id  # the same run, continued from the ledger
    assert len(_live_jobs(ct)) == 1 and _live_jobs(ct)[0] == _launches(ct)[-1][1]  # no second copy
    hist = json.loads(ct.exec([TSUP, "history", "--json", "--config", CONFIG]).stdout)
    assert hist["run_id"] == run_id and len(hist["attempts"]) == 3

    # -- systemctl stop -> the job got SIGTERM and flushed its checkpoint; the save takes longer
    #    than TimeoutStopSec, and the daemon's EXTEND_TIMEOUT_USEC keeps systemd from killing it
    attempt = _launches(ct)[-1][0]
    _write(ct, f"/etc/systemd/system/{UNIT}.d/test.conf", DROP_IN.replace("TimeoutStopSec=40", "TimeoutStopSec=3"))
    ct.exec(["systemctl", "daemon-reload"])
    ct.sh(f"echo 6 > {OPS}/flush_delay")
    t0 = time.monotonic()
    ct.exec(["systemctl", "stop", UNIT], timeout=60)
    took = time.monotonic() - t0
    flushed = ct.exec(["cat", f"{OPS}/stop.{attempt}"]).stdout
    assert flushed.startswith("flushed step=")
    assert ct.exec(["sh", "-c", f"ls {OPS}/ckpt/step_*.ckpt"]).stdout.strip()
    assert ct.show(UNIT, "Result") == "success", ct.show(UNIT, "Result")  # not "timeout"
    # 0 today; 143 once a daemon stopped by SIGTERM says so (SuccessExitStatus=143 keeps it clean)
    assert ct.show(UNIT, "ExecMainStatus") in ("0", "143")
    assert 6 <= took < 30, took
    assert _live_jobs(ct) == []


def test_success_exit_status_143(ct: Container) -> None:
    """A main process that exits 143 on SIGTERM (what a Slurm or Kubernetes stop must see) stops
    cleanly under our unit's settings; the same unit without SuccessExitStatus=143 fails."""
    ct.exec([f"{REPO}/scripts/install-systemd", "--use-venv", str(VENV)], timeout=120)
    text = ct.exec(["cat", f"/etc/systemd/system/{UNIT}"]).stdout
    # The shell says when its trap is set (%n: the unit's name): a SIGTERM before that would kill
    # it the default way, which systemd counts as a clean stop whatever the unit says.
    unit = (text.replace("ExecStart=", "ExecStart=/bin/sh -c 'trap \"exit 143\" TERM; : > /run/%n.ready; "
                                       "while :; do sleep 0.1; done'\n#", 1)
            .replace("Type=notify", "Type=simple").replace("WatchdogSec=60", "WatchdogSec=0"))
    assert "\nSuccessExitStatus=143\n" in unit
    _write(ct, "/etc/systemd/system/t143.service", unit)
    _write(ct, "/etc/systemd/system/t143-control.service", unit.replace("\nSuccessExitStatus=143\n", "\n"))
    ct.exec(["systemctl", "daemon-reload"])
    for name in ("t143.service", "t143-control.service"):
        ct.exec(["systemctl", "start", name])
        assert ct.show(name, "ActiveState") == "active"
        wait_for(lambda: ct.exec(["test", "-e", f"/run/{name}.ready"], check=False).returncode == 0, 10, 0.05,
                 f"{name}'s trap")
        ct.exec(["systemctl", "stop", name], timeout=60, check=False)
    # the control proves the shell really exits 143 and that systemd would call it a failure
    diag = ct.journal("-u", "t143-control.service") + "\n" + ct.exec(
        ["systemctl", "show", "t143-control.service", "-p", "ActiveState,Result,ExecMainStatus,ExecMainCode,LoadState"],
        check=False).stdout
    assert ct.show("t143-control.service", "ActiveState") == "failed", diag
    assert ct.show("t143-control.service", "Result") == "exit-code"
    assert ct.show("t143-control.service", "ExecMainStatus") == "143"
    # ours: a clean stop (inactive, not failed: systemd even unloads it, as any successful stop)
    assert ct.show("t143.service", "ActiveState") == "inactive"
    log = ct.journal("-u", "t143.service")
    assert "Deactivated successfully" in log and "Failed with result" not in log, log


@pytest.mark.slow
def test_template_instance(ct: Container) -> None:
    """transformer-supervisor@NAME reads /etc/transformer-supervisor/NAME.toml."""
    ct.exec([f"{REPO}/scripts/install-systemd", "--use-venv", str(VENV)], timeout=120)
    conf = "/etc/transformer-supervisor/night.toml"
    text = (CONFIG_TEXT.replace("MAX_RESTARTS", "4").replace('"opsjob"', '"night"')
            .replace(OPS, "/srv/night").replace(STATE, "/var/lib/transformer-supervisor/night"))
    _write(ct, conf, text)
    ct.exec(["mkdir", "-p", "/srv/night/ckpt"])
    unit = "transformer-supervisor@night.service"
    try:
        ct.exec(["systemctl", "start", unit], timeout=60)
        assert ct.show(unit, "ActiveState") == "active"
        st = wait_for(lambda: json.loads(ct.exec([TSUP, "status", "--json", "--config", conf]).stdout or "{}"),
                      20, 0.2, "status of the instance")
        assert st["max_restarts"] == 4 and st["state_dir"] == "/var/lib/transformer-supervisor/night"
        assert ct.exec(["test", "-d", "/run/transformer-supervisor/night"], check=False).returncode == 0
        # The instance lives in system-transformer\x2dsupervisor.slice, not system.slice: its
        # ReadWritePaths= must name that cgroup, or the job gets no cgroup of its own (the tree
        # stays read-only under ProtectControlGroups=).
        job = wait_for(lambda: _live_jobs(ct), 20, 0.2, "the instance's job runs")[0]
        cgroup = ct.exec(["cat", f"/proc/{job}/cgroup"]).stdout
        slice_ = re.escape("/system.slice/system-transformer\\x2dsupervisor.slice/")
        assert re.search(rf"^0::{slice_}{re.escape(unit)}/tsup-[^/]+-0$", cgroup, re.M), (
            cgroup + "\n" + ct.journal("-u", unit, "TSUP_EVENT=job_isolation"))
    finally:
        ct.exec(["systemctl", "stop", unit], timeout=60, check=False)
    assert ct.show(unit, "Result") == "success"
    assert ct.exec(["cat", "/srv/night/stop.0"]).stdout.startswith("flushed step=")
