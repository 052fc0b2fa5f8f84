"""Who may hold a control-socket connection, and who gives way when they are all taken.

The rule (issue 24): at most ``total`` connections at once and at most ``per_uid`` from one peer
uid. A new connection over a bound takes the place of the oldest connection that is still
*reading* its request: of its own uid when that uid is at its bound, else of the uid holding the
most connections. The one that gives way gets a ``busy`` reply (the CLI retries it). A connection
whose request is complete (its handler is running, a ``stop`` waiting for the job) never gives
way; when every candidate is such a one, the new connection is refused ``busy``.

Why: the CLI sends its whole request line at once, right after connecting, so it is read within
milliseconds and stops being a candidate. Clients that connect and trickle or stall (and
reconnect when dropped) can only push each other out, never hold ``status`` or ``stop`` off; the
per-uid bound keeps one user's flood from taking root's room (and the other way round).

Thread-safe; no sockets here: the server hands each slot a ``kick`` that wakes its reader.
"""
from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Slot:
    """One admitted connection. ``evicted`` is set (under the lock) when it had to give way;
    its reader then replies ``busy`` and ends."""

    uid: int
    seq: int
    kick: Callable[[], None] = field(repr=False)
    reading: bool = True
    evicted: bool = False


class ConnectionSlots:
    def __init__(self, total: int, per_uid: int) -> None:
        if total < 1 or per_uid < 1:
            raise ValueError(f"connection bounds must be at least 1 (total {total}, per uid {per_uid})")
        self.total = total
        self.per_uid = min(per_uid, total)
        self._live: list[Slot] = []  # in admission order: the first reader is the oldest
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self.evictions = 0

    def admit(self, uid: int, kick: Callable[[], None]) -> Slot | None:
        """A slot for a new connection from ``uid`` (making room by evicting a reader, whose
        ``kick`` is called here, under the lock, so its socket is still open), or None: busy."""
        with self._lock:
            victim: Slot | None = None
            own = [s for s in self._live if s.uid == uid]
            if len(own) >= self.per_uid:
                victim = next((s for s in own if s.reading), None)
                if victim is None:
                    return None
            elif len(self._live) >= self.total:
                counts = Counter(s.uid for s in self._live)
                readers = [s for s in self._live if s.reading]
                if not readers:
                    return None
                victim = min(readers, key=lambda s: (-counts[s.uid], s.seq))
            if victim is not None:
                victim.evicted = True
                self._live.remove(victim)
                self.evictions += 1
                try:
                    victim.kick()
                except OSError:
                    pass  # its peer is gone already; its thread ends on its own
            slot = Slot(uid, next(self._seq), kick)
            self._live.append(slot)
            return slot

    def request_read(self, slot: Slot) -> bool:
        """The slot's request is complete: from now on it never gives way. False if it was
        evicted first (then it must reply ``busy``)."""
        with self._lock:
            if slot.evicted:
                return False
            slot.reading = False
            return True

    def release(self, slot: Slot) -> None:
        """The connection is done (call before closing its socket, so a kick never meets a
        closed descriptor)."""
        with self._lock:
            if slot in self._live:
                self._live.remove(slot)

    def live(self) -> dict[int, int]:
        """Connections held now, by peer uid."""
        with self._lock:
            return dict(Counter(s.uid for s in self._live))

    def answering(self) -> int:
        """Connections whose request is complete and being answered (they never give way)."""
        with self._lock:
            return sum(1 for s in self._live if not s.reading)
