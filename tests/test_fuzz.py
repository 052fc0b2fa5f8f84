"""Property-based fuzz suite (hypothesis, issue 24 build 7): the log parsers, the config loader and
the control socket's request parser take any input without an exception escaping: a record or
None, a Config or a ConfigError, a request or a ControlError. Seeded from the run with a fixed
example budget (tests/helpers/fuzzseed.py): each CI run tries new inputs in a few seconds, and a
failure prints its seed; work per input is bounded by the linearity test
(tests/watch/test_parsers_linear.py), so no per-example deadline is set here."""
from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from supervisor.config.model import ConfigError, load_config
from supervisor.ops.control import ControlError, parse_request
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.parsers import MetricParser

from .helpers.fuzzseed import fuzz
from .watch.crafted import CRAFTED, parse_all

FUZZ = fuzz(100, HealthCheck.too_slow, HealthCheck.function_scoped_fixture)

SEEDS = [b(80) for builds in CRAFTED.values() for b in builds] + [
    "iter 1: loss nan, time 1.0ms", "{'loss': 'nan', 'grad_norm': 'inf'}", '{"step": 1, "loss": 1e400}',
    " iteration 1/ 10 | lm loss: 7.3E+00 |", "step: 1  loss: 7.9  tps: 1,234", "Epoch 0: 1%|x| 1/2 [a, loss=nan.0]"]
FRAGMENTS = st.sampled_from(["step", "loss", ":", "=", " ", "|", ",", "{", "}", "'", '"', "[", "]", "%|", "1", "nan",
                             "-", ".", "e", "9" * 40, "\x1b[A", "\r", "[rank1]:", "iteration", "/", "(", ")"])
LINES = st.one_of(st.text(max_size=300), st.sampled_from(SEEDS),
                  st.lists(FRAGMENTS, max_size=60).map("".join),
                  st.tuples(st.sampled_from(SEEDS), st.text(max_size=40)).map("".join))


@FUZZ
@given(LINES)
def test_parsers_take_any_line(line: str) -> None:
    parse_all(MetricParser(), line)
    parse_all(MetricParser(max_line_chars=10**6), line)


@FUZZ
@given(st.lists(LINES, max_size=8))
def test_the_log_watcher_takes_any_batch(lines: list[str]) -> None:
    w = LogWatcher(DetectorsConfig(), lambda d: None, lambda r: None, clock=lambda: 0.0)
    w.feed("stdout", lines)  # raises nothing: a bad line is skipped alone


TOML_BITS = st.sampled_from(["[job]\n", "command = ['python', 'train.py']\n", "[detectors]\n", "a = ", "[[x]]\n",
                             "= 1\n", "'", '"', "[", "]", "{", "}", "\xff", "nan", "inf", "1e999", "\n", "\\",
                             "[remedies.nan]\n", "scale = { flag = '--lr', factor = 0.5 }\n", "9" * 30])


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.lists(TOML_BITS, max_size=30).map(lambda p: "".join(p).encode("utf-8", "surrogateescape"))))
def test_config_loader_takes_any_file(tmp_path_factory: object, data: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("cfg")) / "c.toml"  # type: ignore[attr-defined]
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as e:
        assert str(e)


@FUZZ
@given(st.one_of(st.binary(max_size=200),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                              max_leaves=20).map(lambda v: __import__("json").dumps(v).encode()),
                 st.fixed_dictionaries({"verb": st.sampled_from(["status", "stop", "restart", "x"]),
                                        "args": st.dictionaries(st.sampled_from(["from", "force", "reason", "n"]),
                                                                st.integers() | st.text() | st.booleans(),
                                                                max_size=3)}).map(lambda v: __import__("json").dumps(v).encode())))
def test_control_request_parser_takes_any_request(data: bytes) -> None:
    try:
        verb, args = parse_request(data)
    except ControlError as e:
        assert e.code in ("bad_request", "unknown_verb")
    else:
        assert isinstance(verb, str) and isinstance(args, dict)


@FUZZ
@given(st.text(max_size=300), st.text(max_size=300), st.text("0123456789abcdef", min_size=4, max_size=80),
       st.integers(min_value=1, max_value=700))
def test_a_url_password_is_masked_wherever_a_line_is_cut(before: str, after: str, secret: str, limit: int) -> None:
    from supervisor.redact import redact_line

    pw = f"S3CR{secret}"
    got = redact_line(f"{before} postgres://u:{pw}@h/db {after}", limit=limit)
    if "S3CR" not in before + after:  # no part of the password is shown, wherever the cut fell
        assert "S3CR" not in got
    assert len(got) <= 3 * limit + 40


@FUZZ
@given(st.dictionaries(st.text(max_size=50), st.text(max_size=2000), max_size=30),
       st.lists(st.text(max_size=2000), max_size=30))
def test_env_and_argv_redaction_take_anything_and_stay_bounded(env: dict[str, str], argv: list[str]) -> None:
    from supervisor.redact import MAX_TOTAL_CHARS, MAX_VALUE_CHARS, redact_argv, redact_env

    shown = redact_env(env)
    assert sum(len(k) + len(v) for k, v in shown.items()) <= MAX_TOTAL_CHARS + 4 * MAX_VALUE_CHARS
    assert sum(map(len, redact_argv(argv))) <= MAX_TOTAL_CHARS + 4 * MAX_VALUE_CHARS
