"""Credentials inside values are masked like secret names (issue 24 build 4): unit cases for
supervisor.redact, and through the real daemon: history, the ledger file and the log."""
from __future__ import annotations

import json
import signal
import sys

from supervisor.redact import (MAX_LINE_CHARS, MAX_TOTAL_CHARS, MAX_VALUE_CHARS, REDACTED, redact_argv, redact_env,
                               redact_data, redact_line, redact_url)
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



def test_webhook_url_shows_scheme_and_host_only():
    assert redact_url("https://hooks.slack.com/services/T0/B0/XYZ") == f"https://hooks.slack.com/{REDACTED}"
    assert redact_url("not a url") == REDACTED and redact_url("http://[::1") == REDACTED


def test_a_huge_line_is_cut_and_says_how_much():
    line = "step 1 " + "x" * 5_000_000
    got = redact_line(line)
    assert got == line[:MAX_LINE_CHARS] + f"…(+{len(line) - MAX_LINE_CHARS} chars)"


def test_a_url_password_split_by_the_cut_is_still_masked():
    # The bound falls inside the password: no "@" is left for the usual rule, the tail rule masks it.
    pad = "x" * (MAX_LINE_CHARS - 30) + " "
    got = redact_line(pad + "postgres://u:" + "S3CRET" * 200 + "@h/db")
    assert "S3CRET" not in got and f"postgres://u:{REDACTED}…(+" in got
    arg = redact_argv(["--db=postgres://u:" + "S3CRET" * 1000 + "@h/db"])[0]
    assert "S3CRET" not in arg and len(arg) < MAX_VALUE_CHARS
    env = redact_env({"DB": "redis://:" + "S3CRET" * 1000 + "@h:6379"})
    assert "S3CRET" not in env["DB"] and env["DB"].endswith("chars)")


def test_env_is_bounded_per_value_and_in_all_and_says_what_was_cut():
    env = {"BIG": "v" * 5_000_000, "N" * 3000: "x", "HF_TOKEN": "t" * 5000}
    env.update({f"VAR_{i}": "y" * 100 for i in range(10_000)})
    got = redact_env(env)
    assert got["BIG"] == "v" * MAX_VALUE_CHARS + f"…(+{5_000_000 - MAX_VALUE_CHARS} chars)"
    assert "N" * MAX_VALUE_CHARS + "…(+1976 chars)" in got and got["HF_TOKEN"] == REDACTED
    assert got["…"].endswith("more variables)")
    shown = sum(len(k) + len(v) for k, v in got.items())
    assert shown < MAX_TOTAL_CHARS + 2 * MAX_VALUE_CHARS + 100
    kept = len(got) - 1 - 3  # the three big ones and the "…" entry
    assert got["…"] == f"(+{10_000 - kept} more variables)"


def test_a_huge_argv_is_cut_per_argument_and_in_all():
    got = redact_argv(["train.py", "--token", "t" * 5000, "a" * 5000] + ["--flag"] * 100_000)
    assert got[:3] == ["train.py", "--token", REDACTED]
    assert got[3] == "a" * MAX_VALUE_CHARS + f"…(+{5000 - MAX_VALUE_CHARS} chars)"
    assert got[-1].endswith("more args)") and sum(map(len, got)) < MAX_TOTAL_CHARS + MAX_VALUE_CHARS
    assert redact_argv(["--api-key", "--token", "x"]) == ["--api-key", "--token", REDACTED]


def test_the_cores_argv_is_shown_by_every_sink_bounded_and_masked():
    """The machine keeps an argv as exec'd (core.messages.Argv); the log line and the ledger row
    (redact_data, after jsonable) and a notification (Masker) show it as redact_argv does."""
    from supervisor.core.messages import Argv, jsonable
    from supervisor.ops.alertmsg import Masker

    argv = Argv(("train.py", "--token", "tk-s3cr3t-9", "a" * 5000))
    want = ["train.py", "--token", REDACTED, "a" * MAX_VALUE_CHARS + f"…(+{5000 - MAX_VALUE_CHARS} chars)"]
    assert redact_data({"argv": argv}) == {"argv": want}
    assert redact_data(jsonable({"argv": argv})) == {"argv": want}
    assert Masker().value({"argv": argv}) == {"argv": want}

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


def test_prose_that_merely_contains_a_marker_word_is_left_alone() -> None:
    # With only a space between, a name must end with the marker to name a secret.
    assert redact_line("tokenizer loaded from gpt2") == "tokenizer loaded from gpt2"
    assert redact_line("secret_sauce on, keyboard ready") == "secret_sauce on, keyboard ready"
    assert redact_line("export HF_TOKEN hf_abc") == f"export HF_TOKEN {REDACTED}"
    assert redact_line("my password hunter2") == f"my password {REDACTED}"
    assert redact_line("tokenizer=hunter2") == f"tokenizer={REDACTED}"  # an assignment still masks


def test_the_fourth_reviews_forms_and_the_decisions_about_their_look_alikes() -> None:
    # A subscript with a secret-named key, assigned or compared; a harmless one stays.
    assert redact_line('os.environ["HF_TOKEN"] = "abc1"') == f'os.environ["HF_TOKEN"] = "{REDACTED}"'
    assert redact_line("if cfg['api_key'] == 'abc2':") == f"if cfg['api_key'] == '{REDACTED}':"
    assert redact_line('os.environ["LR"] = "0.1"') == 'os.environ["LR"] = "0.1"'
    # A URL's user with no password: masked whole when it looks like a token, a name kept.
    assert redact_line("https://0123456789abcdef0123@github.com/o/r") == f"https://{REDACTED}@github.com/o/r"
    assert redact_line("https://abcdefghijklmnopqrstuvwxyz@h/x") == f"https://{REDACTED}@h/x"
    for kept in ("ssh://git@github.com/o/r", "git@github.com:o/r", "https://jane.doe@h/x", "https://trainer01@h/x"):
        assert redact_line(kept) == kept
    # "pass" as a key; as a word (a count, a result, a flag's part, inside a word) it stays.
    assert redact_line("pass=hunter2") == f"pass={REDACTED}" and redact_line("DB_PASS: s3cr") == f"DB_PASS: {REDACTED}"
    for kept in ("pass 2 of 3", "tests pass: 5", "pass: ok", "--pass-through", "bypass=cache", "compass: north"):
        assert redact_line(kept) == kept
    # mysql's glued -p, in a mysql client's command only; "-p db" prompts (db is the database).
    assert redact_line("mysql -uroot -pabc3 db; ssh -p2222 h") == f"mysql -uroot -p{REDACTED} db; ssh -p2222 h"
    assert redact_line("mysql -u root -p train") == "mysql -u root -p train"
    # An XML element named for a secret; a count under a word that counts stays.
    assert redact_line("<password>abc4</password>") == f"<password>{REDACTED}</password>"
    assert redact_line("<tokens>512</tokens><loss>2.5</loss>") == "<tokens>512</tokens><loss>2.5</loss>"


def test_the_fifth_reviews_forms_and_the_decisions_about_their_look_alikes() -> None:
    # A call's quoted name then its value; a quoted phrase before a comma is no name.
    assert redact_line("os.putenv('HF_TOKEN', 'v1xx')") == f"os.putenv('HF_TOKEN', '{REDACTED}')"
    assert redact_line('os.environ.get("HF_TOKEN", default="v2xx")') == \
        f'os.environ.get("HF_TOKEN", default="{REDACTED}")'
    assert redact_line('print("the key", value)') == 'print("the key", value)'
    # mariadb like mysql; openssl's --pass flag; where openssl reads a password from is no password.
    assert redact_line("mariadb -uroot -pv3xx db") == f"mariadb -uroot -p{REDACTED} db"
    assert redact_line("openssl enc --pass v4xx -in a") == f"openssl enc --pass {REDACTED} -in a"
    assert redact_line("openssl enc -pass pass:v4xy") == f"openssl enc -pass pass:{REDACTED}"  # where it is said
    kept = "openssl enc -passin env:PW -pass file:/etc/pw -passout stdin; mariadb -p db; --pass 2"
    assert redact_line(kept) == kept
    # XML: the name in an attribute, an attribute pair, CDATA, HTML-escaped; a metric's element stays.
    assert redact_line('<string name="password">v5xx</string>') == f'<string name="password">{REDACTED}</string>'
    assert redact_line('<param name="token" value="v6xx"/>') == f'<param name="token" value="{REDACTED}"/>'
    assert redact_line("<password><![CDATA[v7xx]]></password>") == f"<password><![CDATA[{REDACTED}]]></password>"
    assert redact_line("&lt;password&gt;v8xx&lt;/password&gt;") == f"&lt;password&gt;{REDACTED}&lt;/password&gt;"
    for kept in ('<string name="app_name">Trainer</string>', "<loss><![CDATA[2.5]]></loss>",
                 "&lt;tokens&gt;512&lt;/tokens&gt;"):
        assert redact_line(kept) == kept
    # A spaced subscript; a name whose spaced value is no secret gives it back to be read as a name.
    assert redact_line("secrets [ 'db_password' ] = 'v9xx'") == f"secrets [ 'db_password' ] = '{REDACTED}'"
    assert redact_line("the token password=w1xx") == f"the token {REDACTED}"
    assert redact_line("the token expired, key rotated") == "the token expired, key rotated"
    # Triple quotes, a quote inside them read past.
    assert redact_line("password = '''it's w2xx'''") == f"password = '''{REDACTED}'''"
