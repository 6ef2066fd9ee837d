"""What every operation of the gateway works with: the read model, the command port, the clock and
the lookups of resources by name or ARN.

An operation (``gpuquota.gateway.policies`` and its siblings) is a function of a ``Context`` and the
request's ``Params``. A write records the resource's pending status in the read model before it sends
the scheduler input, and restores the previous view if the core rejects it (``write_resource``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpuquota.gateway.auth import Principal
from gpuquota.gateway.edge import validation_message
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params
from gpuquota.gateway.ports import CommandPort, CommandRejected
from gpuquota.read.jobs import JobView
from gpuquota.read.model import ReadModel, ResourceView
from gpuquota.support.arns import ArnFactory
from gpuquota.support.clock import Clock
from gpuquota.support.ids import uuid7
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    JobQueueSpec,
    Message,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
)
from gpuquota.wire.inputs import SchedulerInput

M = TypeVar("M", bound=Message)
B = TypeVar("B", bound=BaseModel)
CreateInput = inp.CreateSchedulingPolicy | inp.CreateServiceEnvironment | inp.CreateJobQueue
UpdateInput = (
    inp.UpdateSchedulingPolicy | inp.UpdateServiceEnvironment | inp.UpdateJobQueue | inp.UpdateQuotaShare
)
S = TypeVar("S", SchedulingPolicySpec, ServiceEnvironmentSpec, JobQueueSpec, QuotaShareSpec)


@dataclass
class Context:
    """The read model, command port, clock and pool that the operations share."""

    rm: ReadModel
    port: CommandPort
    clock: Clock
    pool: str

    @property
    def arns(self) -> ArnFactory:
        return self.rm.arns

    # ----- messages ------------------------------------------------------------------------------

    def build(self, kind: type[B], **fields: Any) -> B:
        """A wire model; its validation error is the caller's (a ``ClientException`` naming the field)."""
        try:
            return kind(**fields)
        except ValidationError as exc:
            raise ClientException(validation_message(exc)) from None

    def make(self, kind: type[M], **fields: Any) -> M:
        """A scheduler input with a fresh event id, stamped now."""
        return self.build(kind, event_id=uuid7(), occurred_at=self.clock(), **fields)

    async def send(self, message: SchedulerInput) -> None:
        """Deliver ``message``; the core's rejection becomes a ``ClientException`` with its reason."""
        try:
            await self.port.send(message)
        except CommandRejected as exc:
            raise ClientException(exc.reason) from None

    async def write_resource(
        self, table: dict[Any, ResourceView[S]], key: Any, spec: S, status: str, message: SchedulerInput
    ) -> None:
        """Show ``status`` for ``key`` while ``message`` is sent; undo it if the core rejects it."""
        self.rm.mark(table, key, spec, status, message.event_id)
        try:
            await self.send(message)
        except BaseException:
            self.rm.revert(table, key, message.event_id)
            raise

    # ----- lookups -------------------------------------------------------------------------------

    async def create(self, table: dict[str, ResourceView[S]], spec: S, kind: type[CreateInput]) -> None:
        """Create the resource ``spec`` names, unless ``table`` already has it."""
        if spec.name in table:
            raise ClientException("Object already exists")
        message: CreateInput = kind(event_id=uuid7(), occurred_at=self.clock(), spec=spec)
        await self.write_resource(table, spec.name, spec, "CREATING", message)

    async def update(
        self, table: dict[Any, ResourceView[S]], key: Any, spec: S, kind: type[UpdateInput]
    ) -> None:
        """Replace the resource at ``key`` by the whole new ``spec``."""
        message: UpdateInput = kind(event_id=uuid7(), occurred_at=self.clock(), spec=spec)
        await self.write_resource(table, key, spec, "UPDATING", message)

    def ref(self, ref: str, kind: str, what: str) -> tuple[str, ...]:
        """The names in a resource reference: a plain name, or an ARN of ``kind``."""
        if ref.startswith("arn:"):
            parsed = self.arns.parse(ref)
            if parsed is None or parsed[0] != kind:
                raise ClientException(f"{ref} is not a valid {what} ARN")
            return parsed[1]
        return (ref,)

    def known(self, refs: list[str] | None, table: Mapping[str, Any], kind: str, what: str) -> list[str]:
        """The existing names that ``refs`` point at, once each and in order (all names if none)."""
        if not refs:
            return sorted(table)
        names: list[str] = []
        for ref in refs:
            (name,) = self.ref(ref, kind, what)
            if name in table and name not in names:
                names.append(name)
        return names

    def policy(self, ref: str) -> ResourceView[SchedulingPolicySpec]:
        (name,) = self.ref(ref, "scheduling-policy", "scheduling policy")
        return _found(self.rm.policies.get(name), f"Scheduling policy {ref}")

    def environment(self, ref: str) -> ResourceView[ServiceEnvironmentSpec]:
        (name,) = self.ref(ref, "service-environment", "service environment")
        return _found(self.rm.environments.get(name), f"Service environment {ref}")

    def queue(self, ref: str) -> ResourceView[JobQueueSpec]:
        (name,) = self.ref(ref, "job-queue", "job queue")
        return _found(self.rm.queues.get(name), f"Job queue {ref}")

    def share(self, arn: str) -> ResourceView[QuotaShareSpec]:
        parsed = self.arns.parse(arn)
        if parsed is None or parsed[0] != "quota-share":
            raise ClientException(f"{arn} is not a valid quota share ARN")
        return _found(self.rm.shares.get((parsed[1][0], parsed[1][1])), f"Quota share {arn}")

    def job(self, ref: str) -> JobView:
        (job_id,) = self.ref(ref, "service-job", "service job")
        return _found(self.rm.jobs.get(job_id), f"Service job {ref}")


T = TypeVar("T")


def _found(value: T | None, what: str) -> T:
    if value is None:
        raise ClientException(f"{what} does not exist")
    return value


Handler = Callable[[Context, Params], Awaitable[dict[str, Any]]]
Scoped = Callable[[Context, Params, Principal], dict[str, Any]]
Guard = Callable[[Context, Principal, str, Params], None]
"""Raise ``AccessDenied`` unless the share-limited principal may do the action (``batch:Name``) with
these parameters."""


@dataclass(frozen=True)
class Operation:
    """One AWS operation: its name (as in botocore's model), its handler and its access check."""

    name: str
    """As botocore's model spells it (``SubmitServiceJob``); the path is ``/v1/`` and its lower case."""
    handler: Handler
    guard: Guard | None = None
    """Checks a share-limited principal beyond ``Principal.may`` (``None``: nothing more to check)."""
    scoped: Scoped | None = None
    """What a share-limited principal gets instead of ``handler`` (the jobs of its shares only)."""
    max_bytes: int | None = None
    """The largest request body it accepts (``None``: the gateway's general limit)."""
    admitted: bool = False
    """Refused (429) while the scheduler's backlog is over its bound, before the body is read
    (``gateway.admission``): the operations that add work, ``SubmitServiceJob``."""
