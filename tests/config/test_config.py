"""Config validation: every problem listed with its key path; exit 2; wrap flags override."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.model import ConfigError, config_from_table, load_config
from supervisor.config.doc import render

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=str(cwd), capture_output=True,
                          text=True, timeout=60)


def test_example_config_is_generated_from_the_schema_and_valid():
    example = ROOT / "config.example.toml"
    assert example.read_text() == render(), "run: python -m supervisor.config.doc > config.example.toml"
    # install-units installs it as the production config: it must configure nothing but the defaults
    # (no example active, no demo-specific [on.nan] ladder).
    from supervisor.config.model import Config

    assert load_config(example, need_command=False) == Config()
    assert "\n[on.nan]" not in example.read_text()
    cp = cli("check-config", "--for", "wrap", str(example))
    assert cp.returncode == 0 and "OK for wrap --config" in cp.stdout, cp.stderr
    cp = cli("check-config", str(example))  # as `run --config` reads it: the command is missing
    assert cp.returncode == 2 and "job.command: required" in cp.stderr and "--for wrap" in cp.stderr


def test_check_config_accepts_what_wrap_and_run_accept(daemons, tmp_path: Path):
    """A partial config (no command) that `wrap --config` runs passes `check-config --for wrap`; a
    whole one passes both; a bad one fails both with the same problem."""
    part = tmp_path / "part.toml"
    part.write_text("[policy]\nmax_restarts = 2\n")
    whole = tmp_path / "whole.toml"
    whole.write_text(f'[job]\ncommand = ["{sys.executable}", "-c", "pass"]\n[state]\ndir = "{tmp_path / "sd2"}"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nmax_restarts = -1\n")
    assert cli("check-config", "--for", "wrap", str(part)).returncode == 0
    assert cli("check-config", str(part)).returncode == 2
    d = daemons(["wrap", "--config", str(part), "--state-dir", str(tmp_path / "sd"), "--",
                 sys.executable, "-c", "pass"])
    assert d.wait(60) == 0
    for flags in ((), ("--for", "wrap")):
        assert cli("check-config", *flags, str(whole)).returncode == 0
        cp = cli("check-config", *flags, str(bad))
        assert cp.returncode == 2 and "policy.max_restarts" in cp.stderr
    d = daemons(["wrap", "--config", str(bad), "--state-dir", str(tmp_path / "sd3"), "--", sys.executable, "-c", "pass"])
    assert d.wait(60) == 2 and "policy.max_restarts" in d.stderr()


def test_every_key_of_every_section_has_a_help_line():
    from supervisor.config.model import Config
    from supervisor.config.schema import iter_keys

    keys = list(iter_keys(Config))
    assert len(keys) > 100
    missing = [path for path, _tp, _d, help_ in keys if not help_ and path != "on"]
    assert missing == []


BAD = """
[job]
name = "a/b"
command = "python train.py"
comand = ["x"]
resume_args = "--resume"

[policy]
max_restarts = "ten"
restart_window_s = -5
backoff_jitter = 3
backoff_factor = 0.5

[shutdown]
mode = "gracefull"
stop_signal = "SIGFOO"
grace_s = true

[on.nann]
action = "rollback"

[on.nan]
action = "explode"
remedies = [{ env = { LR = 1 } }, { skip_batches = -1 }]

[heartbeat]
timeout_s = "soon"

[polcy]
x = 1
"""


def test_every_problem_is_listed_with_its_key_path(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(BAD)
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msgs = [str(x) for x in ei.value.problems]
    text = "\n".join(msgs)
    expected = [
        'job.name: expected a name without "/", got "a/b"',
        "job.command: expected an array of strings",
        "job.comand: unknown key (did you mean 'job.command'?)",
        'job.resume_args: expected an array of strings, got "--resume"',
        'policy.max_restarts: expected a non-negative integer, got "ten"',
        "policy.restart_window_s: expected a positive number, got -5",
        "policy.backoff_jitter: expected number <= 1",
        "policy.backoff_factor: expected number >= 1",
        "shutdown.mode: expected one of graceful, forced, hybrid, got \"gracefull\" (did you mean 'graceful'?)",
        'shutdown.stop_signal: expected a signal name such as "SIGTERM" or "SIGUSR1", got "SIGFOO"',
        "shutdown.grace_s: expected a non-negative number, got true",
        "on.nann: unknown cause (did you mean 'on.nan'?)",
        "on.nan.action: expected one of restart, rollback, give_up, warn, got \"explode\"",
        "on.nan.remedies[0].env.LR: expected a string, got 1",
        "on.nan.remedies[1].skip_batches: expected a non-negative integer, got -1",
        'heartbeat.timeout_s: expected a positive number, got "soon"',
        "polcy: unknown key (did you mean 'policy'?)",
    ]
    for e in expected:
        assert any(m.startswith(e) or e in m for m in msgs), f"missing: {e}\nin:\n{text}"
    assert len(msgs) >= 17


def test_check_config_and_run_exit_2_listing_all_problems(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(BAD)
    for args in (["check-config", str(p)], ["run", "--config", str(p)]):
        cp = cli(*args)
        assert cp.returncode == 2
        assert "policy.max_restarts" in cp.stderr and "shutdown.mode" in cp.stderr and "polcy" in cp.stderr


@pytest.mark.parametrize("text,needle", [
    ("[job\n", "not valid TOML"),
    ("", "job.command: required"),
    ('[job]\ncommand = []\n', "job.command: required"),
    ('[job]\ncommand = ["x"]\nworkdir = "/nonexistent/dir"\n', "job.workdir: expected an existing directory"),
    ('[job]\ncommand = ["x"]\n[policy]\nbackoff_initial_s = 50\nbackoff_max_s = 10\n', "policy.backoff_max_s"),
    ('[job]\ncommand = ["x", "y"]\nshell = true\n', "with job.shell = true, expected one string"),
    ('job = 3\n', "job: expected a table, got 3"),
    ('[job]\ncommand = ["x"]\nenv = { A = ["b"] }\n', "job.env.A: expected a string"),
    ('[job]\ncommand = ["x"]\n[log]\nformat = "xml"\n', "log.format: expected one of"),
    ('[job]\ncommand = ["x"]\n[shutdown]\ncheckpoint_timeout_s = nan\n', "expected a number of seconds from 0 up to 31622400 (366 days), got nan"),
])
def test_more_bad_configs(tmp_path, text, needle):
    p = tmp_path / "c.toml"
    p.write_text(text)
    cp = cli("check-config", str(p))
    assert cp.returncode == 2 and needle in cp.stderr, cp.stderr


def test_missing_file_is_a_clear_error(tmp_path):
    cp = cli("check-config", str(tmp_path / "nope.toml"))
    assert cp.returncode == 2 and "file not found" in cp.stderr


def test_shell_command_as_string():
    cfg = config_from_table({"job": {"command": "python train.py | tee x", "shell": True}})
    assert cfg.job.command == ("python train.py | tee x",)


def test_wrap_flags_override_the_file_and_are_validated(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(f'[job]\nname = "file"\ncommand = ["{sys.executable}", "-c", "pass"]\n'
                 f'[state]\ndir = "{tmp_path / "from-file"}"\n[policy]\nmax_restarts = 7\n')
    sd = tmp_path / "from-flag"
    cp = cli("wrap", "--config", str(p), "--state-dir", str(sd), "--name", "flagged", "--max-restarts", "ten")
    assert cp.returncode == 2 and 'policy.max_restarts: expected a non-negative integer, got "ten"' in cp.stderr
    cp = cli("wrap", "--config", str(p), "--state-dir", str(sd), "--name", "flagged")
    assert cp.returncode == 0, cp.stderr
    assert (sd / "ledger.sqlite").exists() and not (tmp_path / "from-file").exists()
    cp = cli("history", "--json", "--state-dir", str(sd))
    assert '"name": "flagged"' in cp.stdout


def test_wrap_without_command_is_usage_error():
    cp = cli("wrap")
    assert cp.returncode == 2 and "wrap needs a command" in cp.stderr
