"""Host health: memory and swap, the job tree's RSS, free disk space, and a storage probe.

* :func:`probe_storage` writes a small file in the checkpoint dir, fsyncs it, reads it back,
  removes it, and checks the dir still lives on the mount (mount point and ``st_dev``) recorded
  the first time: it catches read-only remounts, full disks and vanished network mounts.
* :func:`check_disk` says whether a dir has room for the next checkpoint: at least
  ``host.disk_min_free_gb`` and at least ``host.disk_ckpt_multiple`` x the last checkpoint's size.
* :class:`HostMonitor` (events.Monitor) runs both on a thread of its own every ``host.poll_s``
  (statvfs on a hung NFS mount can block: never on the main loop) and emits ``disk_low``; a failed
  storage probe is also reported as ``disk_low`` (``details["kind"] == "storage"``) with
  suggested action ``give_up``: no checkpoint can be written there, a human must fix the mount.
  Host memory and the job's RSS are logged and shown in ``status()`` only (the kernel OOM killer's
  SIGKILL is what the runner classifies as ``oom``).
"""
from __future__ import annotations

import errno
import os
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

import psutil
import structlog

from ..events import Action, AttemptContext, Cause, Emit
from ..core.observations import Detection
from .config import HostConfig

log = structlog.get_logger("supervisor.health")
GB = 1000**3


# --------------------------------------------------------------------------------------------- memory


def host_memory() -> dict[str, float | int]:
    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    return {"total_bytes": vm.total, "available_bytes": vm.available,
            "available_fraction": round(vm.available / vm.total, 4) if vm.total else 0.0,
            "swap_total_bytes": sw.total, "swap_used_bytes": sw.used, "swap_percent": sw.percent}


def tree_rss(pid: int) -> int | None:
    """Resident memory of ``pid`` and all its descendants (bytes); None when ``pid`` is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # exited between the listing and the read
    return total


# --------------------------------------------------------------------------------------------- disk


@dataclass(frozen=True)
class DiskCheck:
    path: str
    free_bytes: int | None
    needed_bytes: int
    ok: bool
    reason: str | None


def check_disk(path: str | Path, min_free_gb: float, last_checkpoint_bytes: int | None = None,
               ckpt_multiple: float = 0.0) -> DiskCheck:
    """Room for the next checkpoint in ``path``: free >= max(min_free_gb GB, multiple x last size)."""
    needed = int(min_free_gb * GB)
    why = f"{min_free_gb:g} GB (host.disk_min_free_gb)"
    if last_checkpoint_bytes and ckpt_multiple > 0 and ckpt_multiple * last_checkpoint_bytes > needed:
        needed = int(ckpt_multiple * last_checkpoint_bytes)
        why = (f"{ckpt_multiple:g} x the last checkpoint's {last_checkpoint_bytes / GB:.2f} GB "
               "(host.disk_ckpt_multiple)")
    try:
        free = shutil.disk_usage(path).free
    except OSError as exc:
        return DiskCheck(str(path), None, needed, False, f"cannot stat {path}: {exc.strerror or exc}")
    if free < needed:
        return DiskCheck(str(path), free, needed, False,
                         f"{path} has {free / GB:.2f} GB free, below the {needed / GB:.2f} GB needed: {why}")
    return DiskCheck(str(path), free, needed, True, None)


# --------------------------------------------------------------------------------------------- storage


def mount_point_of(path: str | Path) -> str:
    p = Path(os.path.abspath(path))
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return str(p)


@dataclass(frozen=True)
class StorageBaseline:
    """Where the checkpoint dir lived when first seen: a changed ``st_dev`` means a new mount."""

    path: str
    mount_point: str
    st_dev: int

    @classmethod
    def record(cls, path: str | Path) -> StorageBaseline:
        return cls(str(path), mount_point_of(path), os.stat(path).st_dev)


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    path: str
    reason: str | None
    seconds: float
    mount_point: str | None = None
    st_dev: int | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def probe_storage(path: str | Path, baseline: StorageBaseline | None = None,
                  size: int = 4096) -> ProbeResult:
    """Write, fsync, read back and remove a small file in ``path``; compare the mount to ``baseline``."""
    t0 = time.monotonic()
    path = Path(path)

    def fail(reason: str, mount: str | None = None, dev: int | None = None) -> ProbeResult:
        return ProbeResult(False, str(path), reason, time.monotonic() - t0, mount, dev)

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return fail(f"checkpoint dir {path} does not exist (a vanished or unmounted volume?)")
    except OSError as exc:
        return fail(f"cannot stat checkpoint dir {path}: {exc.strerror or exc}")
    mount = mount_point_of(path)
    if baseline is not None and (st.st_dev != baseline.st_dev or mount != baseline.mount_point):
        return fail(f"checkpoint dir {path} is no longer on the volume seen at start "
                    f"(mount {baseline.mount_point} dev {baseline.st_dev} -> mount {mount} dev {st.st_dev}): "
                    "the mount vanished or was replaced", mount, st.st_dev)
    probe = path / f".tsup-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    payload = os.urandom(size)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        if probe.read_bytes() != payload:
            return fail(f"checkpoint dir {path}: read back differs from what was written", mount, st.st_dev)
    except OSError as exc:
        hint = {errno.EROFS: "read-only file system (remounted read-only?)",
                errno.ENOSPC: "no space left on device", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted (immutable?)",
                errno.EDQUOT: "disk quota exceeded", errno.EIO: "I/O error"}.get(exc.errno or 0, "")
        return fail(f"checkpoint dir {path} is not writable: {exc.strerror or exc}"
                    + (f" ({hint})" if hint else ""), mount, st.st_dev)
    finally:
        try:
            probe.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("storage_probe_cleanup_failed", file=str(probe), error=str(exc))
    return ProbeResult(True, str(path), None, time.monotonic() - t0, mount, st.st_dev)


# --------------------------------------------------------------------------------------------- monitor


class HostMonitor:
    """See the module doc. One instance for the daemon; ``start``/``stop`` per attempt.

    ``last_checkpoint_bytes`` returns the size of the newest checkpoint (or None); the storage
    baseline of the checkpoint dir is recorded the first time the monitor starts and kept.
    """

    name = "host"

    def __init__(self, cfg: HostConfig | None = None, *, checkpoint_dir: str | Path | None = None,
                 state_dir: str | Path | None = None,
                 last_checkpoint_bytes: Callable[[], int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic, threaded: bool = True) -> None:
        self._cfg = cfg or HostConfig()
        self._ckpt = Path(checkpoint_dir) if checkpoint_dir else None
        self._state = Path(state_dir) if state_dir else None
        self._last_ckpt = last_checkpoint_bytes
        self._clock = clock
        self._threaded = threaded
        self._lock = threading.Lock()
        self._emit: Emit | None = None
        self._ctx: AttemptContext | None = None
        self.baseline: StorageBaseline | None = None
        self._reported: set[str] = set()
        self._next_check = 0.0
        self._next_probe = 0.0
        self._status: dict[str, object] = {"state": "unknown"}
        self._memory_low_logged = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, ctx: AttemptContext | None, emit: Emit) -> None:
        self._ctx, self._emit = ctx, emit
        self._reported.clear()
        if ctx is not None and ctx.checkpoint_dir is not None and self._ckpt is None:
            self._ckpt = ctx.checkpoint_dir
        if ctx is not None and self._state is None:
            self._state = ctx.state_dir
        if self.baseline is None and self._ckpt is not None and self._ckpt.is_dir():
            self.baseline = StorageBaseline.record(self._ckpt)
        now = self._clock()
        self._next_check = now
        self._next_probe = now + self._cfg.probe_interval_s  # the gate probed just before launch
        if self._threaded:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="tsup-host", daemon=True)
            self._thread.start()

    def poll(self, now: float) -> None:
        if not self._threaded and self._emit is not None:
            self._tick(now)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._emit = None

    def status(self) -> Mapping[str, object]:
        with self._lock:
            return dict(self._status)

    def snapshot(self) -> dict[str, object]:
        """For the ledger: host memory, swap and free space at this moment."""
        snap: dict[str, object] = {"memory": host_memory()}
        for label, d in (("checkpoint_dir", self._ckpt), ("state_dir", self._state)):
            if d is not None:
                try:
                    snap[f"{label}_free_bytes"] = shutil.disk_usage(d).free
                except OSError:
                    snap[f"{label}_free_bytes"] = None
        return snap

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._tick(self._clock())
            self._stop.wait(min(self._cfg.poll_s, 1.0))

    def _tick(self, now: float) -> None:
        try:
            if now >= self._next_check:
                self._next_check = now + self._cfg.poll_s
                self.check()
            if (self._cfg.storage_probe and self._cfg.probe_interval_s > 0 and self._ckpt is not None
                    and now >= self._next_probe):
                self._next_probe = now + self._cfg.probe_interval_s
                self.probe()
        except Exception as exc:  # the monitor outlives its own bugs
            log.exception("host_monitor_error", error=repr(exc), next="retrying at the next poll")

    def check(self) -> None:
        """Memory, swap, job RSS and free space; emits disk_low once per dir per attempt."""
        mem = host_memory()
        rss = tree_rss(self._ctx.pid) if self._ctx else None
        disks: dict[str, object] = {}
        last = self._last_ckpt() if self._last_ckpt else None
        for label, d in (("checkpoint_dir", self._ckpt), ("state_dir", self._state)):
            if d is None:
                continue
            res = check_disk(d, self._cfg.disk_min_free_gb, last if label == "checkpoint_dir" else None,
                             self._cfg.disk_ckpt_multiple)
            disks[label] = {"path": res.path, "free_bytes": res.free_bytes, "needed_bytes": res.needed_bytes,
                            "ok": res.ok}
            if not res.ok and label not in self._reported:
                self._reported.add(label)
                self._send(Detection(
                    at=time.time(), cause=Cause.DISK_LOW, source="host", summary=f"disk low: {res.reason}",
                    value=float(res.free_bytes) if res.free_bytes is not None else None,
                    evidence=res.reason,
                    details={"kind": "disk", "dir": label, "path": res.path, "free_bytes": res.free_bytes,
                             "needed_bytes": res.needed_bytes, "last_checkpoint_bytes": last}))
            elif res.ok:
                self._reported.discard(label)
        if mem["available_fraction"] < self._cfg.memory_warn_fraction:
            if not self._memory_low_logged:
                self._memory_low_logged = True
                log.warning("host_memory_low", available_bytes=mem["available_bytes"],
                            job_rss_bytes=rss, swap_percent=mem["swap_percent"],
                            next="watching; the kernel OOM killer may end the job (classified oom)")
        else:
            self._memory_low_logged = False
        with self._lock:
            self._status = {"state": "ok" if all(v["ok"] for v in disks.values()) else "disk_low",  # type: ignore[index]
                            "memory": mem, "job_rss_bytes": rss, "disks": disks}

    def probe(self) -> ProbeResult | None:
        if self._ckpt is None:
            return None
        res = probe_storage(self._ckpt, self.baseline)
        with self._lock:
            self._status = {**self._status, "storage_probe": res.to_dict()}
        if not res.ok and "storage" not in self._reported:
            self._reported.add("storage")
            self._send(Detection(
                at=time.time(), cause=Cause.DISK_LOW, source="host", summary=f"storage probe failed: {res.reason}",
                evidence=res.reason, suggested_action=Action.GIVE_UP,
                details={"kind": "storage", **res.to_dict()}))
        return res

    def _send(self, det: Detection) -> None:
        log.warning("host_detection", cause=det.cause.value, summary=det.summary)
        if self._emit is not None:
            self._emit(det)
