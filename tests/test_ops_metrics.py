"""Prometheus metrics: scraped over loopback and parsed; the textfile written atomically."""
from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from supervisor.config import Config  # noqa: F401 (the section must be part of the top-level config)
from supervisor.configschema import build
from supervisor.ops.config import MetricsConfig, SystemdConfig
from supervisor.ops.metrics import Metrics

STATUS = {
    "state": "running", "run_id": "gpt-small-20250101", "attempt": 2, "pids": [10],
    "restarts_by_cause": {"nan": 1, "oom": 1},
    "last_metric": {"step": 1200, "loss": 2.5, "grad_norm": 0.75, "tokens_per_sec": 41000.0},
    "heartbeats": {"0": 1.5, "1": 2.5},
    "gpus": [{"index": 0, "memory_used_bytes": 5_000_000_000}, {"index": 1, "memory_used_bytes": 6e9}],
    "checkpoint": "/c/step_1000.pt", "goodput": 0.9, "seconds_since_last_good_checkpoint": 120.0,
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_scrape_over_loopback():
    m = Metrics(MetricsConfig(listen="127.0.0.1:0"))
    m.start()
    try:
        assert m.address is not None
        host, port = m.address
        m.update(STATUS)
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
            assert r.status == 200
            s = samples(r.read().decode())
        assert s[("tsup_restarts_total", (("cause", "nan"),))] == 1
        assert s[("tsup_restarts_total", (("cause", "oom"),))] == 1
        assert s[("tsup_restarts_total", (("cause", "hang"),))] == 0  # every cause present
        assert s[("tsup_state", (("state", "running"),))] == 1
        assert s[("tsup_state", (("state", "gave_up"),))] == 0
        assert s[("tsup_attempt", ())] == 2
        assert s[("tsup_last_step", ())] == 1200
        assert s[("tsup_loss", ())] == 2.5
        assert s[("tsup_grad_norm", ())] == 0.75
        assert s[("tsup_tokens_per_second", ())] == 41000
        assert s[("tsup_heartbeat_age_seconds", (("rank", "1"),))] == 2.5
        assert s[("tsup_gpu_memory_used_bytes", (("gpu", "1"),))] == 6e9
        assert s[("tsup_goodput_ratio", ())] == 0.9
        assert s[("tsup_seconds_since_last_good_checkpoint", ())] == 120
        assert s[("tsup_run_info", (("run_id", "gpt-small-20250101"),))] == 1
        assert 0 <= s[("tsup_status_age_seconds", ())] < 5

        # A rank that went away drops out; a missing metric is absent rather than stale.
        m.update({**STATUS, "heartbeats": {"0": 0.5}, "last_metric": None, "state": "backoff"})
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
            s = samples(r.read().decode())
        assert ("tsup_heartbeat_age_seconds", (("rank", "1"),)) not in s
        assert ("tsup_loss", ()) not in s
        assert s[("tsup_state", (("state", "backoff"),))] == 1
    finally:
        m.close()
    assert m.address is None


def test_textfile_atomic_and_rate_limited(tmp_path: Path):
    now = [0.0]
    target = tmp_path / "tsup.prom"
    m = Metrics(MetricsConfig(textfile=str(target), textfile_interval_s=15), clock=lambda: now[0])
    m.update(STATUS)
    first = target.read_text()
    assert samples(first)[("tsup_attempt", ())] == 2
    assert oct(os.stat(target).st_mode & 0o777) == "0o644"
    m.update({**STATUS, "attempt": 3})
    assert target.read_text() == first  # not yet: at most every 15 s
    now[0] = 15.0
    m.update({**STATUS, "attempt": 3})
    assert samples(target.read_text())[("tsup_attempt", ())] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tsup.prom"]  # no temp files left


def test_textfile_failure_does_not_raise(tmp_path: Path):
    m = Metrics(MetricsConfig(textfile=str(tmp_path / "missing-dir" / "tsup.prom")))
    m.update(STATUS)
    assert not m.write_textfile()


def test_last_good_checkpoint_time():
    m = Metrics()
    m.update({"last_good_checkpoint_at": time.time() - 30})
    age = samples(m.render().decode())[("tsup_seconds_since_last_good_checkpoint", ())]
    assert 29 <= age < 40


def test_config_sections_validate():
    problems: list = []
    cfg = build(MetricsConfig, {"listen": "localhost", "textfile": "rel.prom"}, "metrics", problems)
    assert cfg is not None
    msgs = sorted(str(p) for p in problems)
    assert msgs[0].startswith("metrics.listen: expected \"HOST:PORT\"")
    assert msgs[1].startswith("metrics.textfile: expected an absolute path")
    problems.clear()
    ok = build(MetricsConfig, {"listen": "[::1]:9464", "textfile": "/var/lib/node_exporter/textfile/tsup.prom"},
               "metrics", problems)
    assert problems == [] and ok.listen == "[::1]:9464"
    sd = build(SystemdConfig, {"watchdog": False, "status_interval_s": 0.1}, "systemd", problems)
    assert [str(p) for p in problems] == ["systemd.status_interval_s: expected number >= 0.5, got 0.1"]
    assert sd.watchdog is False
