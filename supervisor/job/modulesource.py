"""The source file a ``python -m pkg.module`` job runs, found without importing anything.

A script's source is read to infer its resume flag (resumeinfer.py); a module run with ``-m`` is
the same kind of script, only named differently. Importing it (or ``importlib.util.find_spec``,
which imports its parent packages and runs their ``__init__``) would run the job's code in the
daemon, so the file is found by the rule ``python -m`` itself follows for the job's own code: the
job's working directory first (``-m`` puts it at ``sys.path[0]``), then each ``PYTHONPATH``
entry (relative ones from the working directory). A package run with ``-m`` runs its
``__main__.py``. Installed packages (site-packages) are not searched: a job's own training code
is what sits there, and an installed trainer's entry point takes its flags from its own docs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

# torchrun's -m/--module: "interpret the launch script as a Python module" (the next word).
_MODULE_FLAGS = ("-m", "--module")


def modules_of(argv: Sequence[str]) -> list[str]:
    """The modules ``argv`` names with ``-m NAME`` (or ``-mNAME``, torchrun's and accelerate's
    ``-m``/``--module``) before its first script (a ``*.py`` word: what follows is its own
    arguments), in order: ``python -m torch.distributed.run -m pkg.train`` names the launcher,
    then the job's module."""
    out = []
    for i, a in enumerate(argv):
        if a.endswith(".py") and not a.startswith("-") and "=" not in a:
            break
        name = argv[i + 1] if a in _MODULE_FLAGS and i + 1 < len(argv) else (
            a[2:] if a.startswith("-m") and not a.startswith("--") and len(a) > 2 and i > 0 else None)
        if name is not None and _valid(name):
            out.append(name)
    return out


def _valid(name: str) -> bool:
    return all(p.isidentifier() for p in name.split("."))


def module_source(name: str, workdir: Path, env: Mapping[str, str] | None = None) -> Path | None:
    """The file ``python -m name`` runs from the job's own code (see the module doc), or None."""
    env = os.environ if env is None else env
    roots = [workdir] + [workdir / p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    parts = name.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        for candidate in (base.with_name(parts[-1] + ".py"), base / "__main__.py"):
            try:
                if candidate.is_file():
                    return candidate
            except OSError:
                continue  # an unreadable folder on the path: the next one, as Python does
    return None
