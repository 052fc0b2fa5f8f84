"""A webhook URL with credentials (``http://user:pw@host/x``) is sent with an ``Authorization:
Basic`` header and its password goes nowhere else (issue 34, D7). Before, urllib kept the userinfo
in the request's host: no credentials were sent, and ``user:pw@127.0.0.1`` went to the system
resolver as a host name (``Name or service not known``, the password to the DNS server). The
resolver is the boundary, so ``socket.getaddrinfo`` is wrapped in process and records every name
it is asked; the webhook is a real HTTP server on 127.0.0.1 that checks the header."""
from __future__ import annotations

import base64
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from structlog.testing import capture_logs

from supervisor.ops import delivery
from supervisor.ops.alertmsg import Alert, Masker
from supervisor.ops.alerts import Alerter
from supervisor.ops.config import NotifyConfig
from supervisor.ops.delivery import PermanentError, Try, split_userinfo
from tests.ops.notifyhelp import dead_url
from tests.util import wait_for

PASSWORD = "zqWHpass"


class AuthHook:
    """A webhook that answers 200 to a POST with the expected Basic credentials, 401 otherwise, and
    keeps every request's path and headers."""

    def __init__(self, user: str, password: str) -> None:
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.seen: list[tuple[str, dict[str, str]]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.seen.append((self.path, dict(self.headers.items())))
                self.send_response(200 if self.headers.get("Authorization") == want else 401)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def asked(monkeypatch) -> list[str]:
    """Every host name handed to the resolver, in order (the real resolver answers)."""
    names: list[str] = []
    real = socket.getaddrinfo

    def recording(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        names.append(str(host))
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    return names


@pytest.fixture
def hook() -> Iterator[AuthHook]:
    h = AuthHook("user", PASSWORD)
    yield h
    h.close()


def test_the_credentials_go_as_a_basic_header_and_never_to_the_resolver(hook: AuthHook, asked: list[str]) -> None:
    delivery.post_webhook(f"http://user:{PASSWORD}@127.0.0.1:{hook.port}/x", b"{}", Try(10.0))
    assert asked and set(asked) == {"127.0.0.1"}, asked  # the lookup, and create_connection's own
    [(path, headers)] = hook.seen
    assert path == "/x" and headers["Host"] == f"127.0.0.1:{hook.port}"
    assert headers["Authorization"] == "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()


def test_a_wrong_password_is_a_401_and_a_url_without_credentials_sends_no_header(hook: AuthHook,
                                                                                 asked: list[str]) -> None:
    with pytest.raises(PermanentError, match="HTTP 401"):
        delivery.post_webhook(f"http://user:wrong@127.0.0.1:{hook.port}/x", b"{}", Try(10.0))
    with pytest.raises(PermanentError, match="HTTP 401"):
        delivery.post_webhook(f"http://127.0.0.1:{hook.port}/x", b"{}", Try(10.0))
    assert "Authorization" not in hook.seen[1][1] and set(asked) == {"127.0.0.1"}, asked


def test_split_userinfo_undoes_percent_escapes_and_keeps_the_rest_of_the_url() -> None:
    assert split_userinfo("https://h.example/x?a=b@c") == ("https://h.example/x?a=b@c", None)
    url, auth = split_userinfo("http://u%40x:p%3Aw%40@[::1]:8080/p?q=1#f")
    assert url == "http://[::1]:8080/p?q=1#f" and auth == "Basic " + base64.b64encode(b"u@x:p:w@").decode()
    assert split_userinfo("http://token@h/")[1] == "Basic " + base64.b64encode(b"token:").decode()


def alert(event: str) -> Alert:
    return Alert(event, "error", f"{event} happened", "gpt", "r1", "node-3", 1, 1_700_000_000.0, {})


def test_the_alerter_delivers_through_it_and_logs_no_password(hook: AuthHook, asked: list[str]) -> None:
    dead = dead_url().replace("http://", f"http://user:{PASSWORD}@")
    for url, outcome in ((f"http://user:{PASSWORD}@127.0.0.1:{hook.port}/x", "sent"), (dead, "failed")):
        a = Alerter(NotifyConfig(webhook_url=url, timeout_s=5.0, retries=0, repeat_after_s=0.0, max_per_hour=1000),
                    Masker())
        with capture_logs() as logs:
            a.start()
            a.submit(alert("gave_up"))
            wait_for(lambda: a.counts()["webhook"][outcome] == 1, 20, 0.02, f"the notice {outcome}")
            a.close(5.0)
        assert logs and PASSWORD not in repr(logs), logs
    failed = [e for e in logs if e["event"] == "notify_failed"]
    assert len(failed) == 1 and "cannot reach the webhook" in failed[0]["error"], failed
    assert asked and not any(PASSWORD in n or "@" in n for n in asked), asked
    assert len(hook.seen) == 1
