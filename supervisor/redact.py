"""The one place that decides what of a shown value is a secret (issue 24 build 4), and the gate
every text leaving the daemon passes (issue 34): log and journal lines (``logsetup``), the
ledger's rows and ``history`` (``ledger.store``), ``status`` and every control reply
(``ops.control``), notifications and webhook bodies (``ops.alertmsg``), reports (through
``history``). Masking at those sinks, not at
each producer, is what makes a new producer safe: a sample line, a remedy's env or a reload's diff
is masked whatever event carries it.

Names (the secret words): an env var (:func:`redact_env`) or a key in text whose name contains
TOKEN, KEY, SECRET, PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL, or ends with the word PWD, AUTH,
COOKIE(S) or a session id's name (``MYSQL_PWD``, ``basic_auth``, ``Set-Cookie``, ``session_id``,
``JSESSIONID``; not ``author``, ``AUTH_TYPE``, ``cookie_jar``), has its value masked whole
(:func:`is_secret`; ``tokenizer=x`` too, a small price; not plurals, exception names or where a
secret is: ``known keys: a``, ``KeyError: 'a'``, ``key_file=/p``, ``SSH_AUTH_SOCK``; a value after
such a name is read again for names: ``KeyError: password=x`` masks x). The shell's ``PWD`` and
``OLDPWD`` holding a path (``/``, ``~``) are kept, holding anything else masked (``pwd: hunter2``).
``None``, ``true`` and the like are no secrets (``api_key=None``). A number, and any value of a
mapping (an event's data, ``status``), is masked only under a name one of whose *words* is such a
marker (:func:`names_secret`: ``password: 12345678`` and ``{"HF_TOKEN": ...}`` go; ``tokens:
12345678``, ``tokens_per_sec=4500``, ``max_tokens 512``, ``num_key_value_heads=8`` and
``{"tokenizers": "0.15"}`` stay). In text, a
secret-named key's value is masked in every syntax a Python job prints, XML and command lines
included (:mod:`supervisor.redactsyntax` lists them), and a secret said with no key: a secret-named call's
literals, "the password is X" (:mod:`supervisor.redactprose`).
Before names are read: a private key in PEM whole, wherever it sits in the text, and base64 key
material (:mod:`supervisor.redactpem`; over the lines of a stream, :class:`LineMasker`, and the
strings of a list at the gate, one stream too), a cookie header's value whole,
an auth object's arguments (``HTTPBasicAuth(...)``). Then credentials *inside* values, whatever
the name: a URL's password (``postgres://u:PASS@h/db`` keeps the user and host), a URL's user
with no password that looks like a token (``https://<PAT>@github.com``; ``git@``, ``jane.doe@``
stay), mysql's and mariadb's glued ``-pX`` in their client's command, ``Authorization:`` values, ``Bearer``/``Basic`` credentials, known token shapes (``hf_``, ``sk-``,
``ghp_``, ``AKIA``, Slack's ``xox``, JWTs) and the values the daemon was told are secret
(:func:`learn_secrets`: the job's env, the remedies' env and the daemon's own, by name).

What is shown is also bounded (a 25 MB argv once made a 131 MB ledger and a 26 MB log line): a
value (an argument, an env name or value) at :data:`MAX_VALUE_CHARS`, a line at
:data:`MAX_LINE_CHARS`, a whole argv or env at :data:`MAX_TOTAL_CHARS`, any one text at a sink at
:data:`MAX_TEXT_CHARS`, each cut said in place (``…(+N chars)``, ``…(+N more args)``, ``…(+N more
variables)``). The cut comes first, so the masking regexes see bounded text; a URL password split
by the cut (no ``@`` left) is masked too. Every regex is linear in its input (possessive and
atomic parts where a word could be re-scanned): a megabyte of hostile text takes well under a
second.
Masks may make the kept part a little longer than its bound (``<redacted>`` for a shorter value).
The webhook URL (its path carries the token) is shown as scheme and host only (:func:`redact_url`).
Pure but for the learned values (a tuple swapped whole under a lock), so the core may use it.
"""
from __future__ import annotations

import re
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from .core.messages import Argv
from .textescape import without_hidden
from .redactnames import (NOT_SECRETS as _NOT_SECRETS, SECRET_MARKERS, is_secret, masks_key, names_password,
                          names_secret,
                          shell_dir_secret as _shell_dir_secret)
from .redactpem import PEM_MAX_LINES, PemStream, mask_keys
from .redactsyntax import NUMBER_RE as _NUMBER_RE, REDACTED, argv_passwords, mask_commands, mask_names

__all__ = ["LineMasker", "PEM_MAX_LINES", "MAX_LINE_CHARS", "MAX_TEXT_CHARS", "MAX_TOTAL_CHARS", "MAX_VALUE_CHARS", "MIN_SECRET_LEN", "REDACTED",
           "SECRET_MARKERS", "cut", "env_secrets", "is_secret", "learn_secrets", "masks_key", "names_secret",
           "redact_argv", "redact_data", "redact_env", "redact_line", "redact_lines", "redact_text", "redact_url", "redact_value"]

MAX_VALUE_CHARS = 1024  # one argument, env name or env value as shown / stored
MAX_LINE_CHARS = 4096  # one free-text line (the parsers read no more of a line either)
MAX_TOTAL_CHARS = 16384  # a whole argv, a whole env
MAX_TEXT_CHARS = 1 << 20  # any one text at a sink (a message, a traceback, a data string)
MIN_SECRET_LEN = 4  # a shorter learned "secret" ("1", "yes") would cut ordinary words out of every text
MAX_KNOWN = 64  # learned secret values kept: each costs one scan of every text

# A cookie header's or a cookie-named key's value, whole: up to its closing quote, else to the line's end.
_COOKIE_RE = re.compile(r"(?i)(?<![A-Za-z0-9])((?:set-)?cookies?['\"]?\s*[=:]\s*)"
                        r"(?:(['\"])(?:[^'\"\\\n]|\\.)++|[^\n]++)")
# The arguments of an auth object (requests' HTTPBasicAuth('user', 'pw'), aiohttp's BasicAuth(...)) or
# of pydantic's secret types (``SecretStr('pw')``).
_AUTH_CALL_RE = re.compile(r"((?:Auth|Secret(?:Str|Bytes))\()[^()\n]{1,512}+(?=\))")

# ://user:password@ -- only the password goes; a user alone (git@host) is no secret. Anchored at
# "://" (not at the scheme), so a long run of letters is never scanned again from each of them.
_URL_USERINFO_RE = re.compile(r"(://[^\s:/@]*+:)([^\s@/]++)(@)")
# ://TOKEN@ -- a userinfo with no colon: a token as the user (https://<PAT>@github.com/o/r) goes whole
# when it looks like one (:func:`_url_user`); a user's name (ssh://git@host, https://jane.doe@h) stays.
_URL_USER_RE = re.compile(r"(://)([^\s:/@?#'\"]++)(?=@)")
# The same cut off before its "@" by a bound: at the very end of the kept text.
_URL_USERINFO_TAIL_RE = re.compile(r"(://[^\s:/@]*+:)([^\s@/]++)\Z")
# A token shape's start cut off by a bound at the very end of the kept text (``… wandb_v1_Zq7M…``).
_TOKEN_TAIL_RE = re.compile(r"\b(?:wandb_v1_|hf_|gh[pousr]_|github_pat_|sk-|glpat-|xox[abeprs]-|npm_|AIza|eyJ)[\w.-]*+\Z")
_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)[\w.~+/-]++=*")
# "Basic" alone is a common word: only a base64-looking credential after it (a digit, + / or =).
_BASIC_RE = re.compile(r"\b(Basic\s+)(?=[A-Za-z0-9+/]{0,200}[0-9+/=])[A-Za-z0-9+/]{8,}+=*")
_AUTH_RE = re.compile(r"(?i)\b((?:proxy-)?authorization['\"]?\s*[=:]\s*['\"]?)"
                      r"((?:bearer|basic|token|digest|negotiate|apikey)\s+)?[^\s'\",;]++")
_TOKEN_SHAPES_RE = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{16,}+|sk-[A-Za-z0-9_-]{20,}+|gh[pousr]_[A-Za-z0-9]{20,}+|github_pat_\w{20,}+"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}\b|xox[abeprs]-[A-Za-z0-9-]{10,}+|AIza[0-9A-Za-z_-]{30,}+"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{10,}+|npm_[A-Za-z0-9]{30,}+|glpat-[A-Za-z0-9_-]{16,}+|LS0tLS1CRUdJTi[A-Za-z0-9+/]{20,}+=*"
    r"|eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+|wandb_v1_\w{20,}+(?:<redacted>)?)")  # W&B's 86-char keys (half masked first)
# A chat webhook's URL path is its token (Slack's hooks, Discord's webhooks): the path goes.
_CHAT_HOOK_RE = re.compile(r"(?i)((?:hooks\.slack\.com/(?:services|workflows|triggers)|discord(?:app)?\.com/api/webhooks)/)"
                           r"[\w/-]++")
# A signed URL's signature and credentials (Azure SAS ``sig=``, S3's ``X-Amz-Signature=``, ``-Credential=``,
# ``-Security-Token=``, GCS's ``X-Goog-...``, CloudFront's and GCS v2's ``Signature=``) in a query: whatever
# the value; S3's and GCS's names alone too (prose, a header: ``X-Amz-Signature: v``).
_URL_SIGNATURE_RE = re.compile(r"(?i)([?&;](?:sig|signature|x-(?:amz|goog)-(?:signature|credential|security-token))=)"
                               r"[^&\s'\"#]++")
_SIGNED_PARAM_RE = re.compile(r"(?i)((?<![\w-])x-(?:amz|goog)-(?:signature|credential|security-token)['\"]?\s*[=:]\s*"
                              r"['\"]?)(?!<redacted>)[^&\s'\"#,;]++")
# ``sig=`` / ``signature=`` in prose only when its value reads as one (:func:`_signature`: ``sig=9``,
# ``sig=SIGTERM``, ``Signature=valid`` stay).
_PROSE_SIGNATURE_RE = re.compile(r"(?i)((?<![\w?&;-])(?:sig|signature)=)([^&\s'\"#,;()]{8,}+)")
_SECRET_FLAG_RE = re.compile(r"^(--?[\w-]*(?:token|key|secret|password|passwd|passphrase|credential)[\w-]*)(=)(.+)$",
                             re.IGNORECASE)

# A Hydra override (``db.password=x``, L1) goes when a word of its key names a secret (not ``tokenizer=x``).
_OVERRIDE_RE = re.compile(r"^([+~]{0,2}[\w.]{1,200}+)(=)(.+)$", re.DOTALL)

_known: tuple[tuple[str, re.Pattern[str] | None], ...] = ()  # (value, its whole-token pattern)
_known_lock = threading.Lock()


def env_secrets(*envs: Mapping[str, str]) -> list[str]:
    """The values to cut out of every text: secret-named variables' values, and the password of a
    URL inside any value (``DATABASE_URL=postgres://u:PASS@h/db``). A value that reads as a word or
    a count (:func:`_plain`: ``SORT_KEY=step``, ``PIN_TOKEN=4242``) only under a password's name
    (``DB_PASSWORD=sunshine``, ``PIN_PASSWORD=12345``): a person chose it, and it is a secret."""
    out: list[str] = []
    for env in envs:
        for k, v in env.items():
            if (names_secret(k) or _shell_dir_secret(k, v)) and (not _plain(v) or names_password(k)):
                out.append(v)
            if "://" in v:
                out.extend(m.group(2) for m in _URL_USERINFO_RE.finditer(v[:MAX_VALUE_CHARS]))
    return out


def _plain(v: str) -> bool:
    """Whether ``v`` reads as a word or a count (letters only, or digits only, under 12 characters):
    cut out of a text only as a whole token (``12345`` not out of ``step 123456``)."""
    return len(v) < 12 and (v.isdigit() or v.isalpha())


def _learnable(v: str | None) -> bool:
    """Whether ``v`` may be cut out of every text: 4 characters or more (``1``, ``yes`` would cut
    ordinary words out of every text) and no word of a switch (``true``, ``none``, ``off``)."""
    if not v or not MIN_SECRET_LEN <= len(v) <= MAX_LINE_CHARS or v == REDACTED:
        return False
    return v.strip().lower() not in _NOT_SECRETS


def learn_secrets(values: Iterable[str | None]) -> None:
    """Cut these values out of every text from now on (process-wide; a value once learned stays,
    so a secret dropped by a reload is still masked in what is said about it). Only values that
    may be secrets (:func:`_learnable`); at most :data:`MAX_KNOWN`, longest first (a secret that
    contains another is cut out whole). A plain one (:func:`_plain`) only as a whole token."""
    global _known
    new = {v for v in values if v is not None and _learnable(v)}
    with _known_lock:
        if new <= {v for v, _ in _known}:
            return
        values_now = sorted(new | {v for v, _ in _known}, key=lambda s: (-len(s), s))[:MAX_KNOWN]
        _known = tuple((v, re.compile(rf"(?<!\w)(?<!\d\.){re.escape(v)}(?!\w)(?!\.\d)") if _plain(v) else None)
                       for v in values_now)


def cut(text: str, limit: int) -> tuple[str, str]:
    """``text`` split at ``limit``: the part kept and what says the rest was cut (or "")."""
    if len(text) <= limit:
        return text, ""
    return text[:limit], f"…(+{len(text) - limit} chars)"


def _mask_tail(kept: str) -> str:
    """A URL password the cut split from its ``@`` (``postgres://u:PASS`` + cut), and a token shape's
    start (``wandb_v1_Zq…`` + cut), are masked."""
    return _TOKEN_TAIL_RE.sub(REDACTED, _URL_USERINFO_TAIL_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", kept))


def _cookie(m: re.Match[str]) -> str:
    return f"{m.group(1)}{m.group(2) or ''}{REDACTED}"


def _blocks(text: str) -> str:
    """What is masked before names are read, since a name's rule would mask only its first word:
    private keys in PEM, cookie values (``a=b; c=d``), an auth object's arguments."""
    text = mask_keys(text)
    low = text.lower()
    if "cookie" in low:
        text = _COOKIE_RE.sub(_cookie, text)
    if "Auth(" in text or "Secret" in text:
        text = _AUTH_CALL_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return text


def _values(value: str, also: Sequence[str] = ()) -> str:
    """Credentials inside a value, whatever its name: PEM keys, cookies, learned secrets, URL
    passwords, authorization values, bearer/basic credentials, token shapes."""
    return _inside(_blocks(value), also)


def _url_user(m: re.Match[str]) -> str:
    """A URL's user with no password masked whole when it looks like a token: 12 characters or
    more with letters and digits, or 24 or more (``git``, ``jane.doe``, ``trainer01`` stay)."""
    user = m.group(2)
    token = (len(user) >= 12 and any(c.isdigit() for c in user) and any(c.isalpha() for c in user)) or len(user) >= 24
    return f"{m.group(1)}{REDACTED}" if token and user != REDACTED else m.group(0)


def _signature(m: re.Match[str]) -> str:
    """A ``sig=``/``signature=`` value in prose, masked when it reads as a signature: a letter and a
    digit, or 20 characters or more."""
    v = m.group(2)
    sig = v != REDACTED and (len(v) >= 20 or (any(c.isdigit() for c in v) and any(c.isalpha() for c in v)))
    return f"{m.group(1)}{REDACTED}" if sig else m.group(0)


def _inside(value: str, also: Sequence[str] = ()) -> str:
    for secret in also:
        if secret in value:
            value = value.replace(secret, REDACTED)
    for secret, whole_token in _known:
        if secret in value:
            value = whole_token.sub(REDACTED, value) if whole_token else value.replace(secret, REDACTED)
    if "://" in value:
        value = _URL_USERINFO_RE.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", value)
        value = _URL_USER_RE.sub(_url_user, value)
    low = value.lower()
    if "authorization" in low:
        value = _AUTH_RE.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{REDACTED}", value)
    if "bearer" in low:
        value = _BEARER_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", value)
    if "Basic" in value:
        value = _BASIC_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", value)
    if "hooks" in low or "webhooks" in low:
        value = _CHAT_HOOK_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", value)
    if ("sig" in low and "=" in value) or "x-amz-" in low or "x-goog-" in low:
        value = _URL_SIGNATURE_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", value)
        value = _SIGNED_PARAM_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", value)
        value = _PROSE_SIGNATURE_RE.sub(_signature, value)
    value = mask_commands(value)
    return _TOKEN_SHAPES_RE.sub(REDACTED, value)


def redact_value(value: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``value`` cut at ``limit`` with credentials inside it masked: learned secrets, URL
    passwords, authorization values, bearer tokens and token shapes."""
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
        shown = REDACTED if is_secret(k) or _shell_dir_secret(k, v) else redact_value(v)
        out[name] = shown
        total += len(name) + len(shown)
    return out


# curl's ``-u user:password`` (``--user``, ``--proxy-user``) in an argv: the password goes; a
# ``uid:gid`` of digits (``docker run -u 1000:1000``) stays.
_USER_FLAGS = frozenset({"-u", "--user", "-U", "--proxy-user"})
_USER_PASSWORD_RE = re.compile(r"([^:\s]*+:)(?![0-9]++$)(.++)")


def _flag_name(arg: str) -> str | None:
    return arg if arg.startswith("-") and len(arg) > 1 and "=" not in arg else None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as shown: ``--password=x`` -> ``--password=<redacted>``, the argument after a
    secret-named flag (``--token x``) masked, and credentials inside any argument masked. A
    number after such a flag is kept (``--max-tokens 512`` is no secret)."""
    out: list[str] = []
    mask_next = False
    total = 0
    passwords = argv_passwords(argv)  # a client's -pX / -p X (mysql, sshpass, mongo), redis-cli's -a X
    for i, whole in enumerate(argv):
        if total >= MAX_TOTAL_CHARS:
            out.append(f"…(+{len(argv) - i} more args)")
            break
        arg, more = cut(whole, MAX_VALUE_CHARS)
        shown, masked_whole = _redact_arg(arg, mask_next)
        if i and argv[i - 1] in _USER_FLAGS and (m := _USER_PASSWORD_RE.fullmatch(shown)) and m.group(2) != REDACTED:
            shown, masked_whole = f"{m.group(1)}{REDACTED}", True
        if i in passwords and not masked_whole:
            shown, masked_whole = arg[:passwords[i]] + REDACTED, True
        mask_next = _flag_name(arg) is not None and is_secret(arg)  # a masked value is no flag
        if more and not masked_whole:  # a secret's length is not said either
            shown = _mask_tail(shown) + more
        out.append(shown)
        total += len(shown)
    return out


_FLAG_RE = re.compile(r"--?[A-Za-z][\w.-]{0,62}")  # an option's name alone (not "-----END ...-----")


def _argv_masks(args: Sequence[str]) -> dict[int, int]:
    """Of a list of strings read as an argv, the values of secret-named flags (``--token X``) and of
    a client's password option (:func:`~supervisor.redactsyntax.argv_passwords`): index -> the
    characters of it still shown."""
    out = argv_passwords(args)
    for i in range(1, len(args)):
        prev, x = args[i - 1], args[i]
        if _FLAG_RE.fullmatch(prev) is not None and is_secret(prev) and not x.startswith("-") \
                and not _NUMBER_RE.fullmatch(x) and x != REDACTED:
            out.setdefault(i, 0)
    return out


def _redact_arg(arg: str, after_secret_flag: bool) -> tuple[str, bool]:
    """One argument as shown, and whether its whole value was masked."""
    if after_secret_flag and not _NUMBER_RE.fullmatch(arg) and not arg.startswith("-"):
        return REDACTED, True
    m = _SECRET_FLAG_RE.match(arg) or _OVERRIDE_RE.match(arg)
    if m and (arg.startswith("-") or names_secret(m.group(1))) and (
            not _NUMBER_RE.fullmatch(m.group(3)) or names_password(m.group(1))):
        return f"{m.group(1)}={REDACTED}", True
    return _values(arg), False


def _mask(text: str, also: Sequence[str] = ()) -> str:
    """``text`` masked; where an escape sequence or an invisible character splits a name
    (``pass\\x1b[0mword=x``, ``pass\\u200bword=x``) its value goes too: the text without them is read,
    and if that masks more, it is what is shown (those characters dropped from this text only)."""
    shown = _inside(mask_names(_blocks(text)), also)
    plain = without_hidden(text)
    if plain is text:
        return shown
    alt = _inside(mask_names(_blocks(plain)), also)
    gained = alt.count(REDACTED) - plain.count(REDACTED) > shown.count(REDACTED) - text.count(REDACTED)
    return alt if gained else shown


def redact_line(line: str, limit: int = MAX_LINE_CHARS) -> str:
    """A free-text line (a log sample, a shell command, an error's evidence) cut at ``limit``,
    with secret-named values, URL passwords, authorization values, token shapes and learned
    secrets masked. A number is no secret unless its name says so: ``tokens_per_sec=4500``
    stays, ``password: 12345678`` goes."""
    kept, more = cut(line, limit)
    kept = _mask(kept)
    return (_mask_tail(kept) + more) if more else kept


class LineMasker:
    """:func:`redact_line` for the consecutive lines of one stream (a job's output), which a line
    alone cannot see: the body of a PEM private key whose BEGIN line came before
    (:class:`~supervisor.redactpem.PemStream`: up to its END line, what follows END on that line
    read as usual). One per stream; not thread-safe on its own (its owner holds the lock it reads
    the stream under)."""

    def __init__(self) -> None:
        self._pem = PemStream()

    def line(self, line: str, limit: int = MAX_LINE_CHARS) -> str:
        """``line`` as shown, masked with what the lines before it said."""
        return _streamed(self._pem, line, lambda rest: redact_line(rest, limit))

    def skip(self, line: str) -> None:
        """A line not shown, read only for what it says of the next ones (a key's BEGIN or END)."""
        got = self._pem.inside(line)
        self._pem.after(line if got is None else got[1])


def _streamed(pem: PemStream, line: str, mask: Callable[[str], str]) -> str:
    """One line of a stream as shown: a key's body line masked, else ``mask`` of it."""
    got = pem.inside(line)
    if got is not None:
        shown, rest = got
        pem.after(rest)
        return shown + (mask(rest) if rest else "")
    pem.after(line)
    return mask(line)


def redact_lines(lines: Iterable[str], limit: int = MAX_LINE_CHARS) -> list[str]:
    """Consecutive lines of one stream, each as shown (:class:`LineMasker`)."""
    masker = LineMasker()
    return [masker.line(line, limit) for line in lines]


def redact_text(text: str, also: Sequence[str] = ()) -> str:
    """The gate for one text at a sink: :func:`redact_line` at :data:`MAX_TEXT_CHARS`, and the
    values in ``also`` cut out too (a sink's own secrets: the webhook URL)."""
    if len(text) < MIN_SECRET_LEN:  # no secret, learned or shaped, fits in fewer
        return text
    kept, more = cut(text, MAX_TEXT_CHARS)
    kept = _mask(kept, also)
    return (_mask_tail(kept) + more) if more else kept


def redact_data(v: Any, also: Sequence[str] = ()) -> Any:
    """Anything JSON-shaped (an event's data, a status reply, a history) as it may leave the
    node: values under secret names masked (:func:`masks_key`), every text through
    :func:`redact_text`; other objects as they are unless their text holds a secret."""
    if isinstance(v, str):
        return redact_text(v, also)
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, Mapping):
        return {k: (REDACTED if masks_key(str(k), x) else redact_data(x, also)) for k, x in v.items()}
    if isinstance(v, Argv):  # the core's argv, shown here (bounded, --token x masked), never by the core
        return redact_data(redact_argv(v.args), also)
    if isinstance(v, (list, tuple)):  # in order: the lines of a stream (samples), a key's body after its BEGIN
        pem = PemStream()
        items = [_streamed(pem, x, lambda s: redact_text(s, also)) if isinstance(x, str) else redact_data(x, also)
                 for x in v]
        if all(isinstance(x, str) for x in v):  # maybe an argv as a plain list: --token X, a client's -p X
            for i, keep in _argv_masks(v).items():
                items[i] = v[i][:keep] + REDACTED
        return tuple(items) if isinstance(v, tuple) else items
    if isinstance(v, (set, frozenset)):
        items = [redact_data(x, also) for x in v]
        return tuple(items) if isinstance(v, tuple) else items
    shown = str(v)
    masked = redact_text(shown, also)
    return v if masked == shown else masked
