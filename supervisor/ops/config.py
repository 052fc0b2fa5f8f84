"""Config sections [metrics] and [systemd]: how the daemon is observed and operated."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config.schema import meta


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
        "node-exporter textfile collector file (absolute, *.prom), rewritten atomically; omitted: none",
        check=_check_textfile))
    textfile_interval_s: float = field(default=15.0, metadata=meta(
        "seconds between rewrites of the textfile", min=1.0))


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
