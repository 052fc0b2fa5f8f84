"""Real Prometheus tools for the monitoring tests: promtool, prometheus and node_exporter from
Debian's ``prometheus`` and ``prometheus-node-exporter``, installed on demand (root, apt-get,
under the same lock as tests/cluster/etcdserver.py), started on free loopback ports with temp
dirs, polled over HTTP, stopped. :class:`Unavailable` carries the reason a test is skipped."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.cluster.etcdserver import free_port
from tests.helpers.apt import apt_install
from tests.util import wait_for

PACKAGES = ("prometheus", "prometheus-node-exporter")
# Debian's names; upstream tarballs call the exporter node_exporter
BINARIES = {"promtool": ("promtool",), "prometheus": ("prometheus",),
            "node_exporter": ("prometheus-node-exporter", "node_exporter")}


class Unavailable(Exception):
    """The tool cannot be installed here; the message is the skip reason."""


def _find(tool: str) -> str | None:
    for name in BINARIES[tool]:
        found = shutil.which(name) or (Path("/usr/bin", name).exists() and f"/usr/bin/{name}")
        if found:
            return str(found)
    return None


def binary(tool: str) -> str:
    """promtool, prometheus or node_exporter, installing Debian's packages when one is missing."""
    found = _find(tool)
    if found:
        return found
    why = apt_install(PACKAGES)  # a no-op when another test installed them while we waited
    found = _find(tool)
    if why is not None or not found:
        raise Unavailable(f"{tool} is not installed and {why or 'its packages installed no ' + tool}")
    # The packages enable system services on 9090/9100 where systemd runs; ours use free ports.
    return found


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


class Server:
    """A started process on a free loopback port, its output in ``log``; ``stop()`` ends it."""

    def __init__(self, argv: list[str], port: int, log: Path, ready_path: str) -> None:
        self.port = port
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: self.proc.poll() is not None or get(self.url(ready_path), timeout=2)[0] == 200,
                     timeout=60, interval=0.1, what=f"{argv[0]} ready")
        except BaseException:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise AssertionError(f"{argv[0]} exited at start; its log:\n{log.read_text()[-3000:]}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def node_exporter(textfile_dir: Path, log: Path) -> Server:
    """node_exporter with only its textfile collector, reading ``textfile_dir``."""
    port = free_port()
    return Server([binary("node_exporter"), f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                   "--collector.textfile", f"--collector.textfile.directory={textfile_dir}"], port, log, "/metrics")


def prometheus(tmp: Path, targets: dict[str, str | list[str]], rule_files: list[Path]) -> Server:
    """Prometheus scraping ``targets`` (job name -> host:port, or a list of them) and evaluating
    ``rule_files`` every second (the production defaults of 15 s/1 m would make a test wait minutes)."""
    port = free_port()
    conf = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [addr] if isinstance(addr, str)
                                                                     else addr}]}
                               for job, addr in targets.items()]}
    cfg = tmp / "prometheus.yml"
    cfg.write_text(json.dumps(conf))  # YAML is a superset of JSON
    (tmp / "tsdb").mkdir()
    return Server([binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                   f"--web.listen-address=127.0.0.1:{port}"], port, tmp / "prometheus.log", "/-/ready")


def api(server: Server, path: str, **params: str) -> Any:
    status, body = get(server.url(path + ("?" + urllib.parse.urlencode(params) if params else "")))
    assert status == 200, (status, body)
    return json.loads(body)["data"]


def firing(server: Server, alertname: str) -> list[dict[str, Any]]:
    return [a for a in api(server, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == alertname and a["state"] == "firing"]
