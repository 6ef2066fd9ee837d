"""The gateway in distributed mode: writes go to Kafka, reads come from the scheduler's log.

Design
------
The read model must see *every* decided event, not only the job events of ``gpuquota.job-state``:
resource changes (``QuotaShareChanged``...), priority changes and rejections feed the AWS views too.
The complete, ordered, durable record of them is the scheduler's own log in PostgreSQL. So the
gateway's ``LogProjector`` tails the pool's log (``EventStore.read(pool, after_seq)``, polled every
``poll_seconds``) and folds each record's events into the ``ReadModel``, exactly as the embedded
shell does. The log's sequence has no gaps and is committed in order (one writer per pool, each
append requires the previous sequence), so tailing by sequence never skips a record; a restarted
gateway folds the log from the start. No second projection, no extra topic. The projector also
folds the core's ``ClusterState`` from the same events, for ``gpuquota explain``.

``KafkaCommandPort.send`` produces the input to ``gpuquota.scheduler.inputs`` keyed by the pool and
waits (at most ``decision_timeout`` seconds) until the projector has folded the record of that input:
a rejection by the core (its ``InputRejected``) becomes ``CommandRejected``, as in embedded mode, and
a Describe right after the write sees the decision. If the scheduler is slow or down the write is
still accepted (the input is durable in Kafka) and is decided later. A broker that does not
acknowledge within ``produce_timeout`` makes the write a 503 (never a hang, never a success for an
input that is not in Kafka); a backlog over its bound makes a submission a 429 (``gateway.admission``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import KW_ONLY, dataclass, field

from gpuquota.adapters.event_store import EventStore, Record, TransientStoreError
from gpuquota.adapters.kafka import BrokerUnavailable, InputProducer
from gpuquota.adapters.log_fold import fold_log
from gpuquota.core import ClusterState
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.errors import ServiceUnavailable
from gpuquota.gateway.ports import raise_if_rejected
from gpuquota.readmodel import ReadModel
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput

log = logging.getLogger(__name__)

Decision = tuple[SchedulerEvent, ...]


class LogProjector:
    """Folds a pool's log from the event store into a ``ReadModel``."""

    def __init__(
        self, store: EventStore, read_model: ReadModel, pool: str, *, poll_seconds: float = 0.02
    ) -> None:
        self.store = store
        self.read_model = read_model
        self.pool = pool
        self.poll_seconds = poll_seconds
        self.seq = 0
        self.state = ClusterState()
        """The core's state, folded from the same log, for ``explain``."""
        self._waiters: dict[str, asyncio.Future[Decision]] = {}

    def expect(self, input_id: str) -> asyncio.Future[Decision]:
        """A future for the events of input ``input_id``, resolved when its record is folded."""
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waiters[input_id] = future
        return future

    def forget(self, input_id: str) -> None:
        future = self._waiters.pop(input_id, None)
        if future is not None and not future.done():
            future.cancel()

    async def catch_up(self) -> int:
        """Fold every record after the last one folded; return how many."""
        _, folded = await fold_log(self.store, self.pool, self.state, self.seq, after=self._folded, page=1000)
        return folded

    def _folded(self, record: Record) -> None:
        """Project a folded record and answer its waiter; the position moves record by record."""
        for event in record.events:
            try:
                self.read_model.apply(event)
            except Exception:  # a projection bug must not stop the gateway
                log.exception("read model could not apply %s %s", event.type, event.event_id)
        self.seq = record.seq
        waiter = self._waiters.pop(record.input.event_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(record.events)

    async def run(self) -> None:
        """Keep folding until cancelled; an unreachable store only delays the read model."""
        failing = False
        while True:
            try:
                await self.catch_up()
                failing = False
            except TransientStoreError as exc:
                if not failing:
                    log.warning("read model: store unavailable (%s); retrying", exc)
                failing = True
            await asyncio.sleep(self.poll_seconds)  # the polling interval of the tail


@dataclass
class KafkaCommandPort:
    """``CommandPort`` that produces inputs to Kafka and reports the core's decision when it comes.

    A submission is first admitted (``gateway.admission``: 429 while the backlog is over its bound).
    The broker must acknowledge the input within ``produce_timeout`` seconds, or the request is a 503
    ``ServiceUnavailable`` that says why and what became of it (``unavailable``). An acknowledged input
    counts in the backlog until the projector folds its record, however long after the request.
    """

    producer: InputProducer
    pool: str
    projector: LogProjector
    _: KW_ONLY
    decision_timeout: float = 5.0
    produce_timeout: float = 5.0
    admission: Admission = field(default_factory=Admission)

    async def send(self, message: SchedulerInput) -> None:
        self.admission.admit(message)
        decided = self.projector.expect(message.event_id)
        try:
            await self.producer.send_within(self.pool, message, self.produce_timeout)
        except BrokerUnavailable as exc:
            self.projector.forget(message.event_id)
            raise unavailable(message, exc) from None
        except BaseException:
            self.projector.forget(message.event_id)
            raise
        self.admission.handed(message.event_id)
        decided.add_done_callback(lambda _: self.admission.decided(message.event_id))
        try:  # the waiter stays until the record is folded: that ends the input's place in the backlog
            events = await asyncio.wait_for(asyncio.shield(decided), self.decision_timeout)
        except TimeoutError:
            log.info(
                "%s %s: not decided within %.1f s", message.type, message.event_id, self.decision_timeout
            )
            return
        raise_if_rejected(message, events)


MAY_BE_RECORDED = (
    "It may still be recorded once the broker is back: a SubmitServiceJob retried with the same "
    "clientToken names the same job, never a second one (boto3 sends one and retries a 503 with it)."
)
NOT_SENT = "Nothing was sent; retry once the broker is back (GET /health/ready)."


def unavailable(message: SchedulerInput, exc: BrokerUnavailable) -> ServiceUnavailable:
    """The 503 of an input the broker did not take: why, and whether it may still be decided."""
    log.warning("%s %s: Kafka unavailable: %s", message.type, message.event_id, exc)
    fate = MAY_BE_RECORDED if exc.sent else NOT_SENT
    return ServiceUnavailable(f"The event interface (Kafka) is unavailable: {exc}. {fate}")


async def cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
