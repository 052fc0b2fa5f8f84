"""Fixtures for the cluster tests: a real etcd on loopback (see etcdserver.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.etcdserver import EtcdServer, Unavailable


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A fresh etcd for one test (its own ports and data dir), stopped afterwards."""
    try:
        server = EtcdServer(tmp_path / "etcd-data")
        server.start()
    except Unavailable as e:
        pytest.skip(f"no real etcd here: {e}")
    try:
        yield server
    finally:
        server.stop()
