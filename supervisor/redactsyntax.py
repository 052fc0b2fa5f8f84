"""Where a secret is written in a job's text (issue 24 build 4, issue 34): the syntaxes around a
secret-named key and the command lines that carry a password. :mod:`supervisor.redact` is the gate
that calls :func:`mask_names` and :func:`mask_commands` (its docstring says the whole rule); which
names are secrets' is :mod:`supervisor.redactnames`'. Kept apart so each module stays one concern.

A secret-named key's value is masked in every syntax a Python job prints: ``k=v``, ``k: v``,
``'k': 'v'``, ``"k": "v"``, ``Namespace(k='v')``, ``--k v``, ``--k=v``, ``k => v``, ``k -> v``,
``k := v``, ``k == v``, URL-encoded ``k%3Dv``; a subscript (``os.environ["HF_TOKEN"] = v``,
``secrets['db_password']='v'``, ``secrets [ 'db_password' ] = 'v'``); a call's quoted name then
its value (``os.putenv('HF_TOKEN', v)``, ``os.environ.setdefault(...)``, ``os.environ.get("HF_TOKEN",
default="v")``, ``setattr(cfg, 'api_key', v)``: the name's opening quote is needed, so
``"the key", x`` stays); the word ``pass`` as a key or a flag (``pass=v``, openssl's ``pass:v`` and
``--pass v``; not ``pass 2 of 3``, ``pass: ok``, ``--pass-through``). A quoted value is read to its
closing quote past escaped ones (``"a\\"b"``), triple quotes too (``'''v'''``), with a bytes or raw
prefix (``b'v'``); a tuple or list whole (``auth=('u', 'pw')``) after an operator, not after
spaces (``secrets ['k']`` is a subscript). A name with only spaces before a value that is no
secret's (``the token expired``) gives the value back to be read as a name itself.
XML: an element named for a secret (``<password>v</password>``, its text in CDATA too), or whose
``name``/``key`` attribute is (Android's ``<string name="password">v</string>``, Java's ``<entry
key="password">v</entry>``), an attribute pair (.NET's ``<add key="Password" value="v"/>``,
``<param name="token" value='v'/>``), each HTML-escaped too (``&lt;password&gt;v&lt;/password&gt;``).
Commands: mysql's and mariadb's glued ``-pX``, sshpass's and MongoDB's tools' ``-p X``, redis-cli's ``-a X``
(in a command that runs their client only; in an argv too: :func:`argv_passwords`).
Every regex is linear in its input (possessive and atomic parts, bounded runs). Pure.
"""
from __future__ import annotations

import re
from typing import Sequence

from .redactnames import (NOT_SECRETS, SECRET_MARKERS, SHELL_DIRS, is_secret, last_word_secret, names_secret, shell_dir_secret,
                          text_secret_name)
from .redactprose import call_value, mask_calls, mask_sentences

__all__ = ["NUMBER_RE", "REDACTED", "argv_passwords", "mask_commands", "mask_names"]

REDACTED = "<redacted>"
NUMBER_RE = re.compile(r"[-+]?\d[\d.,]*(?:e[-+]?\d+)?%?", re.IGNORECASE)

# mysql's password glued to its -p (``mysql -uroot -pX db``; ``-p X`` prompts, X is the database),
# in a command that runs a mysql or mariadb client only: elsewhere -pX is anything (ssh's port, a path).
_MYSQL_RE = re.compile(r"(?i)\b(?:mysql|mariadb)(?:dump|admin|import|check|show|slap|pump|sh)?+\b")
_CMD_END_RE = re.compile(r"[\n;|&]")  # where that command ends
_GLUED_P_RE = re.compile(r"(?<=\s)(-p['\"]?)([^\s'\"]++)")
# curl's user and password (``curl -u admin:PW``, ``--user admin:PW``, ``-uadmin:PW``): the password
# goes. In a curl command only: elsewhere ``-u 1000:1000`` is docker's uid:gid.
_CURL_RE = re.compile(r"(?i)\bcurl\b")
_CURL_USER_RE = re.compile(r"(?<=\s)(-u\s*+['\"]?[^\s:'\"]{0,256}+:|--user(?:=|\s++)['\"]?[^\s:'\"]{0,256}+:)([^\s'\"]++)")
# sshpass's ``-p PW`` / ``-pPW`` (elsewhere ``-p 8080`` is a port).
_SSHPASS_RE = re.compile(r"(?i)\bsshpass\b")
_SSHPASS_P_RE = re.compile(r"(?<=\s)(-p\s*+['\"]?)([^\s'\"]++)")
# ``wandb login KEY`` (its flags before the key skipped): a key has digits and 12 characters or more.
_WANDB_RE = re.compile(r"(?i)\bwandb\s++login\b")
_WANDB_KEY_RE = re.compile(r"\A((?:\s++--?[\w-]++)*+\s++['\"]?)(?=[^\s'\"]*?\d)([^\s'\"-][^\s'\"]{11,}+)")
# MongoDB's tools' ``-p PW`` / ``-pPW`` (mongo, mongosh, mongodump, ...), redis-cli's ``-a PW`` / ``-aPW``.
_MONGO_RE = re.compile(r"(?i)\bmongo(?:sh|dump|restore|export|import|stat|top|files)?+\b")
_REDIS_RE = re.compile(r"(?i)\bredis-cli\b")
_REDIS_A_RE = re.compile(r"(?<=\s)(-a\s*+['\"]?)([^\s'\"]++)")
#: (a word that must be in the text, the command, its password argument).
_COMMANDS = (("mysql", _MYSQL_RE, _GLUED_P_RE), ("mariadb", _MYSQL_RE, _GLUED_P_RE), ("curl", _CURL_RE, _CURL_USER_RE),
             ("sshpass", _SSHPASS_RE, _SSHPASS_P_RE), ("wandb", _WANDB_RE, _WANDB_KEY_RE),
             ("mongo", _MONGO_RE, _SSHPASS_P_RE), ("redis-cli", _REDIS_RE, _REDIS_A_RE))

# The same clients in an argv, whose arguments are masked one by one (the text rules above need
# the client's name in the same text): which short option is the password, and whether its value
# may be the next argument (``-p PW``) or only glued to it (``-pPW``). A bare ``-p`` is ambiguous
# and left alone everywhere else, on purpose: it is a port for psql, redis-cli, ssh and most
# servers (``-p 8080``), docker's publish, mkdir's parents; and mysql's ``-p X`` prompts for the
# password and X is the database. So ``-p`` is read as a password only in the arguments after a
# client that reads it so, once (``sshpass -p PW ssh -p 22 host``: 22 is ssh's port), up to the
# next shell separator; ``--password X`` / ``--passwd X`` / ``--pass X`` go by their names anywhere
# (``redact.redact_argv``; psql's ``--password`` is a switch, so its next word is masked too: a
# small price).
_ARGV_PASSWORD = {"mysql": ("-p", False), "mariadb": ("-p", False), "sshpass": ("-p", True), "mongo": ("-p", True),
                  "redis-cli": ("-a", True)}
_ARGV_CLIENT_RE = re.compile(r"(?i)(?:mysql|mariadb)(?:dump|admin|import|check|show|slap|pump|sh)?|sshpass"
                             r"|mongo(?:sh|dump|restore|export|import|stat|top|files)?|redis-cli")
_ARGV_SEPARATORS = frozenset({";", "|", "&&", "||", "&"})


def argv_passwords(argv: Sequence[str]) -> dict[int, int]:
    """The arguments of ``argv`` that are a client's password (see :data:`_ARGV_PASSWORD`): index ->
    how many of its first characters stay shown (``-pPW`` keeps ``-p``; ``PW`` after ``-p`` none)."""
    out: dict[int, int] = {}
    flag, spaced = "", False
    for i, arg in enumerate(argv):
        if arg in _ARGV_SEPARATORS:
            flag = ""
            continue
        name = arg.rsplit("/", 1)[-1].removesuffix(".exe")
        if _ARGV_CLIENT_RE.fullmatch(name):
            client = name.lower()
            key = next(k for k in _ARGV_PASSWORD if client.startswith(k))
            flag, spaced = _ARGV_PASSWORD[key]
            continue
        if not flag:
            continue
        if arg == flag and spaced and i + 1 < len(argv):
            out[i + 1], flag = 0, ""  # one password a client: sshpass's command after it has its own -p
        elif arg.startswith(flag) and len(arg) > len(flag) and i not in out:
            out[i], flag = len(flag), ""
    return out
# A prompt's answer echoed: ``Password for user admin: X``, ``Passphrase for key '/k': X``.
_PROMPT_RE = re.compile(r"(?i)\b((?:password|passphrase) for [^:\n]{1,128}+:[ \t]*+)([^\s<][^\s]*+)")
# An HTML password field's value (``<input type="password" value="X">``), attributes in any order.
_INPUT_RE = re.compile(r"(?i)<input\b[^<>\n]{0,1024}+>")
_INPUT_PASSWORD_RE = re.compile(r"(?i)\btype\s*=\s*['\"]?password\b")
_INPUT_VALUE_RE = re.compile(r"(?i)(\bvalue\s*=\s*['\"]?)([^'\"\s>]++)")

# An element's text: a CDATA section whole (``]]>`` ends it), or text up to the next tag.
_XML_TEXT = r"(?P<v><!\[CDATA\[(?:[^\]\n]|\](?!\]>))*+\]\]>|[^<\n]{1,4096}+)"
# An XML element (``<password>X</password>``, ``<apiKey a="b">X</apiKey>``, ``<string name="k">X</string>``).
_XML_RE = re.compile(r"<(?P<tag>[A-Za-z_][\w:.-]{0,63}+)(?P<attrs>\s[^<>\n]{0,256}+)?>" + _XML_TEXT
                     + r"</(?P=tag)>")
# The same HTML-escaped, as a web page or an escaped log shows it (``&lt;password&gt;X&lt;/password&gt;``).
_XML_ESCAPED_RE = re.compile(r"(?i)&lt;(?P<tag>[A-Za-z_][\w:.-]{0,63}+)(?P<attrs>\s(?:[^&<>\n]|&(?!gt;)){0,256}+)?"
                             r"&gt;(?P<v>(?:[^&<\n]|&(?!lt;)){1,4096}+)&lt;/(?P=tag)&gt;")
# The attribute that names an element's content (``name="password"``, ``key='api_key'``).
_NAME_ATTR_RE = re.compile(r"(?i)(?<![\w-])(?:name|key)\s*=\s*(['\"])([^'\"<>\n]{1,128}+)\1")
# A name/key attribute and a value attribute of one element, in either order, with at most 8 other
# attributes between them (``<add key="Password" value="X"/>``, ``<add key="Password"
# xdt:Transform="Replace" value="X"/>``, ``<add value="X" key="Password"/>``). Each attribute
# between is possessive and counted: no backtracking into a long run of them.
_OTHER_ATTRS = r"(?:(?!(?:name|key|value)\s*=)[\w:.-]{1,64}+\s*=\s*(?:'[^'<>\n]*+'|\"[^\"<>\n]*+\")\s++){0,8}+"


def _name_attr(n: str) -> str:
    return rf"(?<![\w:.-])(?:name|key)\s*=\s*(?P<q{n}>['\"])(?P<{n}>[^'\"<>\n]{{1,128}}+)(?P=q{n})"


def _value_attr(v: str) -> str:
    return rf"(?<![\w:.-])value\s*=\s*(?P<{v}>'[^'\n]*+'|\"[^\"\n]*+\")"


_ATTR_PAIR_RE = re.compile(rf"(?i){_name_attr('n')}\s++{_OTHER_ATTRS}{_value_attr('v')}"
                           rf"|{_value_attr('v2')}\s++{_OTHER_ATTRS}{_name_attr('n2')}")

# name (a marker anywhere in it, or a last word ending it), then what joins it to its value: a
# subscript's or dict key's closing quote (escaped or not, a "]" after spaces) then "=", ":", "=>",
# "->", ":=", "==", a URL-encoded "=" or ":"; a quoted name's closing quote then a comma (a call's
# arguments, a keyword ``default=`` allowed); or spaces (``sp``). Then the value: quoted (triple
# quotes first; a bytes/raw prefix allowed, backslash escapes read as such, up to its closing quote
# or the line's end), a tuple or list after an operator (``auth=('user', 'pw')``), or bare. The name
# is atomic: on a long word of markers ("keykeykey...") it is tried once per word, not once per marker.
_SECRET_ASSIGN_RE = re.compile(
    r"(?i)\b(?P<name>(?>\w*?(?:(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|PASSPHRASE)\w*+"
    r"|(?:PASS[ \t]PHRASE|PWD?|PASS|AUTH|COOKIES?|SESS(?:ION)?_?ID)\b)))"
    r"(?P<sep>(?:\\?['\"](?:\s*+\])?)?\s*(?:=>|->|:=|%3[AD]|==?|:)[ \t]*|\\?['\"]\s*,\s*(?:default\s*=\s*)?"
    r"|(?P<sp>[ \t]+))"
    r"(?P<q>(?:[BRU]{1,2}|\\)?(?:'''|\"\"\"|['\"])|)"
    r"(?P<v>(?<=''')(?:[^'\\\n]|\\.|'(?!''))++|(?<=\"\"\")(?:[^\"\\\n]|\\.|\"(?!\"\"))++"
    r"|(?<=')(?:[^'\\\n]|\\.)++|(?<=\")(?:[^\"\\\n]|\\.)++"
    r"|(?(sp)(?!)|(?:\([^()\n]{1,512}+\)|\[[^\[\]\n]{1,512}+\]))"
    r"|[^\s'\",;|)}\]{\[]++)")
# After a name with only spaces between, a value is taken for a secret only if it looks like one
# (a digit or a symbol): "my password hunter2" goes, "the token expired" stays.
_LOOKS_SECRET_RE = re.compile(r"[0-9_/+=@:-]")
_STRONG_MARKERS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL")
_NESTED_MAX = 256  # the longest value of a name that is no secret's read again for names inside it
# What follows the word "pass" in prose and test output: results and counts, not passwords.
_PASS_WORDS = frozenset({"ok", "fail", "failed", "pass", "passed", "skip", "skipped", "error", "none", "done"})
# Where openssl's -pass/-passin read a password from, no password itself (``-passin env:VAR``, ``file:/p``).
_PASS_SOURCES_RE = re.compile(r"(?i)(?:env|file|fd):\S*+|stdin")
NAME_MARKS = (*SECRET_MARKERS, "PW", "PASS", "AUTH", "COOKIE", "SESS")


def mask_commands(text: str) -> str:
    """The passwords of the command lines that take one as an argument (:data:`_COMMANDS`), masked
    in each command that runs such a client (to its line's end or a ``;``, ``|``, ``&``)."""
    low = text.lower()
    for word, command_re, arg_re in _COMMANDS:
        if word in low:
            text = _mask_command(text, command_re, arg_re)
    return text


def _mask_command(text: str, command_re: re.Pattern[str], arg_re: re.Pattern[str]) -> str:
    out: list[str] = []
    pos = 0
    for m in command_re.finditer(text):
        if m.start() < pos:
            continue
        stop = _CMD_END_RE.search(text, m.end())
        end = len(text) if stop is None else stop.start()
        out += [text[pos:m.end()], arg_re.sub(lambda g: f"{g.group(1)}{REDACTED}", text[m.end():end])]
        pos = end
    return "".join(out) + text[pos:] if out else text


def _secret_text(name: str, value: str) -> bool:
    """Whether ``value`` under ``name`` is masked: a number only under a word of a secret's name."""
    if value.strip().lower() in NOT_SECRETS or value == REDACTED:
        return False
    return names_secret(name) or (text_secret_name(name) and not NUMBER_RE.fullmatch(value.strip()))


def _xml(m: re.Match[str]) -> str:
    """An element's text masked when its tag, or its ``name``/``key`` attribute, names a secret."""
    v = m["v"]
    cdata = v.startswith("<![CDATA[")
    inner = v[9:-3] if cdata else v
    named = _secret_text(m["tag"], inner)
    if not named and m["attrs"]:
        a = _NAME_ATTR_RE.search(m["attrs"].replace("&quot;", '"').replace("&#39;", "'"))
        named = a is not None and _secret_text(a[2], inner)
    if not named:
        return m.group(0)
    whole, at = m.group(0), m.start()
    shown = "<![CDATA[" + REDACTED + "]]>" if cdata else REDACTED
    return whole[:m.start("v") - at] + shown + whole[m.end("v") - at:]


def _attr_pair(m: re.Match[str]) -> str:
    vg, ng = ("v", "n") if m["v"] is not None else ("v2", "n2")
    v = m[vg]
    if not _secret_text(m[ng], v[1:-1]):
        return m.group(0)
    at, end = m.start(vg) - m.start(), m.end(vg) - m.start()
    return m.group(0)[:at] + v[0] + REDACTED + v[0] + m.group(0)[end:]


def _word_before(text: str, start: int) -> str:
    """The part of the whitespace-separated word that ends at ``start`` (at most 256 characters
    looked at): ``--api-`` for ``--api-key``, ``/run/wrong-`` for a path's file name. A name at
    the end of a path is no secret's name (``/run/wrong-password (authentication failed)``)."""
    j = start
    while j > 0 and start - j < 256 and not text[j - 1].isspace():
        j -= 1
    return text[j:start]


def _quoted_name(text: str, start: int, quote: str) -> bool:
    """Whether the name at ``start`` opens with ``quote``, a flag's dashes and words before it
    allowed: ``'db_password', x``, and an argv list's ``['--password', 'x']``, ``("--api-key", "x")``."""
    j = start
    while j > 0 and start - j < 64 and (text[j - 1] == "-" or text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    return j > 0 and text[j - 1] == quote


def _names_a_key(m: re.Match[str]) -> bool:
    """Whether the bare value is a secret's key itself (``secrets: password: X``): it is read as the
    name, so its own value goes, not the key."""
    v = m["v"]
    k = v.rstrip(":=")  # one key, bounded: "keys:keys:..." is one value (no quadratic re-reading)
    return not m["q"] and 1 < len(v) <= 128 and v[-1] in ":=" and ":" not in k and "=" not in k and is_secret(k)


def _mask_assign(m: re.Match[str]) -> str:
    name, sep, value, q = m["name"], m["sep"], m["v"], m["q"]
    if value == REDACTED or (not q and (value.lower() in NOT_SECRETS or call_value(value, m.string, m.end()))):
        return m.group(0)  # api_key=None; api_key=os.getenv('K'): a call, its literals read by mask_calls
    if _names_a_key(m):
        return m.group(0)
    name = name.replace(" ", "").replace("\t", "")  # "pass phrase" is a passphrase (shown as written)
    if "," in sep and not _quoted_name(m.string, m.start(), sep.lstrip("\\")[0]):
        return m.group(0)  # "the key", x: a quoted phrase, not a quoted name
    if name.lower().endswith("pass") and last_word_secret(name) and (
            # ("--pass X" is a flag's password; "-pass pass:X" says where it is, read on)
            (not sep.strip() and (not _word_before(m.string, m.start()).startswith("-")
                                  or value.lower().startswith("pass:")))
            or value.lower() in _PASS_WORDS or (NUMBER_RE.fullmatch(value) and len(value) < 6)
            or _PASS_SOURCES_RE.fullmatch(value)):
        # "pass 2 of 3", "pass: ok", "pass=1": the word, not a password's name ("-pass pass:X" read on)
        return m.group(0) if len(value) > _NESTED_MAX else f"{m['name']}{sep}{q}{_SECRET_ASSIGN_RE.sub(_mask_assign, value)}"
    if name.upper() in SHELL_DIRS:
        if not shell_dir_secret(name, value):
            return m.group(0)
    elif NUMBER_RE.fullmatch(value):
        if not names_secret(name):  # tokens=12345678, max_tokens 512: counts, not secrets
            return m.group(0)
    elif not text_secret_name(name):  # a value after "KeyError: " or "keys: " may name a secret itself
        if len(value) > _NESTED_MAX:  # bounded, so "keys:keys:..." is no quadratic descent
            return m.group(0) if not any(k in value.upper() for k in NAME_MARKS) else f"{m['name']}{sep}{q}{REDACTED}"
        return f"{m['name']}{sep}{q}{_SECRET_ASSIGN_RE.sub(_mask_assign, value)}"
    elif not sep.strip():
        # "hf_token abc", "--api-key abc" and "my password hunter2" name a secret; prose such as
        # "tokenizer loaded" or "the token expired" does not: with only spaces between, the name
        # must end with the marker and the value look like a secret (or follow a flag's dash).
        word = _word_before(m.string, m.start())  # what the name is the end of: a flag, a path
        flag = word.startswith("-")
        if not flag and value.rstrip(":=").lower() in ("is", "was"):
            return m.group(0)  # "password was: X": a sentence's (mask_sentences), X read on its own
        bare = name.upper().rstrip("0123456789_")
        ends = bare.endswith(SECRET_MARKERS) or last_word_secret(name)
        # An identifier's quoted value (``db_secret "X"``) is its value, whatever it reads as.
        ident = q and ("_" in name or "-" in name) and bare.endswith(_STRONG_MARKERS)
        if "/" in word or (not q and value.startswith("-")) or not (flag or ident or (ends and _LOOKS_SECRET_RE.search(value.rstrip(".!?")))):
            return m.group(0)
    return f"{m['name']}{sep}{q}{REDACTED}"


def _assignments(text: str) -> str:
    """Each secret-named key's value masked. A name followed by spaces and a value that is none of
    its (``the token password=x``, ``secrets ['k'] = x``) is read on from that value, which may
    be a name itself: each word is looked at twice at most, so this stays linear."""
    out: list[str] = []
    pos = at = 0
    while (m := _SECRET_ASSIGN_RE.search(text, at)) is not None:
        shown = _mask_assign(m)
        if shown == m.group(0) and m["sp"] is not None:
            at = m.start("v")  # quoted too: 'secret "password": "X"' reads "password" as the name
            continue
        if shown == m.group(0) and _names_a_key(m):
            at = m.start("v")  # "secrets: password: X": the value is the next name
            continue
        out += [text[pos:m.start()], shown]
        pos = at = m.end()
    return "".join(out) + text[pos:] if out else text


def mask_names(text: str) -> str:
    """The values of secret-named keys, elements and attributes, and the secrets said with no key
    (:mod:`supervisor.redactprose`: a secret-named call's literals, "the password is X"), masked."""
    up = text.upper()
    if not any(mark in up for mark in NAME_MARKS):
        return mask_calls(text) if "LOG" in up or "SIGNIN" in up else text
    if "</" in text:
        text = _XML_RE.sub(_xml, text)
    if "&LT;/" in up:
        text = _XML_ESCAPED_RE.sub(_xml, text)
    if "VALUE" in up:
        text = _ATTR_PAIR_RE.sub(_attr_pair, text)
        if "<INPUT" in up:
            text = _INPUT_RE.sub(_input, text)
    if " FOR " in up:
        text = _PROMPT_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return _assignments(mask_sentences(mask_calls(text)))


def _input(m: re.Match[str]) -> str:
    tag = m.group(0)
    if not _INPUT_PASSWORD_RE.search(tag):
        return tag
    return _INPUT_VALUE_RE.sub(lambda v: f"{v.group(1)}{REDACTED}", tag)
