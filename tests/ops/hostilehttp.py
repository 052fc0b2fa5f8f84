"""A webhook that misbehaves on purpose: a raw TCP server on 127.0.0.1 whose reply to each POST
is chosen by a function of the request (slow, trickling, silent, a redirect, a 500, a huge body,
closed mid-reply). Every request it read is kept, with its event name."""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

#: The behaviours a reply can have (see ``_reply``).
BEHAVIOURS = ("ok", "slow_ok", "trickle", "silent", "redirect", "error500", "huge", "close_mid", "bad_status")


@dataclass(frozen=True)
class Seen:
    at: float
    method: str
    event: str  # the notice's event ("" when the body was not JSON)


class HostileWebhook:
    def __init__(self, choose: Callable[[Seen], str], *, redirect_to: str = "http://127.0.0.1:9/elsewhere") -> None:
        self.choose = choose
        self.redirect_to = redirect_to
        self.seen: list[Seen] = []
        self._closing = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/hook/SECRETPATH"
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def events(self) -> list[str]:
        return [s.event for s in self.seen]

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length"), 0)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            try:
                event = str(json.loads(body).get("event", ""))
            except ValueError:
                event = ""
            seen = Seen(time.monotonic(), lines[0].split(" ")[0], event)
            self.seen.append(seen)
            self._reply(conn, self.choose(seen))
        except OSError:
            pass
        finally:
            conn.close()

    def _wait(self, seconds: float) -> bool:
        """False once the server closes (so no thread outlives the test)."""
        return not self._closing.wait(seconds)

    def _reply(self, conn: socket.socket, how: str) -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        if how == "ok":
            conn.sendall(ok)
        elif how == "slow_ok":  # within any sensible deadline, but not at once
            if self._wait(0.3):
                conn.sendall(ok)
        elif how == "trickle":  # a byte every 0.1 s of a reply that never ends
            while self._wait(0.1):
                conn.sendall(b"H")
        elif how == "silent":
            self._wait(3600)
        elif how == "redirect":
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + self.redirect_to.encode()
                         + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif how == "error500":
            conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops")
        elif how == "huge":  # a 200 whose body is 100 MB: the sender reads what it needs, not all
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\nConnection: close\r\n\r\n")
            block = b"x" * 65536
            for _ in range(100_000_000 // len(block)):
                if self._closing.is_set():
                    return
                conn.sendall(block)
        elif how == "close_mid":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Len")
        elif how == "bad_status":
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        else:
            raise ValueError(how)

    def close(self) -> None:
        self._closing.set()
        self._sock.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)
