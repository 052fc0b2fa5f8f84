"""The job's GPUs: which NVML devices (and MIG slices) the supervised job uses, so that the gate,
the monitor and the events look at those alone (issue 39 item 1).

Where they come from, first found wins:

1. ``gpu.devices`` in the config: UUIDs (``GPU-...``, ``MIG-...``, a unique prefix as CUDA takes
   it) or NVML indices;
2. the job's ``CUDA_VISIBLE_DEVICES`` (``job.env``, else the daemon's environment): CUDA ordinals
   (``0,1``), UUIDs, ``MIG-...`` names; within the devices ``NVIDIA_VISIBLE_DEVICES`` leaves when
   that is set too;
3. ``NVIDIA_VISIBLE_DEVICES`` alone (the container runtime's list: NVML indices or UUIDs);
4. none of them: every GPU NVML sees (a whole node owned by the job).

An ordinal is mapped by NVML's order (PCI bus order). CUDA orders by speed unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a node of identical GPUs the two agree (ties go by PCI bus), on a
mixed node they may not, which is said (``gpu_devices_resolved``) with the fix: UUIDs. Messages
name a device as ``GPU <nvml index> (cuda:<job's ordinal>, <UUID>)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import structlog

from .gpu import GpuBackend, GpuDeviceError, GpuLostError, MigInfo

log = structlog.get_logger("supervisor.health")

_NONE = ("none", "void", "")
# Bounds on what the environment may hold (hostile-inputs): a node has at most a few dozen GPUs and
# MIG devices; an entry longer than a UUID or past the 256th is kept as unresolved, never parsed.
_MAX_ENTRIES = 256
_MAX_ENTRY = 96


def _number(entry: str) -> int | None:
    return int(entry) if entry.isascii() and entry.isdigit() and len(entry) <= 6 else None


def visible_list(value: str | None) -> list[str] | None:
    """A ``*_VISIBLE_DEVICES`` value as its entries; None: every device (unset or ``all``).
    CUDA stops at the first entry it cannot use; so do we (``0,1,x,2`` -> ``0,1``)."""
    if value is None or value.strip().lower() == "all":
        return None
    out: list[str] = []
    for part in value.split(",", _MAX_ENTRIES)[:_MAX_ENTRIES]:
        p = part.strip()[:_MAX_ENTRY]
        if p.lower() in _NONE or (p.startswith("-") and p[1:].isdigit()):
            break
        out.append(p)
    return out


@dataclass(frozen=True)
class JobDevice:
    """One of the job's devices: the NVML index of the GPU, the job's CUDA ordinal, its UUID, and
    the MIG slice (``gi``, ``ci``) when the job was given a slice rather than the whole GPU."""

    index: int
    cuda: int | None
    uuid: str
    mig: MigInfo | None = None


@dataclass(frozen=True)
class Selection:
    """What :func:`resolve` found. ``every`` is true when nothing restricts the job (all GPUs)."""

    devices: tuple[JobDevice, ...]
    every: bool
    source: str
    unresolved: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    _by_index: Mapping[int, tuple[JobDevice, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        by: dict[int, list[JobDevice]] = {}
        for d in self.devices:
            by.setdefault(d.index, []).append(d)
        object.__setattr__(self, "_by_index", {i: tuple(v) for i, v in by.items()})

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(sorted(self._by_index))

    def slices(self, index: int) -> tuple[str, ...]:
        """The UUIDs of the job's MIG devices on GPU ``index``; empty: the job has the whole GPU."""
        mine = self._by_index.get(index, ())
        if self.every or any(d.mig is None for d in mine):
            return ()
        return tuple(d.mig.uuid for d in mine if d.mig is not None)

    def watches(self, index: int) -> bool:
        return self.every or index in self._by_index

    def owns_slice(self, index: int, gi: int | None, ci: int | None) -> bool:
        """An event of GPU ``index`` (of MIG slice ``gi``/``ci``, None: the whole GPU) is the job's:
        the job uses that GPU whole, or that slice; a whole-GPU event touches every slice."""
        if self.every:
            return True
        mine = self._by_index.get(index, ())
        if not mine:
            return False
        if gi is None or any(d.mig is None for d in mine):
            return True
        return any(d.mig is not None and d.mig.gi == gi and (ci is None or d.mig.ci == ci) for d in mine)

    def label(self, index: int, uuid: str | None = None) -> str:
        """``GPU 3 (cuda:1, GPU-...)``: NVML's index, the job's ordinal, the UUID."""
        mine = self._by_index.get(index, ())
        parts = [f"cuda:{d.cuda}" for d in mine if d.cuda is not None and not self.every]
        parts += [u for d in mine if (u := d.mig.uuid if d.mig else d.uuid) != "?"] or (
            [uuid] if uuid and uuid != "?" and not mine else [])
        return f"GPU {index}" + (f" ({', '.join(parts)})" if parts else "")

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "every": self.every, "unresolved": list(self.unresolved),
                "devices": [{"index": d.index, "cuda": d.cuda, "uuid": d.uuid,
                             "mig": d.mig.uuid if d.mig else None} for d in self.devices]}


def wanted(configured: Sequence[str], env: Mapping[str, str]) -> tuple[list[str] | None, list[str] | None, str]:
    """(the NVIDIA_VISIBLE_DEVICES base, the CUDA selection within it, where it came from)."""
    if configured:
        return None, [str(x).strip() for x in configured], "gpu.devices"
    nvidia = visible_list(env.get("NVIDIA_VISIBLE_DEVICES"))
    cuda = visible_list(env.get("CUDA_VISIBLE_DEVICES"))
    if cuda is not None:
        return nvidia, cuda, "CUDA_VISIBLE_DEVICES"
    if nvidia is not None:
        return None, nvidia, "NVIDIA_VISIBLE_DEVICES"
    return None, None, "all GPUs (no CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES or gpu.devices)"


def resolve(backend: GpuBackend, configured: Sequence[str], env: Mapping[str, str], *, say: bool = True) -> Selection:
    """The job's devices on ``backend`` (initialised). Never raises for one device's trouble: an
    entry that matches nothing is kept in ``unresolved`` (said, and the gate warns of it). ``say``:
    log ``gpu_devices_resolved`` (the monitor, once per start; the gate records them in its verdict)."""
    base_spec, spec, source = wanted(configured, env)
    count = backend.device_count()
    uuids: dict[int, str] = {}
    for i in range(count):
        try:
            uuids[i] = backend.device_info(i).uuid
        except (GpuLostError, GpuDeviceError):
            uuids[i] = "?"
    if spec is None:
        return Selection(tuple(JobDevice(i, None, uuids[i]) for i in range(count)), True, source)
    migs: dict[int, Sequence[MigInfo]] = {}
    base = list(range(count))
    unresolved: list[str] = []
    notes: list[str] = []
    if base_spec is not None:
        found = [_match(e, base, uuids, migs, backend, by_ordinal=False) for e in base_spec]
        unresolved += [e for e, f in zip(base_spec, found) if f is None]
        base = [f[0] for f in found if f is not None]
    devices: list[JobDevice] = []
    for cuda, entry in enumerate(spec):
        hit = _match(entry, base, uuids, migs, backend, by_ordinal=source == "CUDA_VISIBLE_DEVICES")
        if hit is None:
            unresolved.append(entry)
            continue
        index, mig = hit
        devices.append(JobDevice(index, cuda if source == "CUDA_VISIBLE_DEVICES" else None, uuids[index], mig))
    if source == "CUDA_VISIBLE_DEVICES" and any(_number(e) is not None for e in spec) \
            and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len({_name(backend, i) for i in base}) > 1:
        notes.append("CUDA_VISIBLE_DEVICES gives ordinals and CUDA_DEVICE_ORDER is not PCI_BUS_ID on a node of "
                     "mixed GPUs: CUDA may number them differently from NVML; give UUIDs to be sure")
    sel = Selection(tuple(devices), False, source, tuple(unresolved), tuple(notes))
    if say:
        log.info("gpu_devices_resolved", source=source, devices=[sel.label(d.index) for d in devices],
                 unresolved=unresolved or None, notes=notes or None,
                 next="the gate, the monitor and the events look at these GPUs only")
    return sel


def _name(backend: GpuBackend, index: int) -> str:
    try:
        return backend.device_info(index).name
    except (GpuLostError, GpuDeviceError):
        return "?"


def _match(entry: str, base: Sequence[int], uuids: Mapping[int, str], migs: dict[int, Sequence[MigInfo]],
           backend: GpuBackend, *, by_ordinal: bool) -> tuple[int, MigInfo | None] | None:
    """One entry -> (NVML index, MIG slice or None). Ordinals count within ``base``; a bare number
    in ``gpu.devices`` or NVIDIA_VISIBLE_DEVICES is an NVML index."""
    n = _number(entry)
    if n is not None:
        if by_ordinal:
            return (base[n], None) if n < len(base) else None
        return (n, None) if n in base else None
    if entry.startswith("MIG-"):
        # the old form MIG-GPU-<uuid>/<gi>/<ci> names its parent; the current one is the slice's own UUID
        parts = entry[4:].split("/")
        gi, ci = (_number(parts[1]), _number(parts[2])) if len(parts) == 3 else (None, None)
        if gi is not None and ci is not None:
            for i in base:
                if uuids[i] == parts[0]:
                    return i, MigInfo(entry, gi, ci)
            return None
        for i in base:
            if i not in migs:
                try:
                    migs[i] = backend.mig_devices(i)
                except (GpuLostError, GpuDeviceError):
                    migs[i] = ()
            for m in migs[i]:
                if m.uuid.startswith(entry):
                    return i, m
        return None
    if not entry:
        return None
    hits = [i for i in base if uuids[i].startswith(entry)]
    return (hits[0], None) if len(hits) == 1 else None
