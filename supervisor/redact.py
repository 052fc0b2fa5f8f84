"""The one place that decides what of a shown value is a secret (issue 24 build 4).

Names first: an env var or key whose name contains TOKEN, KEY, SECRET, PASSWORD, PASSWD or
CREDENTIAL has its value masked whole. Then credentials *inside* values, whatever the name:
the password of a URL's userinfo (``postgres://u:PASS@h/db`` keeps the user and host), the value
of an argv flag named like a secret (``--password=x``, ``--hf-token x``), and bearer tokens.
Used wherever argv, env or lines are shown or stored: history, the ledger, logs, reload events,
sample lines. Pure (no I/O), so the core may use it.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

__all__ = ["REDACTED", "SECRET_MARKERS", "is_secret", "redact_argv", "redact_env", "redact_line",
           "redact_value"]

REDACTED = "<redacted>"
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")

# scheme://user:password@host -- only the password goes; a user alone (git@host) is no secret.
_URL_USERINFO_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)(@)")
_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)[\w.~+/-]+=*")
_SECRET_FLAG_RE = re.compile(r"^(--?[\w-]*(?:token|key|secret|password|passwd|credential)[\w-]*)(=)(.+)$",
                             re.IGNORECASE)
_SECRET_ASSIGN_RE = re.compile(r"(?i)\b(\w*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)\w*)(\s*[=:]\s*|\s+)"
                               r"(['\"]?)([^\s'\",;|]+)")
_NUMBER_RE = re.compile(r"[-+]?\d[\d.,]*(?:e[-+]?\d+)?%?", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Whether a name (env var, flag, key) says its value is a secret."""
    up = name.upper()
    return any(m in up for m in SECRET_MARKERS)


def redact_value(value: str) -> str:
    """``value`` with credentials inside it masked: URL passwords and bearer tokens."""
    value = _URL_USERINFO_RE.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", value)
    return _BEARER_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Secret-named variables masked whole; credentials inside the others masked."""
    return {k: (REDACTED if is_secret(k) else redact_value(v)) for k, v in env.items()}


def _flag_name(arg: str) -> str | None:
    return arg if arg.startswith("-") and len(arg) > 1 and "=" not in arg else None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as shown: ``--password=x`` -> ``--password=<redacted>``, the argument after a
    secret-named flag (``--token x``) masked, and credentials inside any argument masked. A
    number after such a flag is kept (``--max-tokens 512`` is no secret)."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            mask_next = False
            if not _NUMBER_RE.fullmatch(arg) and not arg.startswith("-"):
                out.append(REDACTED)
                continue
        m = _SECRET_FLAG_RE.match(arg)
        if m and not _NUMBER_RE.fullmatch(m.group(3)):
            out.append(f"{m.group(1)}={REDACTED}")
            continue
        name = _flag_name(arg)
        if name is not None and is_secret(name):
            mask_next = True
        out.append(redact_value(arg))
    return out


def redact_line(line: str) -> str:
    """A free-text line (a log sample, a shell command) with secret-named values, URL passwords
    and bearer tokens masked. A number is no secret: ``tokens_per_sec=4500`` stays."""
    line = _SECRET_ASSIGN_RE.sub(lambda m: m.group(0) if _NUMBER_RE.fullmatch(m.group(4))
                                 else f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}", line)
    return redact_value(line)
