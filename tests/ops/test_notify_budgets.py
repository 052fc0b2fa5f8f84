"""[notify] under hostile sinks (issue 34 part 3), against real ones: a local webhook that
trickles, stalls, redirects, errs, floods or hangs up (tests/ops/hostilehttp.py), and real hook
commands. Each try ends within its total deadline, memory stays bounded, every notice is accounted
for, and the give-up notice still goes out behind a stuck one."""
from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from supervisor.ops.alertmsg import Alert, Masker
from supervisor.ops import alerts
from supervisor.ops.alerts import Alerter
from supervisor.ops.config import NotifyConfig
from supervisor.ops.delivery import HOOK_STDERR_BYTES
from tests.conftest import pid_alive
from tests.ops.hostilehttp import BEHAVIOURS, HostileWebhook
from tests.ops.notifyhelp import Webhook
from tests.util import wait_for

PY = sys.executable


def alert(event: str) -> Alert:
    return Alert(event, "error", f"{event} happened", "gpt", "r1", "node-3", 1, 1_700_000_000.0, {})


def alerter(**kw: object) -> Alerter:
    cfg = NotifyConfig(**{"repeat_after_s": 0.0, "max_per_hour": 1000, **kw})  # type: ignore[arg-type]
    a = Alerter(cfg, Masker())
    a.start()
    return a


def test_a_trickling_webhook_is_cut_at_its_total_deadline_and_the_next_notices_go_out():
    """Before: urllib's timeout is per read, so a reply trickled a byte every 0.1 s held the
    sender for good and every later notice was lost. Now the try ends at timeout_s in all."""
    hook = HostileWebhook(lambda s: "trickle" if s.event == "restart_scheduled" else "ok")
    a = alerter(webhook_url=hook.url, timeout_s=1.0, retries=0)
    try:
        with capture_logs() as logs:
            t0 = time.monotonic()
            a.submit(alert("restart_scheduled"))
            a.submit(alert("validation_failed"))
            wait_for(lambda: "validation_failed" in hook.events(), timeout=20, what="the notice after the stuck one")
            took = time.monotonic() - t0
            a.close(5.0)
    finally:
        hook.close()
    assert took < 1.0 + 8.0, took  # the 1 s deadline, with a loaded machine's margin (the trickle is endless)
    failed = [e for e in logs if e["event"] == "notify_failed"]
    assert len(failed) == 1 and "within 1 s" in failed[0]["error"], logs
    assert a.counts()["webhook"] == {"sent": 1, "failed": 1, "dropped": 0}


def test_a_redirect_is_refused_said_with_its_status_and_nothing_reaches_the_other_host():
    elsewhere = Webhook()  # where the 302 points: urllib would have sent it an empty GET
    hook = HostileWebhook(lambda s: "redirect", redirect_to=elsewhere.url)
    a = alerter(webhook_url=hook.url, timeout_s=5.0, retries=2)
    try:
        with capture_logs() as logs:
            a.submit(alert("gave_up"))
            a.close(10.0)
    finally:
        hook.close()
        elsewhere.close()
    said = [e for e in logs if e["event"] == "notify_redirect_refused"]
    assert len(said) == 1 and said[0]["status"] == 302 and said[0]["to_host"] == "127.0.0.1", logs
    assert "not delivered" in said[0]["next"]
    assert hook.events() == ["gave_up"]  # tried once: a redirect is permanent, not retried
    assert elsewhere.received == []
    assert a.counts()["webhook"] == {"sent": 0, "failed": 1, "dropped": 0}


def test_a_stuck_send_yields_at_exit_so_the_give_up_notice_goes_out():
    """An earlier notice's try is stuck (a webhook that never answers it, timeout_s 60) when the
    daemon gives up: the give-up notice jumps the queue and the stuck try is cut halfway through
    shutdown_wait_s, so the last word arrives before the exit."""
    hook = HostileWebhook(lambda s: "ok" if s.event == "gave_up" else "silent")
    a = alerter(webhook_url=hook.url, timeout_s=60.0, retries=3)
    try:
        a.submit(alert("restart_scheduled"))
        wait_for(lambda: hook.events() == ["restart_scheduled"], what="the first notice in flight")
        for _ in range(5):
            a.submit(alert("metrics_blind"))  # a backlog the give-up notice must not wait behind
        a.submit(alert("gave_up"))
        t0 = time.monotonic()
        a.close(4.0)
        took = time.monotonic() - t0
    finally:
        hook.close()
    assert "gave_up" in hook.events(), hook.events()
    assert hook.events().index("gave_up") == 1  # right after the stuck one, before the backlog
    assert took < 4.0 + 3.0, took


def test_a_hook_writing_200_mb_to_stderr_costs_a_bounded_tail_and_its_last_line_is_said(tmp_path: Path):
    """Before: communicate() kept all of it (300 MB made the daemon 0.5 GB) for a 300-character
    tail. Now the hook's stderr is read to a tail of HOOK_STDERR_BYTES, ~50,000x past it here."""
    script = tmp_path / "loud.py"
    script.write_text("import sys\nblock = b'e' * (1 << 20)\nfor _ in range(200):\n    sys.stderr.buffer.write(block)\n"
                      "sys.stderr.write('\\nthe pager is down\\n')\nsys.exit(4)\n")
    a = alerter(command=(PY, str(script)), timeout_s=120.0, retries=0)
    tracemalloc.start()
    try:
        with capture_logs() as logs:
            a.submit(alert("gave_up"))
            a.close(120.0)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    failed = [e for e in logs if e["event"] == "notify_failed"]
    assert len(failed) == 1 and "exited 4: " in failed[0]["error"] and failed[0]["error"].endswith("\nthe pager is down"), logs
    assert peak < 20 * HOOK_STDERR_BYTES + (1 << 20), peak  # 200 MB read, a few tails' worth kept


def test_a_hook_still_running_at_exit_is_killed_with_what_it_started(tmp_path: Path):
    """A hook that never exits and started a child of its own (which would outlive both): past
    shutdown_wait_s the daemon's close kills the hook's process group; nothing is left."""
    pids = tmp_path / "pids"
    script = tmp_path / "stuck.py"
    script.write_text("import os, subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      f"open({str(pids)!r} + '.tmp', 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
                      f"os.replace({str(pids)!r} + '.tmp', {str(pids)!r})\n"
                      "time.sleep(600)\n")
    a = alerter(command=(PY, str(script)), timeout_s=600.0, retries=0)
    with capture_logs() as logs:
        a.submit(alert("gave_up"))
        wait_for(pids.exists, timeout=30, what="the hook and its child started")
        t0 = time.monotonic()
        a.close(0.5)
        took = time.monotonic() - t0
    hook_pid, child_pid = map(int, pids.read_text().split())
    wait_for(lambda: not pid_alive(child_pid) and not pid_alive(hook_pid), timeout=10, what="hook group gone")
    assert took < 0.5 + 5.0, took
    abandoned = [e for e in logs if e["event"] == "notify_abandoned"]
    assert len(abandoned) == 1 and abandoned[0]["cut"] == ["command"], logs


NOTICES = ("restart_scheduled", "metrics_blind", "validation_failed", "hang_suspected")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replies=st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=5),
       notices=st.integers(min_value=1, max_value=4))
def test_generated_webhook_behaviours_end_in_bounded_time_and_memory_and_every_notice_is_counted(
        replies: list[str], notices: int) -> None:
    """Whatever the webhook does (the n-th request gets replies[n % len]), each try ends within
    timeout_s, the sender's memory stays bounded (a 100 MB body is not read), and every notice
    submitted is either sent or failed, never lost or stuck; the give-up notice always arrives
    when the webhook answers it."""
    count = [0]

    def choose(seen: object) -> str:
        if getattr(seen, "event", "") == "gave_up":
            return "ok"
        count[0] += 1
        return replies[(count[0] - 1) % len(replies)]

    hook = HostileWebhook(choose)
    timeout_s = 0.5
    a = alerter(webhook_url=hook.url, timeout_s=timeout_s, retries=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(alerts, "BACKOFF_FIRST_S", 0.1)  # the retry's wait is not what is tested here
        _notices_through(a, hook, notices, replies, timeout_s)


def _notices_through(a: Alerter, hook: HostileWebhook, notices: int, replies: list[str], timeout_s: float) -> None:
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        for i in range(notices):
            a.submit(alert(NOTICES[i % len(NOTICES)]))
        a.submit(alert("gave_up"))
        wait_for(lambda: a.sinks[0].pending() == 0, timeout=60, what="every notice tried")
        took = time.monotonic() - t0
        _now, peak = tracemalloc.get_traced_memory()
        a.close(5.0)
    finally:
        tracemalloc.stop()
        hook.close()
    c = a.counts()["webhook"]
    assert c["sent"] + c["failed"] == notices + 1 and c["dropped"] == 0, (c, replies)
    assert "gave_up" in hook.events(), (replies, hook.events())
    # Each notice: at most 2 tries of timeout_s and a 0.1 s backoff; 4x that for a loaded machine.
    assert took < 4 * (notices * (2 * timeout_s + 0.1) + 2.0), (took, replies)
    assert peak < 8 << 20, (peak, replies)


def test_the_child_pipe_reader_keeps_a_tail_of_each_stream_and_meets_its_deadline(tmp_path: Path):
    """supervisor.childio, the reader every short-lived child goes through: a child that writes
    without end on both streams is left at the deadline with only the tails kept."""
    import subprocess

    from supervisor import childio

    proc = subprocess.Popen([PY, "-c", "import sys\nwhile True:\n    sys.stdout.write('o' * 4096); "
                             "sys.stderr.write('e' * 4096)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    t0 = time.monotonic()
    res = childio.drain(proc, timeout_s=1.0, keep=1000)
    took = time.monotonic() - t0
    childio.kill_group(proc)
    assert res.timed_out and res.returncode is None
    assert len(res.stdout) == 1000 and len(res.stderr) == 1000 and res.dropped > 0
    assert took < 1.0 + 4.0, took
    assert proc.poll() is not None  # reaped by kill_group


def test_the_real_daemon_kills_a_hook_still_running_at_its_exit_and_the_webhook_still_gets_the_give_up(
        daemons, tmp_path: Path):
    """Through `wrap`: the job crashes, the daemon gives up; the hook command never exits and has
    started a child. The webhook (a separate sink) gets the give-up notice; the daemon exits about
    shutdown_wait_s later, and neither the hook nor its child is left running."""
    import psutil

    from tests.ops.test_notify_e2e import CRASH, config, wrap

    mark = f"tsup-hook-mark-{tmp_path.name}"
    script = tmp_path / "stuck.py"
    script.write_text("import subprocess, sys, time\nsys.stdin.read()\n"
                      f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {mark!r}])\n"
                      "time.sleep(600)\n")

    def left() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if any(mark in a or str(script) == a
                                                                          for a in p.info["cmdline"] or ())]

    hook = Webhook()
    sd = tmp_path / "sd"
    try:
        d = daemons(wrap(sd, config(tmp_path, [PY, str(script), mark], hook.url, timeout_s="600",
                                    shutdown_wait_s="3.0")) + CRASH)
        assert d.wait(60) == 3
        assert [b["event"] for b in hook.bodies()] == ["gave_up"], hook.received
    finally:
        hook.close()
    wait_for(lambda: not left(), timeout=10, what="the hook and its child gone")
    assert "notify_abandoned" in d.stderr()
