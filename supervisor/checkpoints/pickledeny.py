"""Callables a checkpoint's pickle may never name: they run code or reach the system whatever
their arguments (issue 34 part 5, the adversarial round's ``rng_state.npy`` holding an
``os.system`` reduce). A checkpoint whose pickle names one is refused outright, by the full gate
too: a weights-only load test of the folder's weights file would pass, and the job's own careless
load of that file would run it. Anything else outside the allowlist (HF's ``training_args.bin``
pickles ``TrainingArguments``) is left to the load test, as before. Not complete (a gadget in an
installed package is not named here): the allowlist and the weights-only load test stay the
guard; this catches the plain payloads. Pure."""
from __future__ import annotations

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



__all__ = ["RUNS_CODE", "names_code", "runs_code"]
