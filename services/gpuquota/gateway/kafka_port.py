"""The gateway in distributed mode: writes go to Kafka, reads come from the scheduler's log.

Design
------
The read model must see *every* decided event, not only the job events of ``gpuquota.job-state``:
resource changes (``QuotaShareChanged``...), priority changes and rejections feed the AWS views too.
The complete, ordered, durable record of them is the scheduler's own log in PostgreSQL. So the
gateway's ``LogProjector`` (``gateway.log_tail``) tails the pool's log and folds each record's events
into the ``ReadModel`` (and the core's ``ClusterState``, for ``gpuquota explain``), exactly as the
embedded shell does, rebuilding both when the log does not continue what it folded. No second
projection, no extra topic.

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

from gpuquota.adapters.kafka import BrokerUnavailable, InputProducer
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.errors import ServiceUnavailable
from gpuquota.gateway.log_tail import LogProjector
from gpuquota.gateway.ports import raise_if_rejected
from gpuquota.wire.inputs import SchedulerInput

log = logging.getLogger(__name__)


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
