"""The watch's line reader over a real socket carrying a chunked HTTP body (how etcd's gateway
sends a watch): lines split across chunks or several to a chunk come out whole, the zero-size
chunk ends the stream, a connection cut mid-chunk gives what came, a broken chunk header is a
ValueError (the watch reports it as dropped), a silent socket raises TimeoutError (idle)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from supervisor.cluster.etcdwatch import _ChunkedLines


@contextmanager
def stream(body: bytes, timeout_s: float = 5.0, keep_open: bool = False) -> Iterator[_ChunkedLines]:
    a, b = socket.socketpair()
    b.settimeout(timeout_s)
    a.sendall(body)
    if not keep_open:
        a.shutdown(socket.SHUT_WR)
    fp = b.makefile("rb")
    try:
        yield _ChunkedLines(fp)
    finally:
        fp.close()
        a.close()
        b.close()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_lines_come_out_whole_across_and_within_chunks_until_the_last_chunk() -> None:
    body = (chunk(b'{"a": 1}\n') + chunk(b'{"b":') + chunk(b' 2}\n{"c": 3}\n') + b"5;ext=1\r\n{\"d\":\r\n"
            + chunk(b" 4}\n") + b"0\r\n\r\n" + chunk(b"after the end\n"))
    with stream(body) as lines:
        got = [lines.readline() for _ in range(5)]
    assert got == [b'{"a": 1}\n', b'{"b": 2}\n', b'{"c": 3}\n', b'{"d": 4}\n', b""]


def test_a_connection_cut_mid_chunk_gives_what_came_then_the_end() -> None:
    with stream(chunk(b'{"a": 1}\n') + b"20\r\n{\"half") as lines:
        assert [lines.readline(), lines.readline(), lines.readline()] == [b'{"a": 1}\n', b'{"half', b""]


def test_a_broken_chunk_header_is_a_value_error() -> None:
    with stream(b"zz\r\nnot a chunk\r\n") as lines, pytest.raises(ValueError):
        lines.readline()


def test_a_silent_stream_raises_timeout_error() -> None:
    with stream(chunk(b'{"a": 1}\n'), timeout_s=0.2, keep_open=True) as lines:
        assert lines.readline() == b'{"a": 1}\n'
        with pytest.raises(TimeoutError):
            lines.readline()
