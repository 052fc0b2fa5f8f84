"""transformer-supervisor under a real systemd, booted in a container (systemd-nspawn).

See tests/systemd/container.py for how (and shared/notes/real-systemd.md for why this way).
Needs root and systemd-nspawn (installed on demand with apt-get); skipped with the reason
otherwise. The checkout and its venv are bind-mounted read-only at the same paths.
"""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

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
    """Our native entries reach journald: matchable by TSUP_* field, each event exactly once."""
    _write(ct, "/usr/local/lib/jtest.py", """\
        import structlog
        from supervisor.ops.journal import JournalProcessor
        p = JournalProcessor.for_environment()
        assert p is not None, "not under the journal"
        structlog.configure(processors=[structlog.processors.add_log_level, p,
                                        structlog.processors.KeyValueRenderer(key_order=["event"])])
        structlog.get_logger().error("restart_scheduled", cause="nan", attempt=3, evidence="a\\nb")
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
    assert e["MESSAGE"].startswith("event=restart_scheduled cause=nan attempt=3")
    text = ct.journal("-u", "jtest.service", "-o", "cat")
    assert text.count("restart_scheduled") == 1, text  # not doubled by a stderr line


def test_supervisor_under_systemd(ct: Container) -> None:
    try:
        _scenario(ct)
    except AssertionError as e:
        lines = [ln for ln in ct.journal("-u", UNIT).splitlines() if '{"step": ' not in ln]
        tail = "\n".join(lines[-50:])
        raise AssertionError(f"{e}\n--- journalctl -u {UNIT} (last 50, without step lines) ---\n{tail}") from None


def _scenario(ct: Container) -> None:
    # -- install: units, the command, a config ----------------------------------------------
    ct.exec([f"{REPO}/scripts/install-systemd", "--use-venv", str(VENV)], timeout=120)
    assert ct.exec(["readlink", TSUP]).stdout.strip() == f"{VENV}/bin/transformer-supervisor"
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
    assert "event=job_started" in log, log[-3000:]
    assert '{"step": 1' in log  # the job's stdout, passed through unchanged
    first_daemon = int(ct.show(UNIT, "MainPID"))
    run_id = wait_for(lambda: _status(ct).get("run_id"), 20, 0.2, "status over the control socket")
    table = ct.exec([TSUP, "status", "--config", CONFIG]).stdout
    assert "run id" in table and run_id in table
    wait_for(lambda: ct.show(UNIT, "StatusText"), 10, 0.2, "STATUS= in systemctl status")

    # -- the job fails -> restart, in the journal and matchable by field ---------------------
    ct.exec(["touch", f"{OPS}/fail"])
    wait_for(lambda: len(_launches(ct)) == 2 and len(_live_jobs(ct)) == 1, 30, 0.2, "restart after the failure")
    wait_for(lambda: "cause=crash" in ct.journal("-u", UNIT), 10, 0.2, "the restart in the journal")
    fields = [json.loads(ln) for ln in ct.journal("-u", UNIT, "TSUP_CAUSE=crash", "-o", "json").splitlines()]
    if fields:
        assert any(f.get("TSUP_EVENT") == "restart_scheduled" for f in fields), fields
        assert all(f["_SYSTEMD_UNIT"] == UNIT and f["TSUP_SOURCE"] == "daemon" for f in fields)
    elif _journal_wired():
        raise AssertionError("journalctl TSUP_CAUSE=crash found nothing although the daemon wires "
                             "JournalProcessor: native journal entries are not arriving")
    # each daemon event is in the journal once (native entry, no duplicate stderr line)
    starts = [ln for ln in ct.journal("-u", UNIT, "-o", "cat").splitlines() if ln.startswith("event=job_started")]
    assert len(starts) == 2, starts
    assert _status(ct)["restarts_by_cause"].get("crash") == 1

    # -- systemctl reload applies a config change -------------------------------------------
    _write(ct, CONFIG, CONFIG_TEXT.replace("MAX_RESTARTS", "7"))
    ct.exec(["systemctl", "reload", UNIT])
    wait_for(lambda: _status(ct).get("max_restarts") == 7, 20, 0.2, "reloaded config in status")
    assert "event=config_reloaded" in ct.journal("-u", UNIT)
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
    assert ct.show(UNIT, "ExecMainStatus") == "0"
    assert 6 <= took < 30, took
    assert _live_jobs(ct) == []
    if not fields:
        pytest.skip("everything passed except `journalctl TSUP_CAUSE=crash`: the daemon does not send "
                    "native journal entries yet (wire supervisor.ops.journal.JournalProcessor via "
                    "logsetup.add_processor)")


def _journal_wired() -> bool:
    """Whether the daemon (outside supervisor/ops) installs the native journal processor."""
    return any("JournalProcessor" in p.read_text() for p in (REPO / "supervisor").rglob("*.py")
               if "ops" not in p.parts)


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
    finally:
        ct.exec(["systemctl", "stop", unit], timeout=60, check=False)
    assert ct.show(unit, "Result") == "success"
    assert ct.exec(["cat", "/srv/night/stop.0"]).stdout.startswith("flushed step=")
