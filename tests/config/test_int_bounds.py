"""Every integer in the config has a ceiling (issue 34, R7): `[policy] max_restarts =
99999999999999999999` and `[detectors] evidence_chars = 100000000` passed `check-config` and
`reload`. A key without its own maximum takes one by what it counts (supervisor.config.schema's
INT_CEILINGS: bytes, characters, records held, directories walked; any other count MAX_COUNT),
refused naming the key path. The walk covers every int key of the schema, so a key added later is
covered without a line here."""
from __future__ import annotations

import dataclasses
import json
import signal
import sys
import typing
from pathlib import Path
from typing import Any, Iterator

import pytest

from supervisor.config.model import Config, ConfigError, config_from_table
from supervisor.config.schema import MAX_COUNT, _int_ceiling, _unwrap_optional
from tests.config.test_duration_bounds import cli, table_with
from tests.util import wait_for

HUGE = 99999999999999999999


def int_keys(cls: type = Config) -> Iterator[tuple[tuple[str, ...], dict[str, Any], Any]]:
    """Every int key (optional ones included) of the schema's tables: path, metadata, default."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, _ = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from (((f.name, *rest), md, d) for rest, md, d in int_keys(typing.cast(type, tp)))
        elif tp is int:
            yield (f.name,), dict(f.metadata), f.default


KEYS = list(int_keys())
PATHS = [".".join(k) for k, _, _ in KEYS]


def refusals(keys: list[tuple[str, ...]], value: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as ei:
        config_from_table(table_with(keys, value), "t")
    return {p.path: p.message for p in ei.value.problems}


def test_every_int_key_refuses_a_number_past_any_machine_integer_naming_the_key() -> None:
    assert {"policy.max_restarts", "detectors.evidence_chars", "job.log_max_bytes"} <= set(PATHS)
    said = refusals([k for k, _, _ in KEYS], HUGE)
    assert set(PATHS) <= set(said), set(PATHS) - set(said)
    assert said["policy.max_restarts"] == (f"expected an integer from 0 up to {MAX_COUNT} (a count past it is a "
                                           f"typo, not a plan), got {HUGE} (omit the key for its default)")


def test_every_default_is_within_its_ceiling_and_the_ceiling_itself_is_accepted() -> None:
    unbounded = [(k, md) for k, md, _ in KEYS if md.get("max") is None and not k[-1].endswith("_s")]
    for k, md, default in KEYS:
        if isinstance(default, int) and md.get("max") is None and not k[-1].endswith("_s"):
            assert default <= _int_ceiling(".".join(k))[0], k
    table = table_with([], None)
    for k, _ in unbounded:
        table.setdefault(k[0], {})
        node = table[k[0]]
        for part in k[1:-1]:
            node = node.setdefault(part, {})
        node[k[-1]] = _int_ceiling(".".join(k))[0]
    table.setdefault("cluster", {}).update(endpoints=["http://etcd:2379"], insecure=True)
    cfg = config_from_table(table, "t")  # every ceiling is a value the key takes (cross-checks aside)
    assert cfg.policy.max_restarts == MAX_COUNT and cfg.detectors.evidence_chars == 1_000_000


def test_the_memory_sized_keys_have_tighter_ceilings() -> None:
    said = refusals([("detectors", "evidence_chars"), ("detectors", "loss_spike", "window"),
                     ("detectors", "parsers", "max_line_chars"), ("detectors", "metric_files_max_dirs")], 100_000_000)
    assert said["detectors.evidence_chars"].startswith(
        "expected an integer from 40 up to 1000000 (characters held per line or event), got 100000000")
    assert "records held in memory" in said["detectors.loss_spike.window"]
    assert set(said) == {"detectors.evidence_chars", "detectors.loss_spike.window",
                         "detectors.parsers.max_line_chars", "detectors.metric_files_max_dirs"}


def test_check_config_refuses_the_reported_values(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(f'[job]\ncommand = ["x"]\n[policy]\nmax_restarts = {HUGE}\n[detectors]\nevidence_chars = 100000000\n')
    r = cli("check-config", str(p))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"policy.max_restarts: expected an integer from 0 up to {MAX_COUNT}" in r.stderr
    assert "detectors.evidence_chars: expected an integer from 40 up to 1000000" in r.stderr


def test_reload_refuses_them_and_keeps_the_running_config(daemons, tmp_path: Path) -> None:
    sd, ready, cfgp = tmp_path / "sd", tmp_path / "ready", tmp_path / "c.toml"
    job = [sys.executable, "-c", "import sys,time; open(sys.argv[1],'w').write('x'); time.sleep(600)", str(ready)]
    head = f'[job]\ncommand = {json.dumps(job)}\n[state]\ndir = "{sd}"\n'
    cfgp.write_text(head)
    d = daemons(["run", "--config", str(cfgp)])
    wait_for(ready.exists, 30, what="job ready")
    cfgp.write_text(head + f"[policy]\nmax_restarts = {HUGE}\n[detectors]\nevidence_chars = 100000000\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "reload_rejected" in d.stderr() and "policy.max_restarts" in d.stderr(), 20,
             what="reload_rejected naming policy.max_restarts")
    assert "detectors.evidence_chars" in d.stderr() and "config_reloaded" not in d.stderr()
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143
