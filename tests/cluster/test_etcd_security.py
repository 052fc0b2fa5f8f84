"""etcd over TLS with client certificates and with user/password auth (issue 26 build 1): the
client against a real etcd started with ``--client-cert-auth`` (certificates made here with the
openssl CLI) and against one with auth enabled; the config checks that refuse plain HTTP to
another host and name every bad credential file."""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from supervisor.cluster.agent import ClusterAgent
from supervisor.cluster.coord import Rules
from supervisor.cluster.credentials import PasswordAuth, tls_context
from supervisor.cluster.etcd import AUTH_RETRY_S, EtcdClient
from supervisor.cluster.etcdtypes import EtcdAuthError, EtcdTlsError
from supervisor.cluster.runkeys import EndRequest, Keys
from supervisor.config.model import ConfigError, config_from_table
from tests.cluster.etcdserver import EtcdServer, Unavailable
from tests.cluster.security import Ca, Pki, change_password, enable_auth
from tests.util import wait_for

PASSWORD = "s3cret-pw-for-test"
ROOT_PW: dict[str, str] = {}  # root's password of each auth_etcd, by endpoint


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    try:
        return Pki.make(tmp_path / "pki")
    except Unavailable as e:
        pytest.skip(str(e))


@contextlib.contextmanager
def _etcd(tmp_path: Path, tls: Pki | None) -> Iterator[EtcdServer]:
    try:
        server = EtcdServer(tmp_path / "etcd-data", tls=tls)
        server.start()
    except Unavailable as e:
        pytest.skip(f"no real etcd here: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tls_etcd(tmp_path: Path, pki: Pki) -> Iterator[EtcdServer]:
    with _etcd(tmp_path, pki) as server:
        yield server


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with _etcd(tmp_path, None) as server:
        ROOT_PW[server.endpoint] = enable_auth(server.endpoint, "tsup", PASSWORD, "/run/")
        yield server


def test_tls_with_a_client_certificate_works_and_without_one_is_refused(
        tls_etcd: EtcdServer, pki: Pki, tmp_path: Path) -> None:
    ok = EtcdClient([tls_etcd.endpoint], tls=tls_context(str(pki.ca.cert), str(pki.client_cert), str(pki.client_key)))
    ok.check_access("/run/")
    rev = ok.put("/run/a", "1")
    got = ok.get("/run/a")
    assert got is not None and got.value == "1" and got.mod_revision == rev
    lease = ok.grant(5)
    assert ok.keepalive(lease.id) == 5
    ok.revoke(lease.id)
    rogue = Ca.make(tmp_path / "rogue", "rogue-ca")
    rogue_cert, rogue_key = rogue.issue("intruder", server=False)
    refused = {
        "no client certificate": tls_context(str(pki.ca.cert)),
        "a client certificate etcd does not trust": tls_context(str(pki.ca.cert), str(rogue_cert), str(rogue_key)),
        "etcd's certificate not trusted (system store)": tls_context("", str(pki.client_cert), str(pki.client_key)),
    }
    for why, ctx in refused.items():
        c = EtcdClient([tls_etcd.endpoint], tls=ctx)
        with pytest.raises(EtcdTlsError, match="TLS handshake") as e:
            c.put("/run/gave_up/intruder", "x")  # the forged give-up of issue 26 never lands
        assert "cluster.ca_file" in str(e.value), why
        with pytest.raises(EtcdTlsError):
            c.check_access("/run/")
    assert ok.get("/run/gave_up/intruder") is None


def test_auth_token_from_the_password_file_renewed_after_an_etcd_restart(
        auth_etcd: EtcdServer, tmp_path: Path) -> None:
    pw = tmp_path / "etcd-password"
    pw.write_text(PASSWORD + "\n")
    c = EtcdClient([auth_etcd.endpoint], auth=PasswordAuth("tsup", str(pw)))
    c.check_access("/run/")
    c.put("/run/a", "1")
    won, _ = c.create("/run/leader", "n1", lease=c.grant(10).id)
    assert won
    token = c._token
    assert token
    auth_etcd.restart()  # etcd's simple tokens live in memory: the old one is invalid now
    req = urllib.request.Request(auth_etcd.endpoint + "/v3/kv/range", json.dumps({"key": "L3J1bi9h"}).encode(),
                                 headers={"Authorization": token}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401
    got = c.get("/run/a")  # renewed on etcd's "invalid auth token", transparently
    assert got is not None and got.value == "1" and c._token != token
    with pytest.raises(EtcdAuthError, match='user "tsup".*permission denied'):
        c.put("/elsewhere", "x")  # the role covers the run's prefix only
    anonymous = EtcdClient([auth_etcd.endpoint])
    with pytest.raises(EtcdAuthError, match="cluster.user and cluster.password_file"):
        anonymous.put("/run/gave_up/intruder", "x")
    assert c.get("/run/gave_up/intruder") is None


def test_a_wrong_password_fails_clearly_never_shown_and_a_fixed_file_heals(
        auth_etcd: EtcdServer, tmp_path: Path) -> None:
    pw = tmp_path / "etcd-password"
    pw.write_text("not-the-password\n")
    now = [0.0]
    c = EtcdClient([auth_etcd.endpoint], auth=PasswordAuth("tsup", str(pw)), clock=lambda: now[0])
    with pytest.raises(EtcdAuthError) as e:
        c.check_access("/run/")
    msg = str(e.value)
    assert 'user "tsup"' in msg and str(pw) in msg and "authentication failed" in msg, msg
    assert "not-the-password" not in msg
    pw.write_text(PASSWORD + "\n")
    with pytest.raises(EtcdAuthError):  # not asked again at once: each try costs etcd a bcrypt
        c.put("/run/a", "1")
    now[0] += AUTH_RETRY_S + 1
    c.put("/run/a", "1")  # the password file is read again at the next try
    kv = c.get("/run/a")
    assert kv is not None and kv.value == "1"


def test_a_password_refused_mid_run_is_an_outage_for_the_node_and_a_fixed_file_heals(
        auth_etcd: EtcdServer, tmp_path: Path) -> None:
    """An operator rotates the password in etcd but not in the file: the token is refused, its
    renewal too; the agent reports etcd out of reach with etcd's reason (local supervision goes
    on, the fence stops the job as when cut off); the file updated, the node is back."""
    pw = tmp_path / "etcd-password"
    pw.write_text(PASSWORD)
    now = [0.0]
    # A request deadline a loaded machine meets: a timeout would be reported as the outage instead.
    client = EtcdClient([auth_etcd.endpoint], timeout_s=3.0, auth=PasswordAuth("tsup", str(pw)), clock=lambda: now[0])
    events: list[tuple[str, str]] = []
    stops: list[EndRequest] = []
    agent = ClusterAgent(client, Keys("/run/agent"), "n1", "127.0.0.1",
                         Rules(nodes=1, min_nodes=1, wait_for_nodes_s=2.0, lease_ttl_s=2.0),
                         on_stop=stops.append, on_event=lambda e, lvl, msg, data: events.append((e, msg)), poll_s=0.05)
    agent.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(agent.wait_for_generation, []).result(timeout=20).gen == 1
        change_password(auth_etcd.endpoint, ROOT_PW[auth_etcd.endpoint], "tsup", "the-rotated-password")
        msg = wait_for(lambda: [m for e, m in events if e == "cluster_etcd_unreachable" and "refused" in m],
                       timeout=20, what="etcd reported out of reach for the refused password")[0]
        assert 'etcd refused user "tsup"' in msg and PASSWORD not in msg, msg
        wait_for(lambda: stops, timeout=20, what="the fence stops the job")
        pw.write_text("the-rotated-password\n")
        now[0] += AUTH_RETRY_S + 1
        wait_for(lambda: any(e == "cluster_etcd_back" for e, _ in events), timeout=20, what="back with the fixed file")
    finally:
        agent.close()


def test_a_user_configured_for_an_etcd_without_auth_is_refused(etcd: EtcdServer, tmp_path: Path) -> None:
    """Configured credentials an etcd ignores would leave the run open to anyone: said, not used."""
    pw = tmp_path / "etcd-password"
    pw.write_text(PASSWORD)
    c = EtcdClient([etcd.endpoint], auth=PasswordAuth("tsup", str(pw)))
    with pytest.raises(EtcdAuthError, match="authentication disabled.*remove cluster.user"):
        c.check_access("/run")


def test_tls_and_auth_together(tls_etcd: EtcdServer, pki: Pki, tmp_path: Path) -> None:
    enable_auth(tls_etcd.endpoint, "tsup", PASSWORD, "/run/", context=pki.client_context())
    pw = tmp_path / "etcd-password"
    pw.write_text(PASSWORD)
    c = EtcdClient([tls_etcd.endpoint], tls=tls_context(str(pki.ca.cert), str(pki.client_cert), str(pki.client_key)),
                   auth=PasswordAuth("tsup", str(pw)))
    c.put("/run/a", "1")
    assert c.get("/run/a") is not None
    # etcd's gateway refuses a client certificate with a Common Name once auth is on: said so
    named_cert, named_key = pki.ca.issue("named", server=True)  # server certs carry a CN
    named = EtcdClient([tls_etcd.endpoint], tls=tls_context(str(pki.ca.cert), str(named_cert), str(named_key)),
                       auth=PasswordAuth("tsup", str(pw)))
    with pytest.raises(EtcdAuthError, match="Common Name"):
        named.check_access("/run/")


# ---------------------------------------------------------------------- config checks (no etcd)

def _cfg(**cluster: object) -> object:
    return config_from_table({"job": {"command": ["python", "train.py"]}, "cluster": {"nodes": 2, **cluster}})


def _problems(**cluster: object) -> str:
    with pytest.raises(ConfigError) as e:
        _cfg(**cluster)
    return "\n".join(str(p) for p in e.value.problems)


def test_plain_http_to_another_host_is_refused_unless_insecure() -> None:
    text = _problems(endpoints=["http://127.0.0.1:2379", "http://etcd-1.internal:2379"])
    assert 'cluster.endpoints[1]: "http://etcd-1.internal:2379" is plain HTTP' in text and "insecure" in text
    assert "endpoints[0]" not in text  # loopback is this machine
    _cfg(endpoints=["http://etcd-1.internal:2379"], insecure=True)
    _cfg(endpoints=["http://localhost:2379", "http://[::1]:2379"])
    assert "credentials in the URL" in _problems(endpoints=["https://u:pw@etcd:2379"])


def test_credential_keys_must_fit_together_and_their_files_load(tmp_path: Path, pki: Pki) -> None:
    text = _problems(endpoints=["http://127.0.0.1:2379"], ca_file=str(pki.ca.cert), user="tsup")
    assert "cluster.ca_file: set, but no endpoint is https://" in text
    assert "cluster.password_file: etcd auth needs both" in text
    text = _problems(endpoints=["https://etcd:2379"], key_file=str(pki.client_key))
    assert "cluster.key_file: set without cluster.cert_file" in text
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    empty = tmp_path / "empty-password"
    empty.write_text("\n")
    text = _problems(endpoints=["https://etcd:2379"], ca_file=str(garbage), user="tsup", password_file=str(empty))
    assert f'cluster.ca_file: cannot load "{garbage}"' in text
    assert f'cluster.password_file: "{empty}" is empty' in text
    text = _problems(endpoints=["https://etcd:2379"], cert_file=str(pki.client_cert),
                     key_file=str(tmp_path / "missing.key"))
    assert "cluster.key_file: no such file" in text
    text = _problems(endpoints=["https://etcd:2379"], cert_file=str(pki.client_cert), key_file=str(pki.server_key))
    assert "cluster.cert_file: cannot load the client certificate" in text  # a key of another certificate
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    c = _cfg(endpoints=["https://etcd:2379"], ca_file=str(pki.ca.cert), cert_file=str(pki.client_cert),
             key_file=str(pki.client_key), user="tsup", password_file=str(pw))
    assert PASSWORD not in repr(c)  # the config holds the file's name, never the password
