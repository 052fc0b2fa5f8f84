"""The shipped alerting rules and dashboard (supervisor/ops/monitoring/), and the textfile at
exit: promtool checks and unit-tests the rules as `install-units --print` gives them; the
dashboard and rules only name series the daemon exports; through the real daemon, node_exporter's
textfile collector reads the textfile without error while the job runs and after the daemon
exits (with the final state, and without process_*/python_* series, which the listener keeps);
a real Prometheus scraping the daemon fires TsupGaveUp on a give-up."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.ops.metrics import Metrics
from tests.cluster.etcdserver import free_port
from tests.ops import promhelp
from tests.ops.promhelp import Unavailable, api, firing, get
from tests.util import wait_for

PY = sys.executable
# A full status: every series the daemon can export is in the exposition.
FULL_STATUS: dict[str, Any] = {
    "state": "running", "run_id": "r1", "attempt": 1, "restarts_by_cause": {"nan": 1},
    "last_metric": {"step": 10, "loss": 2.0, "grad_norm": 1.0, "tokens_per_sec": 1e4, "at": 1.0},
    "heartbeats": {"0": 1.0}, "gpus": [{"index": 0, "uuid": "GPU-x", "memory_used_bytes": 1}], "goodput": 0.9,
    "goodput_detail": {"lost_by_cause": {"nan": 3.0}}, "last_good_checkpoint_at": 1.0, "ledger_write_errors": 0,
    "metrics_blind": {"since": 1.0},
}


def tool(name: str) -> str:
    try:
        return promhelp.binary(name)
    except Unavailable as e:
        pytest.skip(str(e))


def printed(what: str) -> str:
    cp = subprocess.run([PY, "-m", "supervisor", "install-units", "--print", what], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def shipped_rules(tmp: Path) -> Path:
    (tmp / "alerts.yml").write_text(printed("alerts"))
    (tmp / "alerts_test.yml").write_text(printed("alerts-test"))
    return tmp / "alerts.yml"


def test_promtool_checks_and_unit_tests_the_shipped_rules(tmp_path: Path):
    promtool = tool("promtool")
    rules = shipped_rules(tmp_path)
    r = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS: 10 rules found" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def exported_names() -> set[str]:
    m = Metrics()
    m.update(FULL_STATUS)
    return {line.split("{")[0].split(" ")[0] for line in m.render().decode().splitlines() if line.startswith("tsup_")}


def names_in(expr: str) -> set[str]:
    return set(re.findall(r"\btsup_[a-z_]+", expr))


def test_dashboard_and_rules_name_only_series_the_daemon_exports():
    exported = exported_names()
    dash = json.loads(printed("dashboard"))
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 12 and dash["uid"] == "transformer-supervisor"
    used = set().union(*(names_in(e) for e in exprs))
    assert used and used <= exported, used - exported
    assert {p["id"] for p in dash["panels"]} == set(range(1, len(dash["panels"]) + 1))
    rules = printed("alerts")  # YAML; promtool parses it above, here its text is enough
    alerts = re.findall(r"^ +- alert: (\w+)$", rules, re.M)
    assert len(alerts) == 10 and "TsupGaveUp" in alerts
    assert len(re.findall(r"^ +summary: ", rules, re.M)) == len(alerts) == len(re.findall(r"^ +description: ", rules, re.M))
    assert len(re.findall(r"^ +severity: (warning|critical)$", rules, re.M)) == len(alerts)
    used = names_in("\n".join(l for l in rules.splitlines() if "expr:" in l or l.startswith("          ")))
    assert "tsup_state" in used and used <= exported, used - exported


# --------------------------------------------------------------------------- through the daemon
def waiting_job(release: Path, code: int) -> list[str]:
    """A job that reports a step, then waits for ``release`` to appear and exits with ``code``."""
    src = ("import os, sys, time\nprint('step 1 loss 2.5', flush=True)\n"
           f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\nsys.exit({code})\n")
    return [PY, "-c", src]


def write_config(tmp: Path, textfile: Path, listen: str, extra: str = "") -> Path:
    p = tmp / "tsup.toml"
    p.write_text(f'[metrics]\nlisten = "{listen}"\ntextfile = "{textfile}"\ntextfile_interval_s = 1\n{extra}')
    return p


def series(text: str) -> dict[str, float]:
    """name{labels} -> value for every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def textfile_read_cleanly(exporter: promhelp.Server) -> dict[str, float]:
    status, body = get(exporter.url("/metrics"))
    assert status == 200, body
    s = series(body)
    assert s.get("node_textfile_scrape_error") == 0.0, body[-3000:]
    return s


def test_textfile_holds_our_series_and_the_final_state_node_exporter_reads_it(daemons, tmp_path: Path):
    exporter_bin = tool("node_exporter")
    assert exporter_bin
    tdir = tmp_path / "textfile"
    tdir.mkdir()
    textfile = tdir / "tsup.prom"
    release = tmp_path / "release"
    port = free_port()
    exporter = promhelp.node_exporter(tdir, tmp_path / "node_exporter.log")
    try:
        d = daemons(["wrap", "--config", str(write_config(tmp_path, textfile, f"127.0.0.1:{port}")),
                     "--state-dir", str(tmp_path / "sd"), "--"] + waiting_job(release, 0))
        wait_for(lambda: 'tsup_state{state="running"} 1.0' in (textfile.read_text() if textfile.exists() else ""),
                 timeout=60, what="the textfile saying running")
        s = textfile_read_cleanly(exporter)
        assert s['tsup_state{state="running"}'] == 1.0 and s["tsup_last_step"] == 1.0
        listener = get(f"http://127.0.0.1:{port}/metrics")[1]
        assert "process_resident_memory_bytes" in listener and "python_info" in listener  # the listener keeps them
        release.touch()
        assert d.wait(60) == 0, d.stderr()[-3000:]
        final = textfile.read_text()
        s = textfile_read_cleanly(exporter)
    finally:
        exporter.stop()
    assert 'tsup_state{state="running"} 0.0' in final and s['tsup_state{state="running"}'] == 0.0
    assert s['tsup_state{state="finished"}'] == 1.0, final
    assert s['tsup_state{state="gave_up"}'] == 0.0
    assert not re.search(r"^(process_|python_)", final, re.M), final  # node_exporter has its own process_*


@pytest.mark.slow
def test_prometheus_scraping_the_daemon_fires_the_give_up_alert(daemons, tmp_path: Path):
    """The listener is scraped in the gave_up state while the daemon waits for its give-up
    notification (the hook below holds it until the test saw the alert; notify.shutdown_wait_s
    bounds that wait), then the textfile carries gave_up 1 after the exit. TsupGaveUp has no
    `for:`, so the shipped rules fire as they are, no variant with shorter waits is needed."""
    tool("prometheus")
    tdir = tmp_path / "textfile"
    tdir.mkdir()
    textfile = tdir / "tsup.prom"
    release, hook_release = tmp_path / "release", tmp_path / "hook-release"
    hook = [PY, "-c", f"import os, time\nwhile not os.path.exists({str(hook_release)!r}): time.sleep(0.05)"]
    port = free_port()
    cfg = write_config(tmp_path, textfile, f"127.0.0.1:{port}",
                       f"[notify]\ncommand = {json.dumps(hook)}\nshutdown_wait_s = 60\ntimeout_s = 60\n")
    exporter = promhelp.node_exporter(tdir, tmp_path / "node_exporter.log")
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    prom = promhelp.prometheus(prom_dir, {"transformer-supervisor": f"127.0.0.1:{port}",
                                          "node": f"127.0.0.1:{exporter.port}"}, [shipped_rules(prom_dir)])
    try:
        d = daemons(["wrap", "--config", str(cfg), "--state-dir", str(tmp_path / "sd"), "--max-restarts", "0",
                     "--backoff", "0", "--"] + waiting_job(release, 7))

        def scraped_running() -> bool:
            r = api(prom, "/api/v1/query", query='tsup_state{job="transformer-supervisor",state="running"} == 1')
            return bool(r["result"])

        wait_for(scraped_running, timeout=60, interval=0.2, what="Prometheus scraping the daemon running")
        assert not firing(prom, "TsupGaveUp")
        release.touch()  # the job exits 7, no restarts left: the daemon gives up
        try:
            # From the listener itself (the textfile says gave_up as soon as the daemon gives up,
            # so node_exporter's job may fire first).
            alerts = wait_for(lambda: [a for a in firing(prom, "TsupGaveUp")
                                       if a["labels"]["job"] == "transformer-supervisor"], timeout=45, interval=0.2,
                              what="TsupGaveUp firing from the listener")
        except AssertionError:
            raise AssertionError(f"{api(prom, '/api/v1/query', query='tsup_state == 1')}\n"
                                 f"{api(prom, '/api/v1/rules')}\n{d.stderr()[-3000:]}") from None
        assert {a["labels"]["job"] for a in alerts} >= {"transformer-supervisor"}, alerts
        assert "gave up" in alerts[0]["annotations"]["summary"]
        hook_release.touch()
        assert d.wait(90) == 3, d.stderr()[-3000:]
        # After the exit the textfile, read by node_exporter, still says gave_up: the alert holds.
        s = textfile_read_cleanly(exporter)
        assert s['tsup_state{state="gave_up"}'] == 1.0
        wait_for(lambda: any(a["labels"]["job"] == "node" for a in firing(prom, "TsupGaveUp")), timeout=30,
                 interval=0.2, what="TsupGaveUp firing from the textfile after the exit")
    finally:
        hook_release.touch()
        prom.stop()
        exporter.stop()
