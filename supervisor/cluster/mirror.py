"""A node's copy of the run's keys, kept by etcd's streaming watch: read everything once, then
apply the changes as etcd sends them. The agent steps its coordinator on this copy, so a node at
rest sends etcd nothing but its lease keepalives (a 0.2 s poll of every key by every node was
N x 5 reads a second, each of N keys).

Why a copy rather than "wake the read loop on an event": the copy is what the read would return
(etcd delivers every change after the read's revision, in order), and it costs no read per change;
with hundreds of nodes each change would otherwise make every node read every key.

While the stream is not open and could not be opened (etcd out of reach, or refusing watches),
and after a drop until it is re-opened, :meth:`KeyMirror.snapshot` says so and the agent reads
the keys itself, as it always did: polling is the fallback, never a gap. While the first one is
being opened the agent waits for it rather than reading: with hundreds of nodes starting at
once, every node reading every key five times a second while the watches open is what would
keep them from opening. A compacted start revision means one full read, then a watch from its
revision + 1.

A watch silent for ``idle_s`` (the agent: one lease TTL, a fifth of the keepalives' requests) is
re-opened (one request, no read): etcd checks credentials only when a watch opens, and a
connection cut without a word stays silent, so this bounds how long either goes unnoticed; the
lease keepalives alone would not notice (etcd 3.4 does not check their token).
"""

from __future__ import annotations

import threading
from typing import Callable

import structlog

from .etcd import EtcdClient
from .etcdtypes import EtcdError, EtcdRequestError, KeyRange, KeyValue
from .etcdwatch import Watch, WatchCompacted, WatchIdle, open_watch

log = structlog.get_logger("supervisor.cluster")

RETRY_S = (0.2, 2.0)  # re-open a dropped watch after this, doubling up to the second figure
IDLE_S = 10.0  # re-open a watch that was silent this long (the default lease TTL)
REFUSED_RETRY_S = 60.0
OPENING = -1  # snapshot()'s version while a watch is being opened  # etcd refused the watch itself (an old gateway): poll, and ask again this much later


class KeyMirror:
    """The keys in ``keys`` (a range, or every key under a prefix) as etcd's watch reports them; ``on_change`` is called (from the
    mirror's thread) after each change is applied and when the stream opens or drops, and
    ``on_urgent`` first when a changed key is one ``urgent`` names (the agent acts on those at
    once rather than waiting for a burst of changes to settle)."""

    def __init__(self, client: EtcdClient, keys: KeyRange | str, on_change: Callable[[], None], idle_s: float = IDLE_S,
                 *, urgent: Callable[[str], bool] | None = None, on_urgent: Callable[[], None] | None = None) -> None:
        self.client = client
        self.idle_s = idle_s
        self.range = KeyRange.under(keys) if isinstance(keys, str) else keys
        self.on_change = on_change
        self.urgent = urgent  # a change of such a key also calls on_urgent (before on_change)
        self.on_urgent = on_urgent
        self._lock = threading.Lock()
        self._kvs: dict[str, KeyValue] = {}
        self._rev = 0  # the newest revision the copy holds: a watch resumes from the next one
        self._synced = False  # the copy holds a full read (no compaction since)
        self._version = 0  # bumped by every change: the agent re-reads its view only when it moved
        self._watch: Watch | None = None
        self._live = False  # a watch follows the copy (or an idle one is being re-opened)
        self._failed = False  # the last try to open one failed: the agent polls until one opens
        self._closing = threading.Event()
        self._resync = threading.Event()
        self._thread: threading.Thread | None = None
        self.refused = ""  # why etcd refused the watch (the agent polls meanwhile); said once in the log

    def start(self) -> None:
        # Named only once started: close() on the daemon's thread may run while the agent's
        # thread starts a mirror it follows now, and joining a thread not yet started raises.
        # A mirror started after close() ends at once (_run looks at _closing first).
        thread = threading.Thread(target=self._run, name="cluster-watch", daemon=True)
        thread.start()
        self._thread = thread

    def close(self) -> None:
        self._closing.set()
        self._drop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> tuple[int, list[KeyValue]] | None:
        """(a version that changes with every change, every key) while the watch is open and
        the copy complete; (-1, []) while one is being opened (wait for it); None when none could
        be opened (the caller reads etcd itself)."""
        with self._lock:
            if self._live and self._synced:
                return self._version, list(self._kvs.values())
            return None if self._failed or self._closing.is_set() else (OPENING, [])

    def resync(self) -> None:
        """Re-open the stream from the last revision + 1 (after etcd was out of reach: a
        connection that etcd no longer serves may look open and stay silent)."""
        self._resync.set()
        self._drop()

    def _drop(self) -> None:
        with self._lock:
            w = self._watch
        if w is not None:
            w.close()  # the thread's blocked read ends; it re-opens unless closing

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        delay = RETRY_S[0]
        while not self._closing.is_set():
            self._resync.clear()
            try:
                watch = self._open()
            except EtcdRequestError as e:
                self._set_live(False, failed=True)
                if not self.refused:
                    log.warning("cluster_watch_refused", error=str(e), message="etcd refused the key watch; this "
                                f"node polls the keys instead (every turn) and asks again every {REFUSED_RETRY_S:g} s")
                self.refused = str(e)
                self._closing.wait(REFUSED_RETRY_S)
                continue
            except EtcdError as e:  # out of reach: the agent's own reads notice and say so
                self._set_live(False, failed=True)
                log.debug("cluster_watch_unopened", error=str(e))
                self._closing.wait(delay)
                delay = min(delay * 2, RETRY_S[1])
                continue
            if self.refused:
                log.info("cluster_watch_open", message="etcd accepts the key watch again; polling stops")
                self.refused = ""
            delay = RETRY_S[0]
            with self._lock:
                self._watch = watch
            self._set_live(True)
            idle = False
            try:
                self._follow(watch)
            except WatchCompacted as e:
                log.info("cluster_watch_compacted", error=str(e), message="reading every key once, then watching again")
                with self._lock:
                    self._synced = False
            except WatchIdle:  # re-opened from the last revision seen; the copy stays good meanwhile
                idle = True
            except EtcdError as e:
                if not self._closing.is_set() and not self._resync.is_set():
                    log.info("cluster_watch_dropped", error=str(e), message="re-opening it from the last revision "
                             "seen; the keys are polled meanwhile")
            finally:
                watch.close()
                with self._lock:
                    self._watch = None
                if not idle:  # dropped: the agent polls until it is re-opened (and notices an etcd away)
                    self._set_live(False, failed=not self._closing.is_set())

    def _set_live(self, live: bool, failed: bool = False) -> None:
        with self._lock:
            if self._live == live and self._failed == failed:
                return
            self._live, self._failed = live, failed
            self._version += 1
        self.on_change()

    def _open(self) -> Watch:
        with self._lock:
            synced, rev = self._synced, self._rev
        if not synced:  # the first time, or after a compaction: everything once
            kvs, rev = self.client.get_range(self.range)
            with self._lock:
                self._kvs = {kv.key: kv for kv in kvs}
                self._rev, self._synced = rev, True
                self._version += 1
        try:
            return open_watch(self.client, self.range, rev + 1, idle_s=self.idle_s)
        except WatchCompacted:
            with self._lock:
                self._synced = False
            raise

    def _follow(self, watch: Watch) -> None:
        while not self._closing.is_set():
            _rev, events = watch.next_message()
            if not events:
                continue  # etcd's progress notes: nothing changed under the prefix
            with self._lock:
                for e in events:
                    if e.deleted:
                        self._kvs.pop(e.kv.key, None)
                    else:
                        self._kvs[e.kv.key] = e.kv
                    self._rev = max(self._rev, e.kv.mod_revision)
                self._version += 1
            if self.on_urgent is not None and self.urgent is not None and any(self.urgent(e.kv.key) for e in events):
                self.on_urgent()
            self.on_change()


class MirrorSet:
    """Several ranges, each with its :class:`KeyMirror` (a watch each: etcd's gateway takes one
    range per watch), seen as one copy; :meth:`follow` changes the ranges (a mirror for a range
    kept goes on, a new one reads its keys first: until then the copy is being opened)."""

    def __init__(self, client: EtcdClient, ranges: tuple[KeyRange, ...], on_change: Callable[[], None],
                 idle_s: float = IDLE_S, *, urgent: Callable[[str], bool] | None = None,
                 on_urgent: Callable[[], None] | None = None) -> None:
        self._make = lambda r: KeyMirror(client, r, on_change, idle_s, urgent=urgent, on_urgent=on_urgent)
        self.mirrors: dict[KeyRange, KeyMirror] = {r: self._make(r) for r in ranges}
        self._base = 0  # added to the versions' sum: a changed set never repeats a version
        self._last = 0
        self._started = False

    @property
    def ranges(self) -> tuple[KeyRange, ...]:
        return tuple(self.mirrors)

    def start(self) -> None:
        self._started = True
        for m in self.mirrors.values():
            m.start()

    def close(self) -> None:
        self._started = False  # a follow() on the agent's thread meanwhile starts no new mirror
        for m in self.mirrors.values():
            m.close()

    def resync(self) -> None:
        for m in self.mirrors.values():
            m.resync()

    def follow(self, ranges: tuple[KeyRange, ...]) -> None:
        """Watch ``ranges`` from now on (from the agent's thread, the only caller of snapshot)."""
        if set(ranges) == set(self.mirrors):
            return
        gone = [m for r, m in self.mirrors.items() if r not in ranges]
        new = {r: self._make(r) for r in ranges if r not in self.mirrors}
        self.mirrors = {r: self.mirrors.get(r) or new[r] for r in ranges}
        for m in gone:
            m.close()
        self._base = self._last + 1
        if self._started:
            for m in new.values():
                m.start()

    def snapshot(self) -> tuple[int, list[KeyValue]] | None:
        """As :meth:`KeyMirror.snapshot`, over every range: None when any could not be opened
        (the caller reads every key itself), OPENING while any is being opened."""
        snaps = [m.snapshot() for m in self.mirrors.values()]
        if any(s is None for s in snaps):
            return None
        if any(s[0] == OPENING for s in snaps if s is not None):
            return OPENING, []
        self._last = self._base + sum(s[0] for s in snaps if s is not None)
        return self._last, [kv for s in snaps if s is not None for kv in s[1]]
