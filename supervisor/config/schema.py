"""Typed TOML -> frozen dataclass conversion that collects every problem.

Each concern declares its config section as a frozen dataclass in its own module; every field
has a default and ``metadata=meta(help, ...)`` (:mod:`supervisor.fieldmeta`). :func:`build` walks the dataclass fields, so a new
key needs no code here. Problems are collected, never raised one at a time, each naming its key
path and what was expected: ``policy.max_restarts: expected a non-negative integer, got "ten"``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def _show(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _added_member(tp: type[enum.Enum], value: Any) -> bool:
    """``value`` names a member added at run time through the enum's ``_missing_`` (an action
    registered with ``supervisor.core.causes.new_action``): iterating the enum does not list it."""
    try:
        tp(value)
    except (ValueError, TypeError):
        return False
    return True


def _describe(tp: Any) -> str:
    tp, optional = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if tp is bool:
        d = "a boolean"
    elif tp is int:
        d = "an integer"
    elif tp is float:
        d = "a number"
    elif tp is str:
        d = "a string"
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        d = "one of " + ", ".join(repr(m.value) for m in tp)
    elif origin is tuple:
        d = "an array of " + _describe(typing.get_args(tp)[0]).removeprefix("a ").removeprefix("an ") + "s"
    elif origin in (dict, Mapping, typing.Mapping):
        d = "a table of " + _describe(typing.get_args(tp)[1]).removeprefix("a ").removeprefix("an ") + "s"
    elif is_dataclass(tp):
        d = "a table"
    else:
        d = str(tp)
    return d + (" (or omitted)" if optional else "")


def _check_range(value: float, md: Mapping[str, Any], path: str, problems: list[Problem], what: str) -> bool:
    lo, hi = md.get("min"), md.get("max")
    excl = md.get("min_exclusive", False)
    if lo is not None and (value < lo or (excl and value == lo)):
        if lo == 0 and not excl and hi is None:
            desc = f"a non-negative {what}"
        elif lo == 0 and excl and hi is None:
            desc = f"a positive {what}"
        else:
            desc = f"{what} {'>' if excl else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
        problems.append(Problem(path, f"expected {desc}, got {_show(value)}"))
        return False
    if hi is not None and value > hi:
        desc = f"{what} <= {hi:g}" + (f" and >= {lo:g}" if lo is not None else "")
        problems.append(Problem(path, f"expected {desc}, got {_show(value)}"))
        return False
    return True


# The longest duration any `*_s` key takes. Past it a setting is a mistake, not a plan (`grace_s =
# inf` left a job that ignores SIGTERM running for ever), and a wait that long cannot even be
# handed to a lock or a thread (CPython refuses timeouts past about 292 years: OverflowError).
MAX_DURATION_S = 366 * 86400.0
# The shortest positive duration: a timeout or interval that must be above 0 and is set below this
# (`heartbeat.timeout_s = 1e-300`) calls a healthy job hung at once or spins a loop, never a plan.
MIN_DURATION_S = 0.01
# The largest factor (`*_factor`, `*_multiple`) a key without its own maximum takes: past it a
# multiplier is a typo, and `learn_factor = inf` made a learned step timeout endless.
MAX_FACTOR = 1000.0


# The largest integer a key without its own maximum takes, by what the number counts (its name's
# end, as `*_s` and `*_factor` above): past it the value is a typo, not a plan
# (`max_restarts = 99999999999999999999` passed, and is past any C integer), and where the number
# sizes what is held or walked (evidence kept per event, records in a baseline, directories per
# pass) a huge one costs memory or CPU before it does anything useful. Generous on purpose.
MAX_COUNT = 1_000_000_000
INT_CEILINGS: tuple[tuple[tuple[str, ...], int, str], ...] = (
    (("_bytes",), 2**50, "1 PiB"),
    (("_chars",), 1_000_000, "characters held per line or event"),
    ((".window", "_window"), 1_000_000, "records held in memory"),
    (("_dirs",), 1_000_000, "directories walked per pass"),
)


def _int_ceiling(path: str) -> tuple[int, str]:
    for ends, ceiling, why in INT_CEILINGS:
        if path.endswith(ends):
            return ceiling, why
    return MAX_COUNT, "a count past it is a typo, not a plan"


def _int_ok(value: int, md: Mapping[str, Any], path: str, problems: list[Problem]) -> bool:
    """An integer key without its own maximum (and not a `*_s` duration): at most its ceiling."""
    if md.get("max") is not None or path.endswith("_s"):
        return True
    ceiling, why = _int_ceiling(path)
    if value <= ceiling:
        return True
    lo = md.get("min")
    frm = "" if lo is None else f"{'above' if md.get('min_exclusive') else 'from'} {lo:g} "
    shown = _show(value) if len(str(value)) <= 40 else f"a number of {len(str(value))} digits"
    problems.append(Problem(path, f"expected an integer {frm}up to {ceiling} ({why}), got {shown} "
                            "(omit the key for its default)"))
    return False


def _duration_ok(value: float, md: Mapping[str, Any], path: str, problems: list[Problem]) -> bool:
    """A `*_s` key: a finite number of seconds within its range (its own max, else a year)."""
    hi = md.get("max")
    hi = MAX_DURATION_S if hi is None else min(float(hi), MAX_DURATION_S)
    lo = md.get("min")
    positive = md.get("min_exclusive") and lo is not None and lo <= 0
    if positive and 0 < value < MIN_DURATION_S:
        problems.append(Problem(path, f"expected a number of seconds from {MIN_DURATION_S:g} up to {hi:.0f}"
                                + (" (366 days)" if hi == MAX_DURATION_S else "") + f", got {_show(value)}"))
        return False
    if value == value and value <= hi:  # NaN fails the first test; -inf is left to the key's own min
        return True
    frm = "" if lo is None else f"{'above' if md.get('min_exclusive') else 'from'} {lo:g} "
    problems.append(Problem(path, f"expected a number of seconds {frm}up to {hi:.0f}"
                            + (" (366 days)" if hi == MAX_DURATION_S else "") + f", got {_show(value)}"
                            + (": an endless wait is never carried out (omit the key for its default)"
                               if value == float("inf") else "")))
    return False


def _as_float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past any float (TOML's integers are unbounded)
        return math.inf if value > 0 else -math.inf


def _is_factor(path: str) -> bool:
    return path.endswith(("_factor", "_multiple"))


def _range_text(md: Mapping[str, Any]) -> str:
    """A key's range for a message about a value outside every range: " from 1 up to 1000"."""
    lo, hi = md.get("min"), md.get("max")
    if lo is None:
        return "" if hi is None else f" <= {hi:g}"
    if hi is None:
        return f" {'>' if md.get('min_exclusive') else '>='} {lo:g}"
    return f" {'above' if md.get('min_exclusive') else 'from'} {lo:g} up to {hi:g}"


def _convert(tp: Any, value: Any, path: str, md: Mapping[str, Any], problems: list[Problem]) -> Any:
    """Convert one TOML value to ``tp``; on a problem, record it and return MISSING."""
    inner, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        problems.append(Problem(path, f"expected {_describe(tp)}, got nothing"))
        return MISSING
    tp = inner
    origin = typing.get_origin(tp)
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(Problem(path, f"expected a boolean (true or false), got {_show(value)}"))
            return MISSING
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            lo = md.get("min")
            desc = "a non-negative integer" if lo == 0 else ("a positive integer" if lo == 1 else "an integer")
            problems.append(Problem(path, f"expected {desc}, got {_show(value)}"))
            return MISSING
        if path.endswith("_s") and not _duration_ok(_as_float(value), md, path, problems):
            return MISSING
        if not _int_ok(value, md, path, problems):
            return MISSING
        return value if _check_range(value, md, path, problems, "integer") else MISSING
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            lo = md.get("min")
            desc = "a non-negative number" if lo == 0 and not md.get("min_exclusive") else (
                "a positive number" if lo == 0 else "a number")
            problems.append(Problem(path, f"expected {desc}, got {_show(value)}"))
            return MISSING
        value = _as_float(value)
        if path.endswith("_s") and not _duration_ok(value, md, path, problems):
            return MISSING
        if _is_factor(path) and md.get("max") is None:
            md = {**md, "max": MAX_FACTOR}
        if not math.isfinite(value):  # inf, -inf, NaN: never a sensible setting of any key
            problems.append(Problem(path, f"expected a finite number{_range_text(md)}, got {_show(value)}"))
            return MISSING
        return value if _check_range(value, md, path, problems, "number") else MISSING
    if tp is str:
        if not isinstance(value, str):
            problems.append(Problem(path, f"expected a string, got {_show(value)}"))
            return MISSING
        choices = md.get("choices")
        if choices and value not in choices:
            hint = difflib.get_close_matches(value, choices, n=1)
            problems.append(Problem(path, f"expected one of {', '.join(choices)}, got {_show(value)}"
                                    + (f" (did you mean {hint[0]!r}?)" if hint else "")))
            return MISSING
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        valid = [m.value for m in tp]
        if value not in valid and not _added_member(tp, value):
            hint = difflib.get_close_matches(str(value), [str(v) for v in valid], n=1)
            problems.append(Problem(path, f"expected one of {', '.join(map(str, valid))}, got {_show(value)}"
                                    + (f" (did you mean {hint[0]!r}?)" if hint else "")))
            return MISSING
        return tp(value)
    if origin is tuple:
        (item_tp, *_rest) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.append(Problem(path, f"expected {_describe(tp)}, got {_show(value)}"))
            return MISSING
        out = []
        ok = True
        for i, item in enumerate(value):
            conv = _convert(item_tp, item, f"{path}[{i}]", {}, problems)
            ok = ok and conv is not MISSING
            out.append(conv)
        return tuple(out) if ok else MISSING
    if origin in (dict, Mapping, typing.Mapping) or tp is dict:
        _k, val_tp = typing.get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            problems.append(Problem(path, f"expected {_describe(tp)}, got {_show(value)}"))
            return MISSING
        out_d: dict[str, Any] = {}
        ok = True
        for k, v in value.items():
            conv = v if val_tp is Any else _convert(val_tp, v, _join(path, k), {}, problems)
            ok = ok and conv is not MISSING
            out_d[k] = conv
        return types.MappingProxyType(out_d) if ok else MISSING
    if is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(Problem(path, f"expected a table, got {_show(value)}"))
            return MISSING
        return build(typing.cast(type, tp), value, path, problems)
    problems.append(Problem(path, f"unsupported config type {tp!r} (a bug in transformer-supervisor)"))
    return MISSING


def build(cls: type, table: Mapping[str, Any], prefix: str, problems: list[Problem]) -> Any:
    """Build dataclass ``cls`` from a TOML table, appending every problem found to ``problems``.

    Returns an instance (with defaults where a value was bad, so later checks can continue) or
    MISSING when a required field has no value.
    """
    hints = typing.get_type_hints(cls)
    flds: dict[str, Field[Any]] = {f.name: f for f in fields(cls) if f.init}
    known = list(flds)
    for key in table:
        if key not in flds:
            hint = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            problems.append(Problem(_join(prefix, key), "unknown key"
                                    + (f" (did you mean {_join(prefix, hint[0])!r}?)" if hint else
                                       f" (known keys: {', '.join(known)})")))
    kwargs: dict[str, Any] = {}
    missing_required = False
    for name, f in flds.items():
        path = _join(prefix, name)
        if name in table:
            conv = _convert(hints[name], table[name], path, f.metadata, problems)
            if conv is not MISSING:
                check = f.metadata.get("check")
                msg = check(conv) if check else None
                if msg:
                    problems.append(Problem(path, msg))
                else:
                    kwargs[name] = conv
                    continue
        if f.default is MISSING and f.default_factory is MISSING:
            if name not in table:
                problems.append(Problem(path, f"required: expected {_describe(hints[name])}"))
            missing_required = True
    if missing_required:
        return MISSING
    return cls(**kwargs)


def iter_keys(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, Any, Any, str]]:
    """Yield (path, type, default, help) for every key, nested tables included (docs, tests)."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        path = _join(prefix, f.name)
        tp, _ = _unwrap_optional(hints[f.name])
        if is_dataclass(tp) and f.default_factory is not MISSING:
            yield from iter_keys(tp, path)  # type: ignore[arg-type]
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING)
        yield path, hints[f.name], default, f.metadata.get("help", "")


def diff(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between two config objects (for SIGHUP reload logs)."""
    out: dict[str, tuple[Any, Any]] = {}
    if is_dataclass(old) and is_dataclass(new) and type(old) is type(new):
        for f in fields(old):
            out.update(diff(getattr(old, f.name), getattr(new, f.name), _join(prefix, f.name)))
    elif isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in sorted(set(old) | set(new)):
            out.update(diff(old.get(k), new.get(k), _join(prefix, k)))
    elif old != new:
        out[prefix] = (old, new)
    return out
