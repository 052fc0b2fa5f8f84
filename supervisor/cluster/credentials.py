"""What the etcd client proves itself with and checks etcd against (issue 26 build 1).

* TLS: etcd's server certificate is verified against ``[cluster] ca_file`` (or the system's trust
  store) with its host name; ``cert_file``/``key_file`` is the client certificate presented to an
  etcd started with ``--client-cert-auth``.
* Password auth: ``user`` and a ``password_file`` (the password never sits in the config text,
  so the stored config, ``status`` and the logs never hold it). The file is read when a token is
  asked for, so a rotated password is picked up at the next renewal.

Read by the config checks (so ``check-config`` names an unreadable or malformed file) and by the
client's construction; standard library only, no I/O at import.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from ..errors import SupervisorError

__all__ = ["CredentialsError", "PasswordAuth", "tls_context"]


class CredentialsError(SupervisorError):
    """Raised when a credential file cannot be used (missing, unreadable, empty, not PEM);
    ``key`` names the config key (``cluster.ca_file``) so a config check can report it."""

    code = "etcd_credentials"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.problem = message


class _EncryptedKey(SupervisorError):
    """The private key asks for a passphrase, which a daemon has no one to ask."""

    def __init__(self) -> None:
        super().__init__("the private key asks for a passphrase")


def _no_passphrase() -> str:
    raise _EncryptedKey()  # without a callback OpenSSL would prompt on the terminal


def _path(p: str) -> str:
    return str(Path(p).expanduser())


def tls_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """A client context that verifies the server (``ca_file``, else the system's trust store,
    and the host name) and presents ``cert_file`` (its key in ``key_file``, or in ``cert_file``
    itself) when given. Raises :class:`CredentialsError` naming the key whose file is bad."""
    for key, f in (("cluster.ca_file", ca_file), ("cluster.cert_file", cert_file), ("cluster.key_file", key_file)):
        if f and not Path(_path(f)).is_file():  # OpenSSL's own error would not say which file
            raise CredentialsError(key, f'no such file "{f}"')
    try:
        ctx = ssl.create_default_context(cafile=_path(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as e:
        raise CredentialsError("cluster.ca_file", f'cannot load "{ca_file}" as PEM CA certificates '
                               f"({_reason(e)})") from None
    if not cert_file:
        return ctx
    try:
        ctx.load_cert_chain(_path(cert_file), _path(key_file) if key_file else None, password=_no_passphrase)
    except _EncryptedKey:
        raise CredentialsError("cluster.key_file", f'the private key in "{key_file or cert_file}" is encrypted; '
                               "expected an unencrypted PEM key (protect it by its file mode)") from None
    except (OSError, ssl.SSLError) as e:
        raise CredentialsError("cluster.cert_file", f'cannot load the client certificate "{cert_file}" with its key '
                               f'"{key_file or cert_file}" ({_reason(e)}); expected PEM files of one '
                               "certificate and its private key") from None
    return ctx


def _reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError) and e.reason:
        return str(e.reason)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


@dataclass(frozen=True)
class PasswordAuth:
    """etcd user/password auth; the password is read from ``password_file`` on each use."""

    user: str
    password_file: str

    def password(self) -> str:
        """The file's first line (a trailing newline is not part of it). Raises
        :class:`CredentialsError` for a missing, unreadable or empty file."""
        path = _path(self.password_file)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise CredentialsError("cluster.password_file", f'"{self.password_file}" is not UTF-8 text') from None
        except OSError as e:
            raise CredentialsError("cluster.password_file", f'cannot read "{self.password_file}" '
                                   f"({e.strerror or e})") from None
        lines = text.splitlines()
        pw = lines[0] if lines else ""
        if not pw:
            raise CredentialsError("cluster.password_file", f'"{self.password_file}" is empty; expected the etcd '
                                   f'password of user "{self.user}" on its first line')
        return pw
