"""One vocabulary of event names: every name the package emits is an :class:`EventName` member,
every member is emitted, and each member keeps one journal MESSAGE_ID of its own.

The scan reads the package's source (no import of it): a literal first argument of a structlog
call (``log.<level>("name", ...)``), and a literal at the place of a parameter ``event: str`` of
any function or method of the package (``daemon.event``, the machine's ``_record``, the cluster
agent's ``_emit``, ``_say``/``_warn``/``_failed`` helpers, ...) or of the first field ``event: str``
of a dataclass (``Record``, ``Notice``, ``Alert``). A new helper that takes ``event: str`` is
covered without a change here.
"""
from __future__ import annotations

import ast
import functools
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.config.model import ConfigError, config_from_table
from supervisor.eventids import MESSAGE_IDS
from supervisor.eventnames import DYNAMIC, EventName
from supervisor.ops import journal

from .fakes import close_all, daemon

PKG = Path(__file__).resolve().parent.parent / "supervisor"
LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "msg"})
LOGGERS = frozenset({"log", "logger", "_log"})
QUEUES = frozenset({"append", "appendleft", "put", "put_nowait"})


@dataclass(frozen=True)
class Emitted:
    name: str
    where: str  # path:line


@functools.cache
def _trees() -> tuple[tuple[str, ast.Module], ...]:
    return tuple((str(p.relative_to(PKG.parent)), ast.parse(p.read_text(), str(p))) for p in sorted(PKG.rglob("*.py")))


def _is_str(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Name) and node.id in ("str", "EventName")  # a plug-in's Note takes a member


def _event_index(node: ast.stmt) -> int | None:
    """The positional index (self/cls not counted) of a def's ``event: str``, or of a dataclass's
    first field ``event: str``; None when it has neither."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = [a for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
        return next((i for i, a in enumerate(args) if a.arg == "event" and _is_str(a.annotation)), None)
    if isinstance(node, ast.ClassDef):
        fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                  and (s.target.id != "event" or _is_str(s.annotation))]
        return 0 if fields[:1] == ["event"] else None
    return None


def emitters(trees: list[tuple[str, ast.Module]]) -> tuple[dict[str, int], dict[str, dict[str, int | None]]]:
    """Where a call's event name sits: by callable name across the package (the lowest index when
    two defs of one name differ: ``daemon.event(name, ...)`` over the ledger's ``event(run_id,
    attempt, name, ...)``), and per file, where a def in the file itself decides (a ``_send``
    that sends bytes is not the alerting concern's)."""
    anywhere: dict[str, int] = {}
    local: dict[str, dict[str, int | None]] = {}
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                i = _event_index(node)
                local.setdefault(path, {}).setdefault(node.name, i)
                if i is not None:
                    anywhere[node.name] = min(i, anywhere.get(node.name, i))
    return anywhere, local


def _literal(node: ast.expr) -> str | None:
    """A string literal, or a member written ``EventName.X`` (its value; ``EventName.X`` itself
    when there is no such member, so that it is named as unknown)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("EventName", "E"):
        return EventName[node.attr].value if node.attr in EventName.__members__ else f"EventName.{node.attr}"
    return None


def _is_level(node: ast.expr) -> bool:
    """A level: a literal one, or a member written ``Level.X`` (supervisor/levels.py)."""
    return _literal(node) in LEVELS or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                                         and node.value.id == "Level")


def _is_logger(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in LOGGERS
    if isinstance(node, ast.Attribute):
        return node.attr in LOGGERS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        return node.func.id in LOGGERS  # a logger made at first use: _log().warning(...)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get_logger"


def scan(trees: list[tuple[str, ast.Module]], *, defs: tuple[tuple[str, ast.Module], ...] = ()) -> tuple[Emitted, ...]:
    """Every literal event name in ``trees``, with where it is written; the callables they emit
    through are defined in them or in ``defs``."""
    anywhere, local = emitters([*defs, *trees])
    out = []
    for path, tree in trees:
        known = {**anywhere, **local.get(path, {})}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            callee = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            name: str | None = None
            if isinstance(f, ast.Attribute) and f.attr in LEVELS and _is_logger(f.value):
                name = _literal(node.args[0]) if node.args else None
            elif callee in QUEUES and len(node.args) == 1 and isinstance(t := node.args[0], ast.Tuple) \
                    and len(t.elts) >= 3 and _is_level(t.elts[1]):
                name = _literal(t.elts[0])  # an (event, level, message, ...) tuple queued for the loop
            elif len(node.args) >= 3 and _is_level(node.args[1]) and _literal(node.args[0]) is not None:
                name = _literal(node.args[0])  # through a callback: report("monitor_failed", "error", ...)
            elif callee is not None and (i := known.get(callee)) is not None:
                if len(node.args) > i and not isinstance(node.args[i], ast.Starred):
                    name = _literal(node.args[i])
                for kw in node.keywords:
                    if kw.arg == "event":
                        name = _literal(kw.value)
            if name is not None:
                out.append(Emitted(name, f"{path}:{node.lineno}"))
    return tuple(out)


@functools.cache
def emitted() -> tuple[Emitted, ...]:
    """Every literal event name in the package (read once per session)."""
    return scan(list(_trees()))


def test_the_scan_finds_each_form_and_names_a_stray_one():
    src = """
import structlog
log = structlog.get_logger("x")

class Notice2:
    event: str
    level: str

def _say(self, where: int, event: str, level: str) -> None: ...

def f(q, daemon, ledger, run_id, name):
    log.warning("form_log", path="p")
    structlog.get_logger("y").info("form_chained")
    _log().error("form_made_at_first_use")
    daemon.event("form_daemon", "info", "a message")
    daemon.event(EventName.GAVE_UP, "error", "members count as their string")
    daemon.event(EventName.NO_SUCH_MEMBER, "error", "named as unknown")
    ledger.event(run_id, None, "the ledger port: its callers pass a variable", "info", None)
    Record(event="form_keyword", level="info", message="m")
    Notice2("form_dataclass", "info")
    _say(1, "form_helper", "info")
    self.report("form_callback", "error", f"through a callable attribute")
    self.emit("form_level_member", Level.ERROR, "a Level member is a level")
    q.append(("form_queued", "warning", "m", {}))
    q.append(("not_an_event", 3))
    daemon.event(name, "info", "a literal message is no name")
"""
    # Scanned with the package, whose defs (daemon.event, the ledger's event, Record) it calls.
    found = [e.name for e in scan([("pkg/mod.py", ast.parse(src))], defs=_trees())]
    assert sorted(found) == sorted(["form_log", "form_chained", "form_made_at_first_use", "form_daemon", "gave_up", "EventName.NO_SUCH_MEMBER",
                                    "form_keyword", "form_dataclass", "form_helper", "form_callback", "form_level_member",
                                    "form_queued"])


def test_the_scan_sees_each_kind_of_emitter():
    # Guards the scan itself: were a rule to stop matching, the test below would pass on nothing.
    found: dict[str, list[str]] = {}
    for e in emitted():
        found.setdefault(e.name, []).append(e.where)
    for name, where in [("daemon_started", "daemon/runner.py"), ("restart_requested", "core/machine.py"),
                        ("gave_up", "core/attempts.py"), ("cluster_leader", "cluster/agent.py"),
                        ("metrics_blind", "watch/blind.py"), ("checkpoint_chosen", "checkpoints/resumechoice.py"),
                        ("state_dir_unusable", "daemon/statelock.py"), ("restart_loop", "daemon/alerting.py"),
                        ("checkpoint_manifest_metric_not_written", "checkpoints/manifest.py"),
                        ("event_name_unknown", "daemon/recorder.py"), ("ledger_write_failed", "ledger/writeguard.py")]:
        assert any(where in w for w in found.get(name, [])), (name, found.get(name))


def test_every_emitted_name_is_a_member():
    members = {m.value for m in EventName}
    unknown = sorted({f"{e.name} ({e.where})" for e in emitted() if e.name not in members})
    assert not unknown, ("event names that are not supervisor.eventnames.EventName members (add each, "
                         "with its MESSAGE_ID line in supervisor/eventids.py): " + ", ".join(unknown))


def test_every_member_is_emitted_or_listed_as_dynamic():
    said = {e.name for e in emitted()}
    silent = sorted(m.value for m in EventName if m.value not in said and m not in DYNAMIC)
    assert not silent, f"members no code emits (remove them, or list them in eventnames.DYNAMIC): {silent}"
    both = sorted(m.value for m in DYNAMIC if m.value in said)
    assert not both, f"listed as dynamic but emitted literally (drop from DYNAMIC): {both}"


def test_the_id_table_matches_the_members_one_to_one():
    assert set(MESSAGE_IDS) == set(EventName), set(EventName) ^ set(MESSAGE_IDS)
    ids = list(MESSAGE_IDS.values())
    assert len(set(ids)) == len(ids), "two members share a MESSAGE_ID"
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_message_id_uses_the_table_and_uuid5_outside_it():
    assert journal.message_id("daemon_started") == MESSAGE_IDS[EventName.DAEMON_STARTED]
    assert journal.message_id(EventName.GAVE_UP) == MESSAGE_IDS[EventName.GAVE_UP]
    # The ID docs/operating.md and README.md give for every restart (tests/ops checks the table there).
    assert MESSAGE_IDS[EventName.RESTART_SCHEDULED] == "fd3bc15f8aea5132aa95b5a167131465"
    # A library logger's line (not ours) still gets a stable ID of its own.
    assert journal.message_id("urllib3 said so") == uuid.uuid5(journal.ID_NAMESPACE, "urllib3 said so").hex


def test_the_runner_records_an_unknown_name_and_says_so_once_per_name(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    try:
        for _ in range(2):
            d.runner.event("made_up_name", "info", "a module's own word")
        d.runner.event("another_made_up_name", "warning", "and another")
        assert [e["message"] for e in d.ledger.named("made_up_name")] == ["a module's own word"] * 2  # nothing lost
        assert len(d.ledger.named("another_made_up_name")) == 1
        warned = d.ledger.named("event_name_unknown")
        assert [e["data"]["name"] for e in warned] == ["made_up_name", "another_made_up_name"], d.events()
        assert all(e["level"] == "warning" and "EventName" in e["message"] for e in warned)
    finally:
        close_all()


def test_a_notify_event_outside_the_vocabulary_is_a_config_error_naming_the_known_ones() -> None:
    table = {"job": {"command": ["true"]}, "notify": {"events": ["gave_up", "restart_sheduled"]}}
    with pytest.raises(ConfigError) as e:
        config_from_table(table)
    text = str(e.value)
    assert "notify.events" in text and '"restart_sheduled" is not an event name' in text
    assert "did you mean restart_scheduled" in text and "validation_failed" in text
    cfg = config_from_table({**table, "notify": {"events": ["gave_up", "restart_loop", "hang_suspected"]}})
    assert cfg.notify.events == ("gave_up", "restart_loop", "hang_suspected")
    assert all(type(n) is str for n in config_from_table(table | {"notify": {}}).notify.events)  # defaults: plain strings
