"""A reload that changes ``[state] dir`` (supervisor/daemon/reload.py): the rest of the new config
is taken, the state dir stays the running one, and the daemon says so."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.config.model import ConfigSource, load_config
from supervisor.daemon.reload import reload_config


def test_a_reload_keeps_the_running_state_dir_and_takes_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "sup.toml"
    path.write_text(f'[job]\ncommand = ["python", "train.py"]\n[state]\ndir = "{tmp_path / "sd"}"\n'
                    "[policy]\nmax_restarts = 3\n")
    current = load_config(path)
    path.write_text(f'[job]\ncommand = ["python", "train.py"]\n[state]\ndir = "{tmp_path / "elsewhere"}"\n'
                    "[policy]\nmax_restarts = 7\n")
    said: list[tuple[str, str, str, dict[str, Any]]] = []
    new, reply = reload_config(current, ConfigSource.of_file(path), current.state_dir().resolve(),
                               lambda ev, lvl, msg, **data: said.append((ev, lvl, msg, data)))
    assert new is not None and new.state_dir() == current.state_dir() and new.policy.max_restarts == 7
    assert [s[0] for s in said] == ["reload_partial", "config_reloaded"], said
    assert "state.dir cannot change while running" in said[0][2]
    assert "state.dir" not in said[1][3]["changed"] and "policy.max_restarts" in said[1][3]["changed"]
