"""Store failures the shells rely on: an unreachable database is a TransientStoreError."""

from __future__ import annotations

import socket

import pytest

from gpuquota.adapters.event_store import TransientStoreError
from gpuquota.adapters.postgres_store import PostgresEventStore


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


async def test_unreachable_postgres_is_transient() -> None:
    with pytest.raises(TransientStoreError):
        await PostgresEventStore.connect(f"postgresql://u:p@127.0.0.1:{closed_port()}/db")
