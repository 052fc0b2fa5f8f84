"""Saying so when the supervisor cannot see: ``metrics_blind`` and the fix that would end it.

A job whose output no parser understands used to be watched in silence: no NaN, no spike, no
step progress, while the user believed the run protected. :class:`BlindWatch` counts an attempt's
non-empty output lines until a training step is parsed; when ``[detectors] blind_after_lines``
lines, or ``blind_after_s`` seconds of the attempt's run time (from its start, whatever it printed:
a job that prints a banner and then trains in silence is blind too), go by without one,
:meth:`BlindWatch.check` hands out one ``metrics_blind`` notice *per run* (a restart loop must not
repeat it), carrying sample lines (secrets redacted), the formats tried and a ready-to-paste fix:
a ``--metric-regex`` guessed from a sample line that has a number after a loss-like word
(:func:`guess_regex`), else a template, and the files the attempt writes (where its metrics may
be: supervisor.watch.candidates, never the supervisor's own output). When a step is parsed
later, one ``metrics_seen`` notice says so and the blind flag in ``status`` clears.

Counting costs nothing once the attempt has yielded a step (the common case): ``lines`` returns
at once. Notices are taken on the daemon's main loop (``check``), never raised into a reader thread.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..levels import Level
from ..redact import LineMasker, redact_line
from .candidates import Written
from .parsers import MetricParser

#: What the built-in parsers recognise (see :mod:`supervisor.watch.parsers`), named in the notice.
BUILTIN_FORMATS: tuple[str, ...] = ("json", "hf", "progress", "lightning", "tqdm", "csv", "nanogpt", "llmc",
                                    "nanotron", "torchtitan", "megatron", "kv", "generic")
SAMPLES = 5
_SAMPLE_CHARS = 200
_LOSS_RE = re.compile(r"(?i)(?<![A-Za-z])((?:(?:lm|train|training|val|valid|validation|eval|test|total|avg|mean) )?"
                      r"[a-z_/]*loss[a-z_]*)(\s*[=:]\s*|\s+)"
                      r"([-+]?(?:nan|inf(?:inity)?|\d[\d.]*(?:e[-+]?\d+)?))(?![\w.])")
_STEP_RE = re.compile(r"(?i)(?<![A-Za-z_])(global_step|step|iteration|iter|it|batch)(\s*[=:]\s*|\s+)(\d+)")
TEMPLATE_REGEX = r"step[=: ]+(?P<step>\d+).*?loss[=: ]+(?P<loss>[-+.\w]+)"


def redact(line: str) -> str:
    """``line`` with the values of secret-looking names, URL passwords and bearer tokens replaced
    (supervisor.redact, the one place that decides)."""
    return redact_line(line)


def _word(text: str) -> str:
    return r"\s+".join(re.escape(w) for w in text.split())


def _sep(sep: str) -> str:
    """The separator as the line has it (``=``, ``: ``, spaces), a little looser around spaces."""
    mark = sep.strip()
    if not mark:
        return r"\s+"
    return (r"\s*" if sep[0].isspace() else "") + re.escape(mark) + (r"\s*" if sep[-1].isspace() else "")


def guess_regex(line: str) -> str | None:
    """A ``[detectors.parsers]`` regex for ``line`` when it shows a number after a loss-like word
    (``train_loss=nan``, ``lm loss: 7.3``), with the step when a step word precedes a number
    (``iter 60/300``); None otherwise. The guess is checked: it must parse ``line`` back."""
    loss = _LOSS_RE.search(line)
    if loss is None:
        return None
    loss_part = rf"{_word(loss.group(1))}{_sep(loss.group(2))}(?P<loss>[-+.\w]+)"
    step = _STEP_RE.search(line, 0, loss.start())
    if step is not None:
        rx = rf"{_word(step.group(1))}{_sep(step.group(2))}(?P<step>\d+).*?{loss_part}"
    else:
        step = _STEP_RE.search(line, loss.end())
        rx = (rf"{loss_part}.*?\b{_word(step.group(1))}{_sep(step.group(2))}(?P<step>\d+)" if step is not None
              else loss_part)
    try:
        rec = MetricParser([rx], auto=False).parse(line)
    except re.error:
        return None
    return rx if rec is not None and rec.loss is not None else None


@dataclass(frozen=True)
class Notice:
    """An event for the daemon to log, keep in the ledger and show in ``status``."""

    event: str  # metrics_blind | metrics_seen
    level: Level
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


def fix_lines(regex: str | None, *, user_regexes: int, written: Sequence[Written] = (),
              printed: bool = True) -> list[str]:
    """The ways out, most direct first, each ready to paste."""
    rx = regex or TEMPLATE_REGEX
    how = "guessed from the sample line above" if regex else "a template: adapt it to your line"
    toml_rx = f"'{rx}'" if "'" not in rx else repr(rx)
    out = ([f"wrap --metric-regex {shlex.quote(rx)}   ({how}; named groups step, loss, grad_norm, lr, ...)",
            f"or in the config: [detectors.parsers] regexes = [{toml_rx}]"] if printed
           else ["print a line per logged step (e.g. 'step 10 loss 2.31'): the built-in parsers read it"])
    if user_regexes:
        out.append(f"(the {user_regexes} regex(es) already configured matched no line)")
    # Files the attempt wrote (never the supervisor's own output): its metrics may be there.
    text = [w.name for w in written if w.kind == "text"]
    if text:
        out.append(f"the job writes {', '.join(text[:3])}: if its metrics are there, "
                   f"wrap --watch-file {shlex.quote(text[0])} ([job] watch_files)")
    elif not written:
        out.append("if the job writes its metrics to a file: wrap --watch-file 'logs/*.log' ([job] watch_files)")
    other = [f"{w.name} ({'a metric store' if w.kind == 'store' else 'a format no parser here reads'})"
             for w in written if w.kind != "text"]
    if other:
        out.append(f"it also writes {', '.join(other[:3])}: metrics kept only there are not watched")
    out.append("or report them from the script with supervisor.client (docs/jobs.md: the client library)")
    return out


class BlindWatch:
    """The blind bound for one run; ``lines``/``stepped`` under the log watcher's lock (reader
    threads), ``check``/``status`` on the main loop."""

    def __init__(self, after_lines: int, after_s: float, *, user_regexes: Sequence[str] = (),
                 started_at: float | None = None) -> None:
        self.after_lines = after_lines
        self.after_s = after_s
        self._started_at = started_at  # the attempt's start (the watcher's clock); None: none running
        self.user_regexes = tuple(user_regexes)
        self._lock = threading.Lock()
        self._announced = False  # metrics_blind said once per run
        self._blind: dict[str, Any] | None = None  # status while blind
        self._seen_pending: tuple[str, str, int | None] | None = None
        # Set by the watch concern: the files the current attempt wrote (for --watch-file).
        self.find_written: Callable[[], Sequence[Written]] | None = None
        self._attempt_reset()

    def _attempt_reset(self) -> None:
        self._stepped = False
        self._lines = 0
        self._first_at: float | None = None
        self._last_at: float | None = None
        self._lossy: deque[str] = deque(maxlen=SAMPLES)  # lines with a loss-like word and a number
        self._numeric: deque[str] = deque(maxlen=SAMPLES)  # lines with a digit
        self._recent: deque[str] = deque(maxlen=SAMPLES)
        self._stream = LineMasker()  # this attempt's output as one stream, for secrets over several lines

    @property
    def enabled(self) -> bool:
        return self.after_lines > 0 or self.after_s > 0

    def reset(self, now: float | None = None) -> None:
        """A new attempt, started at ``now``: its own count and its own run time (the per-run
        notice stays said)."""
        with self._lock:
            self._attempt_reset()
            self._started_at = now

    def ended(self) -> None:
        """The attempt is over: no run time passes until the next one starts."""
        with self._lock:
            self._started_at = None

    def lines(self, lines: Sequence[str], now: float) -> None:
        """A batch of output lines (any source) before the attempt's first step."""
        if self._stepped or self._blind is not None or not self.enabled:
            return  # nothing more to learn: a step was seen, or the notice was given
        with self._lock:
            n = 0
            for line in lines:
                if line and not line.isspace():
                    n += 1
            if not n:
                return
            if self._first_at is None:
                self._first_at = now
            self._last_at = now
            self._lines += n
            shown_from = max(0, len(lines) - 3 * SAMPLES)  # the latest lines show the steady state; bounded work
            for line in lines[:shown_from]:
                self._stream.skip(line)  # a private key's BEGIN there masks its body below
            for line in lines[shown_from:]:
                s = line.strip()
                if not s:
                    continue
                # Masked as it is cut (a split URL password too), with the lines before it (a PEM key's body).
                s = self._stream.line(s, limit=_SAMPLE_CHARS)
                self._recent.append(s)
                if any(c.isdigit() for c in s):
                    self._numeric.append(s)
                    if _LOSS_RE.search(s):
                        self._lossy.append(s)

    def stepped(self, source: str, fmt: str, step: int | None) -> None:
        """A training step (or a metric record) was parsed."""
        if self._stepped:
            return
        with self._lock:
            self._stepped = True
            if self._blind is not None:
                self._seen_pending = (source, fmt, step)

    def check(self, now: float, formats_seen: Mapping[str, int] | None = None) -> Notice | None:
        """The notice due now, if any (at most one blind notice per run, one seen after it)."""
        with self._lock:
            if self._seen_pending is not None:
                source, fmt, step = self._seen_pending
                self._seen_pending, self._blind = None, None
                return Notice("metrics_seen", Level.INFO,
                              f"metrics parsed at last: {fmt} records from {source}"
                              + (f" (step {step})" if step is not None else "")
                              + "; NaN, spikes and step progress are watched again", {
                                  "source": source, "format": fmt, "step": step})
            if self._stepped or self._blind is not None or not self.enabled:
                return None
            # The attempt's run time: from its start (the first line where no start is known).
            start = self._started_at if self._started_at is not None else self._first_at
            span = max(0.0, now - start) if start is not None else 0.0
            by_lines = self.after_lines > 0 and self._lines >= self.after_lines
            by_time = self.after_s > 0 and start is not None and span >= self.after_s
            if not (by_lines or by_time):
                return None
            samples = self._samples()
            regex = next((rx for s in reversed(self._lossy) if (rx := guess_regex(s)) is not None), None)
            tried = list(BUILTIN_FORMATS) + ([f"{len(self.user_regexes)} regex(es) of [detectors.parsers]"]
                                             if self.user_regexes else [])
            written = self._written()
            fixes = fix_lines(regex, user_regexes=len(self.user_regexes), written=written, printed=bool(self._lines))
            self._blind = {"lines": self._lines, "seconds": round(span, 1), "samples": samples,
                           "formats_tried": tried, "regex": regex, "fix": fixes[0],
                           "written": [w.name for w in written[:SAMPLES]]}
            if self._announced:
                return None  # once per run: a restart loop of a blind job must not repeat it
            self._announced = True
            bound = " or ".join(([f"{self.after_lines} lines"] if self.after_lines > 0 else [])
                                + ([f"{self.after_s:g} s"] if self.after_s > 0 else []))
            seen = (f"from {self._lines} line{'s' if self._lines != 1 else ''} of the job's output" if self._lines
                    else "and the job printed nothing")
            message = (f"metrics blind: no training step parsed {seen} in {span:.1f} s of run time, and no metric "
                       f"file yielded one (bound: {bound}, [detectors] blind_after_lines / blind_after_s); NaN, "
                       "loss spikes and step progress are NOT being watched. Formats tried: " + ", ".join(tried)
                       + (". Sample lines:\n" + "\n".join(f"  | {s}" for s in samples) if samples else ".")
                       + "\nFix:\n" + "\n".join(f"  {f}" for f in fixes))
            # The samples and the fix are in the message (SPEC); the data keeps what a tool reads.
            return Notice("metrics_blind", Level.WARNING, message, {
                "lines": self._lines, "seconds": round(span, 1), "bound": bound, "regex": regex,
                "written": [w.name for w in written[:SAMPLES]]})

    def _written(self) -> Sequence[Written]:
        try:
            return self.find_written() if self.find_written is not None else ()
        except Exception:  # a hint; the notice goes out without it
            return ()

    def _samples(self) -> list[str]:
        picked: list[str] = []
        for pool in (self._lossy, self._numeric, self._recent):
            for s in pool:
                if s not in picked and len(picked) < SAMPLES:
                    picked.append(s)
        return [redact(s) for s in picked[:SAMPLES]]

    def status(self) -> dict[str, Any] | None:
        """``status``'s ``metrics_blind``: None while steps are seen (or not yet judged)."""
        with self._lock:
            return None if self._blind is None else dict(self._blind)
