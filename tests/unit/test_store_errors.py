"""Store failures the shells rely on: an unreachable database is a TransientStoreError."""

from __future__ import annotations

import socket

import asyncpg
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


class RaisingPool:
    """An asyncpg pool whose every query raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.expired = 0

    async def fetchval(self, *args: object) -> object:
        raise self.exc

    async def expire_connections(self) -> None:
        self.expired += 1


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(104, "Connection reset by peer"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.CrashShutdownError("terminating connection because of crash of another server"),
        asyncpg.exceptions.CannotConnectNowError("the database system is in recovery mode"),
        asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
    ],
    ids=type,
)
async def test_errors_of_a_server_that_crashed_restarts_or_failed_over_are_transient(exc: Exception) -> None:
    pool = RaisingPool(exc)
    with pytest.raises(TransientStoreError):
        await PostgresEventStore(pool).last_seq("p")
    # a connection left in the middle of an operation: none of the pool's is trusted any more
    assert pool.expired == (1 if isinstance(exc, asyncpg.InternalClientError) else 0)


async def test_an_error_in_the_query_itself_is_not_transient() -> None:
    with pytest.raises(asyncpg.exceptions.UndefinedTableError):
        await PostgresEventStore(RaisingPool(asyncpg.exceptions.UndefinedTableError("no inputs"))).last_seq(
            "p"
        )
