"""The scheduling policy: the timing defaults the core decides with, written once.

Theory of operation
-------------------
Time enters the core in three ways: agents' heartbeats (a node silent for ``missed_heartbeats``
periods is lost, S5.7), the scheduler's ``Tick`` (timeouts and time limits fire at the next tick) and
the grace a stopped attempt has between SIGTERM and SIGKILL (interface: preemption and termination).
The settings, the embedded and distributed stacks and the node agent take their defaults from one
``SchedulingPolicy()``, so an agent's heartbeat period and the scheduler's node-lost timeout cannot
drift apart.

Not to be confused with the AWS Batch scheduling policy resource (``wire.base.SchedulingPolicySpec``),
which is configuration that users create through the API.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulingPolicy:
    heartbeat_seconds: float = 5.0
    """A node agent's heartbeat period (``GPUQUOTA_HEARTBEAT_SECONDS``)."""
    missed_heartbeats: int = 6
    """Heartbeat periods without a recorded heartbeat before the scheduler declares a node lost."""
    tick_seconds: float = 1.0
    """The period of the scheduler's ``Tick``: how late a timeout or time limit may fire."""
    preemption_grace_seconds: float = 30.0
    """Seconds from SIGTERM to SIGKILL of a stopped attempt (``GPUQUOTA_PREEMPTION_GRACE``)."""

    @property
    def heartbeat_timeout_ms(self) -> int:
        """How long a node may stay silent before it is lost (``ClusterState.heartbeat_timeout_ms``)."""
        return int(self.heartbeat_seconds * (self.missed_heartbeats * 1000))


DEFAULT_POLICY = SchedulingPolicy()
"""The defaults that settings, stacks and node agents start from."""
