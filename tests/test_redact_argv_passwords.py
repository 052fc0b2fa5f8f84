"""A password given to a client as a short option in an argv (issue 34, the fourth round): the job's
command or a hook's argv is shown argument by argument (events, ``status``, the journal, the
ledger), so the text rule that masks ``mysql -pX`` in a line (the client's name in the same text)
never saw it. The decision (redactsyntax.argv_passwords): ``-p`` is read as a password only after
a client that reads it so (mysql/mariadb glued ``-pX``; sshpass and MongoDB's tools ``-p X`` and
``-pX``; redis-cli's ``-a X``), once per client; a bare ``-p`` anywhere else is a port or a
switch (``-p 8080``, ``psql -p 5432``, ``ssh -p 22``, ``mkdir -p``) and stays; ``--password X``,
``--passwd X``, ``--pass X`` go by their names in any command."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import structlog

from supervisor import logsetup
from supervisor.config.model import config_from_table
from supervisor.core.messages import Argv
from supervisor.job.launch import config_json
from supervisor.ledger.store import Ledger
from supervisor.redact import REDACTED, redact_argv, redact_data, redact_text

R = REDACTED
CASES = [
    (["mysql", "-uroot", "-pzqA1x", "train"], ["mysql", "-uroot", f"-p{R}", "train"]),
    (["/usr/bin/mysqldump", "-h", "db", "-pzqA2x", "train"], ["/usr/bin/mysqldump", "-h", "db", f"-p{R}", "train"]),
    (["docker", "exec", "db", "mariadb", "-p'zqA3x'"], ["docker", "exec", "db", "mariadb", f"-p{R}"]),
    (["sshpass", "-p", "zqA4x", "ssh", "-p", "22", "node1"], ["sshpass", "-p", R, "ssh", "-p", "22", "node1"]),
    (["sshpass", "-pzqA5x", "rsync", "a", "b"], ["sshpass", f"-p{R}", "rsync", "a", "b"]),
    (["mongosh", "-u", "admin", "-p", "zqA6x", "mongodb://db"], ["mongosh", "-u", "admin", "-p", R, "mongodb://db"]),
    (["redis-cli", "-h", "r", "-p", "6379", "-a", "zqA7x"], ["redis-cli", "-h", "r", "-p", "6379", "-a", R]),
    (["psql", "-h", "db", "-p", "5432", "--password", "zqA8x"], ["psql", "-h", "db", "-p", "5432", "--password", R]),
    (["app", "--passwd", "zqA9x", "--pass", "zqB1x", "-p", "8080"], ["app", "--passwd", R, "--pass", R, "-p", "8080"]),
]
KEPT = [
    ["python", "serve.py", "-p", "8080"],
    ["ssh", "-p", "2222", "node1"],
    ["docker", "run", "-p", "8080:80", "img"],
    ["mkdir", "-p", "/tmp/x"],
    ["psql", "-h", "db", "-p", "5432", "train"],
    ["mysql", "-uroot", "-p", "train"],  # -p then a word: mysql prompts, the word is the database
    ["mysql", "-pzq", ";", "ssh", "-p2222", "node1"][3:],  # after a separator: another command
    ["redis-cli", "-p", "6379", "ping"],
]


@pytest.mark.parametrize("argv,shown", CASES)
def test_a_clients_password_option_is_masked_in_an_argv(argv: list[str], shown: list[str]) -> None:
    assert redact_argv(argv) == shown
    assert redact_data({"argv": Argv(tuple(argv))}) == {"argv": shown}


@pytest.mark.parametrize("argv", KEPT)
def test_a_bare_p_elsewhere_is_a_port_or_a_switch_and_stays(argv: list[str]) -> None:
    assert redact_argv(argv) == argv


def test_one_password_a_client_and_a_separator_ends_its_command() -> None:
    assert redact_argv(["mysql", "-pzqC1x", ";", "ssh", "-p2222", "n"]) == ["mysql", f"-p{R}", ";", "ssh", "-p2222", "n"]
    assert redact_argv(["bash", "-c", "mysql -uroot -pzqC2x db; ssh -p 22 n"]) == [
        "bash", "-c", f"mysql -uroot -p{R} db; ssh -p 22 n"]
    assert redact_text("mongosh -u a -p zqC3x; redis-cli -a zqC4x -p 6379; ssh -p 22 n") == (
        f"mongosh -u a -p {R}; redis-cli -a {R} -p 6379; ssh -p 22 n")


def test_the_job_command_and_a_hooks_argv_at_every_sink(tmp_path: Path) -> None:
    """The stored config (runs.config_json), an event's argv in the ledger and its history, and a
    journal line: no password of a client's short option."""
    job = ["/usr/bin/mysql", "-uroot", "-pzqD1xjob", "train"]
    hook = ["/usr/bin/redis-cli", "-a", "zqD2xhook", "publish", "alerts"]
    cfg = config_from_table({"job": {"command": job}, "notify": {"command": hook}})
    stored = config_json(cfg)
    assert stored["job"]["command"] == ["/usr/bin/mysql", "-uroot", f"-p{R}", "train"]
    assert stored["notify"]["command"] == ["/usr/bin/redis-cli", "-a", R, "publish", "alerts"]
    led = Ledger(tmp_path)
    try:
        run_id, _ = led.open_run("job", stored)
        led.event(run_id, 1, "job_started", "info", "started", {"argv": Argv(tuple(job)), "hook": hook})
        h = led.history(run_id)
    finally:
        led.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("ledger.sqlite"))
    out = io.StringIO()
    logsetup.configure("json", "info", out)
    try:
        structlog.get_logger("t").info("job_started", argv=Argv(tuple(job)), hook=hook)
    finally:
        structlog.reset_defaults()
    for text in (raw.decode(errors="replace"), json.dumps(h), out.getvalue()):
        assert "zqD1xjob" not in text and "zqD2xhook" not in text
    assert f"-p{R}" in out.getvalue()
