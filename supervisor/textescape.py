"""The one escaper of text the job or the world chose (a job's line, a file's name, a reason quoting
either) before it is shown (issue 34): on the console, in ``status``/``history``/``checkpoints``,
in the CLI's own messages, in logfmt and journal lines.

Such text must not drive the reader's terminal or fool the reader's eye: a control character
(C0, DEL, C1: a terminal takes U+0085 for a new line, U+009B for an escape's start), a line or
paragraph separator (U+2028/2029: a new line to ``str.splitlines`` and many viewers), a bidi
control (U+202A-202E, U+2066-2069, U+200E/200F, U+061C: "RIGHT-TO-LEFT OVERRIDE" makes
``step 10 loss 2.3`` read backwards, or a file name's end look like its start), any other
invisible format character (zero-width space, soft hyphen, word joiner, BOM, tag characters that
carry hidden text) and a lone surrogate (from undecodable bytes; an encoder refuses it) are
written as visible escapes: ``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\u202e``, ``\\U000e0041``.
Visible, not dropped: a forged name is a finding. Kept as they are: the zero-width joiner and
non-joiner (U+200C/200D), which scripts and emoji need to be drawn right. Printable text is never
touched, so a line with nothing to escape is returned as it is (the same object). The set is every
character of Unicode categories Cc, Cf, Cs, Zl and Zp but those two joiners (a test checks it
against the running Python's ``unicodedata``).

One escaper, three modes (:class:`Mode`): ``LINE`` for one line of our own output (every such
character escaped, the newline included, so a value stays on its line); ``FIELD`` for a value
whose renderer writes its newlines its own way (logfmt's ``\\n``, a traceback below the console
line): the newline kept, the rest escaped; ``TERMINAL`` for what a terminal would draw of a job's
line: escape sequences (colours, cursor moves, titles) dropped, a line redrawn with ``\\r`` (a
progress bar) reduced to its last drawing, then escaped as ``LINE``. ``--json`` outputs need none
of this: JSON escapes control characters itself, and the reader's program, not a terminal, reads
them. Pure.
"""
from __future__ import annotations

import enum
import re
from typing import Any

__all__ = ["Mode", "escape", "escaped", "without_hidden"]


class Mode(enum.Enum):
    LINE = "line"  # one line: every unsafe character escaped, "\n" included
    FIELD = "field"  # "\n" kept (the renderer writes it its own way), every other one escaped
    TERMINAL = "terminal"  # escape sequences dropped, \r-redraws resolved, then as LINE


# Cc, Cf, Cs, Zl and Zp (Unicode 15), but U+200C/U+200D; tests/test_narration.py checks the set.
_UNSAFE = (r"\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b\u200e\u200f"
           r"\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
           r"\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f")
_LINE_RE = re.compile(f"[{_UNSAFE}]")
_FIELD_RE = re.compile(f"(?!\n)[{_UNSAFE}]")
# An escape sequence: CSI (colours, cursor moves), OSC (a window title, a hyperlink) to its BEL or
# ST, or a two-character one; a lone ESC too. Dropped on a terminal: escaping them would fill the
# console with a progress bar's codes.
_SEQUENCES_RE = re.compile(r"\x1b\[[0-?]*+[ -/]*+[@-~]|\x1b\][^\x07\x1b]*+(?:\x07|\x1b\\)?|\x1b[@-_]?")
# What a reader does not see in a line: escape sequences and invisible format characters (the
# joiners included: ``pass\u200dword`` reads as "password").
_HIDDEN_RE = re.compile(_SEQUENCES_RE.pattern + r"|[\xad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                        r"\u2066-\u206f\ufeff\U000e0001\U000e0020-\U000e007f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _redrawn(text: str) -> str:
    """Each line as a terminal shows it after its ``\\r`` redraws: its last non-empty drawing."""
    return "\n".join(next((seg for seg in reversed(line.split("\r")) if seg), "") for line in text.split("\n"))


def escape(text: str, mode: Mode = Mode.LINE) -> str:
    """``text`` fit to show in ``mode`` (:class:`Mode`): unsafe characters as visible escapes."""
    if mode is Mode.TERMINAL:
        if "\x1b" in text:
            text = _SEQUENCES_RE.sub("", text)
        if "\r" in text:
            text = _redrawn(text)
    pattern = _FIELD_RE if mode is Mode.FIELD else _LINE_RE
    return pattern.sub(_visible, text) if pattern.search(text) else text


def escaped(text: Any) -> str:
    """Any value's text fit for one line of a terminal (:data:`Mode.LINE`)."""
    return escape(str(text))


def without_hidden(text: str) -> str:
    """``text`` as a reader sees it: escape sequences and invisible format characters dropped (the
    redactor reads a name split by one as the name it shows). ``text`` itself when it has none."""
    return _HIDDEN_RE.sub("", text) if _HIDDEN_RE.search(text) else text
