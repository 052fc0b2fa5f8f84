"""The webhook's host name lookup is within the try's total deadline (issue 34 part 3,
ops/delivery.py). The boundary is the system resolver, so ``socket.getaddrinfo`` is replaced in
process by one that hangs for the webhook's name (as a DNS server that never answers makes the
real one hang for 30 s and more); everything after it is real: the sink's thread, the local
webhook, the sockets. Before, the lookup ran outside the deadline and held the sender (and every
notice behind it, the give-up one too) for as long as the resolver hung."""
from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterator

import pytest
from structlog.testing import capture_logs

from supervisor.ops import delivery
from supervisor.ops.alertmsg import Alert, Masker
from supervisor.ops.alerts import Alerter
from supervisor.ops.config import NotifyConfig
from supervisor.ops.delivery import MAX_LOOKUPS, Try
from tests.ops.notifyhelp import Webhook
from tests.util import wait_for

NAME = "hook.example.invalid"


class HangingResolver:
    """``getaddrinfo`` that hangs on ``NAME`` until released, the first ``hangs`` times; after that
    (and for any other name) it answers ``NAME`` with the local webhook's address."""

    def __init__(self, hangs: int) -> None:
        self.hangs = hangs
        self.calls = 0
        self.release = threading.Event()
        self._real = socket.getaddrinfo

    def __call__(self, host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if host != NAME:
            return self._real(host, port, *args, **kw)
        self.calls += 1
        if self.calls <= self.hangs:
            self.release.wait(60)
        return self._real("127.0.0.1", port, *args, **kw)


@pytest.fixture
def resolver(monkeypatch) -> Iterator[Callable[[int], HangingResolver]]:
    made: list[HangingResolver] = []

    def make(hangs: int) -> HangingResolver:
        r = HangingResolver(hangs)
        monkeypatch.setattr(socket, "getaddrinfo", r)
        made.append(r)
        return r

    yield make
    for r in made:
        r.release.set()
    wait_for(lambda: not any(t.name == "webhook-lookup" for t in threading.enumerate()), 10, 0.02,
             "the hung lookups ended")


def alert(event: str) -> Alert:
    return Alert(event, "error", f"{event} happened", "gpt", "r1", "node-3", 1, 1_700_000_000.0, {})


def test_a_lookup_that_hangs_ends_the_try_at_its_deadline_and_the_next_notice_goes_out(resolver):
    r = resolver(hangs=1)
    hook = Webhook()
    port = urllib.parse.urlsplit(hook.url).port
    a = Alerter(NotifyConfig(webhook_url=f"http://{NAME}:{port}/hook", timeout_s=1.0, retries=0,
                             repeat_after_s=0.0, max_per_hour=1000), Masker())
    a.start()
    try:
        with capture_logs() as logs:
            t0 = time.monotonic()
            a.submit(alert("validation_failed"))
            wait_for(lambda: r.calls == 1, 10, 0.01, "the first notice's lookup under way")
            a.submit(alert("metrics_blind"))
            wait_for(lambda: hook.bodies(), 20, 0.02, "the notice after the hung lookup")
            took = time.monotonic() - t0
            a.close(5.0)
    finally:
        hook.close()
    assert took < 1.0 + 8.0, took  # the 1 s deadline and a loaded machine's margin (the hang is 60 s)
    failed = [e for e in logs if e["event"] == "notify_failed"]
    assert len(failed) == 1 and f"within 1 s (looking up its host {NAME} took all of it" in failed[0]["error"], failed
    assert [b["event"] for b in hook.bodies()] == ["metrics_blind"] and r.calls == 2
    assert a.counts()["webhook"] == {"sent": 1, "failed": 1, "dropped": 0}


def test_hung_lookups_are_bounded_and_a_try_past_them_fails_at_once(resolver):
    resolver(hangs=1000)
    url = f"http://{NAME}:9/hook"
    errors = []
    for _ in range(MAX_LOOKUPS + 3):
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            delivery.post_webhook(url, b"{}", Try(0.2))
        assert time.monotonic() - t0 < 5.0
        errors.append(str(e.value))
        lookups = sum(1 for t in threading.enumerate() if t.name == "webhook-lookup")
        assert lookups <= MAX_LOOKUPS, lookups
    assert all(f"within 0.2 s (looking up its host {NAME}" in m for m in errors[:MAX_LOOKUPS]), errors
    assert all(f"{MAX_LOOKUPS} earlier lookups still hang" in m for m in errors[MAX_LOOKUPS:]), errors


def test_the_daemon_s_exit_cuts_a_try_waiting_on_its_lookup(resolver):
    resolver(hangs=1)
    t = Try(60.0)
    threading.Timer(0.3, t.cut, args=("the supervisor is exiting",)).start()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="the supervisor is exiting"):
        delivery.post_webhook(f"http://{NAME}:9/hook", b"{}", t)
    assert time.monotonic() - t0 < 5.0  # the 60 s deadline not waited out
