"""Two real daemons coordinated through a real etcd that wants TLS with client certificates and
a user/password token (issue 26 build 1): an operator restart on one node stops both and they
resume together;
a third daemon with a wrong password ends its start with etcd's reason. The password appears in
no log, ledger or state file."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.daemons import all_finish, launches, node_config, start
from tests.cluster.etcdserver import EtcdServer, Unavailable
from tests.cluster.security import Pki, enable_auth
from tests.conftest import history
from tests.util import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PASSWORD = "e2e-Secret-pw-7f3a"


@pytest.fixture
def secure_etcd(tmp_path: Path) -> Iterator[tuple[EtcdServer, Pki]]:
    try:
        pki = Pki.make(tmp_path / "pki")
        server = EtcdServer(tmp_path / "etcd-data", tls=pki)
        server.start()
    except Unavailable as e:
        pytest.skip(f"no real etcd over TLS here: {e}")
    try:
        yield server, pki
    finally:
        server.stop()


def _secure(config: Path, pki: Pki, password_file: Path) -> Path:
    with config.open("a") as f:  # [cluster] is the config's last section
        f.write(f'ca_file = "{pki.ca.cert}"\ncert_file = "{pki.client_cert}"\nkey_file = "{pki.client_key}"\n'
                f'user = "tsup"\npassword_file = "{password_file}"\n')
    return config


def test_two_nodes_over_tls_with_auth_stop_and_relaunch_together(
        secure_etcd: tuple[EtcdServer, Pki], tmp_path: Path) -> None:
    etcd, pki = secure_etcd
    prefix = f"/tsup/secure-{uuid.uuid4().hex[:8]}"
    enable_auth(etcd.endpoint, "tsup", PASSWORD, prefix + "/", context=pki.client_context())
    good, wrong = tmp_path / "etcd-password", tmp_path / "wrong-password"
    good.write_text(PASSWORD + "\n")
    wrong.write_text("not-" + PASSWORD + "\n")
    ds = {n: start(tmp_path, n, _secure(node_config(tmp_path, n, etcd, prefix, nodes=2,
                                                     job_args=["60", "0.05", "10"]), pki, good))
          for n in ("n1", "n2")}
    intruder = start(tmp_path, "n3", _secure(node_config(tmp_path, "n3", etcd, prefix, nodes=2,
                                                         job_args=["40", "0.05", "10"]), pki, wrong))
    assert intruder.wait(60) == 3
    out = intruder.stdout() + intruder.stderr()
    assert "cannot start: etcd refused user" in out and "tsup" in out and str(wrong) in out and "authentication failed" in out, out[-2000:]
    for n in ds:
        wait_for(lambda: launches(tmp_path, n), timeout=60, what=f"{n}'s first launch")
    r = subprocess.run([sys.executable, "-m", "supervisor", "restart", "--state-dir", str(tmp_path / "n1" / "state"),
                        "--reason", "a new generation over TLS"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    all_finish(ds, 180)
    runs = {n: launches(tmp_path, n) for n in ds}
    for n, ls in runs.items():
        assert [x["TSUP_GENERATION"] for x in ls] == ["1", "2"], (n, ls)
    assert len({runs[n][1]["TSUP_RESUME_STEP"] for n in ds}) == 1  # one step for both
    assert launches(tmp_path, "n3") == []
    for n in ds:
        events = {e["event"] for e in history(tmp_path / n / "state")["events"]}
        assert {"cluster_started", "cluster_generation_joined"} <= events, (n, events)
    # the password is in its file only: no log line, ledger row or state file of any node holds it
    for n in ("n1", "n2", "n3"):
        for f in (tmp_path / n).rglob("*"):
            if f.is_file():
                assert PASSWORD.encode() not in f.read_bytes(), f
