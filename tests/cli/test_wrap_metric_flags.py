"""``wrap --metric-regex`` and ``wrap --watch-file``: added to the config's keys, validated by flag."""
from __future__ import annotations

import subprocess
import sys

from supervisor.cli import overrides as cli
from supervisor.cli.parser import build_parser
from supervisor.config.model import config_from_table
from tests.conftest import ROOT

TSUP = [sys.executable, "-m", "supervisor"]


def _table(argv: list[str]) -> dict:
    return cli.wrap_table(build_parser().parse_args(["wrap", *argv]))


def test_flags_extend_the_configs_regexes_and_watch_files(tmp_path):
    c = tmp_path / "c.toml"
    c.write_text('[job]\nwatch_files = ["a.log"]\n[detectors.parsers]\nregexes = [\'s=(?P<step>\\d+)\']\n'
                 '[detectors]\nevidence_chars = 100\n')
    t = _table(["--config", str(c), "--metric-regex", r"it (?P<step>\d+) L (?P<loss>\S+)",
                "--metric-regex", r"val (?P<step>\d+) (?P<val_loss>\S+)", "--watch-file", "logs/*.log",
                "--", "python", "x.py"])
    cfg = config_from_table(t, "test")
    assert cfg.detectors.parsers.regexes == (r"s=(?P<step>\d+)", r"it (?P<step>\d+) L (?P<loss>\S+)",
                                             r"val (?P<step>\d+) (?P<val_loss>\S+)")
    assert cfg.detectors.evidence_chars == 100  # the rest of [detectors] is kept
    assert cfg.job.watch_files == ("a.log", "logs/*.log")
    # Without a config: the flags alone.
    cfg = config_from_table(_table(["--watch-file", "m.jsonl", "--", "true"]), "test")
    assert cfg.job.watch_files == ("m.jsonl",) and cfg.detectors.parsers.regexes == ()


def test_a_bad_metric_regex_exits_2_naming_the_flag_and_the_problem(tmp_path):
    for i, (rx, why) in enumerate([(r"step (?P<step>\d+", "not a valid regular expression"),
                    (r"step (\d+) loss (\S+)", "has no named group"),
                    (r"rank (?P<rank>\d+)", "captures neither step nor loss")]):
        sd = tmp_path / f"sd{i}"
        cp = subprocess.run([*TSUP, "wrap", "--state-dir", str(sd), "--metric-regex", rx, "--", "true"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 2, cp.stderr
        assert f"--metric-regex '{rx}'" in cp.stderr and why in cp.stderr
        assert not (sd / "ledger.sqlite").exists()  # refused before any run began


def test_other_group_names_are_allowed_they_land_in_extra():
    args = build_parser().parse_args(["wrap", "--metric-regex", r"(?P<epoch>\d+)x(?P<acc>\d+)", "--", "true"])
    assert cli.wrap_flag_problems(args) == []


def test_status_table_shows_each_metric_source_and_a_blind_runs_fix():
    from supervisor.cli.render import status_table

    text = status_table({"state": "running", "last_metric": None, "metric_sources": [
        {"source": "stdout", "formats": ["generic"], "records": 12, "last_step": 60, "age_s": 1.5},
        {"source": "tb:/w/lightning_logs/version_0/events.out", "formats": ["tensorboard"], "records": 3,
         "last_step": None, "age_s": 0.2}],
        "metrics_blind": {"lines": 200, "seconds": 30.0, "fix": "wrap --metric-regex 'x (?P<loss>\\S+)'"}})
    assert "metric sources  stdout: generic, 12 records, step 60 (1.5s ago)" in text
    assert "tb:/w/lightning_logs/version_0/events.out: tensorboard, 3 records (0.2s ago)" in text
    assert "BLIND: no training step parsed from 200 lines" in text and "fix: wrap --metric-regex" in text
