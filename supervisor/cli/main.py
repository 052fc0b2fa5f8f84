"""Command line: ``transformer-supervisor <verb>`` (also ``python -m supervisor``): each verb's
command function and the daemon's start (the verbs' flags are in :mod:`.parser`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

# Nothing from the package at import time but the install check and the parser (stdlib only):
# when supervisord's `supervisor` package was installed over ours, `from . import __version__` is
# what fails, and main() must first say why (supervisor.installcheck).
from ..installcheck import refuse_foreign
from .parser import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE, build_parser
from .. import strictjson
from ..textescape import escaped
from .clientconfig import reload_refused


def _die_usage(msg: str) -> int:
    print(f"transformer-supervisor: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _state_dir(args: argparse.Namespace) -> Path:
    from .clientconfig import lenient_config

    if getattr(args, "state_dir", None):
        return Path(args.state_dir)
    if getattr(args, "config", None):
        cfg = _config(lambda: lenient_config(args.config))  # a bad value elsewhere: the state dir alone
        if cfg is None:  # not even readable: every problem said, exit 2 as check-config
            raise SystemExit(EXIT_USAGE)
        sd = cfg.state_dir()
        # From a shell, a daemon run by systemd keeps its state under StateDirectory=.
        sysd = Path("/var/lib/transformer-supervisor") / cfg.job.name
        if not cfg.state.dir and not (sd / "ledger.sqlite").exists() and (sysd / "ledger.sqlite").exists():
            return sysd
        return sd
    env = os.environ.get("TSUP_STATE_DIR")
    if env:
        return Path(env)
    cands = sorted(Path(".tsup").glob("*/ledger.sqlite")) if Path(".tsup").is_dir() else []
    if len(cands) == 1:
        return cands[0].parent
    raise SystemExit(_die_usage("which run? pass --state-dir DIR or --config PATH"
                                + (f" (found several under .tsup/: {', '.join(c.parent.name for c in cands)})"
                                   if cands else "")))


def _config(load: Callable[[], Any]) -> Any:
    """The config ``load`` builds, or None once every problem in it is printed with its key path
    (the verb then exits 2)."""
    from ..config.model import ConfigError

    try:
        return load()
    except ConfigError as e:
        print(f"{e.source}: {len(e.problems)} problem(s):", file=sys.stderr)
        for p in e.problems:
            print(f"  - {p}", file=sys.stderr)
        return None


# -- daemon verbs -----------------------------------------------------------------------------

DAEMON_SWITCH_INTERVAL_S = 0.0005


def _one_malloc_arena() -> None:
    """glibc gives each thread that allocates an arena of its own (up to 8 per core) and keeps
    what each freed: with the daemon's short-lived threads (launch preparation, load-test and
    output readers) its RSS wandered 51-60 MiB across identical three-node cluster runs, 51 with
    one arena (the bench's single-node rss rows: 52 either way). Its
    threads are light and take turns on the GIL anyway. ``mallopt(M_ARENA_MAX, 1)`` through
    ctypes because no library wraps it; the daemon's own process only (an environment variable
    would reach the job)."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass  # not glibc (musl has no arenas to cap)


M_ARENA_MAX = -8  # glibc's malloc.h


def _run_daemon(cfg: Any, source: Any, log_format: str | None) -> int:
    from .. import logsetup
    from ..ops.journal import JournalProcessor
    from ..daemon.wiring import build_daemon

    # Under systemd, the daemon's events go to the journal as native entries (a sentence as
    # MESSAGE, MESSAGE_ID per event kind, TSUP_* fields: journalctl TSUP_CAUSE=nan), instead of
    # (not besides) the stderr line.
    jp = JournalProcessor.for_environment(enabled=cfg.systemd.journal_fields)
    if jp is not None:
        logsetup.add_processor(jp)
    logsetup.configure(log_format or cfg.log.format, cfg.log.level)
    from ..daemon.statelock import StateDirLocked, StateDirUnusable
    from ..ledger.store import LedgerError
    from ..ownpaths import UnsafePath

    try:
        daemon = build_daemon(cfg, config=source)
    except (StateDirLocked, StateDirUnusable, LedgerError, UnsafePath) as e:
        print(f"transformer-supervisor: {e.message}", file=sys.stderr)
        return EXIT_USAGE
    # The daemon's threads mostly wait; during a metric flood the output thread is CPU-bound, and
    # every blocking call the loop makes (a /proc read, an SQLite step, a socket recv) then waits
    # for the GIL's switch interval to get it back. At the default 5 ms a /proc walk of a few
    # hundred reads held the loop, and the control replies behind it, for 0.5 s; at 0.5 ms the
    # worst reply under a 300 000-line flood measured 35 ms.
    sys.setswitchinterval(DAEMON_SWITCH_INTERVAL_S)
    _one_malloc_arena()
    try:
        return daemon.run()
    except LedgerError as e:  # the ledger failed at the run's opening (a full disk): said, not a traceback
        print(f"transformer-supervisor: {e.message}; no job was started", file=sys.stderr)
        return EXIT_USAGE


def cmd_run(args: argparse.Namespace) -> int:
    from ..config.model import ConfigSource, load_config

    cfg = _config(lambda: load_config(args.config))
    if cfg is None:
        return EXIT_USAGE
    return _run_daemon(cfg, ConfigSource.of_file(Path(args.config).resolve()), args.log_format)


def cmd_wrap(args: argparse.Namespace) -> int:
    from ..config.model import ConfigSource, config_from_table

    from .overrides import wrap_flag_problems, wrap_table

    problems = wrap_flag_problems(args)
    if problems:
        for problem in problems:
            print(f"transformer-supervisor wrap: {problem}", file=sys.stderr)
        return EXIT_USAGE
    cfg = _config(lambda: config_from_table(wrap_table(args), args.config or "wrap flags"))
    if cfg is None:
        return EXIT_USAGE
    # A reload reads the file again with the same flags over it (the command among them).
    source = ConfigSource(Path(args.config).resolve(), lambda: config_from_table(wrap_table(args), args.config)) \
        if args.config else None
    return _run_daemon(cfg, source, args.log_format)


def _check_config(args: argparse.Namespace) -> int:
    from .checkconfig import cmd_check_config

    return cmd_check_config(args)


# -- client verbs -----------------------------------------------------------------------------

def _control(args: argparse.Namespace, verb: str, payload: dict[str, Any] | None = None) -> tuple[int, Any]:
    from ..ops.control import ControlError, DaemonNotRunning
    from ..ops.controlclient import request

    sd = _state_dir(args)
    try:
        return EXIT_OK, request(sd, verb, payload or {})
    except DaemonNotRunning as e:
        print(f"transformer-supervisor: {escaped(e)}", file=sys.stderr)
        return 1, None
    except ControlError as e:
        print(f"transformer-supervisor: {verb} failed: {escaped(e)}", file=sys.stderr)
        return 1, None


def cmd_status(args: argparse.Namespace) -> int:
    from ..ops.control import ControlError, DaemonNotRunning
    from ..ops.controlclient import request

    sd = _state_dir(args)
    try:
        res = request(sd, "status", {})
    except DaemonNotRunning as e:
        # SPEC: 3 when none runs but the state dir holds a run (its last state from the ledger), 1 when
        # there is no run at all: a script can tell "finished or gave up" from "never started".
        from .verbs import last_run_status, render_last_run

        last = last_run_status(sd, getattr(args, "config", None))
        if last is None:
            print(f"transformer-supervisor: {escaped(e)}", file=sys.stderr)
            return 1
        from ..redact import env_secrets, learn_secrets, redact_data

        # The redaction gate: the job log's tail is the job's own text. Without the daemon, what is
        # known secret is this shell's environment (the job's env values only the daemon knew).
        learn_secrets(env_secrets(os.environ))
        last = redact_data(last)
        print(strictjson.dumps(last, indent=2, sort_keys=True) if args.json else render_last_run(last))
        return EXIT_NOT_RUNNING
    except ControlError as e:
        print(f"transformer-supervisor: status failed: {escaped(e)}", file=sys.stderr)
        return 1
    if args.json:
        print(strictjson.dumps(res, indent=2, sort_keys=True))
    else:
        from .render import render_status

        print(render_status(res))
    return EXIT_OK


def cmd_simple(args: argparse.Namespace, verb: str, payload: dict[str, Any] | None = None) -> int:
    from .verbs import control_verb

    return control_verb(_state_dir(args), verb, payload, wait=getattr(args, "wait", False),
                        timeout=getattr(args, "timeout", 600.0), json_out=getattr(args, "json", False))


def cmd_history(args: argparse.Namespace) -> int:
    from ..ledger.store import Ledger, LedgerError


    sd = _state_dir(args)
    try:
        led = Ledger(sd, readonly=True)  # a FIFO, a folder or a link there: a LedgerError saying so
    except (FileNotFoundError, LedgerError) as e:
        print(f"transformer-supervisor: {escaped(e)}", file=sys.stderr)
        return 1
    try:
        h = led.history(args.run)
    except LedgerError as e:  # not even the run's id could be read (a garbled page of `runs`)
        print(f"transformer-supervisor: {escaped(e)}", file=sys.stderr)
        return 1
    finally:
        led.close()
    unreadable = h.get("unreadable") or {}
    if args.run and h.get("state") is None and not h.get("attempts") and not unreadable:  # every run has a state
        print(f"transformer-supervisor: no run {args.run!r} in the ledger of {sd} "
              "(`history` without --run shows the newest run)", file=sys.stderr)
        return 1
    if args.json:
        print(strictjson.dumps(h, indent=2, default=str))
    else:
        from .render import render_history

        print(render_history(h))
    # What could be read is shown above; what could not is said here, and the exit is 1: the
    # history is not whole.
    for part, error in unreadable.items():
        what = {"run": "the run's state, exit and reason"}.get(part, f"the run's {part}")
        print(f"transformer-supervisor: history: {what} could not be read and are left out: {escaped(error)}",
              file=sys.stderr)
    return 1 if unreadable else EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    from .logs import cmd_logs as logs

    if args.lines < 0:
        return _die_usage(f"logs -n {args.lines}: the number of lines must be 0 (all) or more")
    from ..regularfile import NotARegularFile

    try:
        return logs(args, _state_dir(args))
    except NotARegularFile as e:  # a log swapped for a FIFO or a link while -f follows it: not read
        print(f"transformer-supervisor: {escaped(e)}", file=sys.stderr)
        return 1


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from ..config.model import Config, load_config

    cfg = _config(lambda: load_config(args.config, need_command=False) if args.config else Config())
    if cfg is None:
        return EXIT_USAGE
    ckdir = Path(args.checkpoint_dir) if args.checkpoint_dir else cfg.checkpoint_dir()
    if ckdir is None and cfg.job.command:  # the dir the daemon would find in the command (--output_dir, ...)
        from ..checkpoints.finddir import command_argv, dir_from_command

        found = dir_from_command(command_argv(cfg.job.command, cfg.job.shell), cfg.workdir())
        ckdir = found.path if found is not None and not found.root else None
    if ckdir is None:
        return _die_usage("no checkpoint dir: pass --checkpoint-dir DIR or a config with [checkpoints] dir "
                          "(or a [job] command that names it, e.g. --output_dir)")
    sd = Path(args.state_dir) if args.state_dir else cfg.state_dir()
    from .verbs import checkpoints_verb

    return checkpoints_verb(ckdir, cfg.checkpoints, args.json, sd, job_argv=list(cfg.job.command),
                            job_cwd=cfg.workdir(), load_test=not args.no_load_test)


def _torch_missing() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):
        return True


def cmd_demo(args: argparse.Namespace) -> int:
    # The demo's job trains with torch in this Python: without it, say so once instead of a
    # job that crashes on `import torch` until the restart budget is spent.
    if _torch_missing():
        return _die_usage(f"the demo trains a small model with torch, which this Python ({sys.executable}) "
                          "does not have; install the `train` extra into this environment: "
                          "pip install 'transformer-supervisor[train]' (or run ./scripts/demo in a checkout)")
    from ..demo.run import run_demo

    return run_demo(out=Path(args.out), faults=args.faults, steps=args.steps, seed=args.seed,
                    quiet=not args.show_job_output, log_format=args.log_format)


def cmd_report(args: argparse.Namespace) -> int:
    from ..report.collect import write_run_report

    from ..ledger.errors import LedgerError

    sd = _state_dir(args)
    out = Path(args.out) if args.out else sd / "report"
    unreadable: dict[str, str] = {}
    try:
        html, png = write_run_report(sd, out, args.run, unreadable=unreadable)
    except (FileNotFoundError, LedgerError) as e:  # no ledger, or not even the run can be read

        print(f"transformer-supervisor: report: {escaped(e)}; no report was written", file=sys.stderr)
        return 1
    except OSError as e:  # the out dir: a link or a file where the folder goes, not writable, full

        print(f"transformer-supervisor: report: cannot write {escaped(out)}: {escaped(e)}", file=sys.stderr)
        return 1
    print(f"report: {html}" + (f"\nloss curve: {png}" if png else ""))
    # The report holds what could be read; what could not is said here, and the exit is 1.
    for part, error in unreadable.items():
        what = {"run": "state, exit and reason"}.get(part, part)
        print(f"transformer-supervisor: report: the run's {what} could not be read and are left out "
              f"of the report: {error}", file=sys.stderr)
    return 1 if unreadable else EXIT_OK


def cmd_install_units(args: argparse.Namespace) -> int:
    from ..ops import units

    return units.run(args)


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (`history --json | head`): no traceback, no "Exception ignored"
    at exit; exit 141 (128 + SIGPIPE) as a command killed by SIGPIPE would."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def _without_rich() -> None:
    """structlog imports rich, when it is installed (transformers brings it in through typer), to
    pretty-print exceptions; our renderers print them plainly (logsetup), and its 50 ms of imports
    came before every run's first launch. Marked absent for this process unless already loaded."""
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    _without_rich()
    refuse_foreign()
    try:
        return _main(argv)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:  # Ctrl-C before or after a verb's own handling
        return _interrupted()


def _interrupted() -> int:
    """Exit 130 for Ctrl-C. CPython marks a KeyboardInterrupt raised while code from a string is
    run (a namedtuple or dataclass made by a lazy import the moment Ctrl-C came) as unhandled even
    when it is caught, and `python -m` then ends by SIGINT instead of with our exit code; a fresh
    string eval clears that mark."""
    exec("None")  # a constant string: only the mark is cleared
    return EXIT_INTERRUPTED


#: the verbs that only read the state dir (report writes its own page): ended at any point by Ctrl-C
READING_VERBS = frozenset({"status", "history", "logs", "checkpoints", "report"})


def _interruptible() -> None:
    """Ctrl-C ends a reading verb (exit 130) even when SIGINT came in ignored (a command started
    with `&` from a script, or by nohup): Python then keeps it ignored, and a verb that waits
    (logs -f) could be ended by nothing short of SIGKILL. These verbs only read, so ending one
    at any point leaves nothing half done."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    # `wrap ... -- CMD` (and `check-config --for wrap PATH -- CMD`): argparse would try to parse
    # CMD's own flags; split at the first "--".
    if argv and ("wrap" in argv or "check-config" in argv) and "--" in argv:
        i = argv.index("--")
        head, cmd = argv[:i], argv[i + 1:]
        args = ap.parse_args(head)
        args.command = cmd
    else:
        args = ap.parse_args(argv)
    verb = args.verb
    if verb not in ("run", "wrap", "demo"):
        # Client verbs print their answer on stdout; library events (load tests, manifests)
        # go to stderr, warnings only, so `--json` output stays parseable.
        from .. import logsetup

        logsetup.configure(args.log_format or "auto", "warning")
    if verb in READING_VERBS:
        _interruptible()
    if verb == "wrap" and not args.command and not args.config:
        return _die_usage("wrap needs a command: transformer-supervisor wrap [options] -- CMD ARGS...")
    handlers = {
        "run": cmd_run, "wrap": cmd_wrap, "check-config": _check_config, "status": cmd_status,
        "history": cmd_history, "logs": cmd_logs, "checkpoints": cmd_checkpoints, "demo": cmd_demo, "report": cmd_report,
        "install-units": cmd_install_units,
        "stop": lambda a: cmd_simple(a, "stop"),
        "checkpoint-now": lambda a: cmd_simple(a, "checkpoint-now"),
        "reload": lambda a: EXIT_USAGE if reload_refused(a) else cmd_simple(a, "reload"),
        "restart": lambda a: cmd_simple(a, "restart", {"reason": a.reason, "from": a.from_ckpt and os.path.abspath(a.from_ckpt),
                                                       "rollback": a.rollback, "force": a.force or None}),
    }
    try:
        return handlers[verb](args)
    except KeyboardInterrupt:
        return _interrupted()


if __name__ == "__main__":
    sys.exit(main())
