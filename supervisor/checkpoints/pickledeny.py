"""Callables a checkpoint's pickle may never name: they run code or reach the system whatever
their arguments (issue 34 part 5, the adversarial round's ``rng_state.npy`` holding an
``os.system`` reduce). A checkpoint whose pickle names one is refused outright, by the full gate
too: a weights-only load test of the folder's weights file would pass, and the job's own careless
load of that file would run it. Anything else outside the allowlist (HF's ``training_args.bin``
pickles ``TrainingArguments``) is left to the load test, as before. Not complete (a gadget in an
installed package is not named here): the allowlist and the weights-only load test stay the
guard; this catches the plain payloads. Pure."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Callables that run code or reach the system whatever their arguments: a checkpoint whose pickle
# names one is refused outright, by the full gate too (a weights-only load test of the folder's
# weights file would pass, and the job's own careless load of that file would run it). Anything
# else outside the allowlist (HF's training_args.bin pickles TrainingArguments) is left to the
# load test, as before. Not complete (a gadget in an installed package is not named here): the
# allowlist and the weights-only load test stay the guard; this catches the plain payloads.
RUNS_CODE_MODULES = frozenset({"os", "posix", "nt", "subprocess", "pty", "runpy", "importlib", "ctypes", "socket",
                                "shutil", "pickle", "marshal", "code", "codeop", "multiprocessing", "webbrowser",
                                "commands", "popen2", "timeit", "pdb", "cProfile", "profile", "sys"})
RUNS_CODE_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "getattr", "setattr", "delattr", "open",
                                 "breakpoint", "input", "globals", "locals", "vars", "execfile"})
#: the words a refusal for such a callable carries (:func:`runs_code` reads them)
RUNS_CODE = "a callable that runs code"


def names_code(module: str, name: str) -> bool:
    top = module.split(".", 1)[0]
    if top in RUNS_CODE_MODULES:
        return True
    if top in ("builtins", "__builtin__"):
        return name in RUNS_CODE_BUILTINS
    return top == "operator" and name in ("attrgetter", "methodcaller")


def runs_code(reason: str | None) -> bool:
    """Whether a scan's refusal names a callable that runs code (not merely one outside the allowlist)."""
    return reason is not None and RUNS_CODE in reason


@dataclass(frozen=True)
class Refusal:
    """The pickle scan's refusal of a checkpoint: the file it refused (its place in the folder; the
    checkpoint's own name for a single file or the folder as a whole) and why (the scan's words).
    ``transient``: for a reason that may pass by itself (a file that cannot be read now, a reader
    past its deadline on a loaded machine), so the verdict is not remembered (:mod:`.scancache`)."""

    file: str
    why: str
    transient: bool = False

    def detail(self) -> str:
        """``why`` without the file's name it begins with."""
        return self.why.removeprefix(self.file).removeprefix(":").strip() or self.why


def scan_verdict(refusal: Refusal | None, load_test: Any) -> str | None:
    """The one rule: what the pickle scan's refusal makes of a checkpoint's readiness (the reason
    it is not ready, or None). Every file the scan refused keeps it from being ready (the job may
    load that file carelessly, and no test of ours read it: an rng_state.npy, a .pkl.gz, a DCP
    byte item), with one exception: a torch file the passed load test itself loaded with
    ``weights_only=True`` (``load_test.weights_only`` names it), and for a reason other than a
    callable that runs code. There torch's own allowlist read that very file and accepted it,
    so the scan's shorter list is not the last word (a dtype newer than the scan's table).
    ``load_test``: a :class:`~.loadtest.LoadTestResult` or None (none ran)."""
    if refusal is None:
        return None
    if (not runs_code(refusal.why) and load_test is not None and load_test.passed
            and refusal.file in getattr(load_test, "weights_only", ())):
        return None
    return f"pickle scan refused {refusal.file}: {refusal.detail()}"


__all__ = ["RUNS_CODE", "Refusal", "names_code", "runs_code", "scan_verdict"]
