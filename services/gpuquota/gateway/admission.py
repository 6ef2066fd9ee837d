"""Admission control: new submissions are refused while the pool's undecided backlog is over a bound.

Theory of operation
-------------------
The *undecided backlog* of a gateway is the inputs it has handed to the scheduler (acknowledged by the
broker in distributed mode, queued in the shell in embedded mode) whose decision it has not seen yet.
Its *size* is how many they are and its *age* how long the oldest has waited. Offered more than it can
decide, a scheduler that absorbs everything only grows the backlog: every input waits longer, clients
time out and retry, and more offered load gives less work done. So while the size exceeds
``max_backlog`` or the age exceeds ``max_seconds``, a ``SubmitJob`` is *refused*: HTTP 429
``TooManyRequestsException`` with ``Retry-After``, before anything is recorded, and boto3 retries it
with back-off (a throttling error in each of its retry modes). The gateway asks before it reads the
request's body (``Gateway._operation``): a refusal costs no parsing and no validation, so refused
clients retrying do not take the CPU the scheduler needs. ``Retry-After`` is spread at random over
twice the time the backlog needs to come back under its bound, so the clients refused together do not
come back together.

The bounds trade latency for throughput. The count bound must hold more than one of the scheduler's
batches (its ``batch_max``, 500 inputs) or it decides in batches smaller than it could, paying a
transaction for fewer inputs. The age bound must stay short against the time a slot takes to turn
over: a node's report, which frees a slot, waits in the pool's partition behind every input admitted
before it, so a backlog ``A`` seconds long keeps every slot busy ``A`` seconds longer per job, and a
pool of ``S`` slots then dispatches at most ``S / A`` jobs a second. ``max_seconds`` (1 s) keeps a
pool of 256 slots of instantly finishing jobs dispatching 256 jobs/s at least; a pool whose jobs run for
minutes does not feel it.

Only submissions are refused: terminating, cancelling and changing resources are what an operator does
to get out of an overload, and they add no work.

Each gateway counts its own inputs: the size bound holds per gateway, the age bound is the same for all
of them (the scheduler's lag is what each one sees).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuquota.config.settings import ADMISSION_DEFAULTS, AdmissionSettings
from gpuquota.gateway.errors import TooManyRequests
from gpuquota.wire import inputs as inp
from gpuquota.wire.inputs import SchedulerInput

log = logging.getLogger(__name__)

MAX_RETRY_AFTER = 30
"""The longest ``Retry-After`` (seconds): a client told to wait longer may as well give up."""
FORGET_AFTER = 600.0
"""Seconds after which an input never seen decided stops counting (a lost waiter, not a backlog)."""


@dataclass
class Admission:
    """The bounds of one gateway's undecided backlog, and the inputs in it."""

    max_backlog: int = ADMISSION_DEFAULTS.admission_max_backlog
    """Most inputs undecided at once before submissions are refused (0: no bound)."""
    max_seconds: float = ADMISSION_DEFAULTS.admission_max_seconds
    """Longest wait of the oldest undecided input before submissions are refused (0: no bound)."""
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    """Spreads ``Retry-After`` (a seeded one in tests)."""
    refused: int = 0
    """Submissions refused so far."""
    _undecided: dict[str, float] = field(default_factory=dict)
    """Input id -> when it was handed over, oldest first."""
    _refusing: bool = False

    @classmethod
    def of(cls, settings: AdmissionSettings) -> Admission:
        """The bounds ``settings`` gives (``GPUQUOTA_ADMISSION_*``)."""
        return cls(settings.admission_max_backlog, settings.admission_max_seconds)

    def admit(self, message: SchedulerInput) -> None:
        """Refuse ``message`` (``TooManyRequests``) if it is a submission and the backlog is over a bound."""
        if isinstance(message, inp.SubmitJob):
            self.check()

    def check(self) -> None:
        """Refuse a submission (``TooManyRequests``) while the backlog is over a bound."""
        over = self.over_bound()
        if over is None:
            if self._refusing:
                log.warning("admission: accepting submissions again (%d refused so far)", self.refused)
            self._refusing = False
            return
        if not self._refusing:
            log.warning("admission: refusing submissions: %s", over)
        self._refusing = True
        self.refused += 1
        raise TooManyRequests(f"The scheduler is behind ({over}); retry after a back-off", self.retry_after())

    def handed(self, input_id: str) -> None:
        """``input_id`` is on its way to the scheduler: it counts until ``decided``."""
        self._undecided[input_id] = self.clock()

    def decided(self, input_id: str) -> None:
        self._undecided.pop(input_id, None)

    @property
    def backlog(self) -> int:
        return len(self._undecided)

    def age(self) -> float:
        """How long the oldest undecided input has waited (0 with none)."""
        self._forget_lost()
        oldest = next(iter(self._undecided.values()), None)
        return 0.0 if oldest is None else self.clock() - oldest

    def over_bound(self) -> str | None:
        """Which bound the backlog exceeds, in words, or None."""
        age = self.age()
        if self.max_backlog and self.backlog >= self.max_backlog:
            return f"{self.backlog} inputs undecided, at most {self.max_backlog}"
        if self.max_seconds and age > self.max_seconds:
            return f"the oldest undecided input has waited {age:.1f} s, at most {self.max_seconds:g}"
        return None

    def retry_after(self) -> int:
        """Whole seconds a client should wait: at random from how far the age is over its bound (at
        least 1 s) to twice that, so that the clients refused together spread their retries."""
        over = self.age() - self.max_seconds if self.max_seconds else 0.0
        least = max(1, min(MAX_RETRY_AFTER // 2, math.ceil(over)))
        return least + self.rng.randint(0, least)

    def _forget_lost(self) -> None:
        """Drop inputs older than ``FORGET_AFTER``: a decision that never came must not refuse forever."""
        now = self.clock()
        while self._undecided:
            input_id, since = next(iter(self._undecided.items()))
            if now - since <= FORGET_AFTER:
                return
            log.warning("admission: input %s undecided after %.0f s: not counted", input_id, now - since)
            del self._undecided[input_id]
