"""The names a scanned checkpoint pickle may import (:mod:`.picklescan`'s tables, pure): the
tensor-rebuild allowlist of ``torch.load(weights_only=True)`` (torch/_weights_only_unpickler.py,
kept equal to torch 2.13's by ``tests/checkpoints/test_picklenames.py``), the numpy data types HF's
Trainer allows in ``rng_state*.pth``, and the legacy tar format's storage element sizes."""
from __future__ import annotations

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
# Every torch.dtype torch 2.13's weights-only load accepts (int1-7 / uint1-7 by pattern below): a
# dtype missing here made a healthy checkpoint "refused" (float8_e8m0fnu MX scales, float4 weights).
_TORCH_DTYPES = frozenset({
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64", "int32",
    "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool", "qint8", "quint8", "qint32", "quint4x2",
    "quint2x4", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "double", "float", "half",
    "long", "int", "short", "cfloat", "cdouble", "chalf",
})
# The legacy tensor types' modules (torch.cuda.FloatTensor, torch.sparse.LongTensor, ...), which
# torch's allowlist names for old saves; their storages too (torch.cuda.FloatStorage).
_LEGACY_TYPE_MODULES = ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse")
# The legacy tar format's storage types (torch.<Kind>Storage) and their element sizes in bytes.
ELEMENT_SIZE = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1, "ComplexDouble": 16, "ComplexFloat": 8, "QUInt8": 1, "QInt8": 1,
                "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1}


def allowed(module: str, name: str) -> bool:
    """Whether ``torch.load(weights_only=True)`` imports ``module.name`` by default."""
    if (module, name) in _ALLOWED_EXACT:
        return True
    if module == "torch._utils" and name.startswith("_rebuild_"):
        return True
    if module in _LEGACY_TYPE_MODULES and name.endswith(("Storage", "Tensor")):
        return True
    if module == "torch" and (name in _TORCH_DTYPES or (name[:-1] in ("int", "uint") and name[-1:] in "1234567")):
        return True
    # not torch.storage._load_from_bytes: it would torch.load a nested stream
    return module == "torch.storage" and name in ("UntypedStorage", "TypedStorage")


# HF's rng_state*.pth: the numpy data types the Trainer itself allow-lists to load them with
# weights_only=True (trainer_pt_utils.safe_globals), as the load test does: containers, no code.
RNG_PREFIX = "rng_state"


def numpy_data(module: str, name: str) -> bool:
    if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name == "_reconstruct":
        return True
    return (module == "numpy" and name in ("ndarray", "dtype")) or (module == "numpy.dtypes" and name.endswith("DType"))


__all__ = ["ELEMENT_SIZE", "RNG_PREFIX", "allowed", "numpy_data"]
