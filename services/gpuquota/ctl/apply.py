"""``gpuquota apply -f FILE.yaml``: declarative setup of scheduling policy, service environment, job queue
and quota shares.

The file (see ``deploy/examples/worked-example.yaml``) has up to four sections, each optional::

    schedulingPolicy:   {name, idleResourceAssignmentStrategy: FIFO, tags}
    serviceEnvironment: {name, state, capacityLimits: {UNIT: N}, tags}
    jobQueue:           {name, priority, state, schedulingPolicy, serviceEnvironment, tags}
    quotaShares:        [{name, jobQueue, capacityLimits: {UNIT: N}, strategy, borrowLimit,
                          inSharePreemption, state, tags}, ...]

A job queue's policy and environment default to the file's; a share's job queue defaults to the file's.
Each resource is created when missing and updated (only what differs) when present; resources that
the file does not mention are left alone. ``tags``, when given, become the resource's exact tags.
Everything goes through the AWS Batch API (boto3), so ``apply`` works against any gpuquota gateway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuquota.ctl.api import Api, CliError, poll
from gpuquota.wire.base import CapacityLimit, QueuePriority, QuotaShareSpec

State = Literal["ENABLED", "DISABLED"]
READY_TIMEOUT = 15.0
PENDING = ("CREATING", "UPDATING")


def _on_off(value: Any) -> Any:
    if isinstance(value, bool):
        return "ENABLED" if value else "DISABLED"
    return value


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class PolicyDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    idleResourceAssignmentStrategy: Literal["FIFO"] = "FIFO"
    tags: dict[str, str] | None = None


class EnvironmentDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    state: State = "ENABLED"
    capacityLimits: dict[str, Annotated[int, Field(ge=0)]] = Field(min_length=1)
    tags: dict[str, str] | None = None

    _state = field_validator("state", mode="before")(_on_off)


class QueueDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    priority: QueuePriority = 1
    state: State = "ENABLED"
    schedulingPolicy: str | None = None
    serviceEnvironment: str | None = None
    tags: dict[str, str] | None = None

    _state = field_validator("state", mode="before")(_on_off)


class ShareDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    jobQueue: str | None = None
    capacityLimits: dict[str, int] = Field(min_length=1, max_length=5)
    strategy: Literal["RESERVE", "LEND", "LEND_AND_BORROW"]
    borrowLimit: int | None = Field(default=None, ge=-1)
    inSharePreemption: State = "DISABLED"
    state: State = "ENABLED"
    tags: dict[str, str] | None = None

    _flags = field_validator("state", "inSharePreemption", mode="before")(_on_off)

    def spec(self, queue: str) -> QuotaShareSpec:
        """The wire spec this document asks for (its validation is the quota share's rules)."""
        return QuotaShareSpec(
            name=self.name,
            job_queue=queue,
            capacity_limits=tuple(
                CapacityLimit(unit=u, max_capacity=n) for u, n in self.capacityLimits.items()
            ),
            strategy=self.strategy,
            borrow_limit=-1 if self.borrowLimit is None else self.borrowLimit,
            in_share_preemption=self.inSharePreemption == "ENABLED",
            state=self.state,
            tags=self.tags or {},
        )


def _capacity(limits: dict[str, int]) -> tuple[CapacityLimit, ...]:
    return tuple(CapacityLimit(unit=unit, max_capacity=count) for unit, count in limits.items())


class ApplyDoc(_Doc):
    schedulingPolicy: PolicyDoc | None = None
    serviceEnvironment: EnvironmentDoc | None = None
    jobQueue: QueueDoc | None = None
    quotaShares: list[ShareDoc] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> ApplyDoc:
        if self.jobQueue is not None:
            if self.jobQueue.schedulingPolicy is None and self.schedulingPolicy is None:
                raise ValueError(
                    "jobQueue.schedulingPolicy is required when the file has no schedulingPolicy"
                )
            if self.jobQueue.serviceEnvironment is None and self.serviceEnvironment is None:
                raise ValueError(
                    "jobQueue.serviceEnvironment is required when the file has no serviceEnvironment"
                )
        seen: set[tuple[str, str]] = set()
        for i, share in enumerate(self.quotaShares):
            queue = share.jobQueue or (self.jobQueue.name if self.jobQueue else None)
            if queue is None:
                raise ValueError(f"quotaShares[{i}].jobQueue is required when the file has no jobQueue")
            if (queue, share.name) in seen:
                raise ValueError(f"quotaShares[{i}]: quota share {share.name} is listed twice")
            seen.add((queue, share.name))
            try:
                share.spec(queue)
            except ValidationError as exc:
                raise ValueError(f"quotaShares[{i}]: {exc.errors()[0]['msg']}") from None
        return self

    def policy_of(self, queue: QueueDoc) -> str:
        name = queue.schedulingPolicy or (self.schedulingPolicy.name if self.schedulingPolicy else None)
        assert name is not None
        return name

    def environment_of(self, queue: QueueDoc) -> str:
        name = queue.serviceEnvironment or (self.serviceEnvironment.name if self.serviceEnvironment else None)
        assert name is not None
        return name

    def queue_of(self, share: ShareDoc) -> str:
        name = share.jobQueue or (self.jobQueue.name if self.jobQueue else None)
        assert name is not None
        return name


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse(data: Any, source: str = "the file") -> ApplyDoc:
    """Validate a loaded document; raise ``CliError`` naming the first problem."""
    if data is None:
        raise CliError(f"{source}: the file is empty")
    if not isinstance(data, dict):
        raise CliError(f"{source}: expected a mapping with schedulingPolicy, serviceEnvironment, ...")
    try:
        return ApplyDoc.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = _where(tuple(error["loc"]))
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(_section(tuple(error["loc"])).model_fields)
            return _raise(f"{source}: unknown key {where} (expected one of: {allowed})")
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "missing":
            return _raise(f"{source}: missing required key {where}")
        return _raise(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def _section(loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The model that an ``extra_forbidden`` error at ``loc`` is about."""
    sections: dict[int | str, type[BaseModel]] = {
        "schedulingPolicy": PolicyDoc,
        "serviceEnvironment": EnvironmentDoc,
        "jobQueue": QueueDoc,
        "quotaShares": ShareDoc,
    }
    return sections.get(loc[0], ApplyDoc) if len(loc) > 1 else ApplyDoc


def _raise(message: str) -> ApplyDoc:
    raise CliError(message)


def load(path: str | Path) -> ApplyDoc:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise CliError(f"{path}: invalid YAML{at}: {problem}") from None
    return parse(data, str(path))


# ----- applying ------------------------------------------------------------------------------------


@dataclass
class Change:
    kind: str
    name: str
    action: str  # created | updated | unchanged (with dry_run: "would create" | "would update")
    details: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "action": self.action, "changes": self.details}


def _limits(limits: dict[str, int]) -> list[dict[str, Any]]:
    return [{"capacityUnit": u, "maxCapacity": n} for u, n in limits.items()]


def _limit_map(items: list[dict[str, Any]]) -> dict[str, int]:
    return {str(c["capacityUnit"]): int(c["maxCapacity"]) for c in items}


def _diff_limits(current: dict[str, int], desired: dict[str, int]) -> list[str]:
    out = []
    for unit in sorted(set(current) | set(desired)):
        before, after = current.get(unit), desired.get(unit)
        if before != after:
            out.append(
                f"capacityLimits[{unit}]: {'-' if before is None else before} -> "
                f"{'-' if after is None else after}"
            )
    return out


def _state_change(current: dict[str, Any], state: str, update: dict[str, Any]) -> list[str]:
    """Put a changed ``state`` into ``update``; the change as a detail line."""
    if current.get("state") == state:
        return []
    update["state"] = state
    return [f"state: {current.get('state')} -> {state}"]


def _limit_changes(current: dict[str, Any], limits: dict[str, int], update: dict[str, Any]) -> list[str]:
    """Put changed capacity limits into ``update``; the changes as detail lines."""
    changes = _diff_limits(_limit_map(current.get("capacityLimits", [])), limits)
    if changes:
        update["capacityLimits"] = _limits(limits)
    return changes


def _status(described: dict[str, Any] | None) -> str | None:
    return None if described is None else str(described.get("status", "VALID"))


def _tail(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


class Applier:
    def __init__(self, api: Api, *, dry_run: bool = False) -> None:
        self.api = api
        self.dry_run = dry_run
        self.changes: list[Change] = []

    def run(self, doc: ApplyDoc) -> list[Change]:
        if doc.schedulingPolicy is not None:
            self.policy(doc.schedulingPolicy)
        if doc.serviceEnvironment is not None:
            self.environment(doc.serviceEnvironment)
        if doc.jobQueue is not None:
            self.queue(doc.jobQueue, doc.policy_of(doc.jobQueue), doc.environment_of(doc.jobQueue))
        by_queue: dict[str, list[ShareDoc]] = {}
        for share in doc.quotaShares:
            by_queue.setdefault(doc.queue_of(share), []).append(share)
        for queue, shares in by_queue.items():
            self.shares(queue, shares)
        return self.changes

    # ----- helpers ---------------------------------------------------------------------------

    def _record(self, kind: str, name: str, details: list[str], created: bool = False) -> None:
        if created:
            action = "would create" if self.dry_run else "created"
        elif details:
            action = "would update" if self.dry_run else "updated"
        else:
            action = "unchanged"
        self.changes.append(Change(kind, name, action, details))

    def _tags(self, arn: str, current: dict[str, str], desired: dict[str, str] | None) -> list[str]:
        if desired is None:
            return []
        add = {k: v for k, v in desired.items() if current.get(k) != v}
        remove = sorted(k for k in current if k not in desired)
        details = [f"tags[{k}]: {current.get(k, '-')} -> {v}" for k, v in sorted(add.items())]
        details += [f"tags[{k}]: {current[k]} -> -" for k in remove]
        if not self.dry_run:
            if add:
                self.api.call("tag_resource", resourceArn=arn, tags=add)
            if remove:
                self.api.call("untag_resource", resourceArn=arn, tagKeys=remove)
        return details

    def _wait_valid(self, status: Callable[[], str | None], what: str) -> None:
        """Wait (polling, with a deadline) until a created or updated resource is no longer pending."""
        deadline = time.monotonic() + READY_TIMEOUT
        result = poll(lambda: (s,) if (s := status()) not in PENDING else None, deadline)
        if result is None:
            raise CliError(f"{what} is still pending after {READY_TIMEOUT:g} s")
        if result[0] is None:
            raise CliError(f"{what} disappeared after it was written")
        if result[0] != "VALID":
            raise CliError(f"{what} is {result[0]}")

    # ----- resources -------------------------------------------------------------------------

    def policy(self, doc: PolicyDoc) -> None:
        found = self.api.call("describe_scheduling_policies", arns=[doc.name])["schedulingPolicies"]
        if not found:
            if not self.dry_run:
                self.api.call(
                    "create_scheduling_policy",
                    name=doc.name,
                    quotaSharePolicy={"idleResourceAssignmentStrategy": doc.idleResourceAssignmentStrategy},
                    **({"tags": doc.tags} if doc.tags else {}),
                )
            self._record("scheduling policy", doc.name, [], created=True)
            return
        current = found[0]
        if "quotaSharePolicy" not in current:
            raise CliError(f"scheduling policy {doc.name} exists without a quotaSharePolicy")
        details = self._tags(current["arn"], current.get("tags", {}), doc.tags)
        self._record("scheduling policy", doc.name, details)

    def _describe_one(self, operation: str, listed: str, **query: Any) -> dict[str, Any] | None:
        """The first item ``operation`` lists under ``listed`` (``None`` if it lists none)."""
        items = self.api.call(operation, **query)[listed]
        return dict(items[0]) if items else None

    def _describe_environment(self, name: str) -> dict[str, Any] | None:
        return self._describe_one(
            "describe_service_environments", "serviceEnvironments", serviceEnvironments=[name]
        )

    def environment(self, doc: EnvironmentDoc) -> None:
        current = self._describe_environment(doc.name)
        if current is None:
            if not self.dry_run:
                self.api.call(
                    "create_service_environment",
                    serviceEnvironmentName=doc.name,
                    serviceEnvironmentType="SAGEMAKER_TRAINING",
                    state=doc.state,
                    capacityLimits=_limits(doc.capacityLimits),
                    **({"tags": doc.tags} if doc.tags else {}),
                )
                self._wait_valid(
                    lambda: _status(self._describe_environment(doc.name)), f"service environment {doc.name}"
                )
            self._record("service environment", doc.name, [], created=True)
            return
        update: dict[str, Any] = {}
        details = _state_change(current, doc.state, update)
        details += _limit_changes(current, doc.capacityLimits, update)
        if update and not self.dry_run:
            self.api.call("update_service_environment", serviceEnvironment=doc.name, **update)
            self._wait_valid(
                lambda: _status(self._describe_environment(doc.name)), f"service environment {doc.name}"
            )
        details += self._tags(current["serviceEnvironmentArn"], current.get("tags", {}), doc.tags)
        self._record("service environment", doc.name, details)

    def _describe_queue(self, name: str) -> dict[str, Any] | None:
        return self._describe_one("describe_job_queues", "jobQueues", jobQueues=[name])

    def queue(self, doc: QueueDoc, policy: str, environment: str) -> None:
        current = self._describe_queue(doc.name)
        order = [{"order": 1, "serviceEnvironment": environment}]
        if current is None:
            if not self.dry_run:
                self.api.call(
                    "create_job_queue",
                    jobQueueName=doc.name,
                    jobQueueType="SAGEMAKER_TRAINING",
                    state=doc.state,
                    priority=doc.priority,
                    schedulingPolicyArn=policy,
                    serviceEnvironmentOrder=order,
                    **({"tags": doc.tags} if doc.tags else {}),
                )
                self._wait_valid(lambda: _status(self._describe_queue(doc.name)), f"job queue {doc.name}")
            self._record("job queue", doc.name, [], created=True)
            return
        update: dict[str, Any] = {}
        details = _state_change(current, doc.state, update)
        if current.get("priority") != doc.priority:
            update["priority"] = doc.priority
            details.append(f"priority: {current.get('priority')} -> {doc.priority}")
        current_policy = _tail(str(current.get("schedulingPolicyArn", "")))
        if current_policy != policy:
            update["schedulingPolicyArn"] = policy
            details.append(f"schedulingPolicy: {current_policy or '-'} -> {policy}")
        environments = current.get("serviceEnvironmentOrder") or []
        current_env = _tail(str(environments[0]["serviceEnvironment"])) if environments else "-"
        if current_env != environment:
            update["serviceEnvironmentOrder"] = order
            details.append(f"serviceEnvironment: {current_env} -> {environment}")
        if update and not self.dry_run:
            self.api.call("update_job_queue", jobQueue=doc.name, **update)
            self._wait_valid(lambda: _status(self._describe_queue(doc.name)), f"job queue {doc.name}")
        details += self._tags(current["jobQueueArn"], current.get("tags", {}), doc.tags)
        self._record("job queue", doc.name, details)

    def _describe_share(self, arn: str) -> dict[str, Any] | None:
        try:
            return self.api.call("describe_quota_share", quotaShareArn=arn)
        except CliError as exc:
            if "does not exist" in str(exc):
                return None
            raise

    def shares(self, queue: str, docs: list[ShareDoc]) -> None:
        if self.dry_run and self._describe_queue(queue) is None:
            existing: dict[str, dict[str, Any]] = {}
        else:
            listed = self.api.pages("list_quota_shares", "quotaShares", jobQueue=queue)
            existing = {str(s["quotaShareName"]): s for s in listed}
        for doc in docs:
            self.share(queue, doc, existing.get(doc.name))

    def share(self, queue: str, doc: ShareDoc, current: dict[str, Any] | None) -> None:
        label = f"{queue}/{doc.name}"
        sharing: dict[str, Any] = {"strategy": doc.strategy}
        if doc.strategy == "LEND_AND_BORROW":
            sharing["borrowLimit"] = -1 if doc.borrowLimit is None else doc.borrowLimit
        preemption = {"inSharePreemption": doc.inSharePreemption}
        if current is None:
            if not self.dry_run:
                created = self.api.call(
                    "create_quota_share",
                    quotaShareName=doc.name,
                    jobQueue=queue,
                    capacityLimits=_limits(doc.capacityLimits),
                    resourceSharingConfiguration=sharing,
                    preemptionConfiguration=preemption,
                    state=doc.state,
                    **({"tags": doc.tags} if doc.tags else {}),
                )
                arn = str(created["quotaShareArn"])
                self._wait_valid(lambda: _status(self._describe_share(arn)), f"quota share {label}")
            self._record("quota share", label, [], created=True)
            return
        arn = str(current["quotaShareArn"])
        update: dict[str, Any] = {}
        details = _limit_changes(current, doc.capacityLimits, update)
        current_sharing = current.get("resourceSharingConfiguration", {})
        for key in ("strategy", "borrowLimit"):
            if current_sharing.get(key) != sharing.get(key):
                update["resourceSharingConfiguration"] = sharing
                before, after = current_sharing.get(key, "-"), sharing.get(key, "-")
                details.append(f"{key}: {before} -> {after}")
        current_in_share = current.get("preemptionConfiguration", {}).get("inSharePreemption")
        if current_in_share != doc.inSharePreemption:
            update["preemptionConfiguration"] = preemption
            details.append(f"inSharePreemption: {current_in_share} -> {doc.inSharePreemption}")
        details += _state_change(current, doc.state, update)
        if update and not self.dry_run:
            self.api.call("update_quota_share", quotaShareArn=arn, **update)
            self._wait_valid(lambda: _status(self._describe_share(arn)), f"quota share {label}")
        if doc.tags is not None:
            described = self._describe_share(arn) or {}
            details += self._tags(arn, described.get("tags", {}), doc.tags)
        self._record("quota share", label, details)


def apply(api: Api, doc: ApplyDoc, *, dry_run: bool = False) -> list[Change]:
    return Applier(api, dry_run=dry_run).run(doc)
