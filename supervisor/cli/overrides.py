"""``wrap``'s flags -> the config table: the named flags, ``--set KEY=VALUE``, ``--env KEY=VALUE``.

The named flags (``--max-restarts``, ``--grace``, ...) are aliases of config keys and go through
the same typed assignment as ``--set``.

A value arrives as text; the schema says what it must become. The dotted path is walked through
the config dataclasses (``heartbeat.timeout_s`` -> ``HeartbeatConfig.timeout_s: float | None``,
``on.nan.action`` through the ``on`` mapping to ``OnCause.action``), and the text is turned into
the TOML value that key takes: a number, a boolean, a string, an array (``a,b`` or a TOML array
``["a", "b"]``), a table (a TOML inline table). Nothing is validated here: the value lands in the
same table a config file would give, and :func:`~supervisor.config.model.config_from_table` names
every problem (unknown key with did-you-mean, out of range, bad choice) with its key path, as for
a file. An unknown path keeps the text as TOML would read it, so the error names the real key.
"""

from __future__ import annotations

import argparse
import enum
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from ..config.schema import _unwrap_optional


def split_assignment(text: str, flag: str) -> tuple[str, str] | str:
    """``"a.b=1"`` -> ``("a.b", "1")``; a problem (naming ``flag``) when there is no ``=`` or key."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        return f"{flag} {text!r}: expected KEY=VALUE, e.g. {flag} " + (
            "heartbeat.timeout_s=600" if flag == "--set" else "NCCL_DEBUG=WARN")
    return key, value


def _field_type(root: type, path: list[str]) -> Any | None:
    """The declared type of the key at ``path`` under dataclass ``root``, or None if unknown."""
    tp: Any = root
    for part in path:
        tp, _ = _unwrap_optional(tp)
        if is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            names = {f.name for f in fields(tp)}
            if part not in names:
                return None
            tp = hints[part]
        elif typing.get_origin(tp) in (dict, Mapping, typing.Mapping):
            args = typing.get_args(tp)
            tp = args[1] if len(args) == 2 else Any
        else:
            return None
    return tp


def _toml_value(text: str) -> Any:
    """``text`` as a TOML value (``1``, ``true``, ``["a"]``, ``{a = 1}``); the text itself when it
    is not one (a bare word is a string)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def typed_value(root: type, path: list[str], text: str) -> Any:
    """``text`` converted to what the key at ``path`` takes (left as text where it cannot be:
    the config's validation then names the key and what it expected)."""
    tp = _field_type(root, path)
    if tp is None:
        return _toml_value(text)
    inner, optional = _unwrap_optional(tp)
    origin = typing.get_origin(inner)
    if inner is str or (isinstance(inner, type) and issubclass(inner, enum.Enum)):
        return text
    if inner is bool:
        low = text.strip().lower()
        return {"true": True, "1": True, "yes": True, "on": True,
                "false": False, "0": False, "no": False, "off": False}.get(low, text)
    if inner in (int, float):
        value = _toml_value(text.strip().replace("_", ""))
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else text
    if origin is tuple:
        stripped = text.strip()
        if stripped.startswith("["):
            return _toml_value(stripped)
        (item_tp, *_rest) = typing.get_args(inner)
        items = [s.strip() for s in stripped.split(",")] if stripped else []
        if item_tp is str:
            return items
        return [_toml_value(s) for s in items]
    if origin in (dict, Mapping, typing.Mapping) or is_dataclass(inner):
        return _toml_value(text.strip())
    return _toml_value(text)


def apply_set(table: dict[str, Any], root: type, key: str, text: str) -> None:
    """Put ``key`` (dotted) = ``text``, typed by the schema, into the config ``table``."""
    path = [p.strip() for p in key.split(".")]
    node = table
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
        else:
            child = dict(child)  # never write into a table another caller holds
        node[part] = child
        node = child
    node[path[-1]] = typed_value(root, path, text)


# wrap's flags that stand for one config key each (argparse dest -> dotted key), applied in order.
FLAG_KEYS: tuple[tuple[str, str], ...] = (
    ("name", "job.name"), ("log_file", "job.log_file"), ("state_dir", "state.dir"),
    ("checkpoint_dir", "checkpoints.dir"), ("max_restarts", "policy.max_restarts"),
    ("backoff", "policy.backoff_initial_s"), ("heartbeat_timeout", "heartbeat.timeout_s"),
    ("shutdown", "shutdown.mode"), ("grace", "shutdown.grace_s"), ("workdir", "job.workdir"),
)
# Path flags: an empty one is not given (the others are put as written, and validation names them).
_PATH_FLAGS = frozenset({"name", "log_file", "state_dir", "checkpoint_dir", "workdir"})


def _listed(v: Any) -> list[Any]:
    """A config list the flags extend (a value of another type is kept whole: validation names it)."""
    if v is None:
        return []
    return list(v) if isinstance(v, list) else [v]


def wrap_table(args: argparse.Namespace) -> dict[str, Any]:
    """The config table of ``wrap``: ``--config``'s file, with every flag over it (``--set`` last)."""
    from ..config.model import Config, read_toml

    table: dict[str, Any] = read_toml(Path(args.config)) if args.config else {}
    table = {k: (dict(v) if isinstance(v, dict) else v) for k, v in table.items()}
    job = table.setdefault("job", {})
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if cmd:
        job["command"] = [" ".join(cmd)] if args.shell else cmd
    if args.shell:
        job["shell"] = True
    if args.resume_arg:
        job["resume_args"] = list(args.resume_arg)
    for dest, key in FLAG_KEYS:
        value = getattr(args, dest)
        if value is not None and (value or dest not in _PATH_FLAGS):
            apply_set(table, Config, key, value)
    job = table["job"]
    if args.metric_regex:
        # Added to the config's regexes, not replacing them: both describe lines of the same job.
        det = dict(table.get("detectors") or {})
        parsers = dict(det.get("parsers") or {})
        parsers["regexes"] = _listed(parsers.get("regexes")) + list(args.metric_regex)
        det["parsers"] = parsers
        table["detectors"] = det
    if args.watch_file:
        job["watch_files"] = _listed(job.get("watch_files")) + list(args.watch_file)
    if args.env:
        env = dict(job["env"]) if isinstance(job.get("env"), dict) else {}
        for item in args.env:
            kv = split_assignment(item, "--env")
            if isinstance(kv, tuple):  # a malformed one is named by wrap_flag_problems
                env[kv[0]] = kv[1]
        job["env"] = env
    # Last, so --set can refine what a flag above wrote (--set job.env.X=1 beside --env).
    for item in args.set_keys or ():
        kv = split_assignment(item, "--set")
        if isinstance(kv, tuple):
            apply_set(table, Config, kv[0], kv[1])
    if not job:
        del table["job"]  # no [job] at all, as a file without one gives
    return table


def wrap_flag_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the flags that take a pattern or an assignment, named by the flag (exit 2)."""
    from ..watch.config import check_metric_regex

    problems = []
    for rx in args.metric_regex or ():
        why = check_metric_regex(rx)
        if why is not None:
            problems.append(f"--metric-regex '{rx}': {why}")
    for flag, items in (("--env", args.env), ("--set", args.set_keys)):
        for item in items or ():
            kv = split_assignment(item, flag)
            if isinstance(kv, str):
                problems.append(kv)
    for glob in args.watch_file or ():
        if not glob.strip():
            problems.append("--watch-file: an empty pattern matches no file; give a path or a glob such as 'logs/*.log'")
    return problems
