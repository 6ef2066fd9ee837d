"""``gpuquota apply -f FILE.yaml``: creates or updates the resources the file describes.

The document and its validation are in ``gpuquota.ctl.apply_doc``. Each resource is created when
missing and updated (only what differs) when present; resources that the file does not mention are
left alone. ``tags``, when given, become the resource's exact tags. Everything goes through the AWS
Batch API (boto3), so ``apply`` works against any gpuquota gateway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError, poll
from gpuquota.ctl.apply_doc import (
    ApplyDoc,
    EnvironmentDoc,
    PolicyDoc,
    QueueDoc,
    ShareDoc,
    capacity_limits,
    environment_order,
)
from gpuquota.ctl.render import Style

READY_TIMEOUT = 15.0
PENDING = ("CREATING", "UPDATING")


@dataclass
class Change:
    kind: str
    name: str
    action: str  # created | updated | unchanged (with dry_run: "would create" | "would update")
    details: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "action": self.action, "changes": self.details}


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
        update["capacityLimits"] = capacity_limits(limits)
    return changes


def _status(described: dict[str, Any] | None) -> str | None:
    return None if described is None else str(described.get("status", "VALID"))


def _tail(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Kind:
    """How the API names one kind of resource: ``create_{stem}`` and ``update_{stem}`` write it, the
    update names it by its ``identity`` parameter, and a description holds its ARN under ``arn``."""

    stem: str
    identity: str
    arn: str

    @property
    def label(self) -> str:
        return self.stem.replace("_", " ")

    def operation(self, verb: str) -> str:
        """The AWS operation's name: ``operation("Update")`` of ``quota_share`` is ``UpdateQuotaShare``."""
        return verb + "".join(word.capitalize() for word in self.stem.split("_"))


POLICY = Kind("scheduling_policy", "arn", "arn")
ENVIRONMENT = Kind("service_environment", "serviceEnvironment", "serviceEnvironmentArn")
QUEUE = Kind("job_queue", "jobQueue", "jobQueueArn")
SHARE = Kind("quota_share", "quotaShareArn", "quotaShareArn")


class Applier:
    def __init__(self, api: Api, *, dry_run: bool = False) -> None:
        self.api = api
        self.dry_run = dry_run
        self.changes: list[Change] = []
        self.planned: list[dict[str, Any]] = []
        """In a dry run: the writes it would have sent, ``{"operation": ..., "request": ...}`` in order
        (``POST /gpuquota/v1/impact`` says what they would do; tags are not among them)."""

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
        if doc.trainingPlans:
            self.plans([doc.plan_request(plan) for plan in doc.trainingPlans])
        return self.changes

    def plans(self, bodies: list[dict[str, Any]]) -> None:
        """Training plans (S11, gpuquota's own endpoint): put each one that is new or differs."""
        current = {p["trainingPlanName"]: p for p in self.api.plans()}
        for body in bodies:
            name = body["trainingPlanName"]
            before = current.get(name)
            fields = [k for k in body if k != "trainingPlanName"]
            details = (
                []
                if before is None
                else [f"{k}: {before.get(k)} -> {body[k]}" for k in fields if before.get(k) != body[k]]
            )
            if (before is None or details) and not self.dry_run:
                self.api.put_plan(body)
            self._record("training plan", name, details, created=before is None)

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

    def _create(
        self, kind: Kind, name: str, request: dict[str, Any], tags: dict[str, str] | None
    ) -> dict[str, Any] | None:
        """Create a resource (not in a dry run) and record the creation; what the API answered
        (``None`` in a dry run)."""
        created: dict[str, Any] | None = None
        request = {**request, **({"tags": tags} if tags else {})}
        if self.dry_run:
            self.planned.append({"operation": kind.operation("Create"), "request": request})
        else:
            created = self.api.call(f"create_{kind.stem}", **request)
        self._record(kind.label, name, [], created=True)
        return created

    def _update(
        self,
        kind: Kind,
        name: str,
        identity: str,
        describe: Callable[[], dict[str, Any] | None],
        update: dict[str, Any],
    ) -> None:
        """Send ``update`` (if any, not in a dry run) and wait until the resource is valid again."""
        if update and self.dry_run:
            request = {kind.identity: identity, **update}
            self.planned.append({"operation": kind.operation("Update"), "request": request})
        elif update:
            self.api.call(f"update_{kind.stem}", **{kind.identity: identity}, **update)
            self._wait_described(kind, name, describe)

    def _wait_described(self, kind: Kind, name: str, describe: Callable[[], dict[str, Any] | None]) -> None:
        self._wait_valid(lambda: _status(describe()), f"{kind.label} {name}")

    def _retag(
        self, kind: Kind, name: str, current: dict[str, Any], tags: dict[str, str] | None
    ) -> list[str]:
        """Make the tags of the resource ``current`` describes ``tags`` (``None``: leave them)."""
        return self._tags(str(current[kind.arn]), current.get("tags", {}), tags)

    # ----- resources -------------------------------------------------------------------------

    def policy(self, doc: PolicyDoc) -> None:
        found = self.api.call("describe_scheduling_policies", arns=[doc.name])["schedulingPolicies"]
        if not found:
            self._create(POLICY, doc.name, doc.create_request(), doc.tags)
            return
        current = found[0]
        if "quotaSharePolicy" not in current:
            raise CliError(f"scheduling policy {doc.name} exists without a quotaSharePolicy")
        self._record(POLICY.label, doc.name, self._retag(POLICY, doc.name, current, doc.tags))

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
            if self._create(ENVIRONMENT, doc.name, doc.create_request(), doc.tags) is not None:
                self._wait_described(ENVIRONMENT, doc.name, lambda: self._describe_environment(doc.name))
            return
        update: dict[str, Any] = {}
        details = _state_change(current, doc.state, update)
        details += _limit_changes(current, doc.capacityLimits, update)
        self._update(ENVIRONMENT, doc.name, doc.name, lambda: self._describe_environment(doc.name), update)
        details += self._retag(ENVIRONMENT, doc.name, current, doc.tags)
        self._record(ENVIRONMENT.label, doc.name, details)

    def _describe_queue(self, name: str) -> dict[str, Any] | None:
        return self._describe_one("describe_job_queues", "jobQueues", jobQueues=[name])

    def queue(self, doc: QueueDoc, policy: str, environment: str) -> None:
        current = self._describe_queue(doc.name)
        if current is None:
            request = doc.create_request(policy, environment)
            if self._create(QUEUE, doc.name, request, doc.tags) is not None:
                self._wait_described(QUEUE, doc.name, lambda: self._describe_queue(doc.name))
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
            update["serviceEnvironmentOrder"] = environment_order(environment)
            details.append(f"serviceEnvironment: {current_env} -> {environment}")
        self._update(QUEUE, doc.name, doc.name, lambda: self._describe_queue(doc.name), update)
        details += self._retag(QUEUE, doc.name, current, doc.tags)
        self._record(QUEUE.label, doc.name, details)

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
        sharing, preemption = doc.sharing(), doc.preemption()
        if current is None:
            if (created := self._create(SHARE, label, doc.create_request(queue), doc.tags)) is not None:
                created_arn = str(created["quotaShareArn"])
                self._wait_described(SHARE, label, lambda: self._describe_share(created_arn))
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
        self._update(SHARE, label, arn, lambda: self._describe_share(arn), update)
        if doc.tags is not None:
            described = self._describe_share(arn) or {}
            details += self._tags(arn, described.get("tags", {}), doc.tags)
        self._record(SHARE.label, label, details)


def apply(api: Api, doc: ApplyDoc, *, dry_run: bool = False) -> list[Change]:
    return Applier(api, dry_run=dry_run).run(doc)


def format_changes(changes: list[Change], style: Style) -> str:
    colours = {"created": "green", "updated": "yellow", "unchanged": "dim"}
    rows = []
    for change in changes:
        action = style(change.action, colours.get(change.action, "cyan"))
        rows.append([change.kind, change.name, action, "; ".join(change.details)])
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.action] = counts.get(change.action, 0) + 1
    summary = ", ".join(f"{n} {action}" for action, n in counts.items()) or "nothing to apply"
    return render.table(["RESOURCE", "NAME", "ACTION", "CHANGES"], rows) + "\n" + summary
