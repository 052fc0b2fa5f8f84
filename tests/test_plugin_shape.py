"""The plug-ins' shape (supervisor/daemon/plugin.py, issue 36): a plug-in only reacts. Read from the
source (no import): a module that defines a plug-in imports neither the runner nor the wiring
nor the daemon's view, a plug-in holds no reference to the daemon or to another plug-in and calls
none back (``self.daemon``, ``daemon.event(``, ``.emit(``, ``.apply(``), and no class is a plug-in
and a port at once (it has every method of a port's Protocol in daemon/ports.py). Each check is
shown failing on a crafted module first."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "supervisor"
CAPABILITIES = frozenset({"Plugin", "OnStart", "OnAttempts", "OnMetrics", "OnTicks", "OnNotes", "GivesStatus",
                          "GivesLiveStatus", "GivesMonitors", "GivesJobEnv", "GivesEndFacts", "Closes"})
FORBIDDEN_MODULES = ("supervisor.daemon.runner", "supervisor.daemon.wiring")
FORBIDDEN_NAMES = frozenset({"DaemonView", "Runner", "Concern", "ConcernSet"})
CALLS_BACK = ("emit", "apply")
# The concerns still in the old shape (one base with optional hooks and a DaemonView): the base is
# gone and none may come back.
OLD_SHAPE: frozenset[str] = frozenset()


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PKG.parent)): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def _base_names(c: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else b.attr for b in c.bases if isinstance(b, (ast.Name, ast.Attribute))}


def plugin_classes(sources: dict[str, str]) -> dict[str, tuple[str, ast.ClassDef]]:
    """Every class that derives from a capability base (directly or through another such class)."""
    classes = [(path, node) for path, src in sources.items() for node in ast.walk(ast.parse(src))
               if isinstance(node, ast.ClassDef)]
    names = set(CAPABILITIES)
    found: dict[str, tuple[str, ast.ClassDef]] = {}
    grew = True
    while grew:
        grew = False
        for path, c in classes:
            if c.name not in found and c.name not in CAPABILITIES and _base_names(c) & names:
                found[c.name] = (path, c)
                names.add(c.name)
                grew = True
    return found


def port_methods(ports_src: str) -> dict[str, set[str]]:
    """Each Protocol class of daemon/ports.py and its method names."""
    return {n.name: {f.name for f in n.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
            for n in ast.parse(ports_src).body
            if isinstance(n, ast.ClassDef) and "Protocol" in _base_names(n) and n.name != "DaemonView"}


def violations(sources: dict[str, str], ports_src: str) -> list[str]:
    plugins = plugin_classes(sources)
    ports = port_methods(ports_src)
    out: list[str] = []
    for path in sorted({p for p, _ in plugins.values()}):
        for node in ast.walk(ast.parse(sources[path])):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if any(mod.endswith(f.rsplit(".", 1)[1]) and (node.level or mod.startswith("supervisor"))
                       for f in FORBIDDEN_MODULES):
                    out.append(f"{path}: imports {mod}")
                out += [f"{path}: imports {a.name}" for a in node.names if a.name in FORBIDDEN_NAMES]
    for name, (path, c) in sorted(plugins.items()):
        methods = {f.name for f in c.body if isinstance(f, ast.FunctionDef)}
        out += [f"{path}: {name} is a plug-in and the port {port}" for port, need in ports.items()
                if need and need <= methods]
        for node in ast.walk(c):
            if isinstance(node, ast.Attribute) and node.attr == "daemon":
                out.append(f"{path}:{node.lineno}: {name} reaches the daemon")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and (node.func.attr in CALLS_BACK or (node.func.attr == "event" and isinstance(node.func.value, ast.Name)
                                                          and node.func.value.id in ("d", "daemon")))):
                out.append(f"{path}:{node.lineno}: {name} calls back .{node.func.attr}(")
            ann = node.annotation if isinstance(node, (ast.AnnAssign, ast.arg)) else None
            if ann is not None:
                held = {n.id for n in ast.walk(ann) if isinstance(n, ast.Name)} | {
                    n.value for n in ast.walk(ann) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
                line = getattr(node, "lineno", 0)
                out += [f"{path}:{line}: {name} holds the plug-in {h}" for h in sorted(held & set(plugins)) if h != name]
    return out


def test_every_plugin_only_reacts_and_none_is_a_port():
    sources = _sources()
    assert plugin_classes(sources), "no plug-in found: the scan is broken"
    assert violations(sources, (PKG / "daemon" / "ports.py").read_text()) == []


def test_no_concern_is_added_in_the_old_shape():
    old = {n.name for src in _sources().values() for n in ast.walk(ast.parse(src))
           if isinstance(n, ast.ClassDef) and "Concern" in _base_names(n)}
    assert old <= OLD_SHAPE, f"new concerns in the old shape (write them as plug-ins): {sorted(old - OLD_SHAPE)}"


CRAFTED_PORTS = '''
class HealthGate(Protocol):
    def check(self, previous_pids): ...
'''
CRAFTED = '''
from ..daemon.runner import Runner
from .plugin import OnTicks, GivesStatus
from .ports import DaemonView

class Watcher(OnTicks):
    def tick(self, n, run):
        self.daemon.event("x", "info", "y")
        return ()

class Gate(GivesStatus):
    def check(self, previous_pids):
        return None

class Leans(OnTicks):
    def __init__(self, other: Watcher, d: "DaemonView") -> None:
        self.other = other
    def tick(self, n, run):
        d.emit(None)
        return ()
'''


def test_the_shape_check_fails_on_each_kind_of_violation():
    found = violations({"supervisor/daemon/crafted.py": CRAFTED}, CRAFTED_PORTS)
    text = "\n".join(found)
    assert "imports ..daemon.runner" in text or "imports daemon.runner" in text, text
    assert "imports DaemonView" in text and "imports Runner" in text
    assert "Watcher reaches the daemon" in text
    assert "Gate is a plug-in and the port HealthGate" in text
    assert "Leans holds the plug-in Watcher" in text and "Leans calls back .emit(" in text
