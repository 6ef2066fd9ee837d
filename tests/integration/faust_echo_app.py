"""A one-agent faust app for tests/integration/test_faust_agent.py (run as a worker subprocess).

Consumes ECHO_IN and produces the upper-cased value of each record to ECHO_OUT. Configured only
through environment variables so every test run gets its own app id and topics.
"""

from __future__ import annotations

import os

import faust

BROKERS = [f"kafka://{server.strip()}" for server in os.environ["ECHO_BOOTSTRAP"].split(",")]

app = faust.App(
    os.environ["ECHO_APP_ID"],
    broker=BROKERS,
    store="memory://",
    datadir=os.environ["ECHO_DATADIR"],
    web_enabled=False,
    topic_partitions=1,
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=0.5,
)
source = app.topic(os.environ["ECHO_IN"], key_type=bytes, value_type=bytes, value_serializer="raw")
sink = app.topic(os.environ["ECHO_OUT"], key_type=bytes, value_type=bytes, value_serializer="raw")


@app.agent(source)
async def echo(stream: faust.StreamT[bytes]) -> None:
    async for value in stream:
        await sink.send(value=value.upper())


if __name__ == "__main__":
    app.main()
