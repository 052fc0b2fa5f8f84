"""Config sections [metrics], [web] and [systemd]: how the daemon is observed and operated."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from ..config.schema import Problem
from ..fieldmeta import meta
from ..eventnames import EventName


def check_listen(value: str) -> str | None:
    """``HOST:PORT`` with a numeric port (an IPv6 host in brackets: ``[::1]:9464``)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        return f'expected "HOST:PORT" such as "127.0.0.1:9464", got "{value}"'
    if not port.isdigit() or not 0 <= int(port) < 65536:
        return f'expected a port number 0-65535 after the last ":", got "{port}"'
    return None


def _check_textfile(value: str) -> str | None:
    if not value.startswith("/"):
        return f'expected an absolute path, got "{value}"'
    if not value.endswith(".prom"):
        return f'expected a file name ending in ".prom" (node-exporter reads only those), got "{value}"'
    return None


@dataclass(frozen=True)
class MetricsConfig:
    listen: str | None = field(default=None, metadata=meta(
        'Prometheus endpoint "HOST:PORT" (e.g. "127.0.0.1:9464"); omitted: no listener',
        check=check_listen))
    textfile: str | None = field(default=None, metadata=meta(
        "node-exporter textfile collector file (absolute, *.prom), rewritten atomically; one file per run "
        '(several runs per node: "{name}" in the path is replaced by [job] name, and every series carries '
        "a name label); omitted: none", check=_check_textfile))
    textfile_interval_s: float = field(default=15.0, metadata=meta(
        "seconds between rewrites of the textfile", min=1.0))
    linger_s: float = field(default=90.0, metadata=meta(
        "after the run ends (finished, stopped, gave up), keep the listener up until each Prometheus that "
        "was scraping it has scraped the final state, at most this many seconds (a 60 s scrape interval "
        "fits); 0: exit at once", min=0.0, max=600.0))


def is_loopback_listen(value: str) -> bool:
    """Whether ``HOST:PORT`` binds only this node: localhost or a loopback address (127.0.0.0/8, ::1)."""
    import ipaddress

    host = value.rpartition(":")[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it could resolve to anything


@dataclass(frozen=True)
class WebConfig:
    listen: str | None = field(default=None, metadata=meta(
        'the live status page (read-only): "HOST:PORT" such as "127.0.0.1:9465", then open http://HOST:PORT/ '
        "on the node (or through ssh -L); omitted: no page. Only a loopback address unless allow_remote",
        check=check_listen))
    allow_remote: bool = field(default=False, metadata=meta(
        "let [web] listen bind an address other people can reach (the page has no login: anyone who reaches "
        "it reads the run's state, events and checkpoint paths, masked as every output is)"))


def web_problems(w: WebConfig) -> list[Problem]:
    """The check that spans the section's keys: a page reachable from the network only on purpose."""
    if w.listen and not w.allow_remote and check_listen(w.listen) is None and not is_loopback_listen(w.listen):
        return [Problem("web.listen", f'"{w.listen}" is not a loopback address: the page has no login, so it '
                        'binds 127.0.0.1 or [::1] (reach it with ssh -L) unless [web] allow_remote = true')]
    return []


@dataclass(frozen=True)
class SystemdConfig:
    notify: bool = field(default=True, metadata=meta(
        "send READY/STATUS/STOPPING/RELOADING to systemd when NOTIFY_SOCKET is set (Type=notify)"))
    watchdog: bool = field(default=True, metadata=meta(
        "ping systemd's watchdog (WatchdogSec= in the unit) while the main loop and its monitors are alive"))
    journal_fields: bool = field(default=True, metadata=meta(
        "under systemd, send the daemon's events as native journal entries with TSUP_* fields "
        "(journalctl TSUP_CAUSE=nan) instead of plain stderr lines"))
    status_interval_s: float = field(default=5.0, metadata=meta(
        "seconds between STATUS= updates (the line systemctl status shows)", min=0.5))
    stop_extend_s: float = field(default=60.0, metadata=meta(
        "while a stop waits for the job's checkpoint flush, extend systemd's stop timeout by this "
        "much at a time (EXTEND_TIMEOUT_USEC), so a save in progress is never SIGKILLed", min=1.0))


#: The daemon events a human is told about when ``[notify] events`` is not set; ``restart_loop``
#: is not a daemon event but derived from several ``restart_scheduled`` in a short window.
NOTIFY_DEFAULT_EVENTS: tuple[str, ...] = tuple(e.value for e in (
    EventName.GAVE_UP, EventName.VALIDATION_FAILED, EventName.RESTART_LOOP, EventName.METRICS_BLIND,
    EventName.EVAL_NONFINITE, EventName.RUN_UNWATCHED))


def _check_webhook(value: str) -> str | None:
    if not value.startswith(("http://", "https://")):
        # The URL is a secret (it carries the token): never echo it back in full.
        return f'expected an http:// or https:// URL, got "{value[:8]}..."'
    return None


def _check_command(value: tuple[str, ...]) -> str | None:
    if value and not value[0]:
        return "expected the program to run as the first item, got an empty string"
    return None


def _check_events(value: tuple[str, ...]) -> str | None:
    """Each name one of the daemon's (a misspelt one would never notify, silently)."""
    known = sorted(e.value for e in EventName)
    for name in value:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            return (f'"{name}" is not an event name of the daemon{hint}; the known names: '
                    + ", ".join(known))
    return None


@dataclass(frozen=True)
class NotifyConfig:
    command: tuple[str, ...] = field(default=(), metadata=meta(
        "program to run on each chosen event (exec'd, no shell): the event as JSON on stdin and as "
        "TSUP_NOTIFY_* env vars; empty: none", check=_check_command))
    webhook_url: str | None = field(default=None, metadata=meta(
        'URL to POST each chosen event to as JSON with a Slack-compatible "text" field (a secret: '
        "never logged in full); omitted: none", check=_check_webhook))
    events: tuple[str, ...] = field(default=NOTIFY_DEFAULT_EVENTS, metadata=meta(
        'daemon events that notify: any event name of the journal/history ("restart_scheduled", '
        '"hang_suspected", ...) plus "restart_loop"', check=_check_events))
    timeout_s: float = field(default=10.0, metadata=meta(
        "seconds one webhook POST or hook command may take before it counts as failed", min=0.1))
    retries: int = field(default=2, metadata=meta(
        "tries after a failed one, with backoff (1 s, 2 s, 4 s...)", min=0, max=10))
    repeat_after_s: float = field(default=300.0, metadata=meta(
        "the same event notifies again only after this many seconds (the ones between are counted "
        "and said in the next)", min=0))
    max_per_hour: int = field(default=30, metadata=meta(
        "at most this many notifications an hour in all (gave_up always goes out)", min=1))
    restart_loop_count: int = field(default=3, metadata=meta(
        "restart_loop: this many restarts scheduled within restart_loop_window_s", min=2))
    restart_loop_window_s: float = field(default=900.0, metadata=meta(
        "restart_loop: the window in seconds", min=1.0))
    shutdown_wait_s: float = field(default=5.0, metadata=meta(
        "at daemon exit, wait at most this long for notifications still being sent (the give-up one)",
        min=0.0, max=60.0))
