"""The standby interpreter of a pre-warmed restart (``[job] prewarm``): the job's own Python,
started with the job's options, environment and working directory, that imports the modules the
previous attempt imported and then waits for one request: the next attempt's argv, environment,
working directory and its stdout/stderr (passed as file descriptors). It then runs the job's
script (``runpy.run_path``) or module (``runpy.run_module``) as ``__main__`` and exits with the
job's exit status, as ``python script.py`` would. Before it runs the job it takes the job's
command line (``argvarea.py``, loaded by path): /proc/PID/cmdline, and so ps, ``pgrep -f``, py-spy
and a scheduler's epilog, show the job's argv, and ``sys.orig_argv`` is the cold start's.

Run by path, never as a package module: ``PYTHON [job's options] standby.py SOCK_FD CONFIG_JSON
[ROOM]`` (ROOM: spaces, so that the argv area can hold the job's command line: argvarea.py).
Standard library only, and nothing of the supervisor: the job's Python need not have the
supervisor installed, and what is imported here is imported into the job.

Why no fork: each standby is a fresh process, one per attempt, started after the previous attempt
was launched. Whatever an import started (a thread, a socket, a CUDA context) belongs to this one
process, exactly as in a cold start; nothing is copied from a process that already ran.

The module list. Every attempt that runs through this runner (the cold ones too, when prewarm is
on) writes the names of the modules it imports to its own file, in import order: those in
``sys.modules`` when the job starts, then each ``import`` audit event (PEP 578; a module already
imported raises none, so the cost is one small write per module imported, nothing per step). The
next standby follows that file while it grows and imports, in order, only the modules whose
top-level package lives under this interpreter's standard library or site-packages and is not
found in the job's own directory or working directory (user code may do anything at import
time; a same-named module there would shadow the installed one). The supervisor's own package is
never preloaded: its client reads the attempt's TSUP_* variables.

Never stale: what the standby imported is compared at the hand-over with what is on disk now
(``codeseen.py``, loaded by path: file identities, ``.pth`` files, installed distributions); a
package upgraded or edited since, and it answers ``stale code changed (<module>)``: the attempt
starts cold and says why.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import sysconfig
import traceback

TYPE_CHECKING = False  # typing itself is not imported: the standby's imports are the job's
if TYPE_CHECKING:
    from types import ModuleType

    from .codeseen import CodeSeen

HEAD = struct.Struct("!I")  # the request's JSON length
MAX_REQUEST = 64 << 20
FOLLOW_POLL_S = 0.2  # how often the growing module list of the running attempt is read again
NICE = 19  # while importing, with SCHED_IDLE: the running attempt goes first, always
NEVER = ("__main__", "supervisor")  # top-level names never preloaded


class Refused(Exception):
    """Why this standby cannot run the request: the daemon starts the attempt cold instead."""


class Stale(Refused):
    """What this standby imported changed on disk: the reason is the attempt's, as it is."""


def load_sibling(name: str) -> "ModuleType":
    """``name``.py of this folder, loaded by path and never put in sys.modules: this folder is not
    on the job's path, and the job's sys.modules holds only what it imports itself."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_tsup_standby_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_codeseen() -> "CodeSeen":
    """A :class:`CodeSeen` of ``codeseen.py``, loaded by path."""
    return load_sibling("codeseen").CodeSeen()


# -- the module list ------------------------------------------------------------------------
def install_roots() -> list[str]:
    """The folders an installed module lives in: the standard library and site-packages."""
    import site

    roots = {sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # a virtualenv's old site.py
        pass
    roots.add(site.getusersitepackages())
    return sorted(os.path.realpath(r) for r in roots if r)


def _under(path: str, roots: list[str]) -> bool:
    p = os.path.realpath(path)
    return any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


class Allowed:
    """Which top-level names may be preloaded (decided once per name)."""

    def __init__(self, roots: list[str], exclude: list[str]) -> None:
        self.roots = roots
        self.exclude = [os.path.realpath(d) for d in exclude if d]
        self._seen: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        top = name.partition(".")[0]
        if top not in self._seen:
            self._seen[top] = self._decide(top)
        return self._seen[top]

    def _decide(self, top: str) -> bool:
        if not top.isidentifier() or top in NEVER:
            return False
        if self.exclude and importlib.machinery.PathFinder.find_spec(top, self.exclude) is not None:
            return False  # the job's own directory has it: the job imports that one, not ours
        if top in sys.builtin_module_names:
            return True
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: finds, imports nothing
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        if spec.origin in ("built-in", "frozen"):
            return True
        places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or ())
        return bool(places) and all(
            _under(p, self.roots) and not any(_under(p, [d]) for d in self.exclude) for p in places)


def preload(name: str, allowed: Allowed) -> bool:
    """Import ``name`` when allowed; any failure is the job's to meet again (it is not fatal here)."""
    if name in sys.modules or not allowed(name):
        return False
    try:
        importlib.import_module(name)
        return True
    except BaseException:  # an import that fails or exits here fails the same way in the job
        return False


def cuda_initialised() -> bool:
    """True when a preloaded module created a CUDA context. torch does not at import: its CUDA
    state is initialised lazily (torch.cuda._lazy_init, on the first CUDA call), and
    ``torch.cuda.is_initialized()`` reads that flag without initialising anything. Checked before
    every run, so a library that does initialise CUDA at import makes the attempt cold."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:
        return True  # cannot tell: doubt


# -- priority ------------------------------------------------------------------------------
def _autogroup_nice() -> int | None:
    """This session's autogroup nice (``/autogroup-N nice K``); None where there is none."""
    try:
        with open("/proc/self/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_autogroup_nice(n: int) -> None:
    with open("/proc/self/autogroup", "w") as f:  # OSError where there is none
        f.write(str(n))


def lower_priority() -> tuple[int | None, int | None]:
    """Idle CPU priority for the imports; what to restore: (nice value, autogroup nice). With
    sched_autogroup (most distributions) CPU is first shared between sessions, and the standby has
    one of its own: its autogroup nice goes to 19 (back to 0 needs no privilege). The threads get
    nice 19 and SCHED_IDLE where we may undo both before the job runs (root, or an RLIMIT_NICE
    that allows it; leaving SCHED_IDLE is checked as a nice change)."""
    import resource

    group = _autogroup_nice()
    try:
        if group is not None and group < NICE:
            _set_autogroup_nice(NICE)
        else:
            group = None
    except OSError:
        group = None
    try:
        orig = os.getpriority(os.PRIO_PROCESS, 0)
        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        may = os.geteuid() == 0 or soft == resource.RLIM_INFINITY or 20 - soft <= orig
        if not may or orig >= NICE or os.sched_getscheduler(0) != os.SCHED_OTHER:
            return None, group  # (a job started under another policy gets nothing we could not give back)
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except OSError:
        return None, group
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        pass  # nice 19 alone
    return orig, group


def restore_priority(orig: tuple[int | None, int | None]) -> None:
    """Autogroup nice, then each thread's policy (first: allowed at nice 19) and nice, as the job's."""
    nice, group = orig
    if group is not None:
        try:
            _set_autogroup_nice(group)
        except OSError as e:
            raise Refused(f"cannot restore the job's session CPU priority ({e})") from e
    if nice is None:
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) != os.SCHED_OTHER:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue
        except OSError as e:
            raise Refused(f"cannot restore the job's CPU priority ({e})") from e


# -- the request ---------------------------------------------------------------------------
def read_request(sock: socket.socket) -> tuple[dict, list[int]]:
    """One request: a length, its JSON, and the job's stdout and stderr as fds."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 2)
    if not data:
        raise EOFError("the daemon closed the standby's socket")
    while len(data) < HEAD.size or len(data) < HEAD.size + HEAD.unpack_from(data)[0]:
        if len(data) >= HEAD.size and HEAD.unpack_from(data)[0] > MAX_REQUEST:
            raise EOFError("request too large")
        more = sock.recv(1 << 16)
        if not more:
            raise EOFError("the request was cut short")
        data += more
    (n,) = HEAD.unpack_from(data)
    return json.loads(data[HEAD.size:HEAD.size + n]), list(fds)


def main_path(req: dict) -> tuple[str, str]:
    """('script', path) or ('module', name), as the daemon planned it."""
    kind, target = req["kind"], req["target"]
    if kind not in ("script", "module") or not isinstance(target, str):
        raise Refused(f"unknown request kind {kind!r}")
    return kind, target


def prepare(req: dict, fds: list[int], orig_prio: tuple[int | None, int | None],
            seen: CodeSeen | None = None) -> tuple[str, str]:
    """Everything that can still refuse (before the reply): after it, only the job can fail."""
    if len(fds) != 2:
        raise Refused(f"expected the job's stdout and stderr, got {len(fds)} fds")
    kind, target = main_path(req)
    if kind == "script" and not os.path.isfile(os.path.join(req["cwd"], target)):
        raise Refused(f"{target} is not a plain file (a folder or an archive runs its __main__)")
    if cuda_initialised():
        raise Refused("a preloaded module initialised CUDA")
    changed = seen.changed() if seen is not None else None
    if changed:
        raise Stale(changed)
    restore_priority(orig_prio)
    try:
        os.chdir(req["cwd"])
    except OSError as e:
        raise Refused(f"cannot enter the working directory ({e})") from e
    return kind, target


def record_imports(path: str) -> None:
    """This attempt's module list (see the module docstring): what is imported now, then each
    import as it starts. A write that fails (the job closed the fd, a full disk) is ignored: the
    list only decides what the next standby preloads."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        os.write(fd, "".join(f"{m}\n" for m in list(sys.modules)).encode())
    except OSError:
        return

    def hook(event: str, args: tuple) -> None:
        if event == "import":
            try:
                os.write(fd, f"{args[0]}\n".encode())
            except Exception:
                pass

    sys.addaudithook(hook)


def _set_sys_path0(value: str | None) -> None:
    """What the interpreter puts first on sys.path for this kind of run (none with -P or -I)."""
    if value is not None and not (sys.flags.safe_path or sys.flags.isolated):
        sys.path.insert(0, value)


def run_script(path: str) -> None:
    """``python path``: a fresh ``__main__`` with the absolute ``__file__`` and loader the
    interpreter gives a script (runpy.run_path would also put its path in sys.argv[0], which the
    interpreter leaves as given)."""
    import builtins
    import types

    full = os.path.abspath(path)
    with open(full, "rb") as f:  # as io.open_code: the source, never a cached .pyc (nor does python)
        source = f.read()
    code = compile(source, full, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=full, __cached__=None, __package__=None, __spec__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", full))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def run_job(req: dict, kind: str, target: str) -> int:
    """Run the job as ``__main__``; its exit status, as the interpreter would report it."""
    os.environ.clear()
    os.environ.update(req["env"])
    argv = [str(a) for a in req["args"]]
    if kind == "script":
        _set_sys_path0(os.path.dirname(os.path.realpath(target)))
        sys.argv = [target, *argv]
    else:
        _set_sys_path0(os.getcwd())
        sys.argv = ["-m", *argv]  # run_module(alter_sys=True) puts the module's file first, as -m does
    if hasattr(sys, "orig_argv") and req.get("argv"):  # 3.10+: the command as a cold start was given it
        sys.orig_argv = [str(a) for a in req["argv"]]
    try:
        if kind == "script":
            run_script(target)
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return _exit_code(e)
    except KeyboardInterrupt as e:
        _print_exception(e)
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as the interpreter: killed by SIGINT
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException as e:
        _print_exception(e)
        return 1
    return 0


def _exit_code(e: SystemExit) -> int:
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _print_exception(e: BaseException) -> None:
    """The traceback Python prints, without our frames (this runner's and runpy's)."""
    tb = e.__traceback__
    ours = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
                              or os.path.realpath(tb.tb_frame.f_code.co_filename) in ours):
        tb = tb.tb_next
    e.__traceback__ = tb  # the default hook prints the exception's own traceback, not its argument
    try:
        sys.excepthook(type(e), e, tb)
    except Exception:
        traceback.print_exception(type(e), e, tb)


# -- the standby's life --------------------------------------------------------------------
def wait_and_preload(sock: socket.socket, follow: str, allowed: Allowed, seen: CodeSeen | None = None) -> None:
    """Import the running attempt's modules as its list grows, until the request arrives."""
    offset, pending = 0, b""
    while True:
        got = b""
        if follow:
            try:
                with open(follow, "rb") as f:
                    f.seek(offset)
                    got = f.read()
            except OSError:
                got = b""
            offset += len(got)
        lines = (pending + got).split(b"\n")
        pending = lines.pop()
        for raw in lines:
            if select.select([sock], [], [], 0)[0]:
                return  # the request first: what is left the job imports itself
            name = raw.decode("utf-8", "replace").strip()
            if seen is not None:
                seen.before(name)  # its file as it is before the import reads it
            if preload(name, allowed) and seen is not None:
                seen.note()  # the new modules' files, as they were when read
        if select.select([sock], [], [], FOLLOW_POLL_S)[0]:
            return


def main(args: list[str]) -> int:
    sock = socket.socket(fileno=int(args[0]))
    conf = json.loads(args[1])
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == here:
        del sys.path[0]  # our own folder is not the job's: nothing may be imported from it
    seen = load_codeseen()  # what is imported already (site, its .pth files) and sys.path
    orig_prio = lower_priority() if conf.get("nice", True) else (None, None)
    if conf.get("follow"):
        wait_and_preload(sock, conf["follow"], Allowed(install_roots(), conf.get("exclude") or []), seen)
    try:
        req, fds = read_request(sock)
    except (EOFError, OSError, ValueError):
        return 0  # the daemon went away or gave up on us: nothing ran, nothing to say
    try:
        kind, target = prepare(req, fds, orig_prio, seen)
    except Refused as e:
        sock.sendall(f"{'stale' if isinstance(e, Stale) else 'refuse'} {e}\n".encode())
        return 0
    # The job's own command line for ps, pgrep -f and py-spy (argvarea.py), before the daemon
    # hears "ok": from the launch on, the attempt is found by its argv. A failure is said, not fatal.
    shown = load_sibling("argvarea").show(req["argv"]) if req.get("argv") else "the request has no argv"
    sock.sendall(b"ok\n" if shown is None else f"ok {shown}\n".encode())
    sock.close()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    record_imports(req.get("modules_log") or "")
    return run_job(req, kind, target)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
