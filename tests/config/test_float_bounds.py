"""Every number in the config is finite and within a sane range (issue 34, D6): `[heartbeat]
learn_factor = inf` passed check-config, and in a live run the learned step timeout was inf (`status`
showed `timeout_s: None`) so a hung job was never called hung; `heartbeat.timeout_s = 1e-300` passed
too. The walk covers every float key of the schema, not only the `*_s` durations
(tests/config/test_duration_bounds.py), so a key added later is covered without a line here."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Iterator

import pytest

from supervisor.config.model import Config, ConfigError, config_from_table
from supervisor.config.schema import MAX_FACTOR, MIN_DURATION_S, _unwrap_optional
from tests.conftest import ROOT
from tests.config.test_duration_bounds import table_with


def float_keys(cls: type = Config) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every float key (optional ones included) of the schema's tables, with its field metadata."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, _ = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from (((f.name, *rest), md) for rest, md in float_keys(typing.cast(type, tp)))
        elif tp is float:
            yield (f.name,), dict(f.metadata)


KEYS = list(float_keys())
PATHS = [".".join(k) for k, _ in KEYS]
FACTORS = [k for k, _ in KEYS if k[-1].endswith(("_factor", "_multiple"))]
POSITIVE_DURATIONS = [k for k, md in KEYS if k[-1].endswith("_s") and md.get("min_exclusive") and md.get("min") == 0]


def refusals(keys: list[tuple[str, ...]], value: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as ei:
        config_from_table(table_with(keys, value), "t")
    return {p.path: p.message for p in ei.value.problems}


def test_the_walk_sees_the_keys_that_were_accepted_and_more_than_the_durations() -> None:
    assert {"heartbeat.learn_factor", "heartbeat.timeout_s", "policy.backoff_factor", "detectors.loss_spike.z",
            "checkpoints.prefer_tolerance", "host.disk_min_free_gb", "gpu.memory_watermark"} <= set(PATHS)
    assert len([p for p in PATHS if not p.endswith("_s")]) >= 20
    assert {("heartbeat", "learn_factor"), ("validation", "startup_factor"), ("host", "disk_ckpt_multiple")} <= set(FACTORS)
    assert ("heartbeat", "timeout_s") in POSITIVE_DURATIONS and ("shutdown", "grace_s") not in POSITIVE_DURATIONS


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_every_float_key_refuses_a_non_finite_value_naming_the_key(value: float) -> None:
    said = refusals([k for k, _ in KEYS], value)
    for path in PATHS:
        assert path in said, f"{path} accepted {value}"
        assert f"got {value!r}" in said[path] and "expected" in said[path], said[path]
    assert said["heartbeat.learn_factor"] == f"expected a finite number from 1 up to {MAX_FACTOR:g}, got {value!r}"


def test_an_integer_past_any_float_is_refused_not_a_crash() -> None:
    said = refusals([k for k, _ in KEYS], 10**400)
    assert set(PATHS) <= set(said), set(PATHS) - set(said)


def test_every_factor_has_a_ceiling_and_says_its_range() -> None:
    said = refusals(FACTORS, 10 * MAX_FACTOR)
    assert set(said) == {".".join(k) for k in FACTORS if k != ("checkpoints", "last_good_headroom_factor")}
    assert said["heartbeat.learn_factor"] == "expected number <= 1000 and >= 1, got 10000.0"
    assert refusals([("heartbeat", "learn_factor")], 0.5) == {
        "heartbeat.learn_factor": "expected number >= 1 and <= 1000, got 0.5"}
    cfg = config_from_table(table_with([("heartbeat", "learn_factor"), ("policy", "backoff_factor")], MAX_FACTOR), "t")
    assert cfg.heartbeat.learn_factor == MAX_FACTOR and cfg.policy.backoff_factor == MAX_FACTOR
    # Its own ceiling: a headroom no disk meets stands for "keep no copy" (tests/e2e/test_saves_first_e2e.py).
    assert refusals([("checkpoints", "last_good_headroom_factor")], 1e10) == {
        "checkpoints.last_good_headroom_factor": "expected number <= 1e+09 and >= 0, got 10000000000.0"}


def test_a_positive_duration_has_a_floor() -> None:
    said = refusals(POSITIVE_DURATIONS, 1e-300)
    assert set(said) == {".".join(k) for k in POSITIVE_DURATIONS}
    assert said["heartbeat.timeout_s"] == ("expected a number of seconds from 0.01 up to 31622400 (366 days), "
                                           "got 1e-300")
    cfg = config_from_table(table_with(POSITIVE_DURATIONS, MIN_DURATION_S), "t")
    assert cfg.heartbeat.timeout_s == MIN_DURATION_S and cfg.heartbeat.check_interval_s == MIN_DURATION_S
    # A non-negative duration's 0 stays "none" (no backoff, no grace) and is not caught by the floor.
    assert config_from_table(table_with([("policy", "backoff_initial_s")], 0.0), "t").policy.backoff_initial_s == 0.0


def test_check_config_refuses_the_reported_values(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[job]\ncommand = ["x"]\n[heartbeat]\nlearn_factor = inf\ntimeout_s = 1e-300\n'
                 "[checkpoints]\nprefer_tolerance = nan\n")
    r = subprocess.run([sys.executable, "-m", "supervisor", "check-config", str(p)], cwd=str(ROOT),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "heartbeat.learn_factor: expected a finite number from 1 up to 1000, got inf" in r.stderr
    assert "heartbeat.timeout_s: expected a number of seconds from 0.01 up to 31622400" in r.stderr
    assert "checkpoints.prefer_tolerance: expected a finite number >= 0, got nan" in r.stderr


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_a_float_in_a_table_of_floats_is_finite_too(value: float) -> None:
    """A remedy's ``scale`` (a table of numbers, no field of its own): its values are floats too."""
    table = table_with([], None)
    table["job"]["command"] = ["python", "train.py", "--lr", "0.1"]
    table["on"] = {"nan": {"action": "rollback", "remedies": [{"scale": {"--lr": value}}]}}
    with pytest.raises(ConfigError) as ei:
        config_from_table(table, "t")
    assert [str(p) for p in ei.value.problems] == [f"on.nan.remedies[0].scale.--lr: expected a finite number, got {value!r}"]
    table["on"]["nan"]["remedies"] = [{"scale": {"--lr": 0.5}}]
    assert config_from_table(table, "t").on["nan"].remedies[0].scale["--lr"] == 0.5
