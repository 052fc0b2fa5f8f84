"""Secrets said with no key before them (issue 34, the seventh review): a literal passed to a
secret-named call, and a sentence that says what a password is. :mod:`supervisor.redactsyntax`'s
:func:`~supervisor.redactsyntax.mask_names` calls both before it reads ``key = value`` forms; which
names are secrets' is :mod:`supervisor.redactnames`'. Kept apart so each module stays one concern.

Calls (:func:`mask_calls`): the quoted positional arguments of a call whose callee's name is a
secret's by the words of its name (:func:`~supervisor.redactnames.names_secret`, the rule a
mapping's key is read by): ``set_password('pw')``, ``keyring.set_password('svc', 'user', 'pw')``,
``HfFolder.save_token('t')``, ``Secret("s")``, ``check_password_hash(h, 'pw')``, ``set_api_key('k')``;
the names that rule keeps are kept here (``tokenizer("hi")``, ``key_file("/p")``). Decided, narrower
than a key's name (a call's literal is what the call works on, a key's value is what it names): a
callee whose last word counts or looks up (``token_count("hello")``, ``token_to_id("hello")``,
``reset_password_count(3)``) stays, though ``token_count=hello`` goes; the word ``key`` alone is no
secret's in a callee (``cache_key("m")``, ``gen_key("rsa")``, ``key("x")``), only after ``api``,
``private``, ``secret``, ``access`` and the like. An exception's name says what went wrong
(``KeyError('step')``, ``TokenExpiredError("...")``): kept. A login call's literals go whole, weaker by design
(``client.login(user, "pw")``, ``huggingface_hub.login("hf_...")``, ``smtp.login("me", "pw")``: the
user's name goes with its password; the callee's last word ``login``, ``logon``, ``signin`` or
``authenticate``). A keyword argument is read by its own name (``login(token='t')`` goes by
``token``, ``save_token('t', repo='org/m')`` keeps ``org/m``). A tokenizer's special token is no
secret (``AddedToken("<|endoftext|>")``, ``token_to_id("[PAD]")``). A call as a value is no value
(``api_key=os.getenv('WANDB_API_KEY')``: :func:`call_value`).

Sentences (:func:`mask_sentences`): the word after ``password``/``passwd``/``passphrase``/
``secret``/``api key`` and ``is`` or ``was`` (``the password is hunter2``, ``Password was:
'x'``), unless it reads as English (a small list of the words said of a password, a word ending in
``-ed``/``-ing``/``-ly``, or a length, ``password is 8 characters``): ``the password is required``,
``password was reset``, ``the secret is out`` stay; ``the password is swordfish`` goes (a lowercase
word not on the list), as does anything with a digit, a symbol or an inner capital. ``token is``
is not read so (``the token is <unk>``, ``token is 50256``: a vocabulary's words). Every regex is
linear in its input (possessive parts, bounded runs). Pure.
"""
from __future__ import annotations

import re

from .redactnames import NOT_SECRETS, names_secret

__all__ = ["call_value", "mask_calls", "mask_sentences"]

REDACTED = "<redacted>"

# A call: its callee's name, then its arguments up to the closing ")" (quoted strings read whole,
# past escaped quotes; a nested call's "(" ends the search: that inner call is read on its own).
_QUOTED = r"'(?:[^'\\\n]|\\.)*+'|\"(?:[^\"\\\n]|\\.)*+\""
_CALL_RE = re.compile(rf"(?<![\w$])(?P<callee>[A-Za-z_]\w{{0,127}}+)[ \t]{{0,4}}+\((?P<args>(?:{_QUOTED}|[^()'\"\n])*+)\)")
_QUOTED_RE = re.compile(_QUOTED)
_ARG_TOKEN_RE = re.compile(rf"(?P<s>{_QUOTED})|(?P<o>[^'\"]++|['\"])")
_LOGIN_WORDS = frozenset({"login", "logon", "signin", "authenticate"})
# A callee's last word that counts or looks up what it is given (``token_count("hi")``, ``token_to_id("hi")``).
_CALLEE_MARKS = ("TOKEN", "KEY", "SECRET", "PASS", "CREDENTIAL", "PWD", "AUTH", "COOKIE", "SESS", "LOGIN", "LOGON",
                 "SIGNIN")
_COUNTING_WORDS = frozenset({"count", "counts", "num", "len", "length", "size", "id", "ids", "index", "type"})
# "key" alone names a cache's, a sort's or a dict's key (``cache_key("m")``, ``gen_key("rsa")``): a secret's
# only after one of these (``set_api_key``, ``load_private_key``, ``secret_key``).
_KEY_QUALIFIERS = frozenset({"api", "private", "secret", "access", "signing", "encryption", "ssh", "master", "license",
                             "auth", "client", "service", "account"})
_EXCEPTION_ENDINGS = ("Error", "Exception", "Warning")
_WORD_SPLIT_RE = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# A tokenizer's special token: <pad>, </s>, <|endoftext|>, [PAD], [CLS].
_SPECIAL_TOKEN_RE = re.compile(r"<\|?/?[\w.-]{1,32}\|?>|\[[A-Za-z_]{2,16}\]")
# A dotted name then "(" as a value, its call closed on the same line: ``os.getenv(``, ``self._key(``.
_CALL_VALUE_RE = re.compile(r"[A-Za-z_][\w.]{0,127}\(")
_CALL_REST_RE = re.compile(r"[^()\n]{0,512}+\)")


def _secret_callee(callee: str) -> bool:
    up = callee.upper()
    if not any(mark in up for mark in _CALLEE_MARKS):  # most calls: no word to split
        return False
    words = [w.lower() for w in _WORD_SPLIT_RE.split(callee) if w]
    if not words or callee.endswith(_EXCEPTION_ENDINGS) or words[-1] in _COUNTING_WORDS:
        return False
    if words[-1] in _LOGIN_WORDS:
        return True
    return names_secret(callee) and any(
        names_secret(w) and (w != "key" or (i > 0 and words[i - 1] in _KEY_QUALIFIERS)) for i, w in enumerate(words))


def _kept_literal(inner: str) -> bool:
    return (not inner or inner == REDACTED or inner.strip().lower() in NOT_SECRETS
            or _SPECIAL_TOKEN_RE.fullmatch(inner) is not None)


def _literal(t: re.Match[str]) -> str:
    s = t.group(0)
    return s if _kept_literal(s[1:-1]) else s[0] + REDACTED + s[0]


def _call(m: re.Match[str]) -> str:
    if not _secret_callee(m["callee"]):
        return m.group(0)
    if "=" not in m["args"]:  # positional arguments only: each literal read alone
        args = _QUOTED_RE.sub(_literal, m["args"])
        return m.group(0) if args == m["args"] else f"{m.group(0)[:m.start('args') - m.start()]}{args})"
    out: list[str] = []
    keyword = False  # the argument read is a keyword's (``name=``): its own name decides
    for t in _ARG_TOKEN_RE.finditer(m["args"]):
        s = t["s"]
        if s is None:
            other = t["o"]
            comma = other.rfind(",")
            if comma >= 0:
                keyword = "=" in other[comma:]
            elif "=" in other:
                keyword = True
            out.append(other)
        elif keyword or _kept_literal(s[1:-1]):
            out.append(s)
        else:
            out.append(s[0] + REDACTED + s[0])
    args = "".join(out)
    return m.group(0) if args == m["args"] else f"{m.group(0)[:m.start('args') - m.start()]}{args})"


def mask_calls(text: str) -> str:
    """The quoted positional arguments of secret-named and login calls masked."""
    return _CALL_RE.sub(_call, text) if "(" in text else text


def call_value(value: str, text: str, end: int) -> bool:
    """Whether a bare ``value`` ending at ``end`` of ``text`` is a call (``os.getenv(`` then its
    arguments and ``)``): no secret itself, its arguments read on their own."""
    return _CALL_VALUE_RE.fullmatch(value) is not None and _CALL_REST_RE.match(text, end) is not None


_SENTENCE_RE = re.compile(
    r"(?i)\b(?:pass(?:word|wd|phrase)|secret|api[ _-]?key)[ \t]++(?:is|was)(?:[ \t]*+[:=][ \t]*+|[ \t]++)"
    r"(?:(?P<q>['\"`])(?P<qv>[^'\"`\n]{1,256}+)(?P=q)|(?P<v>[^\s'\"`]++))")
# What a sentence says of a password that is no password (with -ed, -ing and -ly words, and lengths).
_SENTENCE_WORDS = frozenset("""a an the not no now still too also only just being been set unset required needed
    missing empty blank incorrect invalid wrong correct right valid ok okay fine good bad weak strong short long
    hidden secret safe unsafe secure insecure private public in on at from for to of by with same different
    known unknown case it this that what your my our their his her its and or but here there out available
    unavailable mandatory optional none null nil undefined true false present absent ready done gone pending
    simple complex easy hard visible shown printed active inactive reset sent known given taken stolen lost kept
    found read made told put cut forgotten written""".split())
_LENGTH_RE = re.compile(r"[ \t]++(?:characters?|chars?|digits?|letters?|bytes?|long)\b", re.IGNORECASE)


def _sentence_word(value: str, text: str, end: int) -> bool:
    """Whether the word after "password is" reads as English, or a number as a length."""
    word = value.rstrip(".,;:!?)]")
    low = word.lower()
    if not word or low in _SENTENCE_WORDS or low in NOT_SECRETS or word == REDACTED:
        return True
    if word.isdigit():
        return _LENGTH_RE.match(text, end) is not None
    if word.isalpha() and (word.islower() or (word[0].isupper() and word[1:].islower())):
        return low.endswith(("ed", "ing", "ly"))
    return False


def _sentence(m: re.Match[str]) -> str:
    whole, at = m.group(0), m.start()
    if m["q"] is not None:
        if m["qv"].strip().lower() in NOT_SECRETS or m["qv"] == REDACTED:
            return whole
        return whole[:m.start("qv") - at] + REDACTED + whole[m.end("qv") - at:]
    value = m["v"]
    if _sentence_word(value, m.string, m.end()):
        return whole
    shown = value.rstrip(".,;")  # a sentence's full stop is no part of it
    return whole[:m.start("v") - at] + REDACTED + value[len(shown):]


def mask_sentences(text: str) -> str:
    """The word a sentence says a password, a secret or an API key is (``the password is X``)."""
    low = text.lower()
    if (" is" not in low and " was" not in low) or not ("pass" in low or "secret" in low or "api" in low):
        return text
    return _SENTENCE_RE.sub(_sentence, text)
