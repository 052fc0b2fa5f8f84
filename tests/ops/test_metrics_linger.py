"""The listener's last wait ([metrics] linger_s): who counts as a scraper, the bound on what is
remembered, and through the real daemon: a regular scraper is waited for until it fetched the end,
SIGTERM cuts the wait at once."""
from __future__ import annotations

import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.ops.scrapes import LATE_SLACK_S, MAX_SCRAPERS, ScrapeLog
from tests.cluster.etcdserver import free_port
from tests.conftest import Daemon
from tests.ops.test_ops_monitoring import waiting_job
from tests.util import wait_for


def test_a_regular_scraper_is_waited_for_a_one_off_fetch_and_an_overdue_one_are_not():
    now = [100.0]
    log = ScrapeLog(clock=lambda: now[0])
    log.note("10.0.0.1")  # curl, once
    for t in (100.0, 115.0, 130.0):  # Prometheus every 15 s
        now[0] = t
        log.note("10.0.0.2")
    assert log.waiting(since=131.0, now=131.0) == ["10.0.0.2"]
    assert log.waiting(since=131.0, now=130.0 + 2 * 15 + LATE_SLACK_S + 0.1) == []  # it stopped coming
    now[0] = 145.0
    log.note("10.0.0.2")
    assert log.waiting(since=131.0, now=145.0) == []  # it fetched the end


def test_the_scrape_log_keeps_at_most_max_scrapers_addresses_the_latest_ones():
    now = [0.0]
    log = ScrapeLog(clock=lambda: now[0])
    for i in range(1000):
        now[0] = float(i)
        log.note(f"10.0.{i // 256}.{i % 256}")
        log.note(f"10.0.{i // 256}.{i % 256}")
    assert len(log._by_addr) == MAX_SCRAPERS
    assert "10.0.3.231" in log._by_addr  # the last one (999) kept, the first ones gone
    assert "10.0.0.0" not in log._by_addr


class Scraper:
    """Fetches /metrics every ``interval`` seconds in a thread, as Prometheus does, until paused."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.fetches = 0
        self.paused = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if not self.paused.is_set():
                try:
                    with urllib.request.urlopen(self.url, timeout=2) as r:
                        r.read()
                    self.fetches += 1
                except OSError:
                    pass  # not up yet, or gone
            self.done.wait(self.interval)  # the scrape interval, not a wait for a condition

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)


@pytest.fixture
def scrapers() -> Iterator[list[Scraper]]:
    made: list[Scraper] = []
    yield made
    for s in made:
        s.stop()


def start(daemons, tmp_path: Path, code: int) -> tuple[Daemon, str, Path]:
    port = free_port()
    cfg = tmp_path / "tsup.toml"
    cfg.write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\nlinger_s = 120\n')
    release = tmp_path / "release"
    d = daemons(["wrap", "--config", str(cfg), "--state-dir", str(tmp_path / "sd"), "--"] + waiting_job(release, code))
    return d, f"http://127.0.0.1:{port}/metrics", release


def test_the_daemon_waits_for_a_regular_scraper_to_fetch_its_end_then_exits(daemons, tmp_path: Path, scrapers):
    d, url, release = start(daemons, tmp_path, 0)
    s = Scraper(url, 0.5)
    scrapers.append(s)
    wait_for(lambda: s.fetches >= 3, timeout=60, interval=0.05, what="three scrapes of the running daemon")
    before = s.fetches
    release.touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]
    assert s.fetches > before  # the end was fetched before the exit
    err = d.stderr()
    assert "event=metrics_linger " in err and "event=metrics_linger_ended" not in err, err[-3000:]


def test_sigterm_ends_the_wait_at_once(daemons, tmp_path: Path, scrapers):
    d, url, release = start(daemons, tmp_path, 0)
    # A slow scraper, paused after two fetches: left alone the daemon would wait for it until
    # 2 x 10 s + slack after its last fetch; SIGTERM must end that at once.
    s = Scraper(url, 10.0)
    scrapers.append(s)
    wait_for(lambda: s.fetches >= 2, timeout=60, interval=0.05, what="two scrapes of the running daemon")
    s.paused.set()
    release.touch()
    wait_for(lambda: "event=metrics_linger " in d.stderr(), timeout=30, interval=0.05,
             what="the daemon saying it waits for a last scrape")
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0, d.stderr()[-3000:]
    assert time.monotonic() - t0 < 8  # at once, not 21 s after the last fetch (or linger_s)
    err = d.stderr()
    assert "event=metrics_linger_ended" in err and "the wait was interrupted" in err, err[-3000:]
