"""A static check of a checkpoint's pickle stream: which callables would unpickling it import?

Run before ``checkpoints.verify = "overlap"`` hands the newest checkpoint to the job, whose load
test has not finished yet: a stream that names anything outside the tensor-rebuild allowlist (the
globals ``torch.load(weights_only=True)`` accepts) is never handed over. The stream is walked with
:func:`pickletools.genops` (opcodes only; nothing is imported or executed), so the daemon still never
imports torch. For a ``torch.save`` zip file every ``*.pkl`` member (``<name>/data.pkl``) is scanned;
a legacy (non-zip) torch file is a sequence of pickles and each is scanned; a folder's pickle-like
files (``*.pt``, ``*.pth``, ``*.bin``, ``*.pkl``, ``*.ckpt``) are scanned one level down.

Why this and not picklescan or fickling: both are *denylist* scanners (they flag known-dangerous
imports such as ``os.system`` and pass the rest), while the job's ``weights_only`` load is an
*allowlist*; a denylist passes a callable it has not heard of. An allowlist walk is fail-closed,
about sixty lines, and needs no new dependency (fickling also pulls in its own decompiler).
"""
from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path
from typing import IO, Iterator

from .layouts import registry
from .structure import ZIP_MAGIC

# torch.load(weights_only=True)'s own allowlist, by name (torch/_weights_only_unpickler.py).
_ALLOWED_EXACT = frozenset({
    ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
    ("builtins", "slice"), ("builtins", "complex"), ("torch", "Size"), ("torch", "device"), ("torch", "dtype"),
    ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"), ("torch.serialization", "_get_layout"),
    ("torch", "strided"), ("torch", "sparse_coo"), ("torch", "sparse_csr"), ("torch", "sparse_csc"),
    ("torch", "sparse_bsr"), ("torch", "sparse_bsc"), ("torch", "_mkldnn"),
    ("torch._tensor", "_rebuild_from_type_v2"), ("torch._utils", "_rebuild_tensor_v3"),
    ("collections", "Counter"), ("_codecs", "encode"),  # _codecs.encode: bytes in a protocol-2 stream
    ("torch", "per_tensor_affine"), ("torch", "per_tensor_symmetric"), ("torch", "per_channel_affine"),
    ("torch", "per_channel_symmetric"), ("torch", "per_channel_affine_float_qparams"),
})
_TORCH_DTYPES = frozenset({
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64", "int32",
    "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool", "qint8", "quint8", "qint32", "quint4x2",
    "quint2x4", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "double", "float", "half",
    "long", "int", "short", "cfloat", "cdouble", "chalf",
})
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")
MAX_FILES = 64  # a folder with more pickle files is scanned in part: the load test still runs


def allowed(module: str, name: str) -> bool:
    if (module, name) in _ALLOWED_EXACT:
        return True
    if module == "torch._utils" and name.startswith("_rebuild_"):
        return True
    if module == "torch" and (name.endswith(("Storage", "Tensor")) or name in _TORCH_DTYPES
                              or (name[:-1] in ("int", "uint") and name[-1:] in "1234567")):
        return True
    # not torch.storage._load_from_bytes: it would torch.load a nested stream
    return module == "torch.storage" and name in ("UntypedStorage", "TypedStorage")


def _stream_globals(f: IO[bytes]) -> Iterator[str | None]:
    """Every ``module.name`` the stream imports; None for a STACK_GLOBAL whose operands cannot be
    told statically (itself a refusal). Stops at the end of the data or a malformed opcode."""
    while True:
        strings: list[object] = []  # the string operands pushed, newest last (for STACK_GLOBAL)
        memo: dict[object, object] = {}
        seen_any = False
        try:
            for op, arg, _pos in pickletools.genops(f):
                seen_any = True
                if op.name in ("GLOBAL", "INST"):
                    yield str(arg).replace(" ", ".", 1)
                elif op.name == "STACK_GLOBAL":
                    if len(strings) >= 2 and isinstance(strings[-2], str) and isinstance(strings[-1], str):
                        yield f"{strings[-2]}.{strings[-1]}"
                    else:
                        yield None
                elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
                                 "BINSTRING", "SHORT_BINSTRING"):
                    strings.append(arg)
                elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                    memo[arg] = strings[-1] if strings else None
                elif op.name in ("PROTO", "FRAME"):
                    continue  # framing, not on the stack (a frame may fall between a name's two parts)
                elif op.name == "MEMOIZE":
                    memo[len(memo)] = strings[-1] if strings else None
                elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                    strings.append(memo.get(arg))
                else:
                    strings.append(object())  # something else on the stack: not a name operand
        except (ValueError, EOFError, UnicodeDecodeError, OverflowError):
            return  # not (or no more) a pickle: the structural checks and the load test judge that
        if not seen_any:
            return


# HF's rng_state*.pth: the numpy data types the Trainer itself allow-lists to load them with
# weights_only=True (trainer_pt_utils.safe_globals), as the load test does: containers, no code.
RNG_PREFIX = "rng_state"


def numpy_data(module: str, name: str) -> bool:
    if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name == "_reconstruct":
        return True
    return (module == "numpy" and name in ("ndarray", "dtype")) or (module == "numpy.dtypes" and name.endswith("DType"))


def _scan_stream(f: IO[bytes], where: str, rng: bool = False) -> str | None:
    for g in _stream_globals(f):
        if g is None:
            return f"{where}: the pickle imports a callable whose name is computed (STACK_GLOBAL)"
        module, _, name = g.rpartition(".")
        if not allowed(module, name) and not (rng and numpy_data(module, name)):
            return f"{where}: the pickle references {g}, outside the tensor-rebuild allowlist"
    return None


def _scan_file(path: Path) -> str | None:
    rng = path.name.startswith(RNG_PREFIX)
    with open(path, "rb") as f:
        head = f.read(4)
        if head.startswith(ZIP_MAGIC):
            try:
                with zipfile.ZipFile(path) as z:
                    for info in z.infolist():
                        if info.filename.endswith(".pkl"):
                            with z.open(info) as member:
                                why = _scan_stream(member, f"{path.name}:{info.filename}", rng)
                                if why:
                                    return why
            except (zipfile.BadZipFile, OSError):
                return None  # a broken container is the structural check's finding
            return None
        if not head.startswith(b"\x80"):
            return None  # not a pickle (safetensors, text, ...)
        f.seek(0)
        return _scan_stream(f, path.name, rng)


def unsafe_pickle(path: Path) -> str | None:
    """Why unpickling ``path`` could run code outside the tensor-rebuild allowlist, or None."""
    try:
        if path.is_file():
            return _scan_file(path)
        if path.is_dir():
            # What the resume never reads is never handed over either: the layouts' skip list
            # (HF's training_args.bin, a pickle of the TrainingArguments class) is skipped, as
            # the load test skips it.
            files = [p for p in sorted(path.iterdir()) if p.is_file() and p.suffix in PICKLE_SUFFIXES]
            files += [p for d in sorted(path.iterdir()) if d.is_dir() and not d.is_symlink()
                      for p in sorted(d.iterdir()) if p.is_file() and p.suffix in PICKLE_SUFFIXES]
            files = [p for p in files if p.name not in registry.NEVER]
            for p in files[:MAX_FILES]:
                why = _scan_file(p)
                if why:
                    return why
    except OSError:
        return None  # unreadable now: the load test reports it
    return None
