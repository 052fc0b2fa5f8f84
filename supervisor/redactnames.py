"""Which names say their value is a secret (issue 24 build 4, issue 34): an env var's, a key's, a
flag's, an XML element's. The rules are :mod:`supervisor.redact`'s (its docstring says them); kept
apart from the text maskers there so each stays one concern. Pure."""
from __future__ import annotations

import re
from typing import Any

__all__ = ["NOT_SECRETS", "SECRET_LAST_WORDS", "SECRET_MARKERS", "SHELL_DIRS", "is_secret", "last_word_secret",
           "masks_key", "names_password", "names_secret", "names_where", "shell_dir_secret", "text_secret_name"]

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL")
# Short words that name a secret only as a name's last word (``MYSQL_PWD``, ``pwd``, ``DB_PASS``, ``basic_auth``,
# ``HTTPBasicAuth``, ``Cookie``, ``Set-Cookie``, ``session_id``, ``JSESSIONID``, ``PHPSESSID``), never
# inside a longer word or before another (``author``, ``AUTH_TYPE``, ``bypass``, ``--pass-through``, ``cookie_jar``).
SECRET_LAST_WORDS = ("pwd", "pw", "pass", "auth", "cookie", "cookies")
_SESSION_ID_ENDINGS = ("sessionid", "sessid")
# The shell's working directories: paths, not passwords (a value starting "/" or "~" under them stays).
SHELL_DIRS = frozenset({"PWD", "OLDPWD"})
# A name's words that make it a secret's name (numbers included); "tokens", "keys" count things.
_SECRET_WORDS = frozenset({"token", "key", "secret", "secrets", "password", "passwd", "passphrase", "credential",
                           "credentials", "apikey"})
_SECRET_WORD_ENDINGS = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials")
_PASSWORD_WORDS = ("password", "passwd", "passphrase")
_WORD_SPLIT_RE = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# An exception's name says what went wrong, not what it holds (KeyError, TokenExpiredError).
_EXCEPTION_ENDINGS = ("Error", "Exception", "Warning", "Interrupt")
_PLURALS = ("KEYS", "TOKENS")
_WHERE_WORDS = frozenset({"file", "path", "dir", "env", "name", "sock", "socket"})
# Values never taken for a learned secret, whatever their variable's name.
NOT_SECRETS = frozenset({"true", "false", "none", "null", "unset", "yes", "no", "on", "off"})


def last_word_secret(name: str) -> bool:
    """Whether ``name`` ends with a :data:`SECRET_LAST_WORDS` word or a session id's name."""
    words = [w.lower() for w in _WORD_SPLIT_RE.split(name) if w]
    if not words or name.upper() in SHELL_DIRS:
        return False
    return words[-1] in SECRET_LAST_WORDS or "".join(words[-2:]).endswith(_SESSION_ID_ENDINGS)


def shell_dir_secret(name: str, value: Any) -> bool:
    """Whether ``value`` under the shell's ``PWD``/``OLDPWD`` is a password: ``PWD=/home/x`` is a
    path, ``pwd: hunter2`` (no path) is not."""
    return (name.upper() in SHELL_DIRS and value is not None and value != ""
            and not (isinstance(value, str) and value.startswith(("/", "~"))))


def is_secret(name: str) -> bool:
    """Whether a name (env var, flag, key) says its value is a secret: a marker anywhere in it, or
    a last word (:data:`SECRET_LAST_WORDS`; the shell's ``PWD`` and ``OLDPWD`` are paths)."""
    up = name.upper()
    return any(m in up for m in SECRET_MARKERS) or last_word_secret(name)


def names_where(name: str) -> bool:
    """Whether ``name`` names where a secret is, not the secret (``key_file``, ``HF_TOKEN_PATH``,
    ``password_env``): a path or a variable's name is no secret."""
    words = [w for w in _WORD_SPLIT_RE.split(name) if w]
    return bool(words) and words[-1].lower() in _WHERE_WORDS


def names_secret(name: str) -> bool:
    """Whether one of the *words* of ``name`` names a secret (``HF_TOKEN``, ``apiKey``,
    ``db-password``): the stricter test, under which a number is masked too (``max_tokens``,
    ``num_keys`` and ``TOKENIZERS_PARALLELISM`` count or configure things)."""
    if names_where(name):
        return False
    words = [w.lower().rstrip("0123456789") for w in _WORD_SPLIT_RE.split(name)]
    for w, after in zip(words, [*words[1:], ""]):
        if w == "key" and after in ("value", "values"):  # num_key_value_heads: a model's shape
            continue
        if w in _SECRET_WORDS or (w and w.endswith(_SECRET_WORD_ENDINGS)):
            return True
    return last_word_secret(name)


def names_password(name: str) -> bool:
    """Whether ``name`` names a secret a person chose (``DB_PASSWORD``, ``PIN_PASSWORD``,
    ``MYSQL_PWD``, ``ssh_passphrase``): its value is one even when it reads as a word or a number."""
    words = [w.lower().rstrip("0123456789") for w in _WORD_SPLIT_RE.split(name) if w]
    return any(w.endswith(_PASSWORD_WORDS) for w in words) or (bool(words) and words[-1] in ("pwd", "pw", "pass"))


def text_secret_name(name: str) -> bool:
    """Whether a text under ``name`` is masked: :func:`is_secret`, but for plurals ("known keys: job,
    state", "tokens: 512k") and exceptions ("KeyError: 'step'"), which list, count or explain."""
    return (is_secret(name) and not name.upper().rstrip("0123456789_").endswith(_PLURALS)
            and not name.endswith(_EXCEPTION_ENDINGS) and not names_where(name))


def masks_key(key: str, value: Any) -> bool:
    """Whether a mapping's ``value`` under ``key`` is shown as :data:`REDACTED`: anything (a text,
    a number, a list) under a secret-named key (:func:`names_secret`: ``{"tokenizers": "0.15"}``,
    a package's version, stays); an empty one stays."""
    return value is not None and value != "" and (names_secret(key) or shell_dir_secret(key, value))
