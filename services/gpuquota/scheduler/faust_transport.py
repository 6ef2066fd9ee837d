"""How the scheduler's faust app reads its inputs: prompt fetches, whole fetches handed over, batches.

faust delivers records one at a time through layers of per-record work meant for many agents, codecs
and sensors; the scheduler has one agent that reads raw bytes. These are the pieces of faust it
replaces (as faust 0.15.3 does them, minus what the scheduler does not use), each measured with
py-spy on the scheduler at 1,000-2,000 jobs/s:

* ``_PromptConsumerThread``: the broker holds a fetch at most ``fetch_max_wait_ms`` (faust: 1.5 s);
* ``_PromptConsumer._drain_messages``: one wait per fetch, not per record; and the records of a topic
  with an ``Inbox`` are handed over a partition's fetch at a time, as ``SourceRecord``s, without
  faust's per-record message, event, channel put, stream step and ack (getmany-style);
* ``Inbox.batches``: the agent takes what arrived while it handled the previous batch, in one go;
  ``Inbox.ack`` acks a batch's offsets together;

faust's public API cannot do these: it hard-codes the 1.5 s fetch wait (``AIOKafkaConsumerThread.
_create_worker_consumer``) and offers batches only over its per-record delivery (``Stream.
take_events``). Measured against that (the prompt consumer thread kept, faust's own delivery,
``take_events(batch_max, within=batch_linger)`` and ``faust.Schema`` with the raw serializers), in
alternating runs of ``benchmarks.pipeline --rate 800 --seconds 30`` on a loaded host (calibration
92-284 ms), 2026-12-03, two pairs: the scheduler's CPU 0.755-0.816 -> 0.294-0.298 ms per job, 236-282 ->
457-619 jobs/s.
"""

# measured: scheduler CPU 0.79 -> 0.30 ms/job on benchmarks.pipeline, take_events -> Inbox (2026-12-03)

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import faust
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

from gpuquota.scheduler.records import SourceRecord


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
        """faust's loop that hands fetched records over (``Consumer._drain_messages`` with its
        ``getmany``), a fetch at a time.

        One race against "flow suspended" covers a whole fetch (faust: four tasks and an
        ``asyncio.wait`` per record). A rebalance (flow suspended) still abandons the delivery at
        once; records not delivered are not marked read, and the rebalance seeks back to the committed
        offsets anyway. Otherwise as faust 0.15.3.
        """
        stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set
        try:
            while not (stopped() or fetcher_stopped()):
                self.diag.set_flag(faust_consumer.CONSUMER_FETCHING)
                fetched, active = await self._wait_next_records(1.0)
                await self.sleep(0)  # as faust: a loop of empty fetches must not hold the loop
                if self._commit_every is not None and self._n_acked >= self._commit_every:
                    self._n_acked = 0
                    await self.commit()
                if self.should_stop:
                    pass
                elif not self.flow_active:
                    await self._seek_back()  # as faust's getmany: the flow stopped during the fetch
                elif fetched:
                    await self.wait_first(self._deliver(fetched, active), self.suspend_flow.wait())
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

    async def _seek_back(self) -> None:
        """As faust's ``getmany`` when the flow stopped during a fetch: back to the committed offsets."""
        try:
            await self.perform_seek()
        except Exception as exc:
            self.log.warning(f"exception performing seek when flow not active {exc}")

    async def _deliver(self, fetched: Mapping[TP, list[Any]], active: set[TP] | None) -> None:
        app = self.app
        generation = app.consumer_generation_id
        inboxes = cast(SchedulerApp, app).inboxes
        for tp, records in fetched.items():
            if not self.flow_active or app.consumer_generation_id != generation:
                return  # a rebalance began: what is left is fetched again after it
            if active is not None and tp not in active and tp not in self._buffered_partitions:
                continue
            app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            inbox = inboxes.get(tp.topic)
            if inbox is None:
                await self._deliver_each(tp, records, generation)
            else:
                await self._deliver_bulk(inbox, tp, records, generation)

    async def _unread(self, tp: TP, records: list[Any]) -> AsyncIterator[Any]:
        """The records not read yet (as faust: at or after the last offset read), noting faust's gaps
        (offsets skipped by compaction or transaction markers count as acked for commits)."""
        last = self._read_offset[tp]
        gaps = self.app.topics.acks_enabled_for(tp.topic)
        for record in records:
            offset = record.offset
            if last is None or offset >= last:
                if last and offset - last > 1 and gaps:
                    await self._add_gap(tp, last + 1, offset)
                yield record
                last = offset

    async def _deliver_bulk(self, inbox: Inbox, tp: TP, records: list[Any], generation: int) -> None:
        taken = [
            SourceRecord(r.topic, r.partition, r.offset, r.key, r.value or b"")
            async for r in self._unread(tp, records)
        ]
        if taken:
            await inbox.put(_Chunk(generation, taken))
            self._read_offset[tp] = taken[-1].offset

    async def _deliver_each(self, tp: TP, records: list[Any], generation: int) -> None:
        """faust's delivery, a record at a time, for a topic without an inbox (none in the scheduler)."""
        count = 0
        async for record in self._unread(tp, records):
            if not self.flow_active or self.app.consumer_generation_id != generation:
                return
            count += 1
            if count % 100 == 0:
                await asyncio.sleep(0)  # as faust: let other tasks run during a long fetch
            await self.callback(self._to_message(tp, record))
            self._read_offset[tp] = record.offset

    def ack_offsets(self, tp: TP, offsets: Iterable[int]) -> None:
        """``Consumer.ack`` for records handed over without a faust message (an ``Inbox``'s): their
        offsets may be committed (faust commits every ``broker_commit_interval``)."""
        if not self.app.topics.acks_enabled_for(tp.topic):
            return
        with ack_lock:
            committed = self._committed_offset[tp]
            index = self._acked_index[tp]
            new = [o for o in offsets if (committed is None or o >= committed) and o not in index]
            index.update(new)
            self._acked[tp].extend(new)
            self._n_acked += len(new)
        notify(self._waiting_for_ack)


@dataclass(slots=True)
class _Chunk:
    generation: int
    """The consumer generation it was fetched in: a chunk of an older one is not handed out."""
    records: list[SourceRecord]


class Inbox:
    """The fetched records of one topic, waiting for its one agent: handed over a fetch at a time.

    faust hands records over one at a time (per record a message, an event, a channel put, a stream
    step and an ack: with the consumer's per-record work, about a fifth of the scheduler's CPU at
    2,000 jobs/s). The scheduler's agent takes its topic's records getmany-style instead: the consumer
    puts each fetched partition's unread records here in one piece (``_PromptConsumer``); the agent
    takes batches (``batches``) and acks their offsets together once handled (``ack``). At most
    ``most_waiting`` records wait: beyond that the consumer stops handing over (and so fetching) until
    the agent takes some.
    """

    def __init__(self, app: SchedulerApp, topic: str, most_waiting: int) -> None:
        self.app, self.topic, self.most_waiting = app, topic, most_waiting
        self._chunks: deque[_Chunk] = deque()
        self._waiting = 0
        self._arrived = asyncio.Event()
        self._taken = asyncio.Event()

    async def put(self, chunk: _Chunk) -> None:
        while self._waiting >= self.most_waiting:
            self._taken.clear()
            await self._taken.wait()  # backpressure: until the agent takes a batch
        self._chunks.append(chunk)
        self._waiting += len(chunk.records)
        self._arrived.set()

    async def batches(self, most: int, linger: float = 0.0) -> AsyncIterator[list[SourceRecord]]:
        """The records in batches of up to ``most``: what arrived while the previous batch was handled.

        Under load batches grow (group commit). Until ``linger`` seconds after the previous batch was
        handed out, a batch that is not full waits for more (a short pause in which only reading runs
        makes batches much larger on a busy machine); a record that arrives later is handed out at once.
        """
        handed_out = time.monotonic()
        while True:
            batch = self._take(most)
            if not batch:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if len(batch) < most and (left := handed_out + linger - time.monotonic()) > 0:
                await asyncio.sleep(left)  # linger: let more records arrive
                batch += self._take(most - len(batch))
            yield batch
            handed_out = time.monotonic()

    def ack(self, batch: Sequence[SourceRecord]) -> None:
        """Mark ``batch`` handled: its offsets may be committed."""
        consumer = cast(_PromptConsumer, self.app.consumer)
        offsets: dict[int, list[int]] = {}
        for record in batch:
            offsets.setdefault(record.partition, []).append(record.offset)
        for partition, handled in offsets.items():
            consumer.ack_offsets(TP(self.topic, partition), handled)

    def _take(self, most: int) -> list[SourceRecord]:
        """Up to ``most`` records waiting, in fetch order, without waiting. Chunks of an older consumer
        generation (or while flow control is off, during a rebalance) are dropped, neither handled nor
        acked, as faust's stream skips such records: the rebalance seeks back to the committed offsets."""
        app, chunks = self.app, self._chunks
        taken: list[SourceRecord] = []
        while chunks and len(taken) < most:
            chunk = chunks[0]
            if not app.flow_control.is_active() or chunk.generation != app.consumer_generation_id:
                chunks.popleft()
                self._waiting -= len(chunk.records)
                continue
            room = most - len(taken)
            if len(chunk.records) <= room:
                chunks.popleft()
                taken += chunk.records
            else:
                taken += chunk.records[:room]
                del chunk.records[:room]
        self._waiting -= len(taken)
        if self._waiting < self.most_waiting:
            self._taken.set()
        return taken


class SchedulerApp(faust.App):
    """The scheduler's faust app: its consumer's fetches wait at most ``fetch_max_wait_ms`` for
    ``fetch_min_bytes``, and hand the records of a topic with an ``Inbox`` over a fetch at a time."""

    fetch_max_wait_ms: int | None = None
    fetch_min_bytes: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inboxes: dict[str, Inbox] = {}

    def inbox(self, stream: faust.StreamT[Any], most_waiting: int) -> Inbox:
        """Subscribe ``stream``'s topic (as iterating the stream would) and have its records handed to
        the returned ``Inbox`` instead of the stream."""
        channel = cast(faust.TopicT, aiter(stream.channel))  # faust subscribes an iterated topic
        (topic,) = channel.topics
        inbox = self.inboxes[topic] = Inbox(self, topic, most_waiting)
        return inbox

    def _new_transport(self) -> Any:
        transport = super()._new_transport()
        setattr(transport, "Consumer", _PromptConsumer)  # noqa: B010 (a ClassVar, set on this one)
        return transport
