"""The text rules of the detectors, as data: for each cause the regexes whose match on a log line
means it (with a summary, and the literal anchors checked before the regex runs), and the keyword
prefilter of each detector. Read by :mod:`.detectors` (see its doc for the classification)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

from ..events import Action, Cause


@dataclass(frozen=True)
class TextRule:
    """A regex whose match on a line means ``cause``, with a human summary.

    ``anchors``: literal substrings one of which any match contains; checked with ``in`` before
    the regex runs (a substring test costs tens of nanoseconds, a regex search microseconds).
    Empty for user patterns: those always run.
    """

    cause: Cause
    pattern: re.Pattern[str]
    summary: str
    anchors: tuple[str, ...] = ()
    action: Action | None = None
    # True when a match only names the sign in prose ("skipping NaN loss check"): no detection.
    unless: Callable[[str, re.Match[str]], bool] | None = None


def rules_for(cause: Cause, rows: Iterable[tuple[str | tuple[str, ...], str, str]],
              unless: Callable[[str, re.Match[str]], bool] | None = None) -> list[TextRule]:
    out = []
    for anchors, pattern, summary in rows:
        out.append(TextRule(cause, re.compile(pattern), summary, (anchors,) if isinstance(anchors, str) else anchors,
                            unless=unless))
    return out


# A NaN rule's match is prose, not a sign, when a word just before it says the line is about the check
# ("skipping NaN loss check", "if loss is nan", "check whether the loss = nan") or the word right after
# it names a setting ("NaN loss detection: on", "nan detected handler enabled").
_PROSE_BEFORE = re.compile(
    r"(?i)\b(?:skip\w*|check\w*|no|not|never|without|disabl\w*|enabl\w*|ignor\w*|if|whether|unless|guard\w*|"
    r"handl\w*|detection|detecting|catch\w*|mask\w*|replac\w*|allow\w*|toleran\w*|tolerat\w*|avoid\w*|prevent\w*|"
    r"when|whenever)\s+(?:(?:the|a|an|any|all|of|for|on)\s+)?$")
_PROSE_AFTER = re.compile(
    r"(?i)[\s_-]*(?:(?:checks?|checking|checker|guards?|detection|detector|handling|handler|filter\w*|protection|hooks?|"
    r"callbacks?|mode|policy|threshold|options?|flags?|settings?|skipping is)\b|[:=]\s*(?:on|off|true|false|enabled|disabled|"
    r"yes|no)\b)")


def nan_prose(line: str, m: re.Match[str]) -> bool:
    """True when the NaN rule's match ``m`` is a mention of the check, not a NaN (see above)."""
    return (_PROSE_BEFORE.search(line, max(0, m.start() - 40), m.start()) is not None
            or _PROSE_AFTER.match(line, m.end()) is not None)


OOM_RULES = rules_for(Cause.OOM, [
    ("out of memory", r"(?:CUDA|HIP|XPU|MPS)(?: error:)? out of memory", "GPU out of memory"),
    ("OutOfMemoryError", r"OutOfMemoryError", "GPU out of memory"),
    # NCCL's CUDACHECK: "NCCL WARN Cuda failure 2 'out of memory'" (NCCL_DEBUG=WARN or INFO, printed at the
    # failure, before the exception) and the "Last error:" line of its ncclUnhandledCudaError (issue 39)
    ("out of memory'", r"Cuda failure(?: \d{1,4})? 'out of memory'", "GPU out of memory (NCCL: Cuda failure)"),
    (("ALLOC_FAILED", "cudaErrorMemoryAllocation"),
     r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", "GPU allocation failed"),
    ("MemoryError", r"^\s*(?:\[rank\d+\]:\s*)?MemoryError\b", "host out of memory (MemoryError)"),
    ("bad_alloc", r"std::bad_alloc", "host allocation failed (std::bad_alloc)"),
    ("Out of memory", r"RESOURCE_EXHAUSTED: Out of memory", "device out of memory"),
])

# "A.*B" rules are written "^(?>.*?A).*B": the same lines match (some A has a B after it exactly when
# the first A does), but the search stops after the first A instead of rescanning the rest of the line
# from every later A, which made a line of repeated A's cost time quadratic in its length.
NCCL_RULES = rules_for(Cause.NCCL_TIMEOUT, [
    ("Watchdog caught", r"Watchdog caught collective operation timeout", "NCCL collective timed out (watchdog)"),
    ("ProcessGroupNCCL", r"^(?>.*?ProcessGroupNCCL).*(?:[Tt]imeout|timed out|[Ee]rror|abort)", "ProcessGroupNCCL error"),
    ("ommunicator", r"[Cc]ommunicator (?:was )?abort", "NCCL communicator aborted"),
    ("Some NCCL operations", r"Some NCCL operations have failed or timed out", "NCCL operations failed or timed out"),
    ("NCCL watchdog", r"NCCL watchdog thread terminated", "NCCL watchdog terminated"),
    ("nccl", r"nccl(?:InternalError|SystemError|UnhandledCudaError|RemoteError|InvalidUsage)\b", "NCCL error"),
    (("NCCL error", "NCCL Error", "NCCL ERROR"),
     r"^(?>.*?NCCL (?:error|Error|ERROR)\b).*(?:timeout|timed out|unhandled|remote|internal|system)", "NCCL error"),
    ("DistBackendError", r"DistBackendError", "distributed backend error"),
    (("ocket", "Connection reset"),
     r"(?:Socket|socket) [Tt]imeout|^(?>.*?Connection reset by peer).*(?:gloo|nccl|c10d)", "collective socket timeout"),
])

GPU_RULES = rules_for(Cause.GPU_FAULT, [
    ("uncorrectable ECC", r"uncorrectable ECC error", "uncorrectable ECC error"),
    (("GPU is lost", "off the bus"), r"GPU is lost|fallen off the bus", "GPU lost"),
    # The driver's own failures, as CUDA reports them: the device, not the job's code (Xid in dmesg).
    (("CUDA error: unknown error", "CUDA error: device not ready"), r"CUDA error: (?:unknown error|device not ready)",
     "the CUDA driver failed (a GPU fault: look for an Xid in dmesg)"),
])

# A CUDA error is the job's crash, said with the CUDA message (issue 35 part 8: "an illegal memory
# access was encountered" was filed as nccl_timeout). Its forms that mean something more specific
# keep their causes: out of memory and the ALLOC_FAILED statuses are oom (OOM_RULES); the driver's
# unknown error, device not ready, GPU is lost and ECC forms are gpu_fault (GPU_RULES); the NCCL
# rules see an NCCL error first on its own line. Bounded: the message is cut at 200 characters.
CUDA_NOT_CRASH = ("out of memory", "unknown error", "device not ready", "GPU is lost", "uncorrectable ECC",
                  "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
_NOT_CRASH = "|".join(re.escape(x) for x in CUDA_NOT_CRASH)
CUDA_ERROR = re.compile(
    rf"CUDA error: (?!{_NOT_CRASH})(?P<cuda>[^\r\n]{{1,200}})"
    r"|cuDNN error: (?P<cudnn>CUDNN_STATUS_(?!ALLOC_FAILED)[A-Z_]{1,40})"
    r"|(?P<cublas>CUBLAS_STATUS_(?!ALLOC_FAILED)[A-Z_]{1,40})"
    r"|(?P<bare>an illegal memory access was encountered|unspecified launch failure|device-side assert triggered)")
CUDA_ANCHORS = ("CUDA error", "cuDNN error", "CUBLAS_STATUS", "illegal memory access", "unspecified launch failure",
                "device-side assert")
# NCCL's report of a failed CUDA call and the failure it names ("Last error:" then "Cuda failure 'X'")
NCCL_UNHANDLED = re.compile(r"unhandled cuda error|ncclUnhandledCudaError")
NCCL_CUDA_OOM = re.compile(r"Cuda failure(?: \d{1,4})? 'out of memory'")
XID_LINE = re.compile(r"NVRM: Xid \(([^)]{0,200})\): (\d+)")  # bounded: a crafted line of "NVRM: Xid (" stays linear

CKPT_RULES = rules_for(Cause.CHECKPOINT_LOAD_ERROR, [
    ("Missing key(s) in state_dict", r"Missing key\(s\) in state_dict", "missing keys in state_dict"),
    ("Unexpected key(s) in state_dict", r"Unexpected key\(s\) in state_dict", "unexpected keys in state_dict"),
    ("in loading state_dict", r"Error\(s\) in loading state_dict", "state_dict does not match the model"),
    ("size mismatch for", r"size mismatch for \S+", "tensor size mismatch in state_dict"),
    ("PytorchStreamReader failed", r"PytorchStreamReader failed", "checkpoint archive unreadable (PytorchStreamReader)"),
    (("nexpected EOF", "EOFError"), r"[Uu]nexpected EOF|EOFError: Ran out of input",
     "checkpoint file truncated (unexpected EOF)"),
    ("Weights only load failed", r"Weights only load failed", "weights-only checkpoint load failed"),
    ("UnpicklingError", r"UnpicklingError", "checkpoint unpickling failed"),
    (("SafetensorError", "deserializing header"), r"SafetensorError|Error while deserializing header",
     "safetensors checkpoint unreadable"),
    # HF Trainer, --resume_from_checkpoint a folder with no weights file. Its resume *warnings*
    # ("There were missing keys in the checkpoint model loaded: ['lm_head.weight']." for tied
    # weights, printed on every resume) are not load errors and match nothing here.
    ("valid checkpoint", r"Can't find a valid checkpoint at", "HF Trainer found no weights in the checkpoint folder"),
])

# Lines that speak of NaN/inf: never a detection (a NaN is a value in a metric, never a word), only
# the nan_mentioned warning (watch/nannotes.py); the NanDetector judges Megatron's count as a value.
NAN_TEXT_RULES = rules_for(Cause.NAN, [
    ("nan iterations", r"number of nan iterations:\s*([1-9]\d*)", "Megatron reports nan iterations"),
    (("oss is", "oss became", "oss was", "oss ="), r"\b[Ll]oss (?:is|became|was|=) (?:NaN|nan|NAN|inf|Inf|-inf)\b",
     "loss is not finite"),
    (("NaN", "nan ", "Detected"),
     r"\b(?:NaN|nan) (?:or Inf )?(?:loss|detected|found)\b|\bDetected (?:NaN|nan|inf|Inf)\b", "NaN detected"),
    ("is non-finite", r"is non-finite, so it cannot be clipped", "gradient norm is non-finite"),
    ("returned nan values", r"returned nan values in its \d+th output", "autograd anomaly: nan"),
], unless=nan_prose)


# Literal anchors per detector: every built-in rule of a detector contains one of its anchors,
# so a line without any of them cannot match and is never shown to it. Few anchors = fewer passes
# over each batch; "oss" is shared with the metric parser (loss), "emory" by oom and nccl.
NAN_TEXT_KEYWORDS = ("nan", "NaN", "oss", "-finite", "etected")
OOM_KEYWORDS = ("emory", "ALLOC", "_alloc")
NCCL_KEYWORDS = ("NCCL", "nccl", "ommunicator", "Watchdog", "DistBackend", "ocket", "onnection reset", "emory", "launch", "ECC",
                 "GPU is lost", "off the bus", "Xid", "Cuda failure", *CUDA_ANCHORS)
CKPT_KEYWORDS = ("state_dict", "mismatch", "Stream", "EOF", "npickl", "Weights only", "afetensor", "deserializ",
                 "valid checkpoint")
