"""What the redaction gate is told is secret, from a config: the job's env, every remedy's env, the
daemon's own environment (the job inherits it) and the webhook URL (its path is the token).

The gate (:mod:`supervisor.redact`) masks secrets by name and by shape wherever they are written;
a value that has neither (a password printed alone, a token the job logs without its name) is
only caught because the daemon knows it. Told at daemon start and again at each reload, before
the reload's own events are recorded: a secret the new config brings is masked in the diff that
announces it.
"""
from __future__ import annotations

import os
from typing import Mapping

from ..config.model import Config
from ..redact import env_secrets, learn_secrets


def config_secrets(cfg: Config, environ: Mapping[str, str]) -> list[str]:
    """The secret values of ``cfg`` and of ``environ`` (see the module's docstring)."""
    envs = [cfg.job.env, environ, *(r.env for oc in cfg.on.values() for r in oc.remedies)]
    return [*env_secrets(*envs), *([cfg.notify.webhook_url] if cfg.notify.webhook_url else [])]


def teach_gate(cfg: Config, environ: Mapping[str, str] | None = None) -> None:
    """Tell the redaction gate the secrets of ``cfg`` and of ``environ`` (``os.environ``)."""
    learn_secrets(config_secrets(cfg, os.environ if environ is None else environ))
