"""Reading one followed metric file (for :mod:`.metricfiles`, which finds them and delivers the
records): what a file grew since the last read -> records, with its bounds and its second looks.

- Bounded: at most ``READ_CHUNK`` bytes per read (a backlog takes several passes); an unfinished
  CSV/JSONL line holds at most ``MAX_RECORD_LINE`` bytes (a file that grows without a newline costs
  no more: the over-long line is skipped, said once per file and kind of problem, rate-limited);
  an event file holds at most one record and resyncs at a bounded CRC rate (:mod:`.tbevents`).
- Only the regular file the walk judged is read (:func:`.readbounds.open_followed`).
- No file is dropped for good: a CSV whose header names no loss-like column, or a JSONL whose
  probe lines hold no metric, is looked at again when it changes (size or mtime). A CSV whose
  first line changed is read again from its start (Lightning's ``CSVLogger`` first flushing only
  ``lr``/``epoch``, then rewriting the file with ``train_loss``), rows already delivered skipped;
  a JSONL is probed again from where it was left (or from its start when it shrank).
- A file rewritten in place to no larger size (``open(path, "w")`` at each flush or once at exit:
  its size the read offset again, its mtime/ctime changed) is read again from its start like a
  truncated one. In a later attempt the first such change is that attempt's job writing (a fresh
  start writes the same bytes, its NaN too): read whole, the rows of earlier attempts not skipped.
  Otherwise only when its head or tail changed (``DIGEST_BYTES`` each, read when its stamp changed):
  a file touched every pass costs two small reads a pass, never a re-parse.
"""

from __future__ import annotations

import os

import structlog

from ..core.observations import MetricRecord
from ..logsite import log_helper
from .filerows import FileState, Unread, csv_records, jsonl_records, set_header
from .mlflowstore import StoreUnreadable, file_store_key, file_store_records
from .parsers import MetricParser
from .pyjson import unread_reason
from .quiet import QuietLog
from .readbounds import MAX_RECORD_LINE, READ_CHUNK, open_followed, scan_lines
from .tbevents import RESYNC_CHECKS_PER_S, TBReader, group

log = structlog.get_logger("supervisor.watch")

#: Bytes of a file's head and of its tail compared when it changed without growing (touched or rewritten)
DIGEST_BYTES = 512


#: The source prefix of each kind (status ``metric_sources``, a detection's ``source``): ``log:`` a
#: text log the job writes, ``mlflow:`` an MLflow store, ``tb:`` an event file, ``file:`` CSV/JSONL.
_PREFIX = {"tb": "tb:", "log": "log:", "mlflow": "mlflow:", "mlflow_db": "mlflow:"}
#: Substrings one of which every metric line a parser reads holds (the log watcher's prefilter:
#: the parsers' METRIC_KEYWORDS); the other lines of a text log are not parsed at all.
_LOG_KEYWORDS = (b"oss", b"{", b"%|")


def source_of(f: FileState) -> str:
    return _PREFIX.get(f.kind, "file:") + f.path


class FileReader:
    """Reads followed files; its warnings go through one :class:`QuietLog` (the monitor's thread
    alone calls it)."""

    def __init__(self, quiet: QuietLog | None = None, parser: MetricParser | None = None,
                 unread: Unread | None = None) -> None:
        self.attempt = 0  # counted up by the monitor after a later attempt's baseline, before its job starts
        self.quiet = quiet or QuietLog(log)
        self.parser = parser or MetricParser()  # text logs' lines: every trainer format, then the generic one
        self.unread = unread  # told of a JSON-shaped metric line that gives no record (the log watcher counts it)

    # -- a file from before the run ----------------------------------------------------------------

    def take_history(self, f: FileState, st: os.stat_result) -> None:
        """A file that existed before the run: start at its end, but keep a CSV's header (later
        rows need it) and its row count (a rewrite must not replay them). Read in bounded chunks."""
        if f.db is not None:
            try:
                f.db.skip_history()  # the runs before this one (or the ended attempt) are history
            except StoreUnreadable as exc:
                self._warn(f, "metric_file_unreadable", str(exc), "tried again at each pass")
            return
        if f.kind != "csv":
            return
        fh = open_followed(f.path, f.ident)
        if fh is None:
            return
        with fh:
            first, lines, end = scan_lines(fh, f.offset)
        f.offset = end
        if lines:
            f.rows = lines - 1
            if not set_header(f, first):
                self._dropped(f, st, first)

    # -- what it grew ------------------------------------------------------------------------------

    def read(self, f: FileState, st: os.stat_result, final: bool = False) -> tuple[list[MetricRecord], bool]:
        """The records of what ``f`` grew (up to ``READ_CHUNK``), and whether data was left unread.
        ``final``: its writer is gone (the job exited), so a last line without a newline, read to
        the file's end, is a complete line (``step 25 loss nan`` then exit 0 must be judged)."""
        records, more = self._grown(f, st)
        if final and not more and f.tb is None and f.db is None and f.dropped is None:
            records += self._records_of(f, f.lines.flush())
        return records, more

    def _grown(self, f: FileState, st: os.stat_result) -> tuple[list[MetricRecord], bool]:
        if f.db is not None:
            return self._read_db(f)
        size, stamp = st.st_size, (st.st_mtime_ns, st.st_ctime_ns)
        changed = f.stamp is not None and stamp != f.stamp
        f.stamp = stamp
        if size < f.offset or (changed and size == f.offset and f.tb is None and self._rewritten(f, size)):
            later = f.attempt != self.attempt
            self.quiet.say("info", "metric_file_truncated", f.path, offset=f.offset, size=size,
                           seen="shrunk" if size < f.offset else "rewritten in place to the same size",
                           next="reading it again from the start; rows already delivered are skipped"
                           + (" (those of earlier attempts are not: this attempt wrote them)" if later else ""))
            restart(f, self.attempt)
        elif f.kind == "csv" and f.header_raw and size > f.offset and not _head_is(f, f.header_raw):
            restart(f, self.attempt)  # rewritten with a wider header: same rows again, then new ones
        records: list[MetricRecord] = []
        if f.tb is not None and f.tb.throttled:
            records = self._parse(f, b"")  # the resync goes on where its CRC budget ran out
            if f.tb.throttled:
                return records, False  # nothing more is read (held) until the budget refills
        if size <= f.offset:
            return records, False
        fh = open_followed(f.path, f.ident)
        if fh is None:
            return records, False
        with fh:
            try:
                fh.seek(f.offset)
                data = fh.read(READ_CHUNK)
            except OSError:
                return records, False
        f.offset += len(data)
        if data:
            f.written, f.digest = True, None
        records += self._parse(f, data)
        if f.dropped is not None:
            try:
                st = os.stat(f.path)
            except OSError:
                return records, False
            f.offset = max(f.offset, st.st_size) if f.kind == "jsonl" else f.offset
            self._dropped(f, st, f.dropped_head)
            return records, False
        return records, len(data) >= READ_CHUNK

    def _rewritten(self, f: FileState, size: int) -> bool:
        """Whether ``f``, at its read offset's size with a changed mtime/ctime, was rewritten. The
        first change in a later attempt of a file the run wrote: yes (its stamp was taken by the
        baseline pass before that attempt's job started, so its job wrote it, maybe the same bytes).
        Else when its head or tail differs from when its stamp last changed (a touch: no)."""
        if f.attempt != self.attempt and (f.fresh or f.written):
            return True
        digest = _head_tail(f, size)
        old, f.digest = f.digest, digest
        return old is not None and digest is not None and digest != old

    def _parse(self, f: FileState, data: bytes) -> list[MetricRecord]:
        try:
            if f.tb is not None:
                before = f.tb.corrupt
                recs = group(f.tb.read(data), source_of(f))
                if f.tb.corrupt > before:
                    self._warn(f, "metric_file_corrupt_record", f.tb.last_error or "",
                               "the next records are read (a lost framing is looked for at most "
                               f"{RESYNC_CHECKS_PER_S} CRCs a second)")
                return recs
            skipped = f.lines.skipped
            lines = f.lines.push(data)
            if f.lines.skipped > skipped:
                self._warn(f, "metric_file_line_skipped", f"a line longer than {MAX_RECORD_LINE} bytes",
                           "skipped to its newline; the next lines are read")
        except Exception as exc:  # bad content of one file must not stop the others
            self._warn(f, "metric_file_unreadable", repr(exc), "its later content is still read")
            return []
        return self._records_of(f, lines)

    def _records_of(self, f: FileState, lines: list[bytes]) -> list[MetricRecord]:
        """Complete lines of a CSV, JSONL, MLflow file-store metric or text log -> records."""
        if not lines:
            return []
        try:
            if f.kind == "log":
                return self._log_records(f, lines)
            if f.kind == "mlflow":
                return file_store_records(file_store_key(f.path), lines, source_of(f))
            return csv_records(f, lines) if f.kind == "csv" else jsonl_records(f, lines, source_of(f), self.unread)
        except Exception as exc:  # bad content of one file must not stop the others
            self._warn(f, "metric_file_unreadable", repr(exc), "its later content is still read")
            return []

    def _log_records(self, f: FileState, lines: list[bytes]) -> list[MetricRecord]:
        """A text log's metric lines through the line parsers (the same as the job's output)."""
        out: list[MetricRecord] = []
        source = source_of(f)
        for raw in lines:
            if not any(k in raw for k in _LOG_KEYWORDS):
                continue
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            rec = self.parser.parse(line, source)
            if rec is not None and rec.fmt != "progress":  # a bar's position is no metric
                out.append(rec)
            elif rec is None and self.unread is not None and b'{"' in raw:
                why = unread_reason(line, self.parser.max_line_chars, embedded=True)
                if why is not None:
                    self.unread(source, line, why)
        return out

    def _read_db(self, f: FileState) -> tuple[list[MetricRecord], bool]:
        assert f.db is not None
        try:
            records, more = f.db.read(source_of(f))
        except StoreUnreadable as exc:
            self._warn(f, "metric_file_unreadable", str(exc), "tried again at each pass")
            return [], False
        return records, more

    # -- dropped, and looked at again --------------------------------------------------------------

    def _dropped(self, f: FileState, st: os.stat_result, head: bytes) -> None:
        f.dropped = f.dropped or "no loss-like column in its header"
        f.dropped_seen = (st.st_size, st.st_mtime_ns)
        f.dropped_head = head
        self.quiet.say("info", "metric_file_ignored", f.path, why=f.dropped,
                       next="not read while it stays so; looked at again when it changes")

    def changed_since_dropped(self, f: FileState, st: os.stat_result) -> bool:
        return f.dropped is not None and (st.st_size, st.st_mtime_ns) != f.dropped_seen

    def reexamine(self, f: FileState, st: os.stat_result) -> None:
        """A dropped file changed: follow it again if it may now hold metrics."""
        f.dropped_seen = (st.st_size, st.st_mtime_ns)
        if f.kind == "csv":
            if st.st_size >= f.offset and _head_is(f, f.dropped_head):
                return  # rows appended under the same header: still no loss column
            delivered = f.skip_rows  # a file that stopped matching: its rows before that stay skipped
            restart(f, self.attempt)
            f.skip_rows = max(delivered, f.skip_rows)
        elif st.st_size < f.offset:
            restart(f, self.attempt)
        else:
            f.probed = 0  # the lines written since are probed afresh
        f.dropped = None
        self.quiet.say("info", "metric_file_reexamined", f.path, kind=f.kind,
                       next="its new content is read; followed if it names a loss")

    @log_helper
    def _warn(self, f: FileState, event: str, error: str, next_: str) -> None:
        self.quiet.say("warning", event, f.path, error=error, next=next_)


def restart(f: FileState, attempt: int | None = None) -> None:
    """Read ``f`` again from its start; the rows delivered since offset 0 are skipped, unless
    they were read in an earlier attempt than ``attempt`` (this attempt's job rewrote them)."""
    f.skip_rows = f.rows if attempt is None or attempt == f.attempt else 0
    f.attempt = f.attempt if attempt is None else attempt
    f.digest = None
    f.rows = 0
    f.offset = 0
    f.lines.reset()
    f.header = None
    f.header_raw = b""
    f.probed = 0
    if f.tb is not None:
        f.tb = TBReader()


def _head_tail(f: FileState, size: int) -> bytes | None:
    """The first and last :data:`DIGEST_BYTES` of ``f`` up to ``size`` (None: unreadable)."""
    fh = open_followed(f.path, f.ident)
    if fh is None:
        return None
    with fh:
        try:
            head = fh.read(DIGEST_BYTES)
            fh.seek(max(0, size - DIGEST_BYTES))
            return head + b"|" + fh.read(DIGEST_BYTES)
        except OSError:
            return None


def _head_is(f: FileState, head: bytes) -> bool:
    """Whether ``f`` starts with ``head`` now (an unreadable file: as if it did)."""
    fh = open_followed(f.path, f.ident)
    if fh is None:
        return True
    with fh:
        try:
            return fh.read(len(head)) == head
        except OSError:
            return True


__all__ = ["FileReader", "restart", "source_of"]
