"""Bytes -> complete lines: :class:`LineSplitter`, the one splitter for the job's pipes
(:mod:`.output`) and tailed files (:mod:`supervisor.watch.tail`). Apart so a tailer splits lines
as the pipes do without importing the output path and its keeper.
"""

from __future__ import annotations

MAX_LINE = 64 * 1024  # longer lines are cut (head kept): a 10 MB line costs bounded memory

TRUNCATED_MARKER = " ...[line truncated]"


class LineSplitter:
    """Bytes -> complete decoded lines, keeping the partial tail; caps line length.

    The one splitter for pipes and tailed files. Whole chunks are decoded and split at once (C
    speed); UTF-8 errors become U+FFFD. A carriage return ends a line as a newline does: a tqdm
    progress bar redraws itself with ``\r`` and never prints ``\n`` while training, so without
    this its updates (the only sign of progress some trainers give) would pile up in one
    unterminated line until the run ends. ``\r\n`` is one terminator, and the blank segments a
    bar leaves when it clears itself are dropped. The log file copy is made from the raw bytes,
    not from these lines, so it stays byte-exact. A line longer than ``max_line`` bytes is
    delivered once, cut, with TRUNCATED_MARKER, and the rest of it skipped, so the held tail never
    exceeds ``max_line`` (a 10 MB line costs bounded memory).
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._tail = b""
        self._dropping = False  # inside an over-long line: skip until its terminator
        self._after_cr = False  # the last chunk ended in \r: a leading \n completes that \r\n
        self._provisional: str | None = None  # a held bar redraw already delivered (see push)
        self.truncated = 0

    @property
    def pending(self) -> int:
        return len(self._tail)

    def _cut(self, head: bytes | str) -> str:
        self.truncated += 1
        text = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
        return text[: self.max_line] + TRUNCATED_MARKER

    def _hold(self, tail: bytes, out: list[str]) -> None:
        if len(tail) > self.max_line:
            out.append(self._cut(tail[: self.max_line]))
            self._dropping = True
            tail = b""
        self._tail = tail

    def push(self, chunk: bytes) -> list[str]:
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._after_cr = False
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n")
        has_cr = b"\r" in data
        if has_cr:
            cut = max(cut, data.rfind(b"\r"))
        out: list[str] = []
        if cut < 0:
            if self._dropping:
                self._tail = b""
            else:
                self._hold(data, out)
            return out
        complete, tail = data[:cut], data[cut + 1:]
        if has_cr:
            self._after_cr = data[cut:cut + 1] == b"\r" and not tail
            if complete.endswith(b"\r") and data[cut:cut + 1] == b"\n":
                complete = complete[:-1]  # \r\n: one terminator
            text = complete.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
            lines = text.split("\n")
            if self._dropping:
                lines = lines[1:]  # the rest of the over-long line
                self._dropping = False
            # Blank segments are a progress bar clearing its line, not output worth a batch slot.
            lines = [x for x in lines if x.strip()]
        else:
            lines = complete.decode("utf-8", "replace").split("\n")
            if self._dropping:
                lines = lines[1:]  # the rest of the over-long line
                self._dropping = False
        if len(complete) > self.max_line:
            lines = [x if len(x) <= self.max_line else self._cut(x) for x in lines]
        if self._provisional is not None:
            if lines and lines[0] == self._provisional:
                lines = lines[1:]  # delivered already, when it was the held redraw
            self._provisional = None
        out.extend(lines)
        self._hold(tail, out)
        if has_cr and tail and data[cut:cut + 1] == b"\r" and not self._dropping and b"\n" not in tail:
            # A progress bar writes "\r<bar>" and no terminator until its next redraw: the held
            # tail is the bar as the terminal shows it now, and it may be the last thing a hung
            # job ever prints. Deliver it now; the same text completed later is not repeated.
            self._provisional = tail.decode("utf-8", "replace")
            if self._provisional.strip():
                out.append(self._provisional)
        return out

    def flush(self) -> list[str]:
        tail, self._tail = self._tail, b""
        dropping, self._dropping = self._dropping, False
        self._after_cr = False
        provisional, self._provisional = self._provisional, None
        if tail and not dropping:
            text = tail.decode("utf-8", "replace")
            return [] if text == provisional else [text]
        return []
