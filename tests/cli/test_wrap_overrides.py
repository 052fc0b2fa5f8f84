"""`wrap --set KEY=VALUE`, `--env KEY=VALUE`, `--workdir DIR` (SPEC: wrap flags): any documented
key from the command line, typed by the schema, every problem named as for a config file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from supervisor.cli.overrides import apply_set, split_assignment, typed_value
from supervisor.config.model import Config, config_from_table
from tests.conftest import ROOT


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=str(cwd), capture_output=True,
                          text=True, timeout=120)


def test_values_take_the_type_of_their_key() -> None:
    assert typed_value(Config, ["heartbeat", "learn_floor_s"], "120") == 120
    assert typed_value(Config, ["heartbeat", "timeout_s"], "2.5") == 2.5
    assert typed_value(Config, ["job", "name"], "123") == "123"  # a str key keeps digits as text
    assert typed_value(Config, ["job", "unbuffered"], "false") is False
    assert typed_value(Config, ["detectors", "nan", "fields"], "loss,val_loss") == ["loss", "val_loss"]
    assert typed_value(Config, ["detectors", "nan", "fields"], '["loss"]') == ["loss"]
    assert typed_value(Config, ["job", "env"], '{A = "1"}') == {"A": "1"}
    assert typed_value(Config, ["on", "nan", "action"], "give_up") == "give_up"
    # A value that is not one of its type stays text: the config's validation names it.
    assert typed_value(Config, ["policy", "max_restarts"], "ten") == "ten"


def test_set_builds_the_same_config_a_file_would() -> None:
    table: dict = {"job": {"command": ["python", "t.py"]}, "heartbeat": {"timeout_s": 30}}
    apply_set(table, Config, "heartbeat.learn_floor_s", "120")
    apply_set(table, Config, "on.nan.action", "give_up")
    apply_set(table, Config, "detectors.parsers.regexes", r"['it (?P<step>\d+) l (?P<loss>\S+)']")
    cfg = config_from_table(table)
    assert cfg.heartbeat.learn_floor_s == 120.0 and cfg.heartbeat.timeout_s == 30.0
    assert cfg.on["nan"].action is not None and cfg.on["nan"].action.value == "give_up"
    assert cfg.detectors.parsers.regexes == (r"it (?P<step>\d+) l (?P<loss>\S+)",)


def test_malformed_assignments_are_named_by_their_flag() -> None:
    assert split_assignment("a.b=", "--set") == ("a.b", "")
    problem = split_assignment("heartbeat.timeout_s", "--set")
    assert isinstance(problem, str) and problem.startswith("--set 'heartbeat.timeout_s': expected KEY=VALUE")
    assert isinstance(split_assignment("=1", "--env"), str)


def test_wrap_runs_the_job_with_env_workdir_and_set_keys(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    sd = tmp_path / "sd"
    code = "import os; print('ENV', os.environ['MY_FLAG'], 'CWD', os.getcwd())"
    cp = cli("wrap", "--state-dir", str(sd), "--env", "MY_FLAG=on=yes", "--workdir", str(work),
             "--set", "heartbeat.learn_floor_s=7", "--set", "policy.max_restarts=4", "--",
             sys.executable, "-c", code)
    assert cp.returncode == 0, cp.stderr
    assert f"ENV on=yes CWD {work}" in cp.stdout  # only the first '=' splits KEY from VALUE
    hist = json.loads(cli("history", "--json", "--state-dir", str(sd)).stdout)
    assert hist["attempts"][0]["cwd"] == str(work)


def test_wrap_bad_set_exits_2_naming_the_key(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    cp = cli("wrap", "--state-dir", str(sd), "--set", "heartbeat.learn_flor_s=7", "--set", "policy.max_restarts=ten",
             "--", sys.executable, "-c", "pass")
    assert cp.returncode == 2
    assert "heartbeat.learn_flor_s: unknown key (did you mean 'heartbeat.learn_floor_s'?)" in cp.stderr
    assert 'policy.max_restarts: expected a non-negative integer, got "ten"' in cp.stderr
    cp = cli("wrap", "--state-dir", str(sd), "--set", "nokey", "--", sys.executable, "-c", "pass")
    assert cp.returncode == 2 and "--set 'nokey': expected KEY=VALUE" in cp.stderr
    assert not (sd / "ledger.sqlite").exists()
