"""Private keys in a job's text (issue 34): the PEM rule of the redaction gate, kept apart from
:mod:`supervisor.redact` (which calls it before names are read) so each module stays one concern.

Masked in one text (:func:`mask_keys`): a private key in PEM whole, wherever its BEGIN line sits
(``config dump: -----BEGIN PRIVATE KEY----- MIIE... -----END PRIVATE KEY-----`` on one line too),
from ``-----BEGIN ... PRIVATE KEY-----`` to the next ``-----END ...-----``, or to the end of its
base64 when cut short; a line that is one token of 40+ base64 characters (a key's body line, its
BEGIN on another stream, in another sample, or nowhere); and such a token amid other text
(``FORGED MIIEow...``, ``[rank0]: 'MIIEow...'``) when it reads as random (:func:`_key_token`).

Over the lines of one stream (:class:`PemStream`): after a line that opens a key with no END after
it, every line of its body (base64, RFC 1421 headers, a quote or a comma around them) is masked,
up to its END line or the first line that is no key's, at most :data:`PEM_MAX_LINES` lines (a body
line with spaces inside too, when its parts read as key material). A body
line may carry the prefix every line of the stream gets (torchrun's ``[rank0]:``, a timestamp): the
part it shares with the text before BEGIN on the opening line (digits read as alike, so a later
stamp or another rank is the same prefix) is kept and the rest read as the body.
Every regex is linear in its input (possessive parts, bounded runs). Pure.
"""
from __future__ import annotations

import re

__all__ = ["PEM_MAX_LINES", "PemStream", "REDACTED", "mask_keys"]

REDACTED = "<redacted>"

#: The most lines of one stream masked after a private key's BEGIN line with no END line yet: a
#: key is ~50 lines (RSA 4096); past this bound the stream is read line by line again.
PEM_MAX_LINES = 200
#: The most characters of a line read for a key's BEGIN, END or body (a line's bound at the sinks).
_SCAN_CHARS = 4096
#: The most characters of the text before BEGIN kept as the stream's line prefix.
_PREFIX_CHARS = 128

# A private key in PEM, whole: its BEGIN line, then the first END line after it; with none (a sample
# line cut short), the body's base64 run (line breaks, "\n" escapes and PEM's own headers included).
PEM_BEGIN_RE = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?-----")
PEM_END_RE = re.compile(r"-----END [^\n-]{1,60}+-----")
# A line inside a key's body: base64, or one of its RFC 1421 headers (Proc-Type:, DEK-Info:), with a
# quote and a comma around it (a key printed as a list of its lines); any other line ends the block
# unsaid, so a BEGIN line cut short does not hide the lines after it.
_PEM_LINE_RE = re.compile(r"\s*+['\"]?+(?:[A-Za-z0-9+/=]{1,128}+|[A-Za-z-]{1,32}+: [ -~]{0,128}+)?['\"]?+,?+\s*+")
# A body line with spaces inside (a key pasted or wrapped with them: ``MIIEow... abc...``): read as
# body when its parts together read as key material (:func:`_spaced_body`), so prose ends the block.
_PEM_SPACED_RE = re.compile(r"\s*+['\"]?+([A-Za-z0-9+/=]{1,128}+(?:[ \t]++[A-Za-z0-9+/=]{1,128}+){1,16}+)['\"]?+,?+\s*+")
_PEM_BODY_RE = re.compile(r"[A-Za-z0-9+/=\s\\:,-]*+")
# A line (or a whole value) that is one token of 40+ base64 characters: a key's body line, whatever
# came before it. Masked whole when it holds an upper- and a lowercase letter and a digit
# (:func:`_key_line`): hex (SHAs) and words stay.
_KEY_LINE_RE = re.compile(r"(?m)^[ \t]*+([A-Za-z0-9+/=]{40,}+)[ \t\r]*+$")
# The same token amid other text: masked when it reads as random (:func:`_key_token`).
_KEY_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{40,}+=*+(?![A-Za-z0-9+/=])")
_B64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def _mixed(token: str) -> bool:
    return any(c.isupper() for c in token) and any(c.islower() for c in token) and any(c.isdigit() for c in token)


def _spaced_body(line: str, pos: int) -> bool:
    """Whether ``line`` from ``pos`` is a body line with spaces inside: base64 parts that together
    hold 16 characters or more, one of 8 or more, both cases and a digit ("Step 5 of 10" is none)."""
    m = _PEM_SPACED_RE.fullmatch(line, pos)
    if m is None:
        return False
    parts = m.group(1).split()
    joined = "".join(parts)
    return len(joined) >= 16 and max(map(len, parts)) >= 8 and _mixed(joined)


def _turns(token: str) -> int:
    """How often the kind of character (lower, upper, digit) changes along ``token``: random
    base64 changes at most characters, words and paths seldom."""
    kinds = [c.isupper() + 2 * c.isdigit() if c.isalnum() else -1 for c in token]
    return sum(1 for a, b in zip(kinds, kinds[1:]) if a != b and a >= 0 and b >= 0)


def _key_line(m: re.Match[str]) -> str:
    """A base64 line masked whole when it reads as key material: an upper- and a lowercase letter
    and a digit, and no path (two "/"-separated words or more, no "+" or "=" padding, that seldom
    change case or turn digits, as random base64 does at most characters:
    ``/mnt/Data/Experiments/run2024/checkpoints`` stays)."""
    token = m.group(1)
    if not _mixed(token):
        return m.group(0)
    if "+" not in token and not token.endswith("=") and len([w for w in token.split("/") if w]) > 1:
        if _turns(token) * 5 < len(token):
            return m.group(0)
    return m.group(0).replace(token, REDACTED)


def _key_token(m: re.Match[str]) -> str:
    """A 40+ base64 token amid other text, masked when it reads as random: mixed case and digits,
    and its kind of character changes at a third of its characters or more (an identifier such as
    ``TransformerEncoderLayer2WithAttentionPooling`` changes at a quarter, a path less)."""
    token = m.group(0)
    return REDACTED if _mixed(token) and _turns(token) * 3 >= len(token) else token


def _pem(text: str) -> str:
    """Each private key in PEM masked whole (linear: one scan for END lines at most)."""
    out: list[str] = []
    pos, no_end_from = 0, len(text) + 1
    while (m := PEM_BEGIN_RE.search(text, pos)) is not None:
        end = PEM_END_RE.search(text, m.end()) if m.end() < no_end_from else None
        if end is None:
            no_end_from = min(no_end_from, m.end())
            stop = _PEM_BODY_RE.match(text, m.end())
            done = stop.end() if stop else m.end()
        else:
            done = end.end()
        out += [text[pos:m.start()], REDACTED]
        pos = done
    return "".join(out) + text[pos:] if out else text


def mask_keys(text: str) -> str:
    """``text`` with private keys masked: PEM blocks whole, base64 key lines, random base64 tokens."""
    if "-----BEGIN " in text:
        text = _pem(text)
    text = _KEY_LINE_RE.sub(_key_line, text)
    return _KEY_TOKEN_RE.sub(_key_token, text)


def _digitless(s: str) -> str:
    return s.translate(_DIGITS)


_DIGITS = str.maketrans("123456789", "000000000")


class PemStream:
    """Where one stream is about a private key: inside its body after a BEGIN line with no END.
    Not thread-safe on its own (its owner holds the lock it reads the stream under)."""

    def __init__(self) -> None:
        self._left = 0  # lines still read as the body
        self._prefix = ""  # the opening line's text before BEGIN, digits as 0

    def inside(self, line: str) -> tuple[str, str] | None:
        """``line`` when it is a key's body line or its END line: (what is shown of it, the text
        after END still to be read as usual, "" for none); else None (the block ended)."""
        if not self._left:
            return None
        head = line[:_SCAN_CHARS]
        end = PEM_END_RE.search(head)
        if end is not None:
            self._left = 0
            keep = self._kept(head[:end.start()])
            return head[:keep] + REDACTED, line[end.end():]
        prefix = self._kept(head)
        for keep in (prefix, 0) if prefix else (0,):
            if _PEM_LINE_RE.fullmatch(head, keep) is not None or _spaced_body(head, keep):
                self._left -= 1
                return head[:keep] + REDACTED if head[keep:].strip() else head, ""
        self._left = 0  # not a key's line: the block ended unsaid (a one-line key cut short)
        return None

    def after(self, line: str) -> None:
        """Read a line that is no body line for a BEGIN that opens a block (no END after it)."""
        if "-----BEGIN " not in line:
            return
        begins = list(PEM_BEGIN_RE.finditer(line, 0, _SCAN_CHARS))
        if begins and PEM_END_RE.search(line, begins[-1].end(), _SCAN_CHARS) is None:
            self._left = PEM_MAX_LINES
            self._prefix = _digitless(line[:min(begins[-1].start(), _PREFIX_CHARS)])

    def _kept(self, line: str) -> int:
        """How much of ``line``'s start is the stream's line prefix: what it shares with the opening
        line's text before BEGIN (digits alike), cut back to its last character that is no base64."""
        n, common = min(len(line), len(self._prefix)), 0
        if not n:
            return 0
        probe = _digitless(line[:n])
        while common < n and probe[common] == self._prefix[common]:
            common += 1
        while common and line[common - 1] in _B64:
            common -= 1
        return common
