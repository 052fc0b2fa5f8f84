"""Installs: supervisord's `supervisor` package is refused at start-up (exit 2, what to do), a
wheel carries the units and the example config, the demo without torch says what to install.

Two layers: a fake site-packages with supervisord's shape (fast, offline, always), and real
virtual environments with the wheel built from this checkout and supervisord from the package
index (skipped when the index cannot be reached)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from supervisor import installcheck

ROOT = Path(__file__).resolve().parents[2]
SUPERVISORD_VERSION = "4.3.0"
SUPERVISORD_INIT = "# this is a package\n"  # supervisord's whole supervisor/__init__.py
SUPERVISORD_FILES = {  # some of its files, in its shape: __init__.py and events.py share a name with ours
    "__init__.py": SUPERVISORD_INIT,
    "events.py": "def notify(event):\n    pass\n\ndef clear():\n    pass\n",
    "process.py": "class Subprocess:\n    pass\n",
}


def _dist_info(site: Path) -> None:
    d = site / f"supervisor-{SUPERVISORD_VERSION}.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: supervisor\nVersion: {SUPERVISORD_VERSION}\n"
                                "Summary: A system for controlling process state under UNIX\n")
    (d / "top_level.txt").write_text("supervisor\n")
    (d / "INSTALLER").write_text("pip\n")
    (d / "RECORD").write_text("".join(f"supervisor/{n},,\n" for n in SUPERVISORD_FILES)
                              + f"supervisor-{SUPERVISORD_VERSION}.dist-info/METADATA,,\n")


def _our_package(site: Path) -> Path:
    pkg = site / "supervisor"
    shutil.copytree(ROOT / "supervisor", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def _run(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("TSUP_ALLOW_FOREIGN_SUPERVISOR", None)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env,
                          cwd=str(site.parent))


ENTRY_POINTS = (
    # the console script's own code: `from supervisor.cli.main import main; sys.exit(main())`
    ("-c", "import sys; from supervisor.cli.main import main; sys.exit(main(['--version']))"),
    ("-m", "supervisor", "--version"),
    ("-m", "supervisor.ops.units", "--print"),
)


@pytest.mark.parametrize("argv", ENTRY_POINTS, ids=["console-script", "python-m", "units"])
def test_supervisord_installed_over_ours_is_refused(tmp_path: Path, argv):
    """supervisord installed after us: its __init__.py and events.py replaced ours, its process.py beside them."""
    site = tmp_path / "site-packages"
    pkg = _our_package(site)
    for name, text in SUPERVISORD_FILES.items():
        (pkg / name).write_text(text)
    _dist_info(site)
    r = _run(site, *argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "supervisord's" in r.stderr and "pipx install SRC" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


def test_ours_installed_over_supervisord_is_refused(tmp_path: Path):
    """We were installed last: our files are whole, but supervisord's distribution is in the same
    folder (and broken: we replaced its events.py); refuse, and say how to repair it."""
    site = tmp_path / "site-packages"
    _our_package(site)
    _dist_info(site)
    r = _run(site, "-m", "supervisor", "--version")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"`supervisor` {SUPERVISORD_VERSION} is installed into the same folder" in r.stderr
    assert "pip install --force-reinstall supervisor" in r.stderr


def test_supervisord_uninstalled_after_the_clash(tmp_path: Path):
    """`pip uninstall supervisor` after the clash removed the files both had: no __init__.py."""
    site = tmp_path / "site-packages"
    pkg = _our_package(site)
    for name in SUPERVISORD_FILES:
        (pkg / name).unlink(missing_ok=True)
    r = _run(site, "-c", "import sys; from supervisor.cli.main import main; sys.exit(main(['--version']))")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "__init__.py is missing" in r.stderr


def test_no_clash_when_supervisord_is_outside_this_environment(tmp_path: Path):
    """Ours alone is fine; a supervisord elsewhere (not under sys.prefix, not our folder) too."""
    site = tmp_path / "site-packages"
    _our_package(site)
    r = _run(site, "-m", "supervisor", "--version")
    assert r.returncode == 0 and r.stdout.startswith("transformer-supervisor "), r.stderr
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "supervisor").mkdir()
    (other / "supervisor" / "__init__.py").write_text(SUPERVISORD_INIT)
    _dist_info(other)
    env_path = f"{site}{os.pathsep}{other}"
    r = subprocess.run([sys.executable, "-m", "supervisor", "--version"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": env_path}, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr


def test_this_checkout_is_not_a_clash():
    assert installcheck.problems() == []


@pytest.mark.parametrize("name, found", [
    (f"supervisor-{SUPERVISORD_VERSION}.dist-info", True), ("Supervisor-4.2.5.egg-info", True),
    ("supervisor.egg-info", True), ("transformer_supervisor-0.1.0.dist-info", False),
    ("supervisor_tools-1.0.dist-info", False), ("supervisor", False)])
def test_the_quick_listing_sees_what_importlib_metadata_would(tmp_path: Path, monkeypatch, name: str, found: bool):
    """importlib.metadata (~25 ms of imports at every start) is asked only when a folder on
    sys.path lists a supervisord distribution."""
    (tmp_path / name).mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    assert installcheck._may_hold_foreign() is found


def test_demo_without_torch_says_to_install_the_train_extra(tmp_path: Path, monkeypatch, capsys):
    from supervisor.cli import main as cli

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, find_spec says so
    code = cli.main(["demo", "--out", str(tmp_path / "demo-out"), "--steps", "5"])
    err = capsys.readouterr().err
    assert code == 2
    assert "transformer-supervisor[train]" in err and "torch" in err
    assert not (tmp_path / "demo-out").exists()  # nothing launched, nothing written


def test_install_units_from_the_package(tmp_path: Path, capsys):
    from supervisor.cli import main as cli

    root = tmp_path / "root"
    code = cli.main(["install-units", "--root", str(root), "--bin", "/opt/tsup/bin/transformer-supervisor",
                     "--no-reload"])
    assert code == 0, capsys.readouterr().err
    unit = (root / "etc/systemd/system/transformer-supervisor.service").read_text()
    assert "ExecStart=/opt/tsup/bin/transformer-supervisor run --config /etc/transformer-supervisor/config.toml" in unit
    assert unit == (ROOT / "systemd" / "transformer-supervisor.service").read_text().replace(
        "/usr/local/bin/transformer-supervisor", "/opt/tsup/bin/transformer-supervisor")
    assert (root / "etc/systemd/system/transformer-supervisor@.service").is_file()
    conf = root / "etc/transformer-supervisor/config.toml"
    assert conf.read_text() == (ROOT / "config.example.toml").read_text()
    env = root / "etc/transformer-supervisor/env"
    assert oct(env.stat().st_mode & 0o777) == "0o600" and "NCCL_" in env.read_text()
    conf.write_text("# mine\n")
    assert cli.main(["install-units", "--root", str(root), "--no-reload"]) == 0
    assert conf.read_text() == "# mine\n"  # never overwritten
    capsys.readouterr()
    assert cli.main(["install-units", "--print", "transformer-supervisor@.service",
                     "--bin", "/x/transformer-supervisor"]) == 0
    assert "ExecStart=/x/transformer-supervisor run --config /etc/transformer-supervisor/%i.toml" in \
        capsys.readouterr().out


# -- real environments: the wheel of this checkout, supervisord from the package index ----------

def _pip(py: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built from a copy (the shared tree gets no build/ or egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "supervisor", src / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"cannot build the wheel here: {r.stderr.strip()[-300:]}")
    return next(out.glob("transformer_supervisor-*.whl"))


@pytest.fixture(scope="module")
def supervisord_wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("supervisord")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                        "-d", str(out), f"supervisor=={SUPERVISORD_VERSION}"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"supervisord {SUPERVISORD_VERSION} is not available from the package index here: "
                    f"{r.stderr.strip()[-200:]}")
    return next(out.glob("supervisor-*.whl"))


def _venv(where: Path) -> Path:
    """A bare venv; our dependencies come from this test's environment through a path entry
    (no index needed for them), appended after the venv's own site-packages."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    py = where / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    import structlog

    (site / "zz_deps.pth").write_text(str(Path(structlog.__file__).resolve().parents[1]) + "\n")
    return py


@pytest.mark.slow
def test_real_wheel_then_supervisord(tmp_path: Path, wheel: Path, supervisord_wheel: Path):
    py = _venv(tmp_path / "v")
    tsup = tmp_path / "v" / "bin" / "transformer-supervisor"
    assert _pip(py, "install", "--no-deps", "-q", str(wheel)).returncode == 0
    r = subprocess.run([str(tsup), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("transformer-supervisor"), r.stderr
    # the wheel carries the units and the example config
    root = tmp_path / "root"
    r = subprocess.run([str(tsup), "install-units", "--root", str(root), "--no-reload"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    unit = (root / "etc/systemd/system/transformer-supervisor.service").read_text()
    assert f"ExecStart={tsup} run --config /etc/transformer-supervisor/config.toml" in unit
    assert "OOMPolicy=continue" in unit
    assert (root / "etc/transformer-supervisor/config.toml").read_text() == (ROOT / "config.example.toml").read_text()
    for what, file in (("alerts", "alerts.yml"), ("alerts-test", "alerts_test.yml"), ("dashboard", "dashboard.json")):
        r = subprocess.run([str(tsup), "install-units", "--print", what], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr  # the monitoring files are package data too
        assert r.stdout == (ROOT / "supervisor/ops/monitoring" / file).read_text()
    # supervisord on top: pip says nothing, every entry point refuses with what to do
    r = _pip(py, "install", "--no-deps", "-q", str(supervisord_wheel))
    assert r.returncode == 0, r.stderr
    for argv in ([str(tsup), "status"], [str(py), "-m", "supervisor", "--help"]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert "supervisord's" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_real_supervisord_then_wheel(tmp_path: Path, wheel: Path, supervisord_wheel: Path):
    py = _venv(tmp_path / "v")
    assert _pip(py, "install", "--no-deps", "-q", str(supervisord_wheel)).returncode == 0
    assert _pip(py, "install", "--no-deps", "-q", str(wheel)).returncode == 0
    r = subprocess.run([str(tmp_path / "v" / "bin" / "transformer-supervisor"), "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "installed into the same folder" in r.stderr, r.stdout + r.stderr
