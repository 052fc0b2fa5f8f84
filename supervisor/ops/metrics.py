"""Prometheus metrics from the daemon's status: an HTTP listener and/or a node-exporter textfile.

The metrics are built at scrape time from the latest status snapshot (the same dict the
``status`` verb returns), by a custom collector on a private registry: the HTTP thread never
touches the main loop's state, a rank whose heartbeat vanished drops out of the output, and
``restarts_total`` is a true counter taken from the ledger-backed ``restarts_by_cause``.

Conventions (Prometheus naming, checked with ``promtool check metrics`` in the tests): times are
``*_timestamp_seconds`` gauges (unix time; ``time() - tsup_heartbeat_timestamp_seconds`` is the
age), never "seconds since"; lost time is a counter by cause (``tsup_lost_seconds_total``);
``tsup_build_info`` carries the version; the listener's registry also holds the daemon's own
``process_*`` metrics (CPU, memory, open fds, start time) and ``python_info``, the textfile does
not (node_exporter has its own ``process_*`` and would reject the collision); GPU series carry
the device index as ``gpu`` and its ``UUID``, the label names DCGM exporter uses, so
``tsup_gpu_memory_used_bytes * on(gpu, UUID) group_left DCGM_FI_DEV_GPU_UTIL`` joins as is.

Several runs per node: every series carries the run's ``name`` label (``[job] name``), so the
textfiles of several runs in one node_exporter directory never repeat a series, and
``tsup_run_info{name, run_id}`` says which run a name is now. The listener's series carry it too
(one dashboard variable picks a run whichever way it was collected).

The end, seen by a scrape: a daemon that exited right after its give-up was never scraped in the
``gave_up`` state. :meth:`Metrics.linger` keeps the listener up after the end until each
Prometheus that was scraping it has scraped the final state (a scraper: an address that fetched
``/metrics`` at least twice; one that stops scraping for twice its interval is not waited for),
at most ``[metrics] linger_s``.

Health: the listener also answers ``GET /healthz`` (a Kubernetes liveness probe, a load
balancer): 200 "ok" while the main loop keeps publishing its status, 503 once the newest status
is older than :data:`HEALTH_STALE_S` (the daemon is wedged; what systemd's watchdog catches
under systemd), or before the first one.

Wiring (the runner): ``m = Metrics(cfg.metrics)``; ``m.start()`` after the config is loaded
(starts the listener when ``metrics.listen`` is set); ``m.update(status_dict)`` every tick or
every second (cheap; rewrites the textfile at most every ``textfile_interval_s``);
``m.final(status_dict)`` at exit (the textfile then holds the final state, e.g. ``gave_up`` 1, so
an alert can still fire from it after the daemon is gone); ``m.close()``. Status keys read (all optional): state, run_id, attempt, restarts_by_cause,
last_metric{step, loss, grad_norm, tokens_per_sec, at}, heartbeats{rank: age_s},
gpus[{index, uuid, memory_used_bytes}], goodput, goodput_detail{lost_by_cause},
checkpoint_interval{advised_s, current_s, save_cost_s, mtbf_s, goodput_now, goodput_advised}, and
``last_good_checkpoint_at`` (unix time) or ``seconds_since_last_good_checkpoint`` (ages are
turned into timestamps with the time the snapshot was published).
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..core.machine import State
from ..core.runend import Verdict
from ..events import Cause
from .config import MetricsConfig
from .metricserver import start_bounded_server
from .scrapes import ScrapeLog, wait_for_scrapers

log = structlog.get_logger("supervisor.ops")

PREFIX = "tsup_"
# Known states always appear (0 or 1) so a dashboard's "state == gave_up" query never has holes.
STATES = tuple(s.value for s in State)  # derived: a new state cannot be missing here
END_VERDICTS = tuple(v.value for v in Verdict)  # likewise: every verdict on a job's exit 0
#: /healthz turns 503 when the newest status snapshot is older than this (the main loop publishes
#: one every 0.25 s; WatchdogSec=60 is the same bound under systemd)
HEALTH_STALE_S = 60.0


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


class _StatusCollector(Collector):
    def __init__(self, snapshot: Callable[[], tuple[Mapping[str, Any], float]], name: str = "") -> None:
        self._snapshot = snapshot
        self._name = name
        # lost seconds by cause only ever grow within a run (a counter): the goodput detail is
        # recomputed from the timeline and may wobble by a rounding; keep the high-water mark.
        self._lost_run: Any = None
        self._lost: dict[str, float] = {}
        self._lost_lock = threading.Lock()

    def _lost_by_cause(self, status: Mapping[str, Any]) -> dict[str, float]:
        detail = status.get("goodput_detail")
        by_cause = detail.get("lost_by_cause") if isinstance(detail, Mapping) else None
        with self._lost_lock:
            if status.get("run_id") != self._lost_run:
                self._lost_run, self._lost = status.get("run_id"), {}
            if isinstance(by_cause, Mapping):
                for cause, secs in by_cause.items():
                    v = _float(secs)
                    if v is not None and cause != "running":
                        self._lost[str(cause)] = max(self._lost.get(str(cause), 0.0), v)
            return dict(self._lost)

    def collect(self) -> Iterator[Metric]:
        """Every family with the run's ``name`` label first on each sample: two runs' textfiles in
        one node_exporter directory never hold the same series (node_exporter rejects duplicates)."""
        status, wall = self._snapshot()
        name = self._name or str(status.get("name") or "job")  # "job": [job] name's default
        for family in self._families(status, wall):
            family.samples = [s._replace(labels={"name": name, **s.labels}) for s in family.samples]
            yield family

    def _families(self, status: Mapping[str, Any], wall: float) -> Iterator[Metric]:
        build = GaugeMetricFamily(PREFIX + "build_info", "The transformer-supervisor build (always 1)",
                                  labels=["version"])
        build.add_metric([__version__], 1.0)
        yield build

        published = GaugeMetricFamily(PREFIX + "status_timestamp_seconds",
                                      "Unix time the daemon last published its status")
        if wall:
            published.add_metric([], wall)
        yield published

        restarts = CounterMetricFamily(PREFIX + "restarts", "Restarts of the job by cause", labels=["cause"])
        by_cause = status.get("restarts_by_cause") or {}
        for cause in [c.value for c in Cause] + sorted(k for k in by_cause if k not in set(Cause)):
            restarts.add_metric([cause], _float(by_cause.get(cause, 0)) or 0.0)
        yield restarts

        lost = CounterMetricFamily(PREFIX + "lost_seconds",
                                   "Wall time lost to failures by cause: steps thrown away, downtime, start-up",
                                   labels=["cause"])
        for cause, secs in sorted(self._lost_by_cause(status).items()):
            lost.add_metric([cause], secs)
        yield lost

        state = GaugeMetricFamily(PREFIX + "state", "1 for the daemon's current state, 0 for the others",
                                  labels=["state"])
        current = status.get("phase") or status.get("state")  # the machine's own step (status's state is SPEC's)
        for s in STATES + ((current,) if isinstance(current, str) and current not in STATES else ()):
            state.add_metric([s], 1.0 if s == current else 0.0)
        yield state

        info = GaugeMetricFamily(PREFIX + "run_info", "The supervised run: its name and id (always 1)",
                                 labels=["run_id"])
        if status.get("run_id"):
            info.add_metric([str(status["run_id"])], 1.0)
        yield info

        def gauge(name: str, doc: str, value: Any) -> Iterator[Metric]:
            v = _float(value)
            if v is not None:
                g = GaugeMetricFamily(PREFIX + name, doc)
                g.add_metric([], v)
                yield g

        def stamp(age: Any) -> float | None:
            a = _float(age)
            return None if a is None or not wall else wall - max(0.0, a)

        yield from gauge("attempt", "Current attempt number (0 = first launch)", status.get("attempt"))
        lm = status.get("last_metric") or {}
        if isinstance(lm, Mapping):
            yield from gauge("last_step", "Last training step reported by the job", lm.get("step"))
            yield from gauge("loss", "Last training loss", lm.get("loss"))
            yield from gauge("grad_norm", "Last gradient norm", lm.get("grad_norm"))
            yield from gauge("tokens_per_second", "Last reported throughput in tokens per second",
                             lm.get("tokens_per_sec"))
            at = _float(lm.get("at"))
            yield from gauge("last_metric_timestamp_seconds", "Unix time of the job's last training metric",
                             at if at is not None else stamp(lm.get("age_s")))
        blind = GaugeMetricFamily(PREFIX + "metrics_blind",
                                  "1 while the daemon parses no training step from the job's output")
        blind.add_metric([], 1.0 if isinstance(status.get("metrics_blind"), Mapping) else 0.0)
        yield blind
        end = status.get("end")
        if isinstance(end, Mapping):  # the job exited 0: how it finished (watched, unwatched, NaN weights)
            verdict = GaugeMetricFamily(PREFIX + "end_verdict", "1 for the verdict on the job's exit 0 (what was "
                                        "watched, the newest checkpoint's weights), 0 for the others",
                                        labels=["verdict"])
            for name in END_VERDICTS + ((str(end.get("verdict")),) if end.get("verdict") not in END_VERDICTS else ()):
                verdict.add_metric([name], 1.0 if name == end.get("verdict") else 0.0)
            yield verdict
        yield from gauge("goodput_ratio", "Fraction of wall time spent on useful training (0-1)",
                         status.get("goodput"))
        yield from _interval_metrics(status.get("checkpoint_interval"))
        yield from gauge("ledger_write_errors", "Ledger writes dropped since the daemon started (a full disk)",
                         status.get("ledger_write_errors"))
        lag = status.get("output_lag")
        if isinstance(lag, Mapping):
            yield from gauge("output_lag_seconds", "How far the daemon's parsing of the job's output is behind "
                             "the job, in seconds (the job is never slowed by it)", lag.get("seconds"))
            yield from gauge("output_lag_bytes", "Bytes of job.log the daemon's parsers have not read yet",
                             lag.get("bytes"))
        pw = status.get("prewarm")
        if isinstance(pw, Mapping):  # [job] prewarm's standby while it waits: what it costs the node
            yield from gauge("prewarm_rss_bytes", "Resident memory of the waiting prewarm standby (the next "
                             "attempt's interpreter, its imports done)", pw.get("rss_bytes"))
            cpu = _float(pw.get("cpu_s"))
            if cpu is not None:
                c = CounterMetricFamily(PREFIX + "prewarm_cpu_seconds", "CPU seconds the waiting prewarm standby "
                                        "used (its imports, at idle priority; a new standby starts at 0)")
                c.add_metric([], cpu)
                yield c
        good_at = _float(status.get("last_good_checkpoint_at"))
        if good_at is None:
            good_at = stamp(status.get("seconds_since_last_good_checkpoint"))
        yield from gauge("last_good_checkpoint_timestamp_seconds",
                         "Unix time of the newest checkpoint that passed the readiness quicklist", good_at)

        hb = GaugeMetricFamily(PREFIX + "heartbeat_timestamp_seconds", "Unix time of each rank's last heartbeat",
                               labels=["rank"])
        for rank, age in (status.get("heartbeats") or {}).items():
            t = stamp(age)
            if t is not None:
                hb.add_metric([str(rank)], t)
        yield hb

        mem = GaugeMetricFamily(PREFIX + "gpu_memory_used_bytes", "GPU memory in use per device",
                                labels=["gpu", "UUID"])
        for i, g in enumerate(status.get("gpus") or []):
            if isinstance(g, Mapping):
                v = _float(g.get("memory_used_bytes", g.get("memory_used")))
                if v is not None:
                    mem.add_metric([str(g.get("index", i)), str(g.get("uuid") or "")], v)
        yield mem


def _interval_metrics(advice: Any) -> Iterator[Metric]:
    """The checkpoint interval advice (``status``'s ``checkpoint_interval``, core/interval.py):
    seconds of work between saves, now and advised, and the goodput each is expected to give, so
    that ``1 - tsup_checkpoint_interval_expected_goodput{interval="current"}`` is what the current
    interval costs. Absent until the run has a failure rate, a save and a step rhythm."""
    if not isinstance(advice, Mapping):
        return
    for name, doc, key in (
            ("checkpoint_interval_advised_seconds",
             "Seconds of training between saves that maximise goodput for the measured failure rate (Young/Daly)",
             "advised_s"),
            ("checkpoint_interval_current_seconds", "Seconds of training between the job's saves now (median)",
             "current_s"),
            ("checkpoint_save_cost_seconds", "Seconds of training one save costs the job (from its step rhythm)",
             "save_cost_s"),
            ("checkpoint_interval_mtbf_seconds", "Mean seconds between counted failures, across the state dir's runs",
             "mtbf_s")):
        v = _float(advice.get(key))
        if v is not None:
            g = GaugeMetricFamily(PREFIX + name, doc)
            g.add_metric([], v)
            yield g
    expected = GaugeMetricFamily(PREFIX + "checkpoint_interval_expected_goodput",
                                 "Expected goodput (0-1) at the current and at the advised checkpoint interval",
                                 labels=["interval"])
    for label, key in (("current", "goodput_now"), ("advised", "goodput_advised")):
        v = _float(advice.get(key))
        if v is not None:
            expected.add_metric([label], v)
    yield expected


class Metrics:
    """The daemon's Prometheus metrics, on private registries (two daemons in one test process
    never clash): the listener's has the status collector plus the process and platform
    collectors that the default registry would have (``process_*``, ``python_info``); the
    textfile's has the status collector only (node_exporter exports its own ``process_*``)."""

    def __init__(self, config: MetricsConfig | None = None, *, name: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or MetricsConfig()
        self._name = name
        self.scrapes = ScrapeLog()
        self.registry = CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._status: Mapping[str, Any] = {}
        self._status_wall = 0.0
        self._clock = clock
        self._last_textfile: float | None = None
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        collector = _StatusCollector(self._snapshot, name)
        self.registry.register(collector)
        self.textfile_registry = CollectorRegistry(auto_describe=False)
        self.textfile_registry.register(collector)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def _snapshot(self) -> tuple[Mapping[str, Any], float]:
        with self._lock:
            return self._status, self._status_wall

    def published(self) -> tuple[Mapping[str, Any], float]:
        """The newest status and the unix time it was published."""
        return self._snapshot()

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) the listener is bound to (the real port when ``listen`` used port 0)."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Start the HTTP listener if ``listen`` is set. Raises OSError if the port is taken (the
        runner reports it as a config problem: another daemon or exporter owns that port)."""
        if not self.config.listen:
            return
        host, _, port = self.config.listen.rpartition(":")
        host = host.strip("[]")
        # prometheus_client's server with bounds: 8 connections, 10 s each (metricserver.py)
        self._server, self._server_thread = start_bounded_server(int(port), host, self.registry)
        self._server.set_app(self._with_health(self._server.get_app()))
        log.info("metrics_listening", listen=self.config.listen, port=self.address[1] if self.address else None,
                 next="Prometheus can scrape /metrics")

    def health(self, now: float | None = None) -> tuple[bool, str]:
        """(healthy, why): the newest status snapshot is fresh (see :data:`HEALTH_STALE_S`)."""
        status, wall = self._snapshot()
        if not wall:
            return False, "no status published yet (the daemon is starting)"
        age = (time.time() if now is None else now) - wall
        if age > HEALTH_STALE_S:
            return False, (f"the daemon's status is {age:.0f} s old (limit {HEALTH_STALE_S:g} s): its main loop "
                           "is stuck; restart the daemon (it continues the run from its ledger)")
        return True, f"ok: {status.get('state', '?')}, attempt {status.get('attempt', '?')}, status {age:.1f} s old"

    def _with_health(self, metrics_app: Callable[..., Any]) -> Callable[..., Any]:
        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if environ.get("PATH_INFO") in ("/healthz", "/livez"):
                ok, why = self.health()
                body = (why + "\n").encode()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                                ("Cache-Control", "no-store")])
                return [body]
            if environ.get("PATH_INFO") == "/metrics":  # Prometheus' default path: a browser's "/" is no scrape
                self.scrapes.note(str(environ.get("REMOTE_ADDR") or "?"))
            return metrics_app(environ, start_response)

        return app

    def update(self, status: Mapping[str, Any]) -> None:
        """Publish a new status snapshot (called from the main loop)."""
        with self._lock:
            self._status = dict(status)
            self._status_wall = time.time()
        if self.config.textfile:
            now = self._clock()
            if self._last_textfile is None or now - self._last_textfile >= self.config.textfile_interval_s:
                self._last_textfile = now
                self.write_textfile()

    def final(self, status: Mapping[str, Any]) -> None:
        """Publish the last status at exit and write the textfile now, whatever the interval: a
        stopped daemon's textfile says how it ended (``tsup_state{state="gave_up"} 1``)."""
        with self._lock:
            self._status = dict(status)
            self._status_wall = time.time()
        if self.config.textfile:
            self._last_textfile = self._clock()
            self.write_textfile()

    def linger(self, stop: threading.Event, keepalive: Callable[[], None] = lambda: None) -> tuple[float, list[str]]:
        """At the end, after :meth:`final`: keep the listener up until every regular scraper has
        fetched the final state, at most ``linger_s`` or until ``stop`` is set. Returns (seconds
        waited, the addresses that did not come back). No listener or no scraper: no wait."""
        if self._server is None or self.config.linger_s <= 0:
            return 0.0, []
        _, since = self._snapshot()
        started = time.monotonic()
        _, left = wait_for_scrapers(self.scrapes, since, self.config.linger_s, stop, keepalive)
        return time.monotonic() - started, left

    def render(self) -> bytes:
        """The exposition text (what /metrics serves)."""
        return generate_latest(self.registry)

    def render_textfile(self) -> bytes:
        """The textfile's text: our series only, no ``process_*`` or ``python_info``."""
        return generate_latest(self.textfile_registry)

    def textfile_path(self) -> str | None:
        """``[metrics] textfile`` with ``{name}`` replaced by the run's name ("/" made "_": one file)."""
        path = self.config.textfile
        return path.replace("{name}", self._name.replace("/", "_") or "job") if path else None

    def write_textfile(self) -> bool:
        """Rewrite the textfile atomically (temp file in the same dir, then rename): node-exporter
        must never read half a file. Never raises; a failure is logged once per kind."""
        path = self.textfile_path()
        if not path:
            return False
        target = Path(path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(self.render_textfile())
                os.chmod(tmp, 0o644)  # node-exporter usually runs as another user
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            return True
        except OSError as e:
            log.warning("metrics_textfile_failed", path=path, error=str(e),
                        next=f"retrying in {self.config.textfile_interval_s:g} s")
            return False

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)
            self._server_thread = None
