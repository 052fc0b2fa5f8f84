"""The config as a client verb reads it (issue 34 D9): ``status``, ``stop`` and ``logs`` need only
where the daemon keeps its state (``[job] name``, ``[state] dir``) and the job log's path, so one bad
value elsewhere (``[shutdown] grace_s = inf``) must not keep an operator from stopping the daemon.
A config that does not load is read again for those keys alone, with a warning naming each
problem; ``reload`` is refused instead (the daemon would refuse that file), as ``check-config`` says."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from ..textescape import escaped

__all__ = ["lenient_config", "reload_refused"]


def lenient_config(path: str, quiet: bool = False) -> Any:
    """``path`` loaded (no command needed); if it has problems, a Config with only its job name,
    state dir and job log file, each problem said on stderr. A file that cannot be read at all
    raises its ConfigError (the verb says it and exits 2)."""
    from ..config.model import Config, ConfigError, load_config, read_toml

    try:
        return load_config(path, need_command=False)
    except ConfigError as e:
        table = read_toml(Path(path))  # unreadable or not TOML: nothing to fall back on
        problems = e.problems
    job: dict[str, Any] = table["job"] if isinstance(table.get("job"), dict) else {}
    state: dict[str, Any] = table["state"] if isinstance(table.get("state"), dict) else {}
    base = Config()
    keep: dict[str, Any] = {}
    for key in ("name", "log_file", "workdir"):
        if isinstance(job.get(key), str):
            keep[key] = job[key]
    cfg = dataclasses.replace(base, job=dataclasses.replace(base.job, **keep))
    if isinstance(state.get("dir"), str):
        cfg = dataclasses.replace(cfg, state=dataclasses.replace(base.state, dir=state["dir"]))
    if quiet:  # said once per verb: the state dir's reader said it
        return cfg
    print(f"transformer-supervisor: warning: {escaped(path)} has {len(problems)} problem(s); this verb reads only "
          f"its state dir ({escaped(str(cfg.state_dir()))}) and goes on; start and reload refuse the file "
          "until they are fixed (check-config lists them):", file=sys.stderr)
    for p in problems:
        print(f"  - {escaped(str(p))}", file=sys.stderr)
    return cfg


def reload_refused(args: Any) -> bool:
    """``reload --config C``: whether C is refused here, each problem said with its key (the daemon
    would refuse the file it reads again; nothing is sent)."""
    from ..config.model import ConfigError, load_config

    if not getattr(args, "config", None):
        return False
    try:
        load_config(args.config, need_command=False)
        return False
    except ConfigError as e:
        print(f"{escaped(e.source)}: {len(e.problems)} problem(s):", file=sys.stderr)
        for p in e.problems:
            print(f"  - {escaped(str(p))}", file=sys.stderr)
    print("transformer-supervisor: reload refused: fix the config first (nothing was sent; the daemon "
          "keeps running with its config as it is)", file=sys.stderr)
    return True
