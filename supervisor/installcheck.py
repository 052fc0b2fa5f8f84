"""Refuse to run beside supervisord's ``supervisor`` package: the two share the import name.

supervisord (PyPI ``supervisor``, a common container entrypoint) installs a top-level package
``supervisor`` too. Installed into one environment, the two overwrite each other's files
(``__init__.py``, ``events.py``, ``process.py``) and both break, with errors that name neither
(``cannot import name '__version__' from 'supervisor'``, ``'supervisor.events' has no attribute
'clear'``); ``pip check`` sees nothing. Every entry point (the ``transformer-supervisor`` command,
``python -m supervisor``, ``python -m supervisor.ops.units``) calls :func:`refuse_foreign` first
and exits 2 with what to do when:

- the ``supervisor`` package Python imported is not ours (its ``__init__.py`` lacks our marker:
  supervisord's, or missing after a ``pip uninstall supervisor`` removed the files it shared), or
  it is not the folder this module lives in; or
- a ``supervisor`` distribution (supervisord) is installed in this environment: into the same
  folder as ours, or anywhere under ``sys.prefix`` (one of the two shadows the other there).

A supervisord outside this environment (the system's, when ours is in a venv of its own, even
with ``--system-site-packages``) is no clash. Stdlib only, and nothing imported from the package
before the check: it must work when our package's own files were overwritten.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

OUR_DISTRIBUTION = "transformer-supervisor"
#: set in ``supervisor/__init__.py``; supervisord's ``__init__.py`` has no such name
MARKER = "__distribution__"
FOREIGN_DISTRIBUTION = "supervisor"
EXIT_USAGE = 2

WHAT_TO_DO = """\
what to do: give transformer-supervisor an environment of its own (SRC: the package name, a wheel
or a checkout), then repair the other one:
  pipx install SRC                                    # a venv of its own, the command on PATH
  sudo scripts/install-systemd                        # from a checkout: its own venv in /opt, the units
  python3 -m venv /opt/tsup && /opt/tsup/bin/pip install SRC    # a venv per node
and reinstall supervisord where it was: pip install --force-reinstall supervisor
(both packages are imported as `supervisor`; they can never share one environment)"""


def _here() -> Path:
    return Path(__file__).resolve().parent  # the supervisor package (this module is at its top)


def _may_hold_foreign() -> bool:
    """Whether a folder on ``sys.path`` has a ``supervisor-*.dist-info`` or ``.egg-info``: a
    listing costs ~1 ms where importing importlib.metadata (email, csv, zipfile...) costs ~25 ms
    on every daemon start, before the job's launch. A path entry that is no folder (a zip) is left
    to importlib.metadata."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except NotADirectoryError:
            return True
        except OSError:
            continue
        for name in names:
            low = name.lower()
            if (low.endswith((".dist-info", ".egg-info"))
                    and low.split("-", 1)[0].split(".", 1)[0] == FOREIGN_DISTRIBUTION):
                return True
    return False


def _foreign_distributions() -> list[str]:
    """supervisord distributions that clash with us: in our folder, or in this environment."""
    if not _may_hold_foreign():
        return []
    try:
        from importlib.metadata import distributions
    except ImportError:  # pragma: no cover - Python < 3.8
        return []
    here = _here()
    prefix = Path(sys.prefix).resolve()
    found: list[str] = []
    try:
        dists = list(distributions(name=FOREIGN_DISTRIBUTION))
    except Exception:  # broken metadata elsewhere must not stop the daemon
        return []
    for dist in dists:
        try:
            site = Path(str(dist.locate_file(""))).resolve()
        except (OSError, TypeError, ValueError):
            continue
        version = (dist.metadata.get("Version") if dist.metadata else None) or "?"  # type: ignore[attr-defined]
        if site / "supervisor" == here:
            found.append(f"supervisord's distribution `supervisor` {version} is installed into the same folder "
                         f"as transformer-supervisor ({site}): each overwrote the other's files")
        elif site.is_relative_to(prefix):
            found.append(f"supervisord's distribution `supervisor` {version} is installed in this environment "
                         f"({site}), beside transformer-supervisor ({here.parent}): one shadows the other")
    return found


def problems() -> list[str]:
    """What is wrong with this install, as sentences; empty when the `supervisor` package is ours alone."""
    out: list[str] = []
    here = _here()
    pkg = sys.modules.get("supervisor")
    pkg_file = getattr(pkg, "__file__", None) if pkg is not None else None
    if pkg is not None and getattr(pkg, MARKER, None) != OUR_DISTRIBUTION:
        if pkg_file is None:
            out.append(f"{here}/__init__.py is missing: uninstalling supervisord removed the files the two "
                       "packages shared, and transformer-supervisor is broken")
        else:
            out.append(f"the `supervisor` package imported from {pkg_file} is supervisord's, not "
                       "transformer-supervisor's: supervisord was installed over it")
    elif pkg_file is not None and Path(pkg_file).resolve().parent != here:
        out.append(f"`import supervisor` finds {Path(pkg_file).parent}, not transformer-supervisor's {here}")
    out.extend(_foreign_distributions())
    return out


def message(found: list[str]) -> str:
    lines = ["transformer-supervisor: this environment also holds supervisord's `supervisor` package:"]
    lines += [f"  - {p}" for p in found]
    lines.append(WHAT_TO_DO)
    return "\n".join(lines)


def refuse_foreign() -> None:
    """Exit 2 with what to do when another `supervisor` package clashes with ours (see the module
    doc). ``TSUP_ALLOW_FOREIGN_SUPERVISOR=1`` turns the refusal into a warning (at your own risk)."""
    found = problems()
    if not found:
        return
    print(message(found), file=sys.stderr)
    if os.environ.get("TSUP_ALLOW_FOREIGN_SUPERVISOR") == "1":
        print("transformer-supervisor: TSUP_ALLOW_FOREIGN_SUPERVISOR=1: carrying on anyway", file=sys.stderr)
        return
    raise SystemExit(EXIT_USAGE)
