"""Credentials inside values are masked like secret names (issue 24 build 4): unit cases for
supervisor.redact, and through the real daemon: history, the ledger file and the log."""
from __future__ import annotations

import json
import signal
import sys

from supervisor.redact import redact_argv, redact_env, redact_line
from tests.conftest import history
from tests.util import wait_for

PY = sys.executable


def test_argv_flags_and_url_passwords_are_masked_numbers_kept():
    got = redact_argv(["train.py", "--password=hunter2", "--hf-token", "hf_abc", "--max-tokens", "512",
                       "--db", "postgres://u:PASS@h/db", "--lr=3e-4", "--api-key", "-v"])
    assert got == ["train.py", "--password=<redacted>", "--hf-token", "<redacted>", "--max-tokens", "512",
                   "--db", "postgres://u:<redacted>@h/db", "--lr=3e-4", "--api-key", "-v"]


def test_env_values_and_lines():
    assert redact_env({"DB": "mysql://root:pw@db:3306/x", "HF_TOKEN": "t", "GIT": "git@github.com:o/r"}) == \
        {"DB": "mysql://root:<redacted>@db:3306/x", "HF_TOKEN": "<redacted>", "GIT": "git@github.com:o/r"}
    line = "curl -H 'Authorization: Bearer eyJ.abc' https://u:pw@h/x tokens_per_sec=4500"
    assert redact_line(line) == "curl -H 'Authorization: Bearer <redacted>' https://u:<redacted>@h/x tokens_per_sec=4500"


def test_credentials_in_argv_and_env_values_never_reach_history_ledger_or_log(daemons, tmp_path):
    sd, ready = tmp_path / "sd", tmp_path / "ready"
    cfgp = tmp_path / "c.toml"
    argv = [PY, "-c", "import sys,time; open(sys.argv[1],'w').write('x'); time.sleep(600)", str(ready),
            "--password=pw-s3cr3t-1", "--token", "tk-s3cr3t-2", "--db", "postgres://u:url-s3cr3t-3@h/db"]
    cmd = ", ".join(json.dumps(a) for a in argv)
    cfgp.write_text(f'[job]\ncommand = [{cmd}]\nenv = {{ DATABASE_URL = "redis://:env-s3cr3t-4@h:6379" }}\n'
                    f'[state]\ndir = "{sd}"\n')
    d = daemons(["run", "--config", str(cfgp)])
    wait_for(ready.exists, 30, what="job ready")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143
    stored = b"".join(p.read_bytes() for p in sd.iterdir() if p.name.startswith("ledger.sqlite"))
    h = json.dumps(history(sd))
    for secret in ("pw-s3cr3t-1", "tk-s3cr3t-2", "url-s3cr3t-3", "env-s3cr3t-4"):
        assert secret not in d.stderr() and secret.encode() not in stored and secret not in h, secret
    assert "--password=<redacted>" in h and "postgres://u:<redacted>@h/db" in h
