"""Multi-instance attempts (``InstanceCount > 1``): the instances' names, ranks and rendezvous
variables, and :class:`GroupHandle`, one handle over the instances a node runs (I6).

Instances are named as SageMaker names them, ``algo-1`` ... ``algo-N``; instance ``k`` has rank
``k - 1``. The attempt succeeds when every instance exits 0; the first instance that fails stops the
others and its reason, prefixed with its host name, becomes the attempt's.

Working directory (``process`` runtime): a payload whose ``Environment`` names the directory it was
submitted from (``GPUQUOTA_SUBMIT_DIR``, set by ``gpuquota jobs submit`` as Slurm sets
``SLURM_SUBMIT_DIR``) runs there when that directory exists on the node, so ``-- python3 train.py``
finds ``train.py``; where it does not (another machine), the instance runs in its attempt directory
and the first line of its log says so. Without one, it runs in the node's work directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuquota.node_agent.launch import AttemptHandle, LaunchSpec, Outcome, Trace

#: torchrun's default rendezvous port; containers each have their own network namespace
CONTAINER_MASTER_PORT = 29500
#: seconds a failed instance's peers get between SIGTERM and SIGKILL
PEER_STOP_GRACE = 10.0
#: ``MASTER_PORT`` of an attempt spread over several nodes: every node derives the same port from the
#: attempt id, in a range below Linux's ephemeral ports (32768 and up), so no node has to tell the others
GANG_PORTS = (20000, 10000)
#: the payload's ``Environment`` variable naming the directory the job was submitted from
SUBMIT_DIR = "GPUQUOTA_SUBMIT_DIR"


@dataclass(frozen=True)
class Instance:
    rank: int
    host: str
    gpus: tuple[int, ...]


def host_name(rank: int) -> str:
    return f"algo-{rank + 1}"


def rank_of(host: str) -> int:
    """``algo-K`` -> K - 1."""
    suffix = host.rsplit("-", 1)[-1]
    return int(suffix) - 1 if suffix.isdigit() else 0


def total_instances(spec: LaunchSpec) -> int:
    if spec.peers:
        return len(spec.peers)
    return max(spec.request.instance_count, spec.instances_here)


def local_instances(spec: LaunchSpec) -> list[Instance]:
    """The instances this node runs: one per slot of the attempt (ranks from ``spec.first_rank``)."""
    first = spec.first_rank
    if spec.instance_gpus:
        return [Instance(first + i, host_name(first + i), gpus) for i, gpus in enumerate(spec.instance_gpus)]
    visible = spec.env.get("CUDA_VISIBLE_DEVICES", "")
    return [Instance(first, host_name(first), tuple(int(g) for g in visible.split(",") if g.strip()))]


def master_address(spec: LaunchSpec) -> str:
    """The address of the node that runs rank 0 (``algo-1``), for an attempt spread over nodes."""
    return spec.peers[0][1] if spec.peers else "localhost"


def gang_port(attempt_id: str) -> int:
    """``MASTER_PORT`` of an attempt spread over several nodes: the same on every node."""
    base, span = GANG_PORTS
    return base + zlib.crc32(attempt_id.encode()) % span


def attempt_root(work_dir: Path, attempt_id: str) -> Path:
    """The attempt's directory on the node: ``<work dir>/attempts/<attempt id>/``, one ``<algo-K>/`` per
    instance with its ``model/`` and ``output/`` (``/opt/ml/model``, ``/opt/ml/output``), kept (I6)."""
    return work_dir / "attempts" / re.sub(r"[^A-Za-z0-9._-]", "_", attempt_id)


def output_env(spec: LaunchSpec, instance: Instance) -> dict[str, str]:
    """``SM_MODEL_DIR`` and ``SM_OUTPUT_DIR`` of an instance that runs as a local process (created)."""
    root = attempt_root(spec.cwd, spec.attempt_id) / instance.host
    model, output = root / "model", root / "output"
    (output / "data").mkdir(parents=True, exist_ok=True)
    model.mkdir(parents=True, exist_ok=True)
    return {
        "SM_MODEL_DIR": str(model),
        "SM_OUTPUT_DIR": str(output),
        "SM_OUTPUT_DATA_DIR": str(output / "data"),
    }


def working_dir(spec: LaunchSpec, instance: Instance) -> tuple[Path, str | None]:
    """Where the instance's command runs, and the line for its log when that is not where it was asked
    to run (module doc: working directory)."""
    asked = spec.request.environment.get(SUBMIT_DIR)
    if not asked:
        return spec.cwd, None
    if os.path.isabs(asked) and Path(asked).is_dir():
        return Path(asked), None
    fallback = attempt_root(spec.cwd, spec.attempt_id) / instance.host
    fallback.mkdir(parents=True, exist_ok=True)
    why = "does not exist" if os.path.isabs(asked) else "is not an absolute path"
    node = spec.env.get("GPUQUOTA_NODE_ID", "?")
    return fallback, f"gpuquota: {SUBMIT_DIR} {asked} {why} on node {node}: running in {fallback}"


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
        host = self.hosts[index]
        reason = f"Instance {host} (rank {rank_of(host)}) failed: {explain(outcome)}"
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
