"""[metrics] and [systemd]: the TOML fragments document every key with its default."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from supervisor.configschema import build, iter_keys
from supervisor.ops.config import MetricsConfig, SystemdConfig

DOCS = Path(__file__).resolve().parent.parent / "docs" / "config"


@pytest.mark.parametrize("name, cls", [("metrics", MetricsConfig), ("systemd", SystemdConfig)])
def test_fragment_matches_defaults(name: str, cls: type) -> None:
    text = (DOCS / f"{name}.toml").read_text()
    table = tomllib.loads(text)[name]
    problems: list = []
    assert build(cls, table, name, problems) == cls() and problems == []
    documented = set(re.findall(r"^#? ?(\w+) = ", text, re.M))
    assert documented == {path for path, *_ in iter_keys(cls)}
    for line in text.splitlines()[1:]:
        assert "  # " in line, f"key without a one-line comment: {line}"
