"""[notify]: the payload and its masking, the rate limit, and the Alerter against a real local
webhook and a real hook command (no fakes: http.server in a thread, a Python script)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.daemon.alerting import RestartLoop
from supervisor.ops.alertmsg import REDACTED, Alert, Masker, RateLimit
from supervisor.ops.alerts import Alerter
from supervisor.ops.config import NotifyConfig
from tests.ops.notifyhelp import Webhook, dead_url, hook_command, silent_url
from tests.util import wait_for


def alert(event: str = "gave_up", **data: object) -> Alert:
    return Alert(event, "critical", "gave up: restart budget spent", "gpt", "r1", "node-3", 2, 1_700_000_000.0,
                 dict(data))


def test_payload_has_slack_text_and_the_structured_fields():
    p = alert(cause="crash").payload(Masker())
    assert p["text"].startswith("[transformer-supervisor] gpt on node-3 (attempt 2, run r1): gave_up: gave up")
    assert (p["event"], p["level"], p["job"], p["run_id"], p["attempt"]) == ("gave_up", "critical", "gpt", "r1", 2)
    assert p["at"] == "2023-11-14T22:13:20Z" and p["data"] == {"cause": "crash"}
    json.dumps(p, allow_nan=False)  # strict JSON


def test_secrets_are_masked_by_key_and_by_value_everywhere():
    m = Masker.of({"HF_TOKEN": "hf_abcdef123", "LR": "0.1", "DB_PASSWORD": "pw"},
                  {"WANDB_API_KEY": "wandbkey999", "HOME": "/root"}, extra=["https://hooks.example/T0/XYZ"])
    a = Alert("remedies_applied", "warning", "argv has --token=hf_abcdef123 and posts to https://hooks.example/T0/XYZ",
              "gpt", "r1", "h", 0, 0.0,
              {"env": {"MY_SECRET": "s3cr3t-value", "LR_SCALE": "0.5"}, "argv": ["--key", "wandbkey999"],
               "loss": float("nan")})
    p = a.payload(m)
    blob = json.dumps(p, allow_nan=False)
    for secret in ("hf_abcdef123", "wandbkey999", "s3cr3t-value", "hooks.example/T0/XYZ"):
        assert secret not in blob
    assert p["data"]["env"] == {"MY_SECRET": REDACTED, "LR_SCALE": "0.5"}
    assert p["data"]["argv"] == ["--key", REDACTED] and p["data"]["loss"] == "NaN"
    assert "0.1" not in m.secrets and "pw" not in m.secrets  # not secret / too short to cut out of text
    env = a.env(m)
    assert env["TSUP_NOTIFY_EVENT"] == "remedies_applied" and "hf_abcdef123" not in env["TSUP_NOTIFY_MESSAGE"]


def test_rate_limit_holds_repeats_counts_them_and_always_lets_gave_up_out():
    r = RateLimit(repeat_after_s=300, per_hour=3)
    assert r.admit("restart_loop", 0.0) == 0
    assert r.admit("restart_loop", 10.0) is None and r.admit("restart_loop", 20.0) is None
    assert r.admit("restart_loop", 301.0) == 2  # the next one says how many were held back
    assert r.admit("metrics_blind", 302.0) == 0
    assert r.admit("validation_failed", 303.0) is None  # 3 in the hour: the cap
    assert r.admit("gave_up", 304.0) == 0 and r.admit("gave_up", 305.0) == 0  # never held
    assert r.admit("validation_failed", 4000.0) == 1  # the hour moved on


def test_restart_loop_is_count_restarts_within_the_window_once_per_episode():
    loop = RestartLoop(3, 60.0)
    assert [loop.restart(t) for t in (0.0, 10.0)] == [None, None]
    assert loop.restart(20.0) == 3
    assert loop.restart(25.0) is None  # counting starts again
    assert [loop.restart(t) for t in (200.0, 300.0, 400.0)] == [None, None, None]  # spread out: no loop


def test_webhook_and_command_both_receive_the_event(tmp_path: Path):
    hook = Webhook()
    cmd, out = hook_command(tmp_path)
    a = Alerter(NotifyConfig(command=tuple(cmd), webhook_url=hook.url), Masker.of(extra=[hook.url]))
    a.start()
    try:
        assert a.submit(alert(cause="crash"))
        wait_for(lambda: hook.received and out.exists(), 10, what="webhook and hook command")
        body = hook.bodies()[0]
        assert body["event"] == "gave_up" and "gave up" in body["text"] and body["data"] == {"cause": "crash"}
        assert json.loads(out.read_bytes()) == body  # the same JSON on the hook's stdin
        env = json.loads(Path(str(out) + ".env").read_text())
        assert env["TSUP_NOTIFY_EVENT"] == "gave_up" and env["TSUP_NOTIFY_CAUSE"] == "crash"
        assert env["TSUP_NOTIFY_RUN_ID"] == "r1" and env["TSUP_NOTIFY_ATTEMPT"] == "2"
    finally:
        a.close(5.0)
        hook.close()
    assert a.counts() == {"command": {"sent": 1, "failed": 0, "dropped": 0},
                          "webhook": {"sent": 1, "failed": 0, "dropped": 0}}


def test_a_dead_webhook_is_logged_once_without_the_url_and_does_not_delay_the_command(tmp_path: Path):
    url = dead_url()
    cmd, out = hook_command(tmp_path)
    a = Alerter(NotifyConfig(command=tuple(cmd), webhook_url=url, retries=1, repeat_after_s=0),
                Masker.of(extra=[url]))
    with capture_logs() as logs:
        a.start()
        a.submit(alert("restart_loop"))
        wait_for(out.exists, 10, what="the hook command, while the webhook fails")
        wait_for(lambda: a.counts()["webhook"]["failed"] == 1, 10, what="the webhook's failure")
        a.submit(alert("restart_loop"))
        wait_for(lambda: a.counts()["webhook"]["failed"] == 2, 10, what="the second failure")
        a.close(5.0)
    failed = [e for e in logs if e["event"] == "notify_failed"]
    assert len(failed) == 1, failed  # once per episode
    assert failed[0]["sink"] == "webhook" and "refused" in failed[0]["error"].lower() and failed[0]["next"]
    assert "SECRETPATH" not in repr(logs)
    assert a.counts()["command"]["sent"] == 2


def test_close_waits_at_most_its_bound_for_a_webhook_that_never_answers():
    for url in silent_url():
        a = Alerter(NotifyConfig(webhook_url=url, timeout_s=30, retries=3), Masker.of(extra=[url]))
        a.start()
        with capture_logs() as logs:
            a.submit(alert())
            wait_for(lambda: a.sinks[0].busy, 10, what="the POST under way")
            t0 = time.monotonic()
            a.close(1.0)
            took = time.monotonic() - t0
        assert took < 10.0, took  # the bound (1 s) plus a loaded machine's margin, far from the POST's 30 s
        assert any(e["event"] in ("notify_failed", "notify_abandoned") for e in logs), logs


def test_a_full_queue_drops_counts_and_says_so_once(tmp_path: Path):
    for url in silent_url():
        a = Alerter(NotifyConfig(webhook_url=url, timeout_s=30, retries=0, repeat_after_s=0, max_per_hour=1000),
                    Masker.of(extra=[url]))
        a.start()
        with capture_logs() as logs:
            for _ in range(40):  # the first is stuck in the POST; 32 wait; the rest are dropped
                a.submit(alert("validation_failed"))
        assert a.counts()["webhook"]["dropped"] >= 40 - 1 - 32
        assert [e["event"] for e in logs].count("notify_dropped") == 1
        a.close(0.2)
