"""Gathers this node's launch facts for the launch digest (:mod:`supervisor.cluster.digest`):
the code version of the job's working tree (git) or its script's hash, and the package versions
of the job's Python (a short subprocess that reads package metadata: the daemon never imports
torch). Run on the launch preparation thread, once per attempt, before the launch barrier."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

import structlog

from ..config.model import Config
from ..job.envsnapshot import git_info, python_probe
from ..job.launch import config_json
from ..job.process import job_python
from .config import ClusterConfig
from .digest import LaunchFacts, build, command_tokens, select

log = structlog.get_logger("supervisor.cluster")
_DEFAULT_CONFIG: dict[str, Any] | None = None


def code_version(cwd: Path, tokens: Sequence[str]) -> str:
    """``git <HEAD>`` (``+dirty`` with uncommitted changes to tracked files) where the job's
    working directory is a git tree; else the hash of the first file the command names (the
    script); else what was looked at."""
    git = git_info(cwd)
    if git.get("commit"):
        return f"git {git['commit']}" + ("+dirty" if git.get("dirty") else "")
    for t in [*tokens[1:], *tokens[:1]]:  # the script after the interpreter or launcher, else the command
        p = Path(t).expanduser()
        p = p if p.is_absolute() else cwd / p
        try:
            if p.is_file():
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                return f"script {p.name} sha256:{h.hexdigest()[:16]}"
        except OSError:
            continue
    return "unknown (no git tree at the job's workdir, no script file in the command)"


def package_versions(python: str) -> dict[str, str]:
    """The job's Python version and its key packages' versions; when the probe failed, why
    (``unknown``: this node's packages are then not compared, rather than block the run)."""
    probe = python_probe(python, nice=False)  # no job runs now, and the launch barrier waits for it
    if "error" in probe:
        log.warning("cluster_package_probe_failed", error=str(probe["error"])[:300], message="could not read the "
                    "job's package versions; this node's packages are not compared with the others' this time")
        return {"unknown": str(probe["error"])[:200]}
    out = {"python": str(probe.get("python", ""))}
    out.update({str(k): str(v) for k, v in (probe.get("packages") or {}).items()})
    if probe.get("torch_cuda"):
        out["torch.cuda"] = str(probe["torch_cuda"])
    return out


def node_names(cc: ClusterConfig) -> tuple[str, ...]:
    host = socket.gethostname()
    return tuple(n for n in (cc.node_name(), host, host.split(".")[0], cc.advertise_addr) if n)


def _default_config() -> Mapping[str, Any]:
    global _DEFAULT_CONFIG
    if _DEFAULT_CONFIG is None:
        _DEFAULT_CONFIG = config_json(Config())
    return _DEFAULT_CONFIG


def launch_facts(cfg: Config) -> LaunchFacts:
    argv = tuple(cfg.job.command)
    env: dict[str, str] = dict(os.environ) if cfg.job.inherit_env else {}
    env.update(cfg.job.env)
    tokens = command_tokens(argv, cfg.job.shell)
    return LaunchFacts(argv, cfg.job.shell, env, config_json(cfg), _default_config(),
                       code_version(cfg.workdir(), tokens), package_versions(job_python(tokens, cfg.job.python)),
                       node_names(cfg.cluster))


def launch_digest(cfg: Config) -> dict[str, str]:
    """This node's digest of the launch it is about to make, the keys ``require_same`` selects."""
    return select(build(launch_facts(cfg)), cfg.cluster.require_same)


def launch_digest_or_none(cfg: Config | None) -> dict[str, str] | None:
    """:func:`launch_digest`, or None (this node's launch is not compared) when it cannot be
    made: a probe's own failure is in the digest; this is for the unforeseen, which must not stop
    the launch."""
    if cfg is None:
        return None
    try:
        return launch_digest(cfg)
    except Exception as e:
        log.error("cluster_launch_digest_failed", error=repr(e), message="could not build this node's launch "
                  "digest; its launch is not compared with the other nodes' this time")
        return None
