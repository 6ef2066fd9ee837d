"""PostgreSQL TLS: ``sslmode`` (and ``sslrootcert``...) in ``GPUQUOTA_DATABASE_URL`` reach asyncpg unchanged.

asyncpg reads libpq's TLS parameters from the URL's query itself, so the settings only check
``sslmode``'s value and pass the URL on. The proof against the suite's real server: ``disable``
connects in clear, and ``require`` does what the server's ``ssl`` setting says (a server without TLS
refuses the upgrade, one with TLS accepts it) instead of being ignored.
"""

from __future__ import annotations

import asyncpg
import pytest

from gpuquota.adapters.event_store import TransientStoreError
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.config.settings import SchedulerSettings

pytestmark = pytest.mark.integration


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def settings_url(url: str) -> str:
    """The database URL as ``gpuquota scheduler`` reads it from its environment."""
    env = {"GPUQUOTA_KAFKA": "127.0.0.1:9092", "GPUQUOTA_DATABASE_URL": url}
    return SchedulerSettings.from_env(env).database_url


async def test_sslmode_in_the_url_reaches_asyncpg(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        server_tls = await conn.fetchval("SHOW ssl") == "on"
    finally:
        await conn.close()

    plain = with_query(database_url, "sslmode=disable")
    assert settings_url(plain) == plain
    store = await PostgresEventStore.connect(settings_url(plain))
    await store.close()

    required = with_query(database_url, "sslmode=require")
    assert settings_url(required) == required
    if server_tls:
        store = await PostgresEventStore.connect(settings_url(required))
        await store.close()
    else:
        with pytest.raises((TransientStoreError, ConnectionError), match="SSL"):
            await PostgresEventStore.connect(settings_url(required))
