"""What a notification says, with its secrets masked, and when one may go out (the rate limit).

No threads, sockets or processes here: :mod:`supervisor.ops.alerts` sends what this builds.
A payload never carries a secret: it passes the one redaction gate (:mod:`supervisor.redact`):
values of keys that look secret (TOKEN, KEY, SECRET, PASSWORD, ...) become ``"<redacted>"`` wherever
they sit, secrets inside every string are masked, and the known secret values (the job's env and
ours under such names, the webhook URL) are cut out of every string.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..core.messages import Argv
from ..eventnames import EventName
from ..humanize import value as spell
from ..redact import MIN_SECRET_LEN, REDACTED, env_secrets, learn_secrets, masks_key, redact_argv, redact_text
from ..strictjson import finite
from ..textescape import Mode, escape

GAVE_UP = EventName.GAVE_UP
RESTART_LOOP = EventName.RESTART_LOOP


@dataclass(frozen=True)
class Masker:
    """Masks secret-looking keys and known secret values in anything JSON-shaped."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, *envs: Mapping[str, str], extra: Iterable[str | None] = ()) -> "Masker":
        # The env's secrets are learned by the one gate, which every sink asks (a word-like password
        # as a whole token there, the same at every sink); only the sink's own (the webhook URL) stay here.
        own = {v for v in extra if v}
        learn_secrets([*env_secrets(*envs), *own])
        # Longest first: a secret that contains another is cut out whole.
        return cls(tuple(sorted((v for v in own if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)))

    def text(self, s: str) -> str:
        return redact_text(s, self.secrets)

    def value(self, v: Any) -> Any:
        """``v`` made strict JSON (non-finite numbers as strings) with every secret masked."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, bool) or v is None or isinstance(v, int):
            return v
        if isinstance(v, float):
            return finite(v)  # one spelling of NaN everywhere the project writes JSON
        if isinstance(v, Mapping):
            return {str(k): (REDACTED if masks_key(str(k), v2) else self.value(v2))
                    for k, v2 in v.items()}
        if isinstance(v, (list, tuple, set, frozenset)):
            return [self.value(x) for x in v]
        if isinstance(v, Argv):  # the core's argv: bounded and its --token x masked by the one redactor
            return self.value(redact_argv(v.args))
        return self.text(str(v))


@dataclass(frozen=True)
class Alert:
    """One notification: a daemon event (or ``restart_loop``) and where it happened."""

    event: str
    level: str
    message: str
    job: str
    run_id: str
    host: str
    attempt: int | None
    at: float  # wall clock, seconds since the epoch
    data: Mapping[str, Any] = field(default_factory=dict)
    suppressed: int = 0  # the same event held back by the rate limit since the last one sent

    def text(self) -> str:
        """The one line a chat channel shows (Slack's ``text``)."""
        more = f" (+{self.suppressed} more since the last notice)" if self.suppressed else ""
        where = f"attempt {self.attempt}, " if self.attempt is not None else ""
        return f"[transformer-supervisor] {self.job} on {self.host} ({where}run {self.run_id}): {self.event}{more}: {self.message}"

    def payload(self, masker: Masker) -> dict[str, Any]:
        """The JSON sent (webhook body, hook command's stdin): ``text`` plus the structured fields."""
        return masker.value({
            "text": self.text(), "event": self.event, "level": self.level, "message": self.message,
            "job": self.job, "run_id": self.run_id, "host": self.host, "attempt": self.attempt,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)), "suppressed": self.suppressed,
            "data": dict(self.data),
        })

    def env(self, masker: Masker) -> dict[str, str]:
        """``TSUP_NOTIFY_*`` for the hook command: the main fields and the scalar data fields."""
        p = self.payload(masker)
        out = {f"TSUP_NOTIFY_{k.upper()}": "" if v is None else str(v)
               for k, v in p.items() if k != "data"}
        for k, v in (p.get("data") or {}).items():
            name = "".join(c if c.isalnum() else "_" for c in k).upper()
            if isinstance(v, (str, int, float, bool)) and f"TSUP_NOTIFY_{name}" not in out:
                out[f"TSUP_NOTIFY_{name}"] = spell(v)  # true/false, as the log and the journal say it
        # JSON escapes control characters; an env value reaches the hook as its bytes: an ESC or an
        # OSC 52 the job printed would drive the terminal of whoever prints it (newlines kept).
        return {k: escape(v.replace("\0", ""), Mode.FIELD) for k, v in out.items()}


class RateLimit:
    """The same event at most once per ``repeat_after_s``; at most ``per_hour`` in all.

    ``gave_up`` always passes: it is the last word of the daemon, and happens once. A held-back
    event is counted and the next one of its name that goes out says how many there were.
    Not thread-safe on its own: the caller holds a lock.
    """

    def __init__(self, repeat_after_s: float, per_hour: int) -> None:
        self.repeat_after_s = repeat_after_s
        self.per_hour = per_hour
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._sent: list[float] = []  # when, over the last hour

    def admit(self, event: str, now: float) -> int | None:
        """None: hold this one back; else how many of ``event`` were held back before it."""
        self._sent = [t for t in self._sent if now - t < 3600.0]
        if event != GAVE_UP:
            last = self._last.get(event)
            if (last is not None and now - last < self.repeat_after_s) or len(self._sent) >= self.per_hour:
                self._held[event] = self._held.get(event, 0) + 1
                return None
        self._last[event] = now
        self._sent.append(now)
        return self._held.pop(event, 0)
