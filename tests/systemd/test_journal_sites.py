"""The daemon's journal entries under a real systemd (booted in a container, tests/systemd/container.py):
``journalctl TSUP_SOURCE=daemon`` (the documented filter) finds every detection, and each entry's
CODE_FILE/CODE_LINE/CODE_FUNC is the line in our code that decided the event, not a logging helper.

A job that prints a NaN loss on its first attempt and finishes on its second runs under the real
daemon as a service; the test reads the journal back as ``journalctl -o json`` shows it.
"""
from __future__ import annotations

import ast
import json
import os
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import Iterator

import pytest

from tests.systemd.container import Container, Unavailable, boot
from tests.systemd.test_real_systemd import PY, REPO, VENV, _binds
from tests.util import wait_for

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(300)]

UNIT = "nanjob.service"
WORK = "/srv/nanjob"
STATE = "/var/lib/nanjob"
# Machinery between the code that decides an event and the journal: never an event's place.
NOT_A_PLACE = ("supervisor/logsite.py", "supervisor/logsetup.py", "supervisor/ops/journal.py",
               "supervisor/daemon/recorder.py", "supervisor/watch/quiet.py")

JOB = """\
    import json, os, sys, time
    attempt = int(os.environ["TSUP_ATTEMPT"])
    for step in range(1, 31):
        loss = float("nan") if attempt == 0 and step == 20 else 3.0 / step
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        time.sleep(0.02)
    if attempt == 0:
        time.sleep(120)  # stopped by the daemon for the NaN well before this
    """

CONFIG = f"""\
    [job]
    name = "nanjob"
    command = ["{PY}", "{WORK}/job.py"]
    workdir = "{WORK}"

    [checkpoints]
    dir = "{WORK}/ckpt"

    [state]
    dir = "{STATE}"

    [policy]
    max_restarts = 3
    backoff_initial_s = 0.2

    [shutdown]
    grace_s = 5
    """


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


@cache
def _functions(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every function in a source file."""
    tree = ast.parse(Path(path).read_text())
    return [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _innermost_function(path: str, line: int) -> str:
    spans = [(a, b, name) for a, b, name in _functions(path) if a <= line <= b]
    return min(spans, key=lambda s: s[1] - s[0])[2] if spans else "<module>"


@pytest.mark.slow
def test_daemon_entries_keep_their_marker_and_name_their_call_site(ct: Container) -> None:
    _write(ct, f"{WORK}/job.py", JOB)
    _write(ct, f"{WORK}/config.toml", CONFIG)
    ct.exec(["mkdir", "-p", f"{WORK}/ckpt"])
    _write(ct, f"/etc/systemd/system/{UNIT}", f"""\
        [Service]
        Type=notify
        NotifyAccess=main
        ExecStart={VENV}/bin/transformer-supervisor run --config {WORK}/config.toml
        """)
    ct.exec(["systemctl", "daemon-reload"])
    ct.exec(["systemctl", "start", UNIT], timeout=90)
    # The second attempt finishes: the daemon exits and the unit goes inactive.
    wait_for(lambda: ct.show(UNIT, "ActiveState") in ("inactive", "failed"), 150, 0.3, "the run's end")
    every = [json.loads(ln) for ln in ct.journal("-u", UNIT, "-o", "json").splitlines()]
    ours = [json.loads(ln) for ln in ct.journal("-u", UNIT, "TSUP_SOURCE=daemon", "-o", "json").splitlines()]
    said = "\n".join(f"{e.get('TSUP_EVENT')}: {e.get('MESSAGE')}" for e in ours)
    assert ct.show(UNIT, "Result") == "success", said[-3000:]

    # -- the documented filter finds the detections (their own `source` no longer overwrites it)
    kinds = [e.get("TSUP_EVENT") for e in ours]
    for kind in ("daemon_started", "anomaly_detected", "failure_detected", "restart_scheduled", "job_started"):
        assert kind in kinds, f"journalctl TSUP_SOURCE=daemon lacks {kind}: {sorted(set(kinds))}"
    detections = [e for e in ours if e["TSUP_EVENT"] in ("anomaly_detected", "failure_detected")]
    assert all(e["TSUP_CAUSE"] == "nan" and e["TSUP_EVENT_SOURCE"] == "stdout" for e in detections), \
        json.dumps([{k: v for k, v in e.items() if k.startswith(("TSUP_", "CODE_"))} for e in detections], indent=1)
    # every native entry of ours carries the marker; the job's own lines never do
    native = [e for e in every if "TSUP_EVENT" in e]
    assert len(native) == len(ours) and all(e["TSUP_SOURCE"] == "daemon" for e in native)
    assert not [e for e in every if e.get("_TRANSPORT") == "stdout" and "TSUP_SOURCE" in e]

    # -- CODE_*: a line of our code, in the function named, never the logging machinery ------------
    for e in ours:
        where = f"{e['TSUP_EVENT']} at {e.get('CODE_FILE')}:{e.get('CODE_LINE')} {e.get('CODE_FUNC')}"
        for field in ("CODE_FILE", "CODE_LINE", "CODE_FUNC"):
            assert field in e, f"{e['TSUP_EVENT']}: no {field} in its journal entry"
        path, line = e["CODE_FILE"], int(e["CODE_LINE"])
        assert path.startswith(f"{REPO}/supervisor/") and Path(path).is_file(), where
        assert not path.endswith(NOT_A_PLACE), f"a logging helper, not the call site: {where}"
        assert _innermost_function(path, line) == e["CODE_FUNC"], where
    # the main events: the line itself (or the call it starts) names the event it logs
    for kind in ("anomaly_detected", "failure_detected", "restart_scheduled", "job_started", "daemon_started"):
        e = next(x for x in ours if x["TSUP_EVENT"] == kind)
        lines = Path(e["CODE_FILE"]).read_text().splitlines()
        text = "\n".join(lines[int(e["CODE_LINE"]) - 1:int(e["CODE_LINE"]) + 5])
        assert kind in text or kind.upper() in text, f"{kind}: {e['CODE_FILE']}:{e['CODE_LINE']}:\n{text}"
    # a state machine's event: where the machine decided it, not where the runner logged it
    restart = next(x for x in ours if x["TSUP_EVENT"] == "restart_scheduled")
    assert restart["CODE_FILE"].startswith(f"{REPO}/supervisor/core/"), restart["CODE_FILE"]
