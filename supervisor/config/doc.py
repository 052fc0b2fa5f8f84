"""Writes ``config.example.toml`` from the config schema, so the example documents every key
with its default and help text and can never drift from the code (a test compares them).

    python -m supervisor.config.doc > config.example.toml
"""

from __future__ import annotations

import enum
import json
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Mapping

from .model import Config
from .schema import _unwrap_optional
from ..core.causes import Action, config_doc_lines

HEADER = """\
# transformer-supervisor configuration: every key, with its default and what it does.
# Generated from the code by `python -m supervisor.config.doc`. Every active line is the built-in
# default (this file as shipped configures nothing: it parses to the defaults); lines commented out
# are keys with no default or examples ("# example:") to adapt. `run` needs at least [job] command;
# `wrap` takes the command from its flags. Validate a file with
#   transformer-supervisor check-config PATH            (as `run --config` reads it)
#   transformer-supervisor check-config --for wrap PATH (as `wrap --config` reads it)
"""

EXAMPLES: Mapping[str, str] = {
    "job.command": '["python", "train.py", "--config", "cfg.yaml"]',
    "job.resume_args": '["--resume", "{checkpoint}"]',
    "checkpoints.dir": '"checkpoints"',
}

def on_example() -> str:
    """The ``[on.<cause>]`` section: every cause with its default action, from the registry."""
    lines = [
        "# Per-cause action and remedy ladder, [on.<cause>]. Actions: " + ", ".join(a.value for a in Action) + ".",
        "# Each repeat of the same cause (no healthy run in between) applies one more remedy",
        "# (cumulative); a repeat after the last one gives up. The causes and their default actions:",
        *config_doc_lines(),
        "# example: roll a NaN back and lower the learning rate on each repeat",
        "# [on.nan]",
        '# action = "rollback"',
        '# remedies = [{ env = { LR_SCALE = "0.5" } }, { args = ["--lr=1e-4"] }, { skip_batches = 500 }]',
    ]
    return "\n".join(lines) + "\n"


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        return toml_value(v.value)
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    if is_dataclass(v):
        return toml_value({f.name: getattr(v, f.name) for f in fields(v)})
    raise TypeError(f"cannot render {v!r}")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _section(cls: type, path: str, out: list[str]) -> None:
    hints = typing.get_type_hints(cls)
    subs = []
    out.append(f"[{path}]")
    for f in fields(cls):
        tp, _ = _unwrap_optional(hints[f.name])
        key = f"{path}.{f.name}"
        if is_dataclass(tp) and f.default_factory is not MISSING:
            subs.append((tp, key, f.metadata.get("help", "")))
            continue
        help_ = f.metadata.get("help", "")
        if help_:
            out.append(f"# {help_}")
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else None)
        if key in EXAMPLES:
            # Commented out: an example is not a default, and this file is installed as the
            # production config (install-units), where an active example would run.
            if default not in (None, (), [], {}):
                out.append(f"{f.name} = {toml_value(default)}")
            out.append(f"# example: {f.name} = {EXAMPLES[key]}")
        elif default is None:
            out.append(f"# {f.name} =")
        else:
            out.append(f"{f.name} = {toml_value(default)}")
    out.append("")
    for tp, key, help_ in subs:
        if help_:
            out.append(f"# {help_}")
        _section(tp, key, out)  # type: ignore[arg-type]


def render() -> str:
    out = [HEADER]
    for f in fields(Config):
        if f.name == "on":
            out.append(on_example())
            continue
        cls = typing.get_type_hints(Config)[f.name]
        _section(cls, f.name, out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
