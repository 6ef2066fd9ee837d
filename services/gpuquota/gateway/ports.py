"""How the gateway sends writes to the scheduler: the ``CommandPort``.

Embedded mode calls the in-process shell and reports the core's rejection of the input (its
``InputRejected`` event) as ``CommandRejected``. A Kafka port (distributed mode) will only publish,
so it cannot report rejections; the gateway's own validation must catch what it can beforehand.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpuquota.wire import events as ev
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput


class CommandRejected(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CommandPort(Protocol):
    async def send(self, message: SchedulerInput) -> None:
        """Deliver ``message`` to the scheduler; raise ``CommandRejected`` if it is known to be refused."""
        ...


class Scheduler(Protocol):
    async def handle(self, message: SchedulerInput) -> list[SchedulerEvent]:
        """Decide, record and apply ``message``; its events (the scheduler shell of this process)."""
        ...


class EmbeddedCommandPort:
    """Hands inputs straight to the shell of this process."""

    def __init__(self, shell: Scheduler) -> None:
        self.shell = shell

    async def send(self, message: SchedulerInput) -> None:
        raise_if_rejected(message, await self.shell.handle(message))


def raise_if_rejected(message: SchedulerInput, decided: Iterable[ev.SchedulerEvent]) -> None:
    """``CommandRejected`` with the core's reason if ``decided`` holds the rejection of ``message``."""
    for event in decided:
        if isinstance(event, ev.InputRejected) and event.input_event_id == message.event_id:
            raise CommandRejected(event.reason)
