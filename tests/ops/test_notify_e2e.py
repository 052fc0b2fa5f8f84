"""[notify] through the real daemon: a `wrap` run that gives up tells the webhook and runs the
hook command within 2 s; a dead webhook does not hold the exit past shutdown_wait_s."""
from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path

from tests.conftest import history
from tests.ops.notifyhelp import Webhook, dead_url, hook_command

PY = sys.executable
CRASH = [PY, "-c", "import sys; print('step 1 loss 2.5', flush=True); sys.exit(7)"]


def config(tmp: Path, command: list[str], url: str, **extra: str) -> Path:
    p = tmp / "notify.toml"
    lines = ["[notify]", f"command = {json.dumps(command)}", f"webhook_url = {json.dumps(url)}"]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    p.write_text("\n".join(lines) + "\n")
    return p


def wrap(sd: Path, cfg: Path) -> list[str]:
    return ["wrap", "--config", str(cfg), "--state-dir", str(sd), "--max-restarts", "0", "--backoff", "0",
            "--env", "HF_TOKEN=hf_secret_value_42", "--"]


def gave_up_at(sd: Path) -> float:
    ev = [e for e in history(sd)["events"] if e["event"] == "gave_up"]
    assert len(ev) == 1, ev
    return datetime.fromisoformat(ev[0]["at"]).timestamp()


def test_give_up_posts_to_the_webhook_and_runs_the_hook_within_2s(daemons, tmp_path):
    hook = Webhook()
    cmd, out = hook_command(tmp_path, takes_s=0.6)  # a pager that takes its time: the exit waits for it
    sd = tmp_path / "sd"
    try:
        d = daemons(wrap(sd, config(tmp_path, cmd, hook.url)) + CRASH)
        assert d.wait(60) == 3
        # Both arrived before the daemon exited: no polling needed after the exit.
        assert out.exists(), d.stderr()[-3000:]
        gave = [(t, b) for t, _p, b in hook.received if b["event"] == "gave_up"]
        assert len(gave) == 1, hook.received
        at, body = gave[0]
    finally:
        hook.close()
    given_up = gave_up_at(sd)
    # Sent at the give-up, not at some later flush (bounds a loaded machine meets).
    assert at - given_up < 10.0 and out.stat().st_mtime - given_up < 10.0, (given_up, at, out.stat().st_mtime)
    assert body["text"].startswith("[transformer-supervisor]") and "gave up" in body["text"]
    assert body["data"]["cause"] == "crash" and body["run_id"] == history(sd)["run_id"]
    assert json.loads(out.read_bytes())["event"] == "gave_up"
    env = json.loads(Path(str(out) + ".env").read_text())
    assert env["TSUP_NOTIFY_EVENT"] == "gave_up" and env["TSUP_NOTIFY_CAUSE"] == "crash"
    logs = d.stderr()
    assert "SECRETPATH" not in logs and "hf_secret_value_42" not in json.dumps(body)
    assert "notify_ready" in logs
    assert "SECRETPATH" not in json.dumps(history(sd))  # the URL is not kept in the ledger's config


def test_a_dead_webhook_is_logged_and_does_not_delay_the_exit_past_the_bound(daemons, tmp_path):
    cmd, out = hook_command(tmp_path)
    sd = tmp_path / "sd"
    d = daemons(wrap(sd, config(tmp_path, cmd, dead_url(), retries="5", shutdown_wait_s="2.0")) + CRASH)
    assert d.wait(60) == 3
    exited = time.time()
    assert out.exists()  # the hook command still ran
    # 5 retries with backoff (1+2+4+8+16 s) would take 31 s: the exit waited about shutdown_wait_s
    # (2 s), with a margin for a loaded machine's exit that is still far from the retries' 31 s.
    assert exited - gave_up_at(sd) < 2.0 + 10.0, d.stderr()[-2000:]
    logs = d.stderr()
    assert "notify_failed" in logs or "notify_abandoned" in logs, logs[-3000:]
    assert "SECRETPATH" not in logs
