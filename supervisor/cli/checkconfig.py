"""``transformer-supervisor check-config PATH [--for run|wrap] [-- CMD ARGS...]``.

``--for wrap`` checks a file as ``wrap --config`` reads it: the command comes from wrap's own
arguments. What depends on that command cannot be known from the file alone: a ``scale`` remedy
multiplies a flag's value in the command, and ``wrap`` refuses to start when its command has no
such flag with a number. So each such remedy is a problem here, naming the remedy and why,
unless the command is given after ``--``: then it is checked exactly as ``wrap`` will.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .parser import EXIT_OK, EXIT_USAGE


def unchecked_scales(cfg: Any) -> list[Any]:
    """A problem for each scale remedy of a file without a command (``--for wrap``, no ``-- CMD``)."""
    from ..config.schema import Problem

    if cfg.job.command:
        return []  # checked against the file's own command
    return [Problem(f"on.{key}.remedies[{n}].scale.{flag}",
                    f"a scale remedy multiplies {flag}'s value in the launch command, which wrap takes from "
                    f"its own arguments: it cannot be checked without them, and wrap refuses to start unless the "
                    f"command has {flag} with a number; give the command to check it: "
                    f"check-config --for wrap PATH -- CMD ARGS...")
            for key, oc in cfg.on.items() for n, r in enumerate(oc.remedies) for flag in r.scale]


def cmd_check_config(args: argparse.Namespace) -> int:
    from ..config.model import ConfigError, config_from_table, load_config, read_toml

    # --for wrap: the command comes from wrap's flags, so a file without [job] command is whole.
    for_wrap = getattr(args, "for_verb", "run") == "wrap"
    command = list(getattr(args, "command", None) or [])
    if command and not for_wrap:
        print("transformer-supervisor: check-config PATH -- CMD: a command is given to wrap, not read from the "
              "file by run; check it with --for wrap", file=sys.stderr)
        return EXIT_USAGE
    problems: list[Any] = []

    def load() -> Any:
        try:
            if command:  # as wrap --config PATH -- CMD builds it
                table = {k: (dict(v) if isinstance(v, dict) else v) for k, v in read_toml(Path(args.path)).items()}
                table.setdefault("job", {})["command"] = command
                return config_from_table(table, args.path)
            cfg = load_config(args.path, need_command=not for_wrap)
        except ConfigError as e:
            problems.extend(e.problems)
            raise
        unchecked = unchecked_scales(cfg) if for_wrap else []
        if unchecked:
            raise ConfigError(args.path, unchecked)
        return cfg

    try:
        cfg = load()
    except ConfigError as e:  # every problem with its key path, as every verb prints them
        print(f"{e.source}: {len(e.problems)} problem(s):", file=sys.stderr)
        for p in e.problems:
            print(f"  - {p}", file=sys.stderr)
        if not for_wrap and any(p.path == "job.command" for p in problems):
            print("  (a file for `wrap --config`, which takes the command from its flags: "
                  "check-config --for wrap PATH)", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.path}: OK for {'wrap --config' if for_wrap else 'run --config'} "
          f"(job {cfg.job.name!r}, state dir {cfg.state_dir()})"
          + (" with the command given" if command else ""))
    return EXIT_OK
