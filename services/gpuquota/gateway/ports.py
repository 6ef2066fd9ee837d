"""How the gateway sends writes to the scheduler: the ``CommandPort``.

Both modes report the core's rejection of an input (its ``InputRejected`` event) as
``CommandRejected``: the embedded port calls the in-process shell and reads the decision it returns;
the Kafka port (``gpuquota.gateway.kafka_port``, distributed mode) produces the input and waits, up to
its decision timeout, for the decision in the log. A write not decided by then is still accepted.

Both ports first ask ``gateway.admission`` whether the backlog of undecided inputs has room: a
submission over its bound is a 429 ``TooManyRequestsException`` with ``Retry-After``. A write that
cannot be recorded is a 503 ``ServiceUnavailable`` that says why, never a hang: in embedded mode an
event log that refuses writes (``StoreWriteFailed``: the disk is full; nothing was recorded, and the
same request succeeds once the log takes writes again); in distributed mode a broker that does not
acknowledge within the produce timeout (``kafka_port``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpuquota.adapters.event_store import StoreWriteFailed
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.errors import ServiceUnavailable
from gpuquota.wire import events as ev
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput


class CommandRejected(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CommandPort(Protocol):
    async def send(self, message: SchedulerInput) -> None:
        """Deliver ``message`` to the scheduler; raise ``CommandRejected`` if it is known to be refused,
        a 429 or 503 ``ApiError`` if it was not taken (module docstring)."""
        ...


class Scheduler(Protocol):
    async def handle(self, message: SchedulerInput) -> list[SchedulerEvent]:
        """Decide, record and apply ``message``; its events (the scheduler shell of this process)."""
        ...


NOT_RECORDED = "Nothing was recorded; retry once the event log takes writes again (GET /health/ready)."


class EmbeddedCommandPort:
    """Hands inputs straight to the shell of this process; the inputs it waits on are the backlog that
    ``admission`` bounds (the shell queues every input it is handed)."""

    def __init__(self, shell: Scheduler, admission: Admission | None = None) -> None:
        self.shell = shell
        self.admission = admission or Admission()

    async def send(self, message: SchedulerInput) -> None:
        self.admission.admit(message)
        self.admission.handed(message.event_id)
        try:
            decided = await self.shell.handle(message)
        except StoreWriteFailed as exc:
            raise ServiceUnavailable(f"The event log cannot be written: {exc}. {NOT_RECORDED}") from None
        finally:
            self.admission.decided(message.event_id)
        raise_if_rejected(message, decided)


def raise_if_rejected(message: SchedulerInput, decided: Iterable[ev.SchedulerEvent]) -> None:
    """``CommandRejected`` with the core's reason if ``decided`` holds the rejection of ``message``."""
    for event in decided:
        if isinstance(event, ev.InputRejected) and event.input_event_id == message.event_id:
            raise CommandRejected(event.reason)
