"""The systemd units and the example config, as the installed package carries them.

A wheel install (``pipx install transformer-supervisor``, ``pip install`` into a venv per node)
has no source checkout: the units ship as package data (``supervisor/ops/systemd/*.service``,
which ``systemd/`` in the checkout links to) and the example config is generated from the schema
(:func:`supervisor.config.doc.render`). Install them with::

    sudo transformer-supervisor install-units            # units, /etc/transformer-supervisor/{config.toml,env}
    transformer-supervisor install-units --print         # the plain unit on stdout, nothing written
    transformer-supervisor install-units --print alerts  # Prometheus alerting rules (also: alerts-test, dashboard)
    python -m supervisor.ops.units --root /tmp/image     # the same, under a staging root

The units' ``ExecStart=`` names the command that installs them (the console script of this
environment), unless ``--bin`` says otherwise; ``scripts/install-systemd`` links
/usr/local/bin/transformer-supervisor and passes that. Existing configs are never overwritten;
units are (they are ours). Nothing is enabled or started.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence, TextIO

#: install-units --help: the docstring above without its RST (argparse prints it as is).
DESCRIPTION = """\
Install the systemd units, the example config and the env file from this installed package.

  sudo transformer-supervisor install-units        units, /etc/transformer-supervisor/{config.toml,env}
  transformer-supervisor install-units --print     the plain unit on stdout, nothing written
  transformer-supervisor install-units --root DIR  the same under a staging root (an image build)

ExecStart= names this environment's transformer-supervisor unless --bin says otherwise. Existing
configs are never overwritten; units are (they are ours). Nothing is enabled or started. The
installed config.toml configures nothing but the defaults: set [job] command before starting."""

UNITS = ("transformer-supervisor.service", "transformer-supervisor@.service")
DEFAULT_BIN = "/usr/local/bin/transformer-supervisor"
DEFAULT_CONFIG_DIR = "/etc/transformer-supervisor"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
#: What ``--print`` also prints, from ``supervisor/ops/monitoring/`` (package data): Prometheus
#: alerting rules, their ``promtool test rules`` file, a Grafana dashboard. Printed, not installed:
#: they belong to the Prometheus and Grafana hosts, not to the training node.
MONITORING = {"alerts": "alerts.yml", "alerts-test": "alerts_test.yml", "dashboard": "dashboard.json"}

ENV_FILE_TEXT = """\
# Environment for every transformer-supervisor unit on this node (EnvironmentFile= in the units;
# transformer-supervisor@NAME also reads NAME.env beside this file, which wins). The daemon and the
# job get these; the daemon masks values of secret-looking names (*TOKEN*, *KEY*, *SECRET*, *PASSWORD*)
# in its logs. Keep this file 0600: it may hold tokens.
#
#HF_TOKEN=hf_...
#WANDB_API_KEY=...
#NCCL_SOCKET_IFNAME=ib0
#NCCL_IB_HCA=mlx5
#NCCL_DEBUG=WARN
"""


def unit_text(name: str, bin_path: str = DEFAULT_BIN, config_dir: str = DEFAULT_CONFIG_DIR) -> str:
    """A unit as shipped, with the command and config dir substituted."""
    if name not in UNITS:
        raise ValueError(f"unknown unit {name!r} (known: {', '.join(UNITS)})")
    from importlib import resources  # here, not at import: the parser imports this module on every verb's way

    text = (resources.files("supervisor") / "ops" / "systemd" / name).read_text(encoding="utf-8")
    text = text.replace(DEFAULT_BIN, bin_path)
    return text.replace(DEFAULT_CONFIG_DIR + "/", config_dir.rstrip("/") + "/")


def monitoring_text(what: str) -> str:
    """The shipped alerting rules, their test file or the Grafana dashboard (see :data:`MONITORING`)."""
    from importlib import resources

    return (resources.files("supervisor") / "ops" / "monitoring" / MONITORING[what]).read_text(encoding="utf-8")


def example_config() -> str:
    from ..config.doc import render

    return render()


def default_bin() -> str:
    """This environment's console script, when it exists; else /usr/local/bin/transformer-supervisor."""
    cand = Path(sys.executable).parent / "transformer-supervisor"
    return str(cand) if cand.is_file() else DEFAULT_BIN


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _under(root: str | None, path: str) -> Path:
    return Path(root) / path.lstrip("/") if root else Path(path)


def install(*, root: str | None = None, unit_dir: str = DEFAULT_UNIT_DIR, config_dir: str = DEFAULT_CONFIG_DIR,
            bin_path: str | None = None, reload: bool = True, err: TextIO | None = None) -> list[Path]:
    """Write the units, the example config and the env file (the last two only when absent);
    ``systemctl daemon-reload`` when systemd runs and ``root`` is not set. Returns what was written."""
    err = err or sys.stderr
    bin_path = bin_path or default_bin()
    written: list[Path] = []
    for name in UNITS:
        dest = _under(root, unit_dir) / name
        _write(dest, unit_text(name, bin_path, config_dir), 0o644)
        written.append(dest)
        print(f"installed {dest}", file=err)
    cdir = _under(root, config_dir)
    conf = cdir / "config.toml"
    if conf.exists():
        print(f"kept the existing {conf}", file=err)
    else:
        _write(conf, example_config(), 0o644)
        written.append(conf)
        print(f"wrote the example config {conf}: set [job] command and workdir, [checkpoints] dir", file=err)
    env = cdir / "env"
    if env.exists():
        print(f"kept the existing {env}", file=err)
    else:
        _write(env, ENV_FILE_TEXT, 0o600)
        written.append(env)
        print(f"wrote {env} (mode 0600, all commented out): tokens and NCCL_* for the daemon and the job",
              file=err)
    if reload and not root and Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
        subprocess.run(["systemctl", "daemon-reload"], check=False)
        print(f"systemd reloaded; next: transformer-supervisor check-config {conf} && "
              "systemctl enable --now transformer-supervisor", file=err)
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--print", dest="print_unit", nargs="?", const=UNITS[0], metavar="UNIT", default=None,
                   help=f"print a unit ({' or '.join(UNITS)}; default the first), 'config' (the example "
                        "config), 'alerts' (Prometheus alerting rules), 'alerts-test' (their promtool test) or "
                        "'dashboard' (Grafana JSON) on stdout and write nothing")
    p.add_argument("--root", metavar="DIR", help="write everything under DIR (a staging root for an image or "
                                                 "a package build); the units still name the real paths")
    p.add_argument("--unit-dir", default=DEFAULT_UNIT_DIR, metavar="DIR",
                   help=f"where the units go (default {DEFAULT_UNIT_DIR})")
    p.add_argument("--config-dir", default=DEFAULT_CONFIG_DIR, metavar="DIR",
                   help=f"where config.toml and env live (default {DEFAULT_CONFIG_DIR})")
    p.add_argument("--bin", dest="bin_path", metavar="PATH",
                   help="the command ExecStart= runs (default: this environment's transformer-supervisor, "
                        f"else {DEFAULT_BIN})")
    p.add_argument("--no-reload", action="store_true", help="do not run systemctl daemon-reload")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.print_unit is not None:
        if args.print_unit == "config":
            out.write(example_config())
            return 0
        if args.print_unit in MONITORING:
            out.write(monitoring_text(args.print_unit))
            return 0
        try:
            out.write(unit_text(args.print_unit, args.bin_path or default_bin(), args.config_dir))
        except ValueError as e:
            print(f"install-units: {e}; or one of: config, {', '.join(MONITORING)}", file=sys.stderr)
            return 2
        return 0
    try:
        install(root=args.root, unit_dir=args.unit_dir, config_dir=args.config_dir, bin_path=args.bin_path,
                reload=not args.no_reload)
    except OSError as e:
        print(f"install-units: {e} (run as root, or pass --root DIR)", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from ..installcheck import refuse_foreign

    refuse_foreign()
    ap = argparse.ArgumentParser(prog="python -m supervisor.ops.units",
                                 description="Install (or print) the systemd units and the example config.")
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
