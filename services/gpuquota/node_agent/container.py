"""The ``container`` runtime (I6): each instance of an attempt is a container of the job's
``TrainingImage``, run by an OCI engine's command line (``podman``, or ``docker``). The image is
first rewritten by the node's image map and pulled when missing (:mod:`~gpuquota.node_agent.images`).

Containers carry labels (``gpuquota.node_id``, ``gpuquota.job_id``, ``gpuquota.attempt_id``,
``gpuquota.instance``) and are not removed when they exit: a restarted agent finds them by label and
adopts the running ones or reads the exit code of the finished ones (:meth:`ContainerRuntime.adopt`).
A container is removed once its attempt is reported (``reap``) or stopped (``stop``).

Limits: podman applies its own default rlimits (nofile, nproc) unless told otherwise, and in a
sandbox whose hard limits are lower the OCI runtime fails (``error setting rlimit type 7``); the
runtime therefore passes ``--ulimit`` values no higher than the agent's own (:func:`ulimit_flags`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuquota.config.image_map import ImageMap
from gpuquota.node_agent import children
from gpuquota.node_agent.images import PullError, ensure_image
from gpuquota.node_agent.instances import (
    CONTAINER_MASTER_PORT,
    GroupHandle,
    Instance,
    gang_port,
    host_name,
    instance_env,
    local_instances,
    master_address,
)
from gpuquota.node_agent.launch import AdoptRecord, AttemptHandle, LaunchError, LaunchSpec, Outcome, Trace
from gpuquota.node_agent.sagemaker_contract import InstanceLayout, prepare_instance, read_failure

log = logging.getLogger(__name__)

ENGINES = ("podman", "docker")
LABEL = "gpuquota"
#: OCI runtime podman is told to use when installed (``GPUQUOTA_OCI_RUNTIME`` overrides; empty: podman's
#: default). crun refuses hosts with controllers on both cgroup hierarchies ("hybrid mode"); runc does not.
OCI_RUNTIME_ENV = "GPUQUOTA_OCI_RUNTIME"
_COMMAND_TIMEOUT = 120.0
#: ``run`` pulls an image the node does not have: large training images take minutes
_RUN_TIMEOUT = 1800.0


class EngineMissing(RuntimeError):
    """No container engine is installed."""


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip("._-") or "x"


def ulimit_flags() -> list[str]:
    """``--ulimit`` for nofile and nproc, each at most the agent's own limits (which every process may
    set); nproc is also kept under the nofile hard limit, the sandbox ceiling measured on our hosts."""
    nofile_soft, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc_soft, nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)
    cap = nofile_hard if nofile_hard != resource.RLIM_INFINITY else 1 << 20

    def bound(value: int) -> int:
        return cap if value == resource.RLIM_INFINITY else min(value, cap)

    return [
        "--ulimit",
        f"nofile={bound(nofile_soft)}:{bound(nofile_hard)}",
        "--ulimit",
        f"nproc={bound(nproc_soft)}:{bound(nproc_hard)}",
    ]


@dataclass(frozen=True)
class ContainerEngine:
    """An engine's command line: ``podman`` or ``docker`` (same verbs; GPU flags differ)."""

    name: str
    path: str
    oci_runtime: str | None = None

    @classmethod
    def find(cls, preferred: str | None = None) -> ContainerEngine:
        for name in (preferred,) if preferred else ENGINES:
            path = shutil.which(name)
            if path is not None:
                oci = os.environ.get(OCI_RUNTIME_ENV, "runc" if shutil.which("runc") else "")
                return cls(name, path, (oci or None) if name == "podman" else None)
        wanted = preferred or " or ".join(ENGINES)
        raise EngineMissing(f"no container engine found: install {wanted} (deploy/local/podman.sh)")

    def argv(self, *args: str) -> list[str]:
        runtime = ["--runtime", self.oci_runtime] if self.oci_runtime else []
        return [self.path, *runtime, *args]

    async def call(self, *args: str, timeout: float | None = _COMMAND_TIMEOUT) -> tuple[int, str, str]:
        """(return code, stdout, stderr) once the command has exited (not once its output ends: a
        container's monitor may inherit it, :mod:`~gpuquota.node_agent.children`)."""
        return await children.run(self.argv(*args), timeout)

    def call_sync(self, *args: str) -> tuple[int, str]:
        done = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=_COMMAND_TIMEOUT)
        return done.returncode, done.stdout

    def gpu_flags(self, gpus: tuple[int, ...]) -> list[str]:
        if not gpus:
            return []
        if self.name == "docker":
            return ["--gpus", "device=" + ",".join(str(g) for g in gpus)]
        return [f for g in gpus for f in ("--device", f"nvidia.com/gpu={g}")]

    async def inspect(self, name: str) -> dict[str, Any] | None:
        rc, out, _ = await self.call("inspect", "--type", "container", name)
        return _first(out) if rc == 0 else None

    async def remove(self, name: str) -> None:
        await self.call("rm", "--force", *(["--time", "0"] if self.name == "podman" else []), name)

    async def remove_network(self, name: str) -> None:
        await self.call("network", "rm", *(["--force"] if self.name == "podman" else []), name)


_PR_SET_PDEATHSIG = 1
_FOLLOWERS: set[subprocess.Popen[bytes]] = set()
"""``logs --follow`` processes not reaped yet (one killed may need a moment); referenced until then."""


def _die_with_parent() -> None:
    """In a follower, before exec: SIGKILL when the agent dies (Linux), so that an agent killed with
    SIGKILL leaves no follower appending to the log its successor writes again."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _reap_followers() -> None:
    for follower in list(_FOLLOWERS):
        if follower.poll() is not None:
            _FOLLOWERS.discard(follower)


def _first(out: str) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError):
        docs = json.loads(out)
        if isinstance(docs, list) and docs and isinstance(docs[0], dict):
            return docs[0]
    return None


def _ip(address: str) -> str:
    """An IP address of ``address`` (``--add-host`` takes no host name); :class:`LaunchError` if unknown."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        raise LaunchError(f"Cannot resolve the address {address} of a node of the attempt") from None


def describe_exit(code: int, oom: bool, failure: str | None) -> str:
    """The reason of a failed container: its failure file, else what its exit code says."""
    if failure:
        return failure
    if oom:
        return f"Container killed: out of memory (OOMKilled, exit code {code})"
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"Container killed by signal {signal.Signals(code - 128).name} (exit code {code})"
    return f"exited with code {code}"


@dataclass(eq=False, slots=True)
class ContainerHandle:
    """One instance's container: waited for with the engine's ``wait``; its log copied by ``logs -f``."""

    engine: ContainerEngine
    name: str
    host: str
    failure_file: Path | None
    log_path: Path
    replay: bool
    """Adopted: rewrite the log from the container's start."""
    pid: int | None = None
    pgid: int | None = None
    start_time: int | None = None
    _follower: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def _follow_log(self) -> None:
        if self._follower is not None:
            return
        _reap_followers()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb" if self.replay else "ab") as log:
            self._follower = subprocess.Popen(
                self.engine.argv("logs", "--follow", self.name),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        _FOLLOWERS.add(self._follower)

    async def wait(self) -> Outcome:
        self._follow_log()
        try:
            rc, out, err = await self.engine.call("wait", self.name, timeout=None)  # as long as it runs
        except asyncio.CancelledError:
            self._kill_follower()  # the agent stops: its successor copies the log again
            raise
        if rc != 0 or not out.strip().lstrip("-").isdigit():
            return Outcome(exit_code=None, reason=f"Container {self.name} lost: {err.strip() or 'gone'}")
        code = int(out.strip().splitlines()[-1])
        if code == 0:
            return Outcome(exit_code=0)
        state = (await self.engine.inspect(self.name) or {}).get("State") or {}
        failure = read_failure(self.failure_file) if self.failure_file is not None else None
        return Outcome(exit_code=code, reason=describe_exit(code, bool(state.get("OOMKilled")), failure))

    async def stop(self, grace: float, trace: Trace) -> None:
        seconds = str(max(0, math.ceil(grace)))
        trace(f"{self.engine.name} stop --time {seconds} {self.name} (SIGTERM, SIGKILL after the grace)")
        await self.engine.call("stop", "--time", seconds, self.name, timeout=grace + _COMMAND_TIMEOUT)
        await self.reap()
        trace(f"container {self.name} gone")

    async def reap(self) -> None:
        # The follower ends by itself once it has copied the exited container's last lines; removing
        # the container first could delete its log before the follower read them.
        await self._stop_following(10)
        await self.engine.remove(self.name)

    async def _stop_following(self, patience: float) -> None:
        follower = self._follower
        deadline = time.monotonic() + patience
        while follower is not None and follower.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._kill_follower()

    def _kill_follower(self) -> None:
        """Synchronous, so that it completes even in a task cancelled at its agent's stop."""
        follower = self._follower
        if follower is not None and follower.poll() is None:
            follower.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                follower.wait(timeout=1)
        _reap_followers()


class ContainerRuntime:
    """Runs ``AlgorithmSpecification.TrainingImage`` with SageMaker's training contract."""

    name = "container"
    contained = True
    """The job's ``CheckpointConfig.LocalPath`` is a path inside the container, not on the node."""

    def __init__(self, engine: ContainerEngine, images: ImageMap | None = None) -> None:
        self.engine = engine
        self.images = images or ImageMap()
        """The operator's rewrites of the jobs' images (``GPUQUOTA_IMAGE_MAP``)."""

    @staticmethod
    def container_name(node: str, attempt_id: str, instance: Instance) -> str:
        return f"gpuquota-{_safe(node)}-{_safe(attempt_id)}-{instance.host}"

    async def launch(self, spec: LaunchSpec) -> AttemptHandle:
        image = spec.request.training_image
        if not image:
            raise LaunchError("No image to run: the payload has no AlgorithmSpecification.TrainingImage")
        image = self.images.resolve(image)
        try:
            await ensure_image(self.engine, image)
        except PullError as exc:
            raise LaunchError(str(exc)) from None
        node = spec.env.get("GPUQUOTA_NODE_ID", "")
        instances = local_instances(spec)
        # an attempt spread over several nodes uses the hosts' network (see docs/runtimes.md)
        network = (
            await self._network(node, spec.attempt_id) if len(instances) > 1 and not spec.peers else None
        )
        master, port = host_name(0), CONTAINER_MASTER_PORT
        if spec.peers:
            master, port = master_address(spec), gang_port(spec.attempt_id)
        handles: list[ContainerHandle] = []
        try:
            for instance in instances:
                env = instance_env(spec, instance, master, port)
                layout = prepare_instance(spec, instance, env)
                name = self.container_name(node, spec.attempt_id, instance)
                log = self._log(spec, instance)
                await self._run(spec, image, name, instance, layout, log, network)
                handle = ContainerHandle(self.engine, name, instance.host, layout.failure_file, log, False)
                handles.append(handle)
        except BaseException:
            for handle in handles:
                await handle.reap()
            if network is not None:
                await self.engine.remove_network(network)
            raise
        return self._handle(handles, network, bool(spec.peers))

    def _handle(
        self, handles: list[ContainerHandle], network: str | None, gang: bool = False
    ) -> AttemptHandle:
        if len(handles) == 1 and network is None and not gang:
            return handles[0]

        async def remove_network() -> None:
            if network is not None:
                await self.engine.remove_network(network)

        return GroupHandle(handles, [h.host for h in handles], remove_network)

    def _log(self, spec: LaunchSpec, instance: Instance) -> Path:
        if instance.rank == spec.first_rank:
            return spec.log_path
        return spec.log_path.with_name(f"{spec.log_path.stem}.{instance.host}{spec.log_path.suffix}")

    @staticmethod
    def _network_name(node: str, attempt_id: str) -> str:
        return f"gpuquota-{_safe(node)}-{_safe(attempt_id)}"[:200]

    async def _network(self, node: str, attempt_id: str) -> str:
        name = self._network_name(node, attempt_id)
        rc, _, err = await self.engine.call("network", "create", name)
        if rc != 0 and "exists" not in err:
            raise LaunchError(f"Cannot create the attempt's network {name}: {err.strip()}")
        return name

    async def _run(
        self,
        spec: LaunchSpec,
        image: str,
        name: str,
        instance: Instance,
        layout: InstanceLayout,
        log: Path,
        network: str | None,
    ) -> None:
        await self.engine.remove(name)  # a leftover of an earlier launch that failed half-way
        request = spec.request
        env = dict(layout.env)
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(g) for g in instance.gpus) or "void"
        args = ["run", "--detach", "--name", name, "--hostname", instance.host, *ulimit_flags()]
        labels = {
            "node_id": spec.env.get("GPUQUOTA_NODE_ID", ""),
            "work_dir": str(spec.cwd),
            "job_id": spec.job_id,
            "attempt_id": spec.attempt_id,
            "instance": instance.host,
            "log": str(log),
            "failure_file": str(layout.failure_file),
        }
        args += [f for key, value in labels.items() for f in ("--label", f"{LABEL}.{key}={value}")]
        if network is not None:
            args += ["--network", network, "--network-alias", instance.host]
        elif spec.peers:  # across machines: the hosts' network; every instance by its node's address
            args += [
                "--network",
                "host",
                *(f"--add-host={host}:{_ip(address)}" for host, address in spec.peers),
            ]
        args += [f for m in layout.mounts for f in ("--mount", m.flag())]
        args += [f for key, value in sorted(env.items()) for f in ("--env", f"{key}={value}")]
        args += self.engine.gpu_flags(instance.gpus)
        # docker's --entrypoint takes one word: the entrypoint's other words lead the command
        entrypoint = list(request.entrypoint)
        if entrypoint:
            args += ["--entrypoint", entrypoint[0]]
        # SageMaker runs an image without ContainerEntrypoint/ContainerArguments as "<image> train"
        command = entrypoint[1:] + (list(request.arguments) or ([] if entrypoint else ["train"]))
        try:
            rc, _, err = await self.engine.call(*args, image, *command, timeout=_RUN_TIMEOUT)
        except TimeoutError:
            raise LaunchError(
                f"Cannot start image {image}: no answer from {self.engine.name} within {_RUN_TIMEOUT:g} s"
            ) from None
        if rc != 0:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            raise LaunchError(
                f"Cannot start image {image}: {lines[-1] if lines else f'{self.engine.name} failed'}"
            )

    def adopt(self, record: AdoptRecord) -> AttemptHandle | None:
        if record.runtime != self.name or not record.attempt_id:
            return None
        filters = [f"label={LABEL}.attempt_id={record.attempt_id}", f"label={LABEL}.node_id={record.node_id}"]
        rc, out = self.engine.call_sync(
            "ps", "--all", "--format", "{{.Names}}", *(f for flt in filters for f in ("--filter", flt))
        )
        names = sorted(n.strip() for n in out.splitlines() if n.strip()) if rc == 0 else []
        if not names:
            return None
        handles = [h for h in map(self._adopt_container, names) if h is not None]
        if not handles:
            return None
        handles.sort(key=lambda h: int(h.host.rsplit("-", 1)[-1]) if h.host[-1:].isdigit() else 0)  # algo-K
        network = self._network_name(record.node_id, record.attempt_id) if len(handles) > 1 else None
        return self._handle(handles, network)

    def sweep(self, node_id: str, work_dir: Path, keep: set[str]) -> list[str]:
        """Removes the containers an agent of ``node_id`` on ``work_dir`` started for attempts other than
        ``keep`` (it died between starting them and recording them in ``state.json``): their attempts
        are not this agent's any more, and the scheduler runs them again."""
        filters = [f"label={LABEL}.node_id={node_id}", f"label={LABEL}.work_dir={work_dir}"]
        rc, out = self.engine.call_sync(
            "ps", "--all", "--format", "{{.Names}}", *(f for flt in filters for f in ("--filter", flt))
        )
        kept = {_safe(attempt) for attempt in keep}
        prefix = f"gpuquota-{_safe(node_id)}-"
        strays = [
            name
            for name in out.split()
            if rc == 0 and name.startswith(prefix) and name[len(prefix) :].rsplit("-", 2)[0] not in kept
        ]
        podman = self.engine.name == "podman"
        for name in strays:
            log.warning("removing container %s: started by a previous agent that did not record it", name)
            self.engine.call_sync("rm", "--force", *(["--time", "0"] if podman else []), name)
        for network in {name.rsplit("-", 2)[0] for name in strays}:  # multi-instance attempts' networks
            self.engine.call_sync("network", "rm", *(["--force"] if podman else []), network)
        return strays

    def _adopt_container(self, name: str) -> ContainerHandle | None:
        rc, out = self.engine.call_sync("inspect", "--type", "container", name)
        doc = _first(out) if rc == 0 else None
        if doc is None:
            return None
        labels = (doc.get("Config") or {}).get("Labels") or {}
        log = Path(labels.get(f"{LABEL}.log") or os.devnull)
        failure = labels.get(f"{LABEL}.failure_file")
        host = labels.get(f"{LABEL}.instance") or "algo-1"
        return ContainerHandle(self.engine, name, host, Path(failure) if failure else None, log, replay=True)
