"""Several runs per node, through real daemons: two runs write their own textfiles ("{name}" in
``[metrics] textfile``) into one node_exporter directory, which reads both without an error,
each series by its ``name``, and a give-up of one is seen while the other runs on. A real
Prometheus with the shipped rules: TsupDaemonDown pages for a daemon killed while it supervised,
and never for one that finished or was stopped (each lingers until scraped in its end state)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.etcdserver import free_port
from tests.conftest import Daemon, started_daemons
from tests.ops import promhelp
from tests.ops.promhelp import api
from tests.ops.test_ops_monitoring import series, shipped_rules, textfile_read_cleanly, tool, waiting_job
from tests.util import wait_for

PY = sys.executable
Start = Callable[..., Daemon]


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Start]:
    """Daemons each with its own output files (tmp/NAME/daemon.std*), stopped at teardown."""
    def make(name: str, config: Path, job: list[str], *extra: str) -> Daemon:
        home = tmp_path / name
        home.mkdir()
        return Daemon(["wrap", "--config", str(config), "--state-dir", str(home / "sd"), "--name", name, *extra,
                       "--"] + job, home)

    with started_daemons(make) as start:
        yield start


def test_two_runs_in_one_textfile_directory_node_exporter_reads_both_by_name(runs: Start, tmp_path: Path):
    tool("node_exporter")
    tdir = tmp_path / "textfile"
    tdir.mkdir()
    cfg = tmp_path / "tsup.toml"
    cfg.write_text(f'[metrics]\ntextfile = "{tdir}/tsup-{{name}}.prom"\ntextfile_interval_s = 1\n')
    exporter = promhelp.node_exporter(tdir, tmp_path / "node_exporter.log")
    fail, finish = tmp_path / "fail", tmp_path / "finish"
    try:
        alpha = runs("alpha", cfg, waiting_job(fail, 7), "--max-restarts", "0")
        beta = runs("beta", cfg, waiting_job(finish, 0))

        def both(state_a: str, state_b: str) -> dict[str, float]:
            s = textfile_read_cleanly(exporter)  # node_textfile_scrape_error 0: no duplicate, no bad file
            ok = (s.get(f'tsup_state{{name="alpha",state="{state_a}"}}') == 1.0
                  and s.get(f'tsup_state{{name="beta",state="{state_b}"}}') == 1.0)
            return s if ok else {}

        s = wait_for(lambda: both("running", "running"), timeout=60, interval=0.2, what="both runs running")
        assert sorted(p.name for p in tdir.glob("*.prom")) == ["tsup-alpha.prom", "tsup-beta.prom"]
        infos = [k for k in s if k.startswith("tsup_run_info{")]
        assert len(infos) == 2 and {re.search(r'name="(\w+)"', k).group(1) for k in infos} == {"alpha", "beta"}  # type: ignore[union-attr]
        ours = [k for k in s if k.startswith("tsup_")]
        assert ours and all(re.search(r'name="(alpha|beta)"', k) for k in ours), ours  # every series names its run
        fail.touch()  # alpha's job exits 7 with no restart left: it gives up; beta runs on
        assert alpha.wait(60) == 3, alpha.stderr()[-3000:]
        s = wait_for(lambda: both("gave_up", "running"), timeout=30, interval=0.2, what="alpha gave_up, beta running")
        assert s['tsup_state{name="alpha",state="running"}'] == 0.0 and s['tsup_state{name="beta",state="gave_up"}'] == 0.0
        finish.touch()
        assert beta.wait(60) == 0, beta.stderr()[-3000:]
        s = wait_for(lambda: both("gave_up", "finished"), timeout=30, interval=0.2, what="alpha gave_up, beta finished")
        assert series((tdir / "tsup-alpha.prom").read_text())['tsup_state{name="alpha",state="gave_up"}'] == 1.0
    finally:
        fail.touch()
        finish.touch()
        exporter.stop()


def fast_rules(tmp: Path) -> Path:
    """The shipped rules with TsupDaemonDown's `for: 2m` made 3 s (a test cannot wait 2 minutes):
    the expression is the shipped one."""
    rules = shipped_rules(tmp)
    text = rules.read_text()
    head, sep, tail = text.partition("- alert: TsupDaemonDown")
    assert sep and tail.count("for: 2m") == 1, tail
    rules.write_text(head + sep + tail.replace("for: 2m", "for: 3s"))
    return rules


def alerts_for(prom: promhelp.Server, instance: str) -> list[dict[str, Any]]:
    return [a for a in api(prom, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == "TsupDaemonDown" and a["labels"].get("instance") == instance]


@pytest.mark.slow
def test_daemon_down_pages_a_killed_daemon_never_a_finished_or_stopped_one(runs: Start, tmp_path: Path):
    tool("prometheus")
    ports = {name: free_port() for name in ("done", "stopped", "killed")}
    instances = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    prom = promhelp.prometheus(prom_dir, {"transformer-supervisor": list(instances.values())}, [fast_rules(prom_dir)])
    release = tmp_path / "release"
    daemons = {}
    try:
        for name, port in ports.items():
            cfg = tmp_path / f"{name}.toml"
            cfg.write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
            daemons[name] = runs(name, cfg, waiting_job(release, 0) if name == "done" else waiting_job(tmp_path / "never", 0))
        # each scraped a few times while running: a regular scraper is waited for at the end
        running = 'count_over_time(tsup_state{job="transformer-supervisor",state="running"}[1m]) >= 3'
        wait_for(lambda: len(api(prom, "/api/v1/query", query=running)["result"]) == 3, timeout=90, interval=0.2,
                 what="Prometheus scraping the three daemons running")
        release.touch()  # "done" finishes: exit 0
        assert daemons["done"].wait(60) == 0, daemons["done"].stderr()[-3000:]
        cp = subprocess.run([PY, "-m", "supervisor", "stop", "--state-dir", str(tmp_path / "stopped" / "sd")],
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert daemons["stopped"].wait(60) == 0, daemons["stopped"].stderr()[-3000:]
        for name in ("done", "stopped"):
            assert "event=metrics_linger " in daemons[name].stderr(), daemons[name].stderr()[-3000:]
        daemons["killed"].proc.send_signal(signal.SIGKILL)  # dies while it supervises: no end state
        daemons["killed"].proc.wait(30)
        fired = wait_for(lambda: [a for a in alerts_for(prom, instances["killed"]) if a["state"] == "firing"],
                         timeout=60, interval=0.2, what="TsupDaemonDown firing for the killed daemon")
        assert fired[0]["labels"]["severity"] == "critical"
        # The two that ended have been down longer than the killed one: had the rule matched
        # them, they would be firing too. Their last scraped state was their end.
        assert alerts_for(prom, instances["done"]) == [] and alerts_for(prom, instances["stopped"]) == []
        ends = api(prom, "/api/v1/query", query='last_over_time(tsup_state{state=~"finished|stopped"}[5m]) == 1')
        assert sorted((r["metric"]["name"], r["metric"]["state"]) for r in ends["result"]) == [
            ("done", "finished"), ("stopped", "stopped")]
    finally:
        release.touch()
        (tmp_path / "never").touch()  # the killed daemon's job, orphaned, exits
        prom.stop()


def test_a_run_of_the_same_name_in_another_textfile_is_said_at_start(runs: Start, tmp_path: Path):
    """Two runs named alike would repeat each other's series (node_exporter rejects both files):
    the daemon says so when it starts, naming the other file, and supervises on."""
    tdir = tmp_path / "textfile"
    tdir.mkdir()
    (tdir / "tsup-old.prom").write_text('tsup_run_info{name="alpha",run_id="20250101-000000-aaaaaa"} 1.0\n')
    (tdir / "other-tool.prom").write_text('tsup_run_info{name="beta",run_id="x"} 1.0\nnode_thing 1\n')
    cfg = tmp_path / "tsup.toml"
    cfg.write_text(f'[metrics]\ntextfile = "{tdir}/tsup-{{name}}.prom"\n')
    release = tmp_path / "release"
    d = runs("alpha", cfg, waiting_job(release, 0))
    try:
        line = wait_for(lambda: [ln for ln in d.stderr().splitlines() if ln.startswith("event=metrics_textfile_name_taken ")],
                        timeout=60, interval=0.1, what="the daemon naming the other file of its name")[0]
        assert str(tdir / "tsup-old.prom") in line and "other-tool.prom" not in line, line
        assert "give this run its own [job] name" in line
    finally:
        release.touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]


def test_the_look_at_other_textfiles_is_bounded_and_never_blocks(tmp_path: Path):
    import os

    from supervisor.ops import textfiles

    marker = b'tsup_run_info{name="alpha",run_id="r"} 1.0\n'
    (tmp_path / "late.prom").write_bytes(b"#" * (textfiles.HEAD_BYTES + 10) + b"\n" + marker)  # past the head
    (tmp_path / "huge.prom").write_bytes(marker + b"x" * 16_000_000)  # 16 MB: only its head is read
    os.mkfifo(tmp_path / "fifo.prom")  # no writer: a blocking open would hang here
    (tmp_path / "link.prom").symlink_to(tmp_path / "huge.prom")  # links are not followed
    found = textfiles.same_name_elsewhere(str(tmp_path / "tsup-alpha.prom"), "alpha")
    assert found == [str(tmp_path / "huge.prom")]
    crowd = tmp_path / "crowd"
    crowd.mkdir()
    for i in range(textfiles.MAX_FILES * 2):
        (crowd / f"f{i}.prom").write_bytes(marker)
    assert len(textfiles.same_name_elsewhere(str(crowd / "tsup-alpha.prom"), "alpha")) == textfiles.MAX_FILES
