"""Prometheus metrics: scraped over loopback and parsed; the textfile written atomically."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor import __version__

from supervisor.config.model import Config  # noqa: F401 (the section must be part of the top-level config)
from supervisor.config.schema import build
from supervisor.ops.config import MetricsConfig, SystemdConfig
from supervisor.ops.metrics import Metrics

STATUS = {
    "state": "running", "run_id": "gpt-small-20250101", "attempt": 2, "pids": [10],
    "restarts_by_cause": {"nan": 1, "oom": 1},
    "last_metric": {"step": 1200, "loss": 2.5, "grad_norm": 0.75, "tokens_per_sec": 41000.0},
    "heartbeats": {"0": 1.5, "1": 2.5},
    "gpus": [{"index": 0, "uuid": "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", "memory_used_bytes": 5_000_000_000},
             {"index": 1, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "memory_used_bytes": 6e9}],
    "checkpoint": "/c/step_1000.pt", "goodput": 0.9, "seconds_since_last_good_checkpoint": 120.0,
    "goodput_detail": {"ratio": 0.9, "lost_by_cause": {"startup": 12.5, "nan": 30.25, "oom": 4.0}},
}
UUID1 = "GPU-11111111-2222-3333-4444-555555555555"


def samples(text: str, name: str = "job") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(series name, labels but ``name``) -> value; every tsup_ series carries the run's ``name``."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            if s.name.startswith("tsup_"):
                assert labels.pop("name", None) == name, s
            out[(s.name, tuple(sorted(labels.items())))] = s.value
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
        assert s[("tsup_gpu_memory_used_bytes", (("UUID", UUID1), ("gpu", "1")))] == 6e9
        assert s[("tsup_goodput_ratio", ())] == 0.9
        assert s[("tsup_run_info", (("run_id", "gpt-small-20250101"),))] == 1
        assert s[("tsup_build_info", (("version", __version__),))] == 1
        # times are timestamps (unix seconds), not "seconds since"
        now = time.time()
        published = s[("tsup_status_timestamp_seconds", ())]
        assert now - 5 < published <= now
        assert s[("tsup_heartbeat_timestamp_seconds", (("rank", "1"),))] == pytest.approx(published - 2.5)
        assert s[("tsup_last_good_checkpoint_timestamp_seconds", ())] == pytest.approx(published - 120)
        assert not [k for k in s if "age" in k[0] or "since" in k[0]]
        # lost time by cause: a counter
        assert s[("tsup_lost_seconds_total", (("cause", "nan"),))] == 30.25
        assert s[("tsup_lost_seconds_total", (("cause", "startup"),))] == 12.5
        # the daemon's own process metrics
        assert s[("process_start_time_seconds", ())] > 0 and s[("process_resident_memory_bytes", ())] > 0
        assert ("process_cpu_seconds_total", ()) in s

        # A rank that went away drops out; a missing metric is absent rather than stale.
        m.update({**STATUS, "heartbeats": {"0": 0.5}, "last_metric": None, "state": "backoff"})
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
            s = samples(r.read().decode())
        assert ("tsup_heartbeat_timestamp_seconds", (("rank", "1"),)) not in s
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
    m.update({"last_good_checkpoint_at": 1_700_000_000.5, "last_metric": {"step": 3, "at": 1_700_000_100.25}})
    s = samples(m.render().decode())
    assert s[("tsup_last_good_checkpoint_timestamp_seconds", ())] == 1_700_000_000.5
    assert s[("tsup_last_metric_timestamp_seconds", ())] == 1_700_000_100.25


def test_lost_seconds_never_decrease_within_a_run():
    m = Metrics()
    lost = lambda: {k[1][0][1]: v for k, v in samples(m.render().decode()).items()  # noqa: E731
                    if k[0] == "tsup_lost_seconds_total"}
    m.update({"run_id": "a", "goodput_detail": {"lost_by_cause": {"crash": 10.0, "running": 3.0}}})
    assert lost() == {"crash": 10.0}  # the running attempt's tail is not lost (yet)
    m.update({"run_id": "a", "goodput_detail": {"lost_by_cause": {"crash": 9.5, "hang": 2.0}}})
    assert lost() == {"crash": 10.0, "hang": 2.0}
    m.update({"run_id": "b", "goodput_detail": {"lost_by_cause": {"oom": 1.0}}})
    assert lost() == {"oom": 1.0}  # a new run starts from zero (a counter reset)


def test_output_lag_is_exported_while_a_job_runs():
    m = Metrics()
    m.update({**STATUS, "output_lag": {"seconds": 12.5, "bytes": 4096, "max_seconds": 20.0, "unparsed_bytes": 0}})
    s = samples(m.render().decode())
    assert s[("tsup_output_lag_seconds", ())] == 12.5 and s[("tsup_output_lag_bytes", ())] == 4096
    m.update({**STATUS, "output_lag": None})  # no job
    assert not any(k[0].startswith("tsup_output_lag") for k in samples(m.render().decode()))


def test_the_waiting_prewarm_standbys_memory_and_cpu_are_exported_only_while_one_waits():
    m = Metrics()
    m.update({**STATUS, "prewarm": {"state": "ready", "pid": 77, "rss_bytes": 301_989_888, "cpu_s": 2.25}})
    s = samples(m.render().decode())
    assert s[("tsup_prewarm_rss_bytes", ())] == 301_989_888 and s[("tsup_prewarm_cpu_seconds_total", ())] == 2.25
    for block in ({"state": "due", "reason": "starts 5 s after the attempt's first step"}, {"state": "off"}, None):
        m.update({**STATUS, "prewarm": block})
        assert not any(k[0].startswith("tsup_prewarm") for k in samples(m.render().decode())), block


def test_the_prewarm_block_is_rendered_for_people_by_status():
    import re

    from supervisor.cli.render import status_table

    def line(block: dict) -> list[str]:
        return re.findall(r"^prewarm +(.*)$", status_table({**STATUS, "prewarm": block}), re.M)

    ready = {"state": "ready", "pid": 77, "rss_bytes": 301_989_888, "cpu_s": 2.25}
    assert line(ready) == ["ready (pid 77, 288.0 MiB resident, 2.25 CPU-s)"]
    due = {"state": "due", "reason": "starts 5 s after the attempt's first step"}
    assert line(due) == ["due: starts 5 s after the attempt's first step"]
    assert line({"state": "off"}) == []


def _advice() -> dict:
    from supervisor.core.interval import advise

    advice = advise(save_cost_s=6.0, run_seconds=4 * 3600.0, failures=4, restart_s=40.0, current_s=1800.0)
    assert advice is not None
    return advice.to_json()


def test_checkpoint_interval_advice_is_exported_with_the_goodput_each_interval_gives():
    advice = _advice()
    m = Metrics()
    m.update({**STATUS, "checkpoint_interval": advice})
    s = samples(m.render().decode())
    assert s[("tsup_checkpoint_interval_advised_seconds", ())] == advice["advised_s"]
    assert s[("tsup_checkpoint_interval_current_seconds", ())] == 1800.0
    assert s[("tsup_checkpoint_save_cost_seconds", ())] == 6.0
    assert s[("tsup_checkpoint_interval_mtbf_seconds", ())] == 3600.0
    now = s[("tsup_checkpoint_interval_expected_goodput", (("interval", "current"),))]
    best = s[("tsup_checkpoint_interval_expected_goodput", (("interval", "advised"),))]
    assert now == advice["goodput_now"] and best == advice["goodput_advised"]
    assert 0 < now < best < 1  # saving every 30 min against a failure an hour costs more than the advice


def test_no_interval_series_before_there_is_advice():
    m = Metrics()
    m.update({**STATUS, "checkpoint_interval": None})
    assert not any(k[0].startswith(("tsup_checkpoint_interval", "tsup_checkpoint_save_cost"))
                   for k in samples(m.render().decode()))
    m.update({**STATUS, "checkpoint_interval": {**_advice(), "current_s": None, "goodput_now": None}})
    s = samples(m.render().decode())
    assert ("tsup_checkpoint_interval_current_seconds", ()) not in s
    assert [k[1] for k in s if k[0] == "tsup_checkpoint_interval_expected_goodput"] == [(("interval", "advised"),)]


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed (apt-get install prometheus)")
def test_promtool_check_metrics_is_clean(tmp_path: Path):
    m = Metrics()
    m.update({**STATUS, "last_good_checkpoint_at": time.time() - 60,
              "checkpoint_interval": _advice()})
    text = m.render()
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b"", (r.stdout + r.stderr).decode()


def test_exposition_parses_and_follows_the_naming_conventions():
    """Without promtool: prometheus_client's parser, and promtool's main lint rules by hand."""
    m = Metrics()
    m.update(STATUS)
    fams = list(text_string_to_metric_families(m.render().decode()))
    names = {f.name for f in fams}
    assert {"tsup_build_info", "tsup_restarts", "tsup_lost_seconds", "process_cpu_seconds", "python_info",
            "tsup_heartbeat_timestamp_seconds", "tsup_gpu_memory_used_bytes"} <= names
    for f in fams:
        assert f.documentation, f.name
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples), f.name
        assert f.name == f.name.lower() or f.name.startswith("process_"), f.name
        assert not f.name.endswith(("_age_seconds", "_milliseconds", "_count")), f.name


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


def test_healthz_on_the_metrics_listener():
    """GET /healthz: 503 before the first status and once it is stale (a wedged main loop), else 200."""
    import urllib.error

    from supervisor.ops import metrics as mod

    m = Metrics(MetricsConfig(listen="127.0.0.1:0"))
    m.start()
    try:
        host, port = m.address or ("", 0)

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        code, text = get("/healthz")
        assert code == 503 and "no status" in text
        m.update({**STATUS, "state": "backoff"})
        code, text = get("/healthz")
        assert code == 200 and text.startswith("ok: backoff, attempt 2")
        assert get("/metrics")[0] == 200 and "tsup_state" in get("/metrics")[1]
        ok, why = m.health(now=time.time() + mod.HEALTH_STALE_S + 5)
        assert not ok and "main loop is stuck" in why
    finally:
        m.close()


def test_textfile_leaves_out_process_and_platform_series_the_listener_keeps(tmp_path: Path):
    target = tmp_path / "tsup.prom"
    m = Metrics(MetricsConfig(textfile=str(target)))
    m.final({**STATUS, "state": "gave_up"})  # written at once, whatever the interval
    text = target.read_text()
    assert 'tsup_state{name="job",state="gave_up"} 1.0' in text and 'tsup_state{name="job",state="running"} 0.0' in text
    assert not [l for l in text.splitlines() if l.split(" ")[0].startswith(("process_", "python_"))
                or l.startswith(("# HELP process_", "# HELP python_"))], text
    served = m.render().decode()
    assert "process_start_time_seconds" in served and "python_info" in served


def test_the_verdict_on_a_jobs_exit_0_is_exported_once_it_ended_and_rendered_in_status():
    from supervisor.cli.render import status_table

    m = Metrics()
    m.update(STATUS)  # running: no verdict yet, no series
    assert not any(k[0] == "tsup_end_verdict" for k in samples(m.render().decode()))
    end = {"verdict": "unwatched", "reason": "finished, unwatched: the job exited 0 after 9.0 s (attempt 0), but "
           "no training metric was ever seen", "sources": [], "last_step": None, "weights": {"finite": None}}
    m.update({**STATUS, "state": "finished", "end": end})
    s = samples(m.render().decode())
    assert s[("tsup_end_verdict", (("verdict", "unwatched"),))] == 1.0
    assert s[("tsup_end_verdict", (("verdict", "watched"),))] == 0.0
    assert s[("tsup_end_verdict", (("verdict", "nonfinite_weights"),))] == 0.0
    rows = [line.split(None, 1) for line in status_table({**STATUS, "end": end}).split("\n")]
    assert ["end", "unwatched: " + end["reason"]] in rows
