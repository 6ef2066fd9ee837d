"""Multi-instance attempts (``InstanceCount > 1``): the instances' names, ranks and rendezvous
variables, and :class:`GroupHandle`, one handle over the instances a node runs (I6).

Instances are named as SageMaker names them, ``algo-1`` ... ``algo-N``; instance ``k`` has rank
``k - 1``. The attempt succeeds when every instance exits 0; the first instance that fails stops the
others and its reason, prefixed with its host name, becomes the attempt's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gpuquota.node_agent.runtime import AttemptHandle, LaunchSpec, Outcome, Trace

#: torchrun's default rendezvous port; containers each have their own network namespace
CONTAINER_MASTER_PORT = 29500
#: seconds a failed instance's peers get between SIGTERM and SIGKILL
PEER_STOP_GRACE = 10.0


@dataclass(frozen=True)
class Instance:
    rank: int
    host: str
    gpus: tuple[int, ...]


def host_name(rank: int) -> str:
    return f"algo-{rank + 1}"


def total_instances(spec: LaunchSpec) -> int:
    return max(spec.request.instance_count, spec.instances_here)


def local_instances(spec: LaunchSpec) -> list[Instance]:
    """The instances this node runs: one per slot of the attempt (ranks from 0)."""
    if spec.instance_gpus:
        return [Instance(i, host_name(i), gpus) for i, gpus in enumerate(spec.instance_gpus)]
    visible = spec.env.get("CUDA_VISIBLE_DEVICES", "")
    return [Instance(0, host_name(0), tuple(int(g) for g in visible.split(",") if g.strip()))]


def instance_env(spec: LaunchSpec, instance: Instance, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables that differ between instances, and the rendezvous of a multi-instance job."""
    total = total_instances(spec)
    env = {
        "SM_HOSTS": json.dumps([host_name(r) for r in range(total)]),
        "SM_CURRENT_HOST": instance.host,
        "SM_NUM_GPUS": str(len(instance.gpus)),
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in instance.gpus),
    }
    if total > 1:
        env |= {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(total),
            "NODE_RANK": str(instance.rank),
        }
    return env


def free_port() -> int:
    """A TCP port nobody listens on now (the ``process`` runtime's instances share the host's ports)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def failed(outcome: Outcome) -> bool:
    return outcome.exit_code != 0 or outcome.signal is not None


def explain(outcome: Outcome) -> str:
    """A readable reason for a failed instance."""
    if outcome.reason:
        return outcome.reason
    if outcome.signal is not None:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(outcome.signal).name}"
        return f"killed by signal {outcome.signal}"
    if outcome.exit_code is not None:
        return f"exited with code {outcome.exit_code}"
    return "exit status unknown"


class GroupHandle:
    """The instances of one attempt on this node, seen as one :class:`AttemptHandle`."""

    def __init__(
        self,
        members: Sequence[AttemptHandle],
        hosts: Sequence[str],
        cleanup: Callable[[], Awaitable[None]] | None = None,
        peer_grace: float = PEER_STOP_GRACE,
    ) -> None:
        self.members = list(members)
        self.hosts = list(hosts)
        self.pid = self.members[0].pid
        self.pgid = self.members[0].pgid
        self.start_time = self.members[0].start_time
        self._cleanup = cleanup
        self._peer_grace = peer_grace

    @property
    def member_records(self) -> list[tuple[int | None, int | None]]:
        """(pid, start time) per instance: what ``state.json`` keeps for a restarted agent."""
        return [(m.pid, m.start_time) for m in self.members]

    async def wait(self) -> Outcome:
        waits = {asyncio.ensure_future(m.wait()): i for i, m in enumerate(self.members)}
        first: tuple[int, Outcome] | None = None
        stops: list[asyncio.Task[None]] = []
        try:
            pending = set(waits)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    outcome = task.result()
                    if first is None and failed(outcome):
                        first = (waits[task], outcome)
                        stops = [self._stop_peer(waits[t]) for t in pending]
            if stops:
                await asyncio.gather(*stops)
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)  # their clean-up is done when we return
        if first is None:
            return Outcome(exit_code=0)
        index, outcome = first
        reason = f"Instance {self.hosts[index]} (rank {index}) failed: {explain(outcome)}"
        return Outcome(exit_code=outcome.exit_code, signal=outcome.signal, reason=reason)

    def _stop_peer(self, index: int) -> asyncio.Task[None]:
        return asyncio.create_task(self.members[index].stop(self._peer_grace, lambda what: None))

    async def stop(self, grace: float, trace: Trace) -> None:
        await asyncio.gather(*(m.stop(grace, trace) for m in self.members))
        await self._done()

    async def reap(self) -> None:
        await asyncio.gather(*(m.reap() for m in self.members))
        await self._done()

    async def _done(self) -> None:
        if self._cleanup is not None:
            await self._cleanup()
