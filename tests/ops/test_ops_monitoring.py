"""The shipped alerting rules and dashboard (supervisor/ops/monitoring/), and the textfile at
exit: promtool checks and unit-tests the rules as `install-units --print` gives them; the
dashboard and rules only name series the daemon exports; through the real daemon, node_exporter's
textfile collector reads the textfile without error while the job runs and after the daemon
exits (with the final state, and without process_*/python_* series, which the listener keeps);
a real Prometheus scraping the daemon's listener fires TsupGaveUp on a give-up (the daemon
lingers until it was scraped in the gave_up state) and tsup_restarts_total equals `status`. Every
rule has a runbook_url naming a section of the docs; the dashboard picks a run by `name`.
Several runs per node, and TsupDaemonDown after an end: tests/ops/test_ops_several_runs.py."""
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
    # the dashboard's variables pick a run: every tsup_ selector filters by name as well as instance
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "instance", "name"]
    assert all(e.count('name=~"$name"') == len(names_in(e)) for e in exprs), exprs


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_rule_has_a_runbook_url_naming_a_section_of_the_docs():
    root = Path(__file__).resolve().parents[2]
    rules = printed("alerts")
    alerts = re.findall(r"^ +- alert: (\w+)$", rules, re.M)
    urls = re.findall(r'^ +runbook_url: "([^"]+)"$', rules, re.M)
    assert len(urls) == len(alerts) == 10
    for alert, url in zip(alerts, urls):
        path, _, anchor = url.partition("#")
        doc = root / path
        assert doc.is_file(), url
        anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", doc.read_text(), re.M)}
        assert anchor == alert.lower() and anchor in anchors, (url, sorted(a for a in anchors if "tsup" in a))


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
        wait_for(lambda: 'tsup_state{name="job",state="running"} 1.0' in (textfile.read_text() if textfile.exists() else ""),
                 timeout=60, what="the textfile saying running")
        s = textfile_read_cleanly(exporter)
        assert s['tsup_state{name="job",state="running"}'] == 1.0 and s['tsup_last_step{name="job"}'] == 1.0
        listener = get(f"http://127.0.0.1:{port}/metrics")[1]
        assert "process_resident_memory_bytes" in listener and "python_info" in listener  # the listener keeps them
        release.touch()
        assert d.wait(60) == 0, d.stderr()[-3000:]
        final = textfile.read_text()
        s = textfile_read_cleanly(exporter)
    finally:
        exporter.stop()
    assert 'tsup_state{name="job",state="running"} 0.0' in final and s['tsup_state{name="job",state="running"}'] == 0.0
    assert s['tsup_state{name="job",state="finished"}'] == 1.0, final
    assert s['tsup_state{name="job",state="gave_up"}'] == 0.0
    assert not re.search(r"^(process_|python_)", final, re.M), final  # node_exporter has its own process_*


@pytest.mark.slow
def test_prometheus_fires_the_give_up_from_the_listener_and_restarts_total_equals_status(daemons, tmp_path: Path):
    """Nothing holds the daemon after its give-up: it keeps its listener up until Prometheus
    scraped the gave_up state ([metrics] linger_s, said as metrics_linger), then exits 3; the
    alert fires from the listener's job (no textfile is scraped here) after the daemon is gone.
    One restart, then the give-up on the second failure: the counter says 1, as `status` does."""
    tool("prometheus")
    textfile = tmp_path / "tsup.prom"
    release = tmp_path / "release"
    port = free_port()
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    prom = promhelp.prometheus(prom_dir, {"transformer-supervisor": f"127.0.0.1:{port}"}, [shipped_rules(prom_dir)])
    sd = tmp_path / "sd"
    try:
        d = daemons(["wrap", "--config", str(write_config(tmp_path, textfile, f"127.0.0.1:{port}")),
                     "--state-dir", str(sd), "--name", "gpt-a", "--max-restarts", "1", "--backoff", "0", "--"]
                    + waiting_job(release, 7))
        # Scraped a few times: the daemon waits at its end only for an address that scrapes it
        # regularly (a one-off fetch is not waited for).
        wait_for(lambda: api(prom, "/api/v1/query", query='count_over_time(tsup_state{job="transformer-supervisor",'
                             'state="running"}[1m]) >= 3')["result"], timeout=60, interval=0.2,
                 what="Prometheus scraping the daemon running")
        assert not firing(prom, "TsupGaveUp")
        release.touch()  # attempt 0 exits 7: one restart; attempt 1 exits 7 at once: the budget is spent
        assert d.wait(90) == 3, d.stderr()[-3000:]
        assert "event=metrics_linger " in d.stderr(), d.stderr()[-3000:]
        alerts = wait_for(lambda: firing(prom, "TsupGaveUp"), timeout=30, interval=0.2,
                          what="TsupGaveUp firing from the listener after the daemon exited")
        assert [(a["labels"]["job"], a["labels"]["name"]) for a in alerts] == [("transformer-supervisor", "gpt-a")]
        cp = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sd)], capture_output=True,
                            text=True, timeout=60)
        assert cp.returncode == 3, cp.stderr
        said = {c: float(n) for c, n in json.loads(cp.stdout)["restarts_by_cause"].items() if n}
        assert sum(said.values()) == 1, said
        query = 'last_over_time(tsup_restarts_total{job="transformer-supervisor"}[10m]) > 0'
        scraped = {r["metric"]["cause"]: float(r["value"][1]) for r in api(prom, "/api/v1/query", query=query)["result"]}
        assert scraped == said
        in_textfile = {k.split('cause="')[1].split('"')[0]: v for k, v in series(textfile.read_text()).items()
                       if k.startswith("tsup_restarts_total{") and v}
        assert in_textfile == said
    finally:
        release.touch()
        prom.stop()
