"""Secrets never leave the node, through the real daemon and the real CLI (issue 34): the cases
an adversarial review found. A blind job's sample lines (dict and JSON forms, an Authorization
header, a numeric password, the job's and the daemon's env values printed bare; and the third
review's defects: a bytes literal ``b'...'``, a PEM private key, a quote escaped inside a value,
``k => v``; the fourth's: a subscript ``os.environ["HF_TOKEN"] = ...``, a token as a URL's user,
``pass=``, mysql's glued ``-p``, ``<password>...</password>``; the fifth's: ``os.putenv('K', v)``,
``<add key="Password" value="..."/>``, ``&lt;password&gt;``, triple quotes) reach none of the
journal/console lines, the ledger file, ``status --json``, ``history --json``, the notify command,
the webhook or the report. A remedy's env (a key, a URL password) is masked in
``remedies_applied`` and ``restart_scheduled``, and a URL password changed by a reload in the
``config_reloaded`` diff."""
from __future__ import annotations

import json
import os
import signal
import stat
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import ROOT, history
from tests.ops.notifyhelp import Webhook, hook_command
from tests.util import wait_for

PY = sys.executable

FIRST_LINES = ("config: {'wandb_api_key': 'wk0a1b2c3d4e5f', 'lr': 0.1}", '{"hf_token": "hfx9y8z7w6v5", "step": 5}',
               "headers: Authorization: Bearer bearertok.abc123", "password: 918273645")
FIRST_SAMPLES = ["config: {'wandb_api_key': '<redacted>', 'lr': 0.1}", '{"hf_token": "<redacted>", "step": 5}',
                 "headers: Authorization: Bearer <redacted>", "password: <redacted>"]
# The third review's defects: a bytes literal, a PEM key, an escaped quote, "=>".
DEFECT_LINES = ("{'secret': b'zqC6x'}", "private_key: -----BEGIN PRIVATE KEY-----MIIEvzqC3x",
                '{"password": "a\\"zqC8x"}', 'api_key => "zqB2x"')
DEFECT_SAMPLES = ["{'secret': b'<redacted>'}", "private_key: <redacted>", '{"password": "<redacted>"}',
                  'api_key => "<redacted>"']
# The fourth review's defects: subscripts, a URL's user, "pass" as a key, mysql's -p, XML elements.
FOURTH_LINES = ('os.environ["HF_TOKEN"] = "zqU1xenv"', "git clone https://zqU4x0123456789abcdef@github.com/o/r.git",
                "pass=zqU5xpw", "<password>zqU7xxml</password>")
FOURTH_SAMPLES = ['os.environ["HF_TOKEN"] = "<redacted>"', "git clone https://<redacted>@github.com/o/r.git",
                  "pass=<redacted>", "<password><redacted></password>"]
FIFTH_LINES = ("openssl enc -aes256 -pass pass:zqU8xssl", "os.environ['WANDB_API_KEY']='zqU2xwb'",
               "secrets['db_password'] = 'zqU3xdb'", "mysql -h db -uroot -pzqU6xmy train")
FIFTH_SAMPLES = ["openssl enc -aes256 -pass pass:<redacted>", "os.environ['WANDB_API_KEY']='<redacted>'",
                 "secrets['db_password'] = '<redacted>'", "mysql -h db -uroot -p<redacted> train"]
# The fifth review's (issue 34): a call's quoted name then its value, .NET's attribute pair, an
# HTML-escaped element, triple quotes.
SIXTH_LINES = ("os.putenv('HF_TOKEN', 'zqW1xputenv')", '<add key="Password" value="zqX7xnet"/>',
               "&lt;password&gt;zqY3xhtml&lt;/password&gt;", "password = '''zqY8xtriple'''")
SIXTH_SAMPLES = ["os.putenv('HF_TOKEN', '<redacted>')", '<add key="<redacted>" value="<redacted>"/>',
                 "&lt;password&gt;<redacted>&lt;/password&gt;", "password = '''<redacted>'''"]
# The seventh review's (issue 34): a secret-named call's literal, a short presigned URL, a sentence
# saying the password, W&B's new 86-character key.
WANDB_V1 = "wandb_v1_Zq7M4kWb0TestOnlyNotAKey3Xy_Pz8Lm2Nb6Vc4Xr1Ts5Uw9Yq3Ke7Hd0Jf2Gb6Mn8Pl4Rv1Sc5T"
SEVENTH_LINES = ("presigned https://b.s3.amazonaws.com/k?X-Amz-Signature=zqN7x", "set_password('zqM1xsetpw0abcdefgh')",
                 "the password is zqO5xhunter2", f"wandb: logged in as trainer with {WANDB_V1}")
SEVENTH_SAMPLES = ["presigned https://b.s3.amazonaws.com/k?X-Amz-Signature=<redacted>", "set_password('<redacted>')",
                   "the password is <redacted>", "wandb: logged in as trainer with <redacted>"]
ENV_SECRETS = ("jobenvsecret-2468", "daemonsecret-1357")
CASES = {"first": (FIRST_LINES, ("wk0a1b2c3d4e5f", "hfx9y8z7w6v5", "bearertok.abc123", "918273645"), FIRST_SAMPLES,
                   "password: <redacted>"),
         "defects": (DEFECT_LINES, ("zqC6x", "MIIEvzqC3x", "zqC8x", "zqB2x"), DEFECT_SAMPLES,
                     "private_key: <redacted>"),
         "fourth": (FOURTH_LINES, ("zqU1xenv", "zqU4x0123456789abcdef", "zqU5xpw", "zqU7xxml"), FOURTH_SAMPLES,
                    "pass=<redacted>"),
         "fifth": (FIFTH_LINES, ("zqU8xssl", "zqU2xwb", "zqU3xdb", "zqU6xmy"), FIFTH_SAMPLES, "-p<redacted> train"),
         "sixth": (SIXTH_LINES, ("zqW1xputenv", "zqX7xnet", "zqY3xhtml", "zqY8xtriple"), SIXTH_SAMPLES,
                   "&lt;password&gt;<redacted>&lt;/password&gt;"),
         "seventh": (SEVENTH_LINES, ("zqM1xsetpw0abcdefgh", "zqN7x", "zqO5xhunter2", WANDB_V1[:36]), SEVENTH_SAMPLES,
                     "the password is <redacted>")}


def _blind_job(lines: tuple[str, ...]) -> str:
    """A job that prints ``lines``, then the job's and the daemon's secret env values bare, and waits."""
    return ("import os, sys, time\n" + "".join(f"print({line!r}, flush=True)\n" for line in lines)
            + 'print("connected with", os.environ["JOB_SECRET_TOKEN"], "as", os.environ["DAEMON_SERVICE_TOKEN"], '
              "flush=True)\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n")


def _cli(*args: str) -> str:
    cp = subprocess.run([PY, "-m", "supervisor", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def _ledger_bytes(sd: Path) -> str:
    return b"".join(p.read_bytes() for p in sd.iterdir() if p.name.startswith("ledger.sqlite")).decode(errors="replace")


def _leaks(secrets: tuple[str, ...], **texts: str) -> dict[str, list[str]]:
    return {where: found for where, text in texts.items() if (found := [s for s in secrets if s in text])}


class BlindRun(NamedTuple):
    """What one metrics_blind run left at each sink."""

    d: Any  # the daemon
    sd: Path
    status: str  # status --json while it ran
    webhook: str  # the webhook's bodies
    history: str  # history --json after it
    hook_out: Path  # the hook command's stdin (and its env beside it, + ".env")
    report: str


def _blind_run(daemons: Any, tmp_path: Path, job_text: str, env_toml: str, blind_after_lines: int,
               daemon_env: dict[str, str] | None = None) -> BlindRun:
    """A job (``job_text``, waiting for its go file) under ``run`` with ``[job] env`` ``env_toml``,
    a hook command and a local webhook told of metrics_blind: run to its end, every sink read."""
    job, go, sd = tmp_path / "job.py", tmp_path / "go", tmp_path / "sd"
    job.write_text(job_text)
    hook = Webhook()
    cmd, out = hook_command(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[job]\ncommand = {json.dumps([PY, str(job), str(go)])}\n{env_toml}\n"
                   f'[state]\ndir = "{sd}"\n[detectors]\nblind_after_lines = {blind_after_lines}\nblind_after_s = 0\n'
                   f"[notify]\ncommand = {json.dumps(cmd)}\nwebhook_url = {json.dumps(hook.url)}\n"
                   'events = ["metrics_blind"]\n')
    try:
        d = daemons(["run", "--config", str(cfg)], **({"env": daemon_env} if daemon_env else {}))
        wait_for(lambda: "event=metrics_blind" in d.stderr(), 30, 0.05, "metrics_blind on the console")
        status = _cli("status", "--json", "--state-dir", str(sd))
        wait_for(lambda: hook.received and out.exists() and Path(str(out) + ".env").exists(), 20,
                 what="the webhook and the hook command told")
        body = json.dumps(hook.bodies())
    finally:
        hook.close()
    go.touch()
    assert d.wait(30) == 0, d.stderr()[-3000:]
    hist = _cli("history", "--json", "--state-dir", str(sd))
    report = Path(_cli("report", "--state-dir", str(sd), "--out", str(tmp_path / "rep")).split()[1]).read_text()
    return BlindRun(d, sd, status, body, hist, out, report)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_blind_jobs_sample_lines_reach_no_sink_unmasked(daemons, tmp_path: Path, case: str) -> None:
    lines, line_secrets, expected, tail_shows = CASES[case]
    blind_secrets = (*line_secrets, *ENV_SECRETS)
    run = _blind_run(daemons, tmp_path, _blind_job(lines), 'env = { JOB_SECRET_TOKEN = "jobenvsecret-2468" }', 5,
                     daemon_env={"DAEMON_SERVICE_TOKEN": "daemonsecret-1357"})
    d, sd, status, body, hist, out = run.d, run.sd, run.status, run.webhook, run.history, run.hook_out
    # With no daemon, status shows the end of the job's log: the job's own text, through the gate too
    # (the env values learned are the CLI's own: here the daemon's, which the job printed).
    after = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sd)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "DAEMON_SERVICE_TOKEN": "daemonsecret-1357"})
    assert after.returncode == 3 and tail_shows in after.stdout, after.stdout
    known_here = tuple(s for s in blind_secrets if s != "jobenvsecret-2468")  # [job] env: the daemon's knowledge
    assert not _leaks(known_here, status_after_exit=after.stdout)
    assert not _leaks(blind_secrets, journal=d.stderr(), ledger=_ledger_bytes(sd), status=status, history=hist,
                      hook_stdin=out.read_text(), hook_env=Path(str(out) + ".env").read_text(), webhook=body,
                      report=run.report)
    # What was masked is still said: the samples are there, with their secrets replaced.
    [ev] = [e for e in json.loads(hist)["events"] if e["event"] == "metrics_blind"]
    samples = json.loads(status)["metrics_blind"]["samples"]
    assert samples == [*expected, "connected with <redacted> as <redacted>"], samples
    assert all(f"  | {s}" in ev["message"] for s in samples), ev["message"]


REMEDY_JOB = """\
import os, sys, time
if "WANDB_API_KEY" not in os.environ:  # crashes until the remedy's env comes
    sys.exit(1)
open(sys.argv[1], "w").write("up")
time.sleep(600)
"""
REMEDY_SECRETS = ("remedykey-97531", "remedyurlpw-8642", "oldurlpw-1357", "newurlpw-7531")


def _remedy_config(path: Path, job: Path, ready: Path, sd: Path, db_password: str) -> None:
    path.write_text(f"[job]\ncommand = {json.dumps([PY, str(job), str(ready)])}\n"
                    f'env = {{ DATABASE_URL = "postgres://trainer:{db_password}@db:5432/x" }}\n'
                    f'[state]\ndir = "{sd}"\n[policy]\nbackoff_initial_s = 0.2\nbackoff_jitter = 0\n'
                    '[on.crash]\nremedies = [{ env = { WANDB_API_KEY = "remedykey-97531", '
                    'RESULTS_URL = "https://up:remedyurlpw-8642@results.example/x" } }]\n')


def test_a_remedys_env_and_a_reloaded_url_password_are_masked(daemons, tmp_path: Path) -> None:
    job, ready, sd, cfg = tmp_path / "job.py", tmp_path / "ready", tmp_path / "sd", tmp_path / "c.toml"
    job.write_text(REMEDY_JOB)
    _remedy_config(cfg, job, ready, sd, "oldurlpw-1357")
    d = daemons(["run", "--config", str(cfg)])
    wait_for(ready.exists, 60, 0.05, "the attempt with the remedy's env up")
    _remedy_config(cfg, job, ready, sd, "newurlpw-7531")
    _cli("reload", "--state-dir", str(sd))
    wait_for(lambda: [e for e in history(sd)["events"] if e["event"] == "config_reloaded"], 20, 0.05,
             "config_reloaded in the ledger")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143
    hist = _cli("history", "--json", "--state-dir", str(sd))
    assert not _leaks(REMEDY_SECRETS, journal=d.stderr(), ledger=_ledger_bytes(sd), history=hist)
    events = {e["event"]: e for e in json.loads(hist)["events"]}
    assert {"remedies_applied", "restart_scheduled", "config_reloaded"} <= set(events), sorted(events)
    # Masked, not dropped: the names, the user and the host stay.
    env = {"RESULTS_URL": "https://up:<redacted>@results.example/x", "WANDB_API_KEY": "<redacted>"}
    assert events["remedies_applied"]["data"]["env"] == env
    assert events["restart_scheduled"]["data"]["remedies"][0]["env"] == env
    assert events["config_reloaded"]["data"]["changed"] == {
        "job.env.DATABASE_URL": ["postgres://trainer:<redacted>@db:5432/x"] * 2}


SEVENTH_JOB = r"""
import os, sys, time
lines = ["-----BEGIN RSA PRIVATE KEY-----", "MIIEpAIBAAKCAQEAzqP4xpemline1abcdefghijkl", "zqP4xpemline2abcdefghijklmnopqrstuv==",
         "-----END RSA PRIVATE KEY-----", "check argv ['--password', 'zqD3xargvlist', '--lr', '0.1']",
         "curl -u admin:zqD5xcurl2 https://x 1",
         "x5 secret " + os.environ["DB_PASSWORD"] + " and " + os.environ["PIN_PASSWORD"] + " num at step 123456",
         "x1 \x1b]52;c;cm0gLXJmIH4K\x07 osc52 clipboard"]
for line in lines:
    print(line, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""
SEVENTH_SECRETS = ("zqP4xpemline1", "zqP4xpemline2", "zqD3xargvlist", "zqD5xcurl2", "sunshine", " 12345 ")


def test_a_pem_key_an_argv_list_and_a_word_password_reach_no_sink(daemons, tmp_path: Path) -> None:
    """The sixth review (issue 34 D3, D4, D6, R6): a PEM key printed over four lines (only its BEGIN
    line was masked), an argv printed as a Python list, curl's -u, and ``[job] env`` passwords that
    read as a word and a PIN (masked at the notify sinks only) reach none of the journal, the
    ledger, ``status --json``, ``history --json``, the hook, the webhook, the report; the hook's env
    carries no raw ESC (OSC 52). A step number that contains the PIN keeps its digits."""
    run = _blind_run(daemons, tmp_path, SEVENTH_JOB, 'env = { DB_PASSWORD = "sunshine", PIN_PASSWORD = "12345" }', 8)
    d, sd, status, body, hist, out, report = run
    journal = d.stderr().split("event=metrics_blind", 1)[1]  # the job's own lines pass through before it
    hook_env = Path(str(out) + ".env").read_text()
    assert not _leaks(SEVENTH_SECRETS, journal=journal, ledger=_ledger_bytes(sd), status=status, history=hist,
                      hook_stdin=out.read_text(), hook_env=hook_env, webhook=body, report=report)
    samples = json.loads(status)["metrics_blind"]["samples"]
    assert "check argv ['--password', '<redacted>', '--lr', '0.1']" in samples, samples
    assert "x5 secret <redacted> and <redacted> num at step 123456" in samples, samples
    assert "\x1b" not in hook_env and "\\x1b]52" in hook_env, hook_env


def test_the_checkpoints_verb_masks_a_secret_in_a_file_name(tmp_path: Path) -> None:
    """R7 (issue 34): ``checkpoints`` printed ``step_13_hf_token=<value>.pt`` as it is; its table,
    its ``--json`` and its progress lines pass the gate."""
    import pickle

    ck = tmp_path / "ck"
    ck.mkdir()
    with open(ck / "step_13_hf_token=zqR7xfilename9.pt", "wb") as f:
        pickle.dump({"model": {}}, f, protocol=2)
    for extra in ((), ("--json",)):
        cp = subprocess.run([PY, "-m", "supervisor", "checkpoints", "--checkpoint-dir", str(ck), "--state-dir",
                             str(tmp_path / "sd"), "--no-load-test", *extra], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
        assert cp.returncode == 0, cp.stderr
        assert "zqR7x" not in cp.stdout + cp.stderr and "hf_token=<redacted>" in cp.stdout, cp.stdout + cp.stderr


HANG_JOB = r"""
import sys, time
for s in range(1, 6):
    print(f"step {s} loss 1.0", flush=True)
    time.sleep(0.2)  # a cadence of steps: the silence after them is a hang
print("-----BEGIN RSA PRIVATE KEY-----", flush=True)
print("MIIEpAIBAAKCAQEAzqH1xhangbodyOut0abcdefghijklmnopqrstuvwxyz0123", flush=True)
time.sleep(0.3)
sys.stderr.write("zqH2xhangbodyErr1ABCDEFGHIJKLMNOPqrstuvwxyz0123456789+/==\n")
sys.stderr.flush()
time.sleep(600)
"""
HANG_SECRETS = ("zqH1xhangbody", "zqH2xhangbody", "zqN1xcurlpw", "zqN2xapikey", "zqN3xpasswd", "zqL1xhydra", "zqL2xhydra")


def test_a_key_body_as_a_hangs_last_line_and_the_notify_commands_secrets_reach_no_sink(daemons, tmp_path: Path) -> None:
    """PS/PS2 and NC (issue 34): the job printed a PEM key's BEGIN, its body (on stdout, then on
    stderr) and hung: the body line, the hang's last line, is masked in hang_detected,
    failure_detected's evidence, the journal, history --json and the ledger's bytes. The notify
    command's argv secrets (curl's ``-u user:pw``, ``--api-key x``, ``--password x``) are masked in
    notify_ready and in the ledger's stored config (the daemon runs the hook from its config). L1:
    the job's Hydra overrides ``db.password=x`` are masked in the ledger's attempts too (the daemon
    relaunches from its config, not from the ledger), which is 0600 in a 0700 state dir."""
    job, sd, cfg = tmp_path / "job.py", tmp_path / "sd", tmp_path / "c.toml"
    job.write_text(HANG_JOB)
    hook = ["/bin/true", "-u", "admin:zqN1xcurlpw", "--api-key", "zqN2xapikey", "--password", "zqN3xpasswd",
            "https://alerts.example/x"]
    argv = [PY, str(job), "db.password=zqL1xhydra", "+model.api_key=zqL2xhydra", "max_tokens=512"]
    cfg.write_text(f"[job]\ncommand = {json.dumps(argv)}\nprewarm = false\n"
                   f'[state]\ndir = "{sd}"\n[gpu]\nbackend = "none"\n[host]\nstorage_probe = false\n'
                   "[heartbeat]\ntimeout_s = 4\nlook_s = 1\n[policy]\nmax_restarts = 0\n"
                   f"[notify]\ncommand = {json.dumps(hook)}\n")
    d = daemons(["run", "--config", str(cfg)])
    assert d.wait(90) == 3, d.stderr()[-3000:]  # the hang, no restart left: gave up
    hist = _cli("history", "--json", "--state-dir", str(sd))
    journal = d.stderr().split("event=hang_detected", 1)[1]  # the job's own lines pass through before it
    assert not _leaks(HANG_SECRETS, journal=journal, ledger=_ledger_bytes(sd), history=hist)
    assert not _leaks(HANG_SECRETS[2:], console=d.stderr())
    assert json.loads(hist)["attempts"][0]["argv"][2:] == ["db.password=<redacted>", "+model.api_key=<redacted>",
                                                           "max_tokens=512"]
    assert stat.S_IMODE(sd.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in sd.iterdir() if p.name.startswith("ledger.sqlite")} == {0o600}
    events = {e["event"]: e for e in json.loads(hist)["events"]}
    assert "last line: '<redacted>'" in json.dumps(events["failure_detected"]), events["failure_detected"]
    hang = [line for line in d.stderr().splitlines() if line.startswith("event=hang_detected")]
    assert hang and "last_line=<redacted>" in hang[0], hang
    ready = [line for line in d.stderr().splitlines() if "notify_ready" in line]
    assert ready and "admin:<redacted>" in ready[0], ready
    table = json.loads(sqlite3.connect(sd / "ledger.sqlite").execute("SELECT config_json FROM runs").fetchone()[0])
    assert table["notify"]["command"] == ["/bin/true", "-u", "admin:<redacted>", "--api-key", "<redacted>",
                                          "--password", "<redacted>", "https://alerts.example/x"]
