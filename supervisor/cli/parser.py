"""The command line's shape: every verb, its flags and help, and the exit statuses they share
(the command functions are in :mod:`.main`)."""

from __future__ import annotations

import argparse

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_GAVE_UP = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
EXIT_NOT_RUNNING = 3  # status: no daemon answers, but the state dir holds a finished run

EXIT_CODES = """\
exit status:
  0    run/wrap: the job finished, or was stopped on request (`stop`) after a graceful stop;
       other verbs: done
  1    a client verb failed: no daemon runs for that state dir, the request was refused, a
       --wait timed out
  2    bad usage or config (every problem printed with its key path), or supervisord's
       `supervisor` package in this environment (see docs/configuration.md: installs); run/wrap: another
       daemon (its pid named) already holds the state dir, the state dir is another user's, or
       its ledger is corrupt or was written by a newer version
  3    run/wrap: gave up (restart budget spent, no progress, a fault that needs a human; the last
       log line says why); restart --wait: the daemon gave up instead of restarting; status: no
       daemon runs, the last run's end is printed (state, exit, reason, when)
  143  run/wrap: stopped by SIGTERM before the job finished (a scheduler's time limit, preemption
       or eviction, `systemctl stop`): requeue it
  130  run/wrap: the same for SIGINT (Ctrl-C); client verbs: interrupted
  141  stdout was closed early (`history --json | head`): the output was cut, quietly"""

WRAP_EPILOG = """\
Flags override the same keys of --config (every key: config.example.toml).
Example:
  transformer-supervisor wrap --max-restarts 5 --checkpoint-dir ckpt \\
      --resume-arg=--resume={checkpoint} -- torchrun --nproc-per-node=8 --max-restarts=0 train.py

""" + EXIT_CODES


def add_locator(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--state-dir", help="the run's state dir (ledger, control socket)")
    g.add_argument("--config", help="the run's config file (its state dir is used)")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    ap = argparse.ArgumentParser(prog="transformer-supervisor",
                                 description="Supervise a training job: detect failures, reboot it under control.",
                                 epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"transformer-supervisor {__version__}")
    ap.add_argument("--log-format", choices=("auto", "console", "logfmt", "json"), default=None,
                    help="the daemon's own event lines on stderr (default: config log.format)")
    sub = ap.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True

    p = sub.add_parser("run", help="the daemon in the foreground (systemd's ExecStart)",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the run's config file (TOML; check it with check-config)")

    p = sub.add_parser("wrap", help="supervise any command: wrap [options] -- CMD ARGS...",
                       description="Supervise CMD: the daemon in the foreground, configured by flags.",
                       epilog=WRAP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="PATH", help="a config file to start from; the flags override its keys")
    p.add_argument("--name", help="the run's name ([job] name): names the state dir ./.tsup/NAME (default: job)")
    p.add_argument("--state-dir", metavar="DIR", help="ledger, control socket, heartbeats ([state] dir; "
                                                      "default ./.tsup/NAME)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where the job writes its checkpoints ([checkpoints] "
                                                           "dir): verified before every resume")
    p.add_argument("--log-file", metavar="PATH", help="also append the job's output to this file ([job] log_file)")
    p.add_argument("--max-restarts", metavar="N", help="restarts allowed within the restart window before "
                                                       "giving up with exit 3 ([policy] max_restarts)")
    p.add_argument("--heartbeat-timeout", metavar="SECONDS",
                   help="hang timeout ([heartbeat] timeout_s): a rank's heartbeat older than this, or, for a "
                        "job without the client, no new step and no output line for this long "
                        "(default: learned from the job's rhythm)")
    p.add_argument("--shutdown", metavar="MODE", help="how the job is stopped ([shutdown] mode): graceful (stop "
                                                      "signal, wait --grace, SIGKILL), hybrid (emergency "
                                                      "checkpoint first) or forced (SIGKILL)")
    p.add_argument("--grace", metavar="SECONDS", help="how long the job may take to flush and exit after the "
                                                      "stop signal ([shutdown] grace_s, default 120)")
    p.add_argument("--resume-arg", action="append", default=None, metavar="ARG",
                   help="appended when resuming; {checkpoint} is replaced (repeatable)")
    p.add_argument("--metric-regex", action="append", default=None, metavar="REGEX",
                   help="read metrics from lines this regex matches, with named groups step, loss (and grad_norm, "
                        "lr, val_loss, ...), e.g. 'iter (?P<step>\\d+) .* loss (?P<loss>[-+.\\w]+)'; added to "
                        "[detectors.parsers] regexes, tried after the built-in formats (repeatable). The "
                        "metrics_blind warning prints one guessed from the job's own lines")
    p.add_argument("--watch-file", action="append", default=None, metavar="GLOB",
                   help="also read metrics and errors from the files matching GLOB, e.g. 'logs/rank*.log' "
                        "(relative to the job's workdir; added to [job] watch_files; repeatable)")
    p.add_argument("--env", action="append", default=None, metavar="KEY=VALUE",
                   help="environment for the job ([job] env; repeatable; values of names with TOKEN, KEY, "
                        "SECRET or PASSWORD are never logged)")
    p.add_argument("--workdir", metavar="DIR", help="the job's working directory ([job] workdir; default: here)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE", dest="set_keys",
                   help="any config key by its dotted path, the value typed by the schema, e.g. "
                        "--set heartbeat.learn_floor_s=120 --set on.nan.action=give_up "
                        "--set detectors.nan.fields=loss,val_loss (repeatable; applied after the other flags)")
    p.add_argument("--backoff", metavar="SECONDS", help="first delay before relaunching an attempt that failed without progress (policy.backoff_initial_s; one that made progress relaunches at once)")
    p.add_argument("--shell", action="store_true", help="run CMD as one string through /bin/sh -c")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...: the job's launch command")

    p = sub.add_parser("status", help="the run's state: the running daemon's, else the last run's from the ledger",
                       description="Ask the running daemon for its state (exit 0). When no daemon runs, print "
                                   "the last run from the state dir's ledger, as systemctl status shows an "
                                   "inactive unit: state, exit code, reason, when it ended, the last lines of "
                                   "the job's log (exit 3). Exit 1 when the state dir holds no run at all.")
    add_locator(p)
    p.add_argument("--json", action="store_true", help="print the state as JSON (strict: no bare NaN)")

    p = sub.add_parser("restart", help="controlled reboot now")
    add_locator(p)
    p.add_argument("--reason", default="operator request", help="recorded in the ledger and the journal")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from", dest="from_ckpt", metavar="CKPT", help="resume from this checkpoint (verified first)")
    g.add_argument("--rollback", action="store_true", help="restart as a rollback: no emergency checkpoint of the current (suspect) state first")
    p.add_argument("--force", action="store_true",
                   help="with --from: use the checkpoint even when its checks fail (missing, corrupt, needs pickled code)")
    add_wait(p, "until the new attempt is launched")

    p = sub.add_parser("checkpoint-now", help="ask the job for an emergency checkpoint")
    add_locator(p)
    p.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")

    p = sub.add_parser("stop", help="graceful stop of the job, then the daemon exits 0")
    add_locator(p)
    add_wait(p, "until the daemon has exited (the job stopped, its checkpoint flushed)")

    p = sub.add_parser("reload", help="reload the daemon's config (same as SIGHUP)")
    add_locator(p)
    p.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")

    p = sub.add_parser("checkpoints", help="the readiness quicklist for every checkpoint found, and the ones "
                                           "still being written")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--config", help="the run's config file: its checkpoint dir (or the one its command names) "
                                    "and state dir")
    g.add_argument("--checkpoint-dir", help="list this checkpoint dir (no config)")
    p.add_argument("--state-dir", help="where the hash cache lives (default: the config's state dir)")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.add_argument("--no-load-test", action="store_true",
                   help="a quick look: skip the torch load tests (files, digests and manifests only)")

    p = sub.add_parser("logs", help="the job's output from its log file (-f: follow a running job)",
                       description="Print the last lines of the job's output (job.log, or [job] log_file: "
                                   "stdout and stderr as the job wrote them); -f follows it until the "
                                   "daemon exits.")
    add_locator(p)
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing what the job writes (across log rotation) until the daemon has exited "
                        "and the log stopped growing; Ctrl-C stops it (exit 130)")
    p.add_argument("-n", "--lines", type=int, default=50, metavar="N",
                   help="how many of the last lines to print first (default 50; 0: the whole log); lines "
                        "before a rotation come from the rotated job.log.1, .2 ...")
    p.add_argument("--stderr", action="store_true",
                   help="only the job's stderr (job.stderr.log, written beside the job log)")

    p = sub.add_parser("history", help="the run ledger")
    add_locator(p)
    p.add_argument("--json", action="store_true", help="print the run and its attempts as JSON")
    p.add_argument("--run", help="a run id (default: the newest)")

    p = sub.add_parser("check-config", help="validate a config file; exit 0, or 2 with every problem listed",
                       description="Validate a config file exactly as `run --config` (default) or "
                                   "`wrap --config` (--for wrap) reads it: every problem is listed with its "
                                   "key path, exit 2. With --for wrap, what depends on wrap's command (a scale "
                                   "remedy's flag) is checked only when the command follows: "
                                   "check-config --for wrap PATH -- CMD ARGS...")
    p.add_argument("path", metavar="PATH", help="the config file (TOML)")
    p.add_argument("--for", dest="for_verb", choices=("run", "wrap"), default="run",
                   help="the verb that will read it: run needs [job] command; wrap takes the command "
                        "from its flags (default: run)")

    p = sub.add_parser("demo", help="a tiny GPT trained under supervision, with injected faults")
    p.add_argument("--faults", default=None, help="comma list (default: nan,hang,crash,oom,corrupt_ckpt); "
                                                  "'none' for a clean run")
    p.add_argument("--out", default="demo-out", help="where the demo writes its run, checkpoints and report")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps of the demo run (default 600; the faults fire at fixed fractions of it)")
    p.add_argument("--seed", type=int, default=1234, help="the random seed of the model and data (default 1234)")
    p.add_argument("--show-job-output", action="store_true",
                   help="pass the job's own output through too (it is always in OUT/job.log)")

    p = sub.add_parser("report", help="write the HTML report of a run")
    add_locator(p)
    p.add_argument("--out", help="output folder (default: <state dir>/report)")
    p.add_argument("--run", help="a run id (default: the newest)")

    from ..ops import units

    p = sub.add_parser("install-units", help="install the systemd units, the example config and the env file "
                                             "from this installed package (--print: show them)",
                       description=units.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    units.add_arguments(p)
    for choice in sub._choices_actions:  # a verb without its own description says its help line
        sp = sub.choices[choice.dest]
        if not sp.description and choice.help:
            sp.description = choice.help[0].upper() + choice.help[1:] + "."
    return ap


def add_wait(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--wait", action="store_true", help=f"wait {what}; exit 1 if it does not happen in --timeout")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="how long --wait waits (default 600)")
    p.add_argument("--json", action="store_true", help="print the daemon's answer (and the wait's outcome) as JSON")
