"""The one place that decides what of a shown value is a secret (issue 24 build 4).

Names first: an env var or key whose name contains TOKEN, KEY, SECRET, PASSWORD, PASSWD or
CREDENTIAL has its value masked whole. Then credentials *inside* values, whatever the name:
the password of a URL's userinfo (``postgres://u:PASS@h/db`` keeps the user and host), the value
of an argv flag named like a secret (``--password=x``, ``--hf-token x``), and bearer tokens.
Used wherever argv, env or lines are shown or stored: history, the ledger, logs, reload events,
sample lines. Pure (no I/O), so the core may use it.

What is shown is also bounded (a 25 MB argv once made a 131 MB ledger and a 26 MB log line): a
value (an argument, an env name or value) at :data:`MAX_VALUE_CHARS`, a line at
:data:`MAX_LINE_CHARS`, a whole argv or env at :data:`MAX_TOTAL_CHARS`, each cut said in place
(``…(+N chars)``, ``…(+N more args)``, ``…(+N more variables)``). The cut comes first, so the
masking regexes see bounded text; a URL password split by the cut (no ``@`` left) is masked too.
Masks may make the kept part a little longer than its bound (``<redacted>`` for a shorter value).
The webhook URL (its path carries the token) is shown as scheme and host only (:func:`redact_url`).
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence
from urllib.parse import urlsplit

__all__ = ["MAX_LINE_CHARS", "MAX_TOTAL_CHARS", "MAX_VALUE_CHARS", "REDACTED", "SECRET_MARKERS", "cut",
           "is_secret", "redact_argv", "redact_env", "redact_line", "redact_url", "redact_value"]

MAX_VALUE_CHARS = 1024  # one argument, env name or env value as shown / stored
MAX_LINE_CHARS = 4096  # one free-text line (the parsers read no more of a line either)
MAX_TOTAL_CHARS = 16384  # a whole argv, a whole env

REDACTED = "<redacted>"
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")

# scheme://user:password@host -- only the password goes; a user alone (git@host) is no secret.
_URL_USERINFO_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)(@)")
# The same cut off before its "@" by a bound: at the very end of the kept text.
_URL_USERINFO_TAIL_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)\Z")
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


def cut(text: str, limit: int) -> tuple[str, str]:
    """``text`` split at ``limit``: the part kept and what says the rest was cut (or "")."""
    if len(text) <= limit:
        return text, ""
    return text[:limit], f"…(+{len(text) - limit} chars)"


def _mask_tail(kept: str) -> str:
    """A URL password the cut split from its ``@`` (``postgres://u:PASS`` + cut) is masked."""
    return _URL_USERINFO_TAIL_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", kept)


def _values(value: str) -> str:
    value = _URL_USERINFO_RE.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", value)
    return _BEARER_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", value)


def redact_value(value: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``value`` cut at ``limit`` with credentials inside it masked: URL passwords and bearer
    tokens."""
    kept, more = cut(value, limit)
    kept = _values(kept)
    return (_mask_tail(kept) + more) if more else kept


def redact_url(url: str) -> str:
    """A URL whose path carries a token (a webhook) as it may be shown: scheme and host only."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    if not parts.scheme or not parts.hostname:
        return REDACTED
    return f"{parts.scheme}://{parts.hostname}/{REDACTED}"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Secret-named variables masked whole; credentials inside the others masked; names and
    values cut at MAX_VALUE_CHARS, the whole at MAX_TOTAL_CHARS (the rest said as one entry)."""
    out: dict[str, str] = {}
    total = 0
    for i, (k, v) in enumerate(env.items()):
        if total >= MAX_TOTAL_CHARS:
            out["…"] = f"(+{len(env) - i} more variables)"
            break
        name = "".join(cut(k, MAX_VALUE_CHARS))  # a name is no secret; is_secret sees it whole
        shown = REDACTED if is_secret(k) else redact_value(v)
        out[name] = shown
        total += len(name) + len(shown)
    return out


def _flag_name(arg: str) -> str | None:
    return arg if arg.startswith("-") and len(arg) > 1 and "=" not in arg else None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as shown: ``--password=x`` -> ``--password=<redacted>``, the argument after a
    secret-named flag (``--token x``) masked, and credentials inside any argument masked. A
    number after such a flag is kept (``--max-tokens 512`` is no secret)."""
    out: list[str] = []
    mask_next = False
    total = 0
    for i, whole in enumerate(argv):
        if total >= MAX_TOTAL_CHARS:
            out.append(f"…(+{len(argv) - i} more args)")
            break
        arg, more = cut(whole, MAX_VALUE_CHARS)
        shown, masked_whole = _redact_arg(arg, mask_next)
        mask_next = _flag_name(arg) is not None and is_secret(arg)  # a masked value is no flag
        if more and not masked_whole:  # a secret's length is not said either
            shown = _mask_tail(shown) + more
        out.append(shown)
        total += len(shown)
    return out


def _redact_arg(arg: str, after_secret_flag: bool) -> tuple[str, bool]:
    """One argument as shown, and whether its whole value was masked."""
    if after_secret_flag and not _NUMBER_RE.fullmatch(arg) and not arg.startswith("-"):
        return REDACTED, True
    m = _SECRET_FLAG_RE.match(arg)
    if m and not _NUMBER_RE.fullmatch(m.group(3)):
        return f"{m.group(1)}={REDACTED}", True
    return _values(arg), False


def _mask_assign(m: re.Match[str]) -> str:
    name, sep, value = m.group(1), m.group(2), m.group(4)
    if _NUMBER_RE.fullmatch(value):
        return m.group(0)
    # "hf_token abc" and "--api-key abc" name a secret; prose such as "tokenizer loaded" or
    # "secret_sauce on" does not: with only a space between, the name must end with the marker.
    if not sep.strip() and not name.upper().rstrip("0123456789_").endswith(SECRET_MARKERS):
        return m.group(0)
    return f"{name}{sep}{m.group(3)}{REDACTED}"


def redact_line(line: str, limit: int = MAX_LINE_CHARS) -> str:
    """A free-text line (a log sample, a shell command, an error's evidence) cut at ``limit``,
    with secret-named values, URL passwords and bearer tokens masked. A number is no secret:
    ``tokens_per_sec=4500`` stays."""
    kept, more = cut(line, limit)
    kept = _SECRET_ASSIGN_RE.sub(_mask_assign, kept)
    kept = _values(kept)
    return (_mask_tail(kept) + more) if more else kept
