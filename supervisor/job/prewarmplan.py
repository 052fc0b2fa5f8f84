"""Which jobs a pre-warmed restart (``[job] prewarm``, :mod:`.prewarm`) can serve, and what a
standby must still share with the attempt it is handed: the plan of a plain Python job (``python
[options] script.py ...`` / ``python [options] -m module ...``; anything else is cold, with the
reason), the interpreter file, the environment less the per-attempt variables."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Mapping, Sequence

# Set per attempt (launch.launch_spec): they differ between any two attempts, so they are the
# request's to set; a standby is started without them (nothing can depend on them at import, and
# the running attempt's orphan search, which looks for its TSUP_ATTEMPT, never takes the standby).
PER_ATTEMPT = ("TSUP_ATTEMPT", "TSUP_RESUME_FROM", "TSUP_RESUME_STEP", "TSUP_SKIP_BATCHES",
               "TSUP_HEARTBEAT_DIR", "TORCHELASTIC_ERROR_FILE")
# Each runner's own mark, only in the environment it is started with (not the job's os.environ):
# /proc/PID/environ of the runner, and of what the job forks without an exec, is that start's, so
# an orphan of the attempt it runs is found by this mark, not by a TSUP_ATTEMPT (process.py).
STANDBY_MARK = "TSUP_STANDBY"
# Interpreter options that take no argument and those that take one: the standby starts with the
# same ones. Anything else (-c, -i, combined flags) is a doubt: cold.
FLAGS = frozenset({"-u", "-O", "-OO", "-B", "-s", "-S", "-E", "-I", "-P", "-b", "-bb", "-q", "-d", "-R"})
FLAGS_WITH_VALUE = frozenset({"-X", "-W"})


@dataclass(frozen=True)
class Plan:
    """A plain Python job: how the standby runs it."""

    python: str  # argv[0], as given
    options: tuple[str, ...]
    kind: str  # "script" | "module"
    target: str  # the script's path (as given) or the module's name
    args: tuple[str, ...]  # after the script or module

    def argv(self) -> list[str]:
        """The command this plan runs (the attempt's, as planned)."""
        main = [self.target] if self.kind == "script" else ["-m", self.target]
        return [self.python, *self.options, *main, *self.args]

    def exclude(self, cwd: str) -> list[str]:
        """The job's own folders: nothing found there is preloaded."""
        dirs = [cwd]
        if self.kind == "script":
            dirs.append(os.path.dirname(os.path.join(cwd, self.target)) or cwd)
        return dirs


def plan(argv: Sequence[str]) -> Plan | str:
    """The plan for ``argv``, or why it is not a plain Python job (then: cold)."""
    if not argv:
        return "no command"
    base = os.path.basename(argv[0])
    if not base.startswith("python") or not all(c.isalnum() or c in ".-_" for c in base[6:]) or base.endswith("-config"):
        return f"not a plain Python job ({base} is not a Python interpreter)"
    opts: list[str] = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in FLAGS:
            opts.append(a)
        elif a in FLAGS_WITH_VALUE and i + 1 < len(argv):
            opts += [a, argv[i + 1]]
            i += 1
        elif a == "-m" and i + 1 < len(argv):
            return Plan(argv[0], tuple(opts), "module", argv[i + 1], tuple(argv[i + 2:]))
        elif a.startswith("-"):
            return f"interpreter option {a} is not supported by prewarm"
        else:
            return Plan(argv[0], tuple(opts), "script", a, tuple(argv[i + 1:]))
        i += 1
    return "no script or module in the command"


def interpreter_identity(python: str, env: Mapping[str, str], cwd: str) -> tuple[str, int, int] | None:
    """Which file runs as ``python`` (the job's PATH, its cwd): a replaced interpreter is a doubt."""
    path = python if "/" in python else shutil.which(python, path=env.get("PATH", os.defpath))
    if not path:
        return None
    try:
        real = os.path.realpath(os.path.join(cwd, path))
        st = os.stat(real)
    except OSError:
        return None
    return real, st.st_ino, st.st_mtime_ns


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the standby starts with: the attempt's, less its per-attempt keys."""
    return {k: v for k, v in env.items() if k not in PER_ATTEMPT}


def env_difference(standby: Mapping[str, str], attempt: Mapping[str, str]) -> str | None:
    """The first variable (sorted) that differs, besides the per-attempt ones; None when none.
    Any of them could have been read at import time (CUDA_VISIBLE_DEVICES, PYTHONPATH,
    LD_LIBRARY_PATH, a library's own switches): no list of the ones that matter is trusted."""
    now = import_env(attempt)
    for k in sorted(set(standby) | set(now)):
        if standby.get(k) != now.get(k):
            return k
    return None
