"""Durations anywhere in the config are finite and sensible (issue 34 part 7): `shutdown.grace_s =
inf` was accepted, and then nothing stopped a job that ignores SIGTERM. Every `*_s` key of the
schema refuses inf, NaN and a value past a year, naming the key and the allowed range, through
`check-config`, `wrap`'s flags and `--set`."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Iterator

import pytest

from supervisor.config.model import Config, ConfigError, config_from_table
from supervisor.config.schema import MAX_DURATION_S
from tests.conftest import ROOT

PY = sys.executable


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", *args], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)


def duration_keys(cls: type = Config, kind: type = float) -> Iterator[tuple[str, ...]]:
    """Every `*_s` key of type ``kind`` in the schema's tables (sub-tables included), as its path."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if dataclasses.is_dataclass(inner[0]):
            yield from ((f.name, *rest) for rest in duration_keys(inner[0], kind))  # type: ignore[arg-type]
        elif f.name.endswith("_s") and inner[0] is kind:
            yield (f.name,)


def table_with(keys: list[tuple[str, ...]], value: Any) -> dict[str, Any]:
    table: dict[str, Any] = {"job": {"command": ["x"]}}
    for path in keys:
        t = table
        for part in path[:-1]:
            t = t.setdefault(part, {})
        t[path[-1]] = value
    return table


KEYS = list(duration_keys())
INT_KEYS = list(duration_keys(kind=int))  # whole seconds: TOML has no integer inf or nan


def test_the_schema_has_the_durations_this_test_walks() -> None:
    paths = {".".join(k) for k in KEYS}
    assert {"shutdown.grace_s", "heartbeat.timeout_s", "policy.restart_window_s", "checkpoints.load_timeout_s"} <= paths
    assert len(paths) > 30 and ("policy", "blind_progress_active_s") in INT_KEYS


@pytest.mark.parametrize("keys,value,shown", [
    (KEYS, float("inf"), "got inf"), (KEYS, float("nan"), "got nan"), (KEYS, MAX_DURATION_S * 100, "got 3162240000.0"),
    (INT_KEYS, 10**30, "got 1e+30")])
def test_every_duration_key_refuses_an_endless_or_absurd_value(keys: list[tuple[str, ...]], value: float,
                                                               shown: str) -> None:
    with pytest.raises(ConfigError) as ei:
        config_from_table(table_with(keys, value), "t")
    said = {p.path: p.message for p in ei.value.problems}
    for path in (".".join(k) for k in keys):
        assert path in said, f"{path} accepted {value}"
        assert "expected a number of seconds" in said[path] and "up to" in said[path] and shown in said[path]


def test_a_year_is_still_a_duration() -> None:
    cfg = config_from_table(table_with([("shutdown", "grace_s"), ("policy", "restart_window_s")], MAX_DURATION_S), "t")
    assert cfg.shutdown.grace_s == MAX_DURATION_S and cfg.policy.restart_window_s == MAX_DURATION_S


def test_check_config_wrap_and_set_refuse_an_endless_grace(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[job]\ncommand = ["x"]\n[shutdown]\ngrace_s = inf\n[heartbeat]\ntimeout_s = 1e300\n')
    r = cli("check-config", str(p))
    assert r.returncode == 2
    assert ("shutdown.grace_s: expected a number of seconds from 0 up to 31622400 (366 days), got inf: "
            "an endless wait is never carried out") in r.stderr
    assert "heartbeat.timeout_s: expected a number of seconds above 0 up to 31622400 (366 days), got 1e+300" in r.stderr
    sd = tmp_path / "sd"
    for flags in (["--grace", "inf"], ["--set", "shutdown.grace_s=inf"], ["--set", "shutdown.grace_s=nan"]):
        w = cli("wrap", "--state-dir", str(sd), *flags, "--", PY, "-c", "pass")
        assert w.returncode == 2, (flags, w.stderr)
        assert "shutdown.grace_s: expected a number of seconds from 0 up to 31622400" in w.stderr, w.stderr
    assert not (sd / "ledger.sqlite").exists()  # refused before anything ran
