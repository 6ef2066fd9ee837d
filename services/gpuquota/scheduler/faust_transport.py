"""How the scheduler's faust app reads its inputs: prompt fetches, one race per fetch, batches.

faust delivers records one at a time through layers of per-record work meant for many agents, codecs
and sensors; the scheduler has one agent that reads raw bytes. These are the pieces of faust it
replaces (as faust 0.15.3 does them, minus what the scheduler does not use), each measured with
py-spy on the scheduler at 1,000-2,000 jobs/s:

* ``_PromptConsumerThread``: the broker holds a fetch at most ``fetch_max_wait_ms`` (faust: 1.5 s);
* ``_PromptConsumer._drain_messages``: one wait per fetch, not per record;
* ``SchedulerApp.create_event`` and ``RawSchema``: a record's event without faust's settings and codec
  registries (``conf.Event`` is a settings look-up per record, and the ``raw`` codec a registry
  look-up per key and value: together about 6 % of the scheduler's CPU at 2,000 jobs/s);
* ``batches``: the agent takes what arrived while it handled the previous batch, in one go.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, MutableMapping
from typing import Any, cast

import faust
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT, EventT
from faust.types.tuples import Message


class _PromptConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, with the broker's wait for more data taken from ``SchedulerApp``.

    faust asks the broker to hold a fetch up to 1.5 s (hard-coded). While a partition's records are
    being handled, the consumer's next fetch leaves that partition out and parks on the idle ones;
    the busy partition is fetched again only when that fetch returns. So under load each batch of a
    busy partition waited up to 1.5 s for the next (the pipeline saturated at ~150 jobs/s while the
    scheduler was mostly idle).
    """

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        wait = getattr(self.app, "fetch_max_wait_ms", None)
        if wait is not None:
            consumer._fetch_max_wait_ms = wait  # aiokafka hands it to its fetcher at start
        least = getattr(self.app, "fetch_min_bytes", None)
        if least is not None:
            consumer._fetch_min_bytes = least
        return consumer


class _PromptConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _PromptConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:
        """faust's loop that hands fetched records to the streams, with one wait per fetch, not per record.

        faust races each record's delivery against "flow suspended" (``wait_first``: four tasks and an
        ``asyncio.wait`` per record, the largest part of faust's per-record cost in the scheduler's
        profile). Here one such race covers all the records of a fetch: a rebalance (flow suspended)
        still abandons the delivery at once; records not delivered are not marked read, and the
        rebalance seeks back to the committed offsets anyway. Otherwise as faust 0.15.3.
        """
        stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set
        read_offset: MutableMapping[TP, int | None] = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for

        async def deliver(fetched: list[tuple[TP, Any]]) -> None:
            for count, (tp, message) in enumerate(fetched, 1):
                if not self.flow_active or message.generation_id != self.app.consumer_generation_id:
                    return  # a rebalance began: what is left is fetched again after it
                if count % 100 == 0:
                    await asyncio.sleep(0)  # as faust: let other tasks run during a long fetch
                offset, last = message.offset, read_offset[tp]
                if last is None or offset >= last:
                    if last and offset - last > 1 and acks_enabled_for(message.topic):
                        await self._add_gap(tp, last + 1, offset)
                    await self.callback(message)
                    read_offset[tp] = offset

        try:
            while not (stopped() or fetcher_stopped()):
                self.diag.set_flag(faust_consumer.CONSUMER_FETCHING)
                fetched = [pair async for pair in self.getmany(timeout=1.0)]
                await self.sleep(0)  # as faust: a loop of empty fetches must not hold the loop
                if self._commit_every is not None and self._n_acked >= self._commit_every:
                    self._n_acked = 0
                    await self.commit()
                if fetched and not self.should_stop:
                    await self.wait_first(deliver(fetched), self.suspend_flow.wait())
                self.diag.unset_flag(faust_consumer.CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if not self.transport.app.should_stop:
                raise
            self.log.info("Broker stopped consumer, shutting down...")
        except asyncio.CancelledError:
            if not self.transport.app.should_stop:
                raise
            self.log.info("Consumer shutting down for user cancel.")
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(faust_consumer.CONSUMER_FETCHING)


class SchedulerApp(faust.App):
    """The scheduler's faust app: its consumer's fetches wait at most ``fetch_max_wait_ms`` for
    ``fetch_min_bytes``."""

    fetch_max_wait_ms: int | None = None
    fetch_min_bytes: int | None = None
    _make_event: Callable[..., EventT[Any]] | None = None

    def create_event(self, key: Any, value: Any, headers: Any, message: Message) -> EventT[Any]:
        """faust's, with the event class looked up once (``conf`` is a settings registry)."""
        make = self._make_event
        if make is None:
            make = self._make_event = cast(Callable[..., EventT[Any]], self.conf.Event)
        return make(self, key, value, headers, message)

    def _new_transport(self) -> Any:
        transport = super()._new_transport()
        setattr(transport, "Consumer", _PromptConsumer)  # noqa: B010 (a ClassVar, set on this one)
        return transport


async def batches(
    stream: faust.StreamT[bytes], most: int, linger: float = 0.0
) -> AsyncGenerator[list[EventT[bytes]], None]:
    """The stream's events in batches of up to ``most``: what arrived while the previous one was handled.

    Records wait in the stream's channel (faust's buffer) while a batch is handled; each batch takes
    what is there (group commit), so under load batches grow. Until ``linger`` seconds after the
    previous batch was handed out, a batch that is not full waits for more (a short pause in which
    only reading runs makes batches much larger on a busy machine); a record that arrives later is
    handed out at once. Only the first record of a batch is read through the stream when the channel
    is empty (waiting for it); the rest are taken from the channel in one go (``_take_buffered``):
    the stream's iterator costs a pass of the event loop per record. (``Stream.take_events``
    instead stops reading while a batch is handled, and always waits its ``within``.)
    """
    stream_events = cast(AsyncGenerator[EventT[bytes], None], stream.events())
    async with contextlib.aclosing(stream_events) as events:
        handed_out = time.monotonic()
        while True:
            batch = _take_buffered(stream, most)
            if not batch:
                try:
                    batch = [await anext(events)]  # the stream raises a channel error, or ends
                except StopAsyncIteration:
                    return
                batch += _take_buffered(stream, most - 1)
            if len(batch) < most and (left := handed_out + linger - time.monotonic()) > 0:
                await asyncio.sleep(left)  # linger: let more records arrive
                batch += _take_buffered(stream, most - len(batch))
            yield batch
            handed_out = time.monotonic()


def _take_buffered(stream: faust.StreamT[bytes], most: int) -> list[EventT[bytes]]:
    """Up to ``most`` events waiting in the stream's channel, without waiting, as the stream would.

    What faust's stream iterator does per event, in bulk: records of an older consumer generation (or
    while flow control is off, during a rebalance) are acked and skipped, and the rest are tracked as
    pending acks. Stops at a channel error: the stream's iterator raises it with the next record.
    """
    app, queue = stream.app, cast(Any, stream.channel).queue
    consumer = app.consumer
    acking_topics = app.topics.acking_topics
    taken: list[EventT[bytes]] = []
    while len(taken) < most and not queue.empty() and not queue._errors:
        event: EventT[bytes] = queue.get_nowait()
        message = event.message
        if not app.flow_control.is_active() or message.generation_id != app.consumer_generation_id:
            if event.ack():  # as the stream does: not handled here; a rebalance seeks back
                app.sensors.on_message_out(message.tp, message.offset, message)
            continue
        if message.topic in acking_topics and not message.tracked:
            message.tracked = True
            consumer.track_message(message)
        taken.append(event)
    return taken


class RawSchema(faust.Schema[bytes, bytes]):
    """A topic's keys and values as the bytes (or None) the record holds: the ``raw`` codec, without
    looking it up in faust's codec registry for every key and value."""

    def loads_key(self, app: AppT, message: Message, *, loads: Any = None, serializer: Any = None) -> Any:
        return message.key

    def loads_value(self, app: AppT, message: Message, *, loads: Any = None, serializer: Any = None) -> Any:
        return message.value
