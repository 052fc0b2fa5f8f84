"""``systemctl reload`` (SIGHUP, the reload verb): read the config file again and say what changes.

Sections whose objects are built once at daemon start are recorded and apply after a daemon
restart; ``job``, ``policy``, ``shutdown``, ``on`` and ``validation`` apply at the next launch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from ..config import schema as configschema
from ..config.model import Config, ConfigError, ConfigSource
from ..job.process import is_secret
from .knownsecrets import teach_gate

# Config sections whose objects are built once at daemon start: a reload records them, a
# daemon restart applies them.
RESTART_SECTIONS = ("state", "log", "heartbeat", "detectors", "checkpoints", "gpu", "host", "metrics", "web", "systemd",
                    "cluster", "notify")
# Keys whose values are secrets though their names do not say so (the webhook URL carries a token).
SECRET_KEYS = ("notify.webhook_url",)


def _masked(v: Any) -> Any:
    """``v`` with the secret-looking values of any remedy env masked (``[on.<cause>]``)."""
    from ..core.settings import Remedy
    from ..job.process import redact_env

    if isinstance(v, Remedy):
        return dataclasses.replace(v, env=redact_env(v.env))
    if isinstance(v, (tuple, list)):
        return type(v)(_masked(x) for x in v)
    if isinstance(v, dict):
        return {k: _masked(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type) and any(
            f.name == "remedies" for f in dataclasses.fields(v)):
        return dataclasses.replace(v, remedies=_masked(v.remedies))  # type: ignore[attr-defined]
    return v


def reload_config(current: Config, source: ConfigSource | None, state_dir: Path,
                  event: Callable[..., None]) -> tuple[Config | None, dict[str, Any]]:
    """The new config (None: keep the running one) and the reply to the operator."""
    if source is None:
        event("reload_ignored", "warning", "reload requested but the daemon runs without a config file "
              "(wrap with flags only); nothing to reload")
        return None, {"reloaded": False, "reason": "no config file"}
    try:
        new = source.load()
    except ConfigError as e:
        problems = [str(p) for p in e.problems]
        event("reload_rejected", "error", f"reload of {source.path} rejected, keeping the running config: "
              + "; ".join(problems), problems=problems)
        return None, {"reloaded": False, "problems": problems}
    teach_gate(new)  # before the diff is recorded: a secret the new config brings is masked in it
    changed = configschema.diff(current, new)
    if new.state_dir().resolve() != state_dir:
        changed.pop("state.dir", None)
        event("reload_partial", "warning", "state.dir cannot change while running; restart the daemon")
        new = dataclasses.replace(new, state=current.state)
    # Sections read once at daemon start (monitors, services, listeners) need a restart.
    later = sorted(k for k in changed if k.split(".", 1)[0] in RESTART_SECTIONS)
    if later:
        event("reload_needs_restart", "warning",
              f"{len(later)} changed key(s) take effect only after a daemon restart: {', '.join(later)}", keys=later)
    event("config_reloaded", "info",
          f"config reloaded from {source.path}: {len(changed)} key(s) changed"
          + (f" ({', '.join(sorted(changed))})" if changed else "") + "; applied at the next launch",
          changed={k: (["<redacted>", "<redacted>"] if is_secret(k.rsplit(".", 1)[-1]) or k in SECRET_KEYS
                       else [str(_masked(a)), str(_masked(b))])
                   for k, (a, b) in changed.items()})
    return new, {"reloaded": True, "changed": sorted(changed)}
