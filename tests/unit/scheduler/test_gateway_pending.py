"""Pending statuses: a command port that does not answer at once (like Kafka) leaves CREATING/SUBMITTED."""

from __future__ import annotations

import json

import pytest

from gpuquota.gateway import ClientException, CommandRejected, Gateway
from gpuquota.gateway.params import Params
from gpuquota.read.model import ReadModel
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.inputs import SchedulerInput


class QueuedPort:
    """Keeps what it is sent; the test decides what the scheduler makes of it."""

    def __init__(self) -> None:
        self.sent: list[SchedulerInput] = []
        self.reject: str | None = None

    async def send(self, message: SchedulerInput) -> None:
        self.sent.append(message)
        if self.reject is not None:
            raise CommandRejected(self.reject)


async def test_created_resources_are_pending_until_their_event() -> None:
    rm, port = ReadModel(), QueuedPort()
    gateway = Gateway(rm, port)
    await gateway.call("CreateSchedulingPolicy", Params({"name": "p"}))
    policy = await gateway.call("DescribeSchedulingPolicies", Params({"arns": ["p"]}))
    assert policy["schedulingPolicies"][0]["name"] == "p"
    assert rm.policies["p"].status == "CREATING"
    (message,) = port.sent
    assert isinstance(message, inp.CreateSchedulingPolicy)
    rm.apply(ev.SchedulingPolicyChanged(event_id="e/0", occurred_at=1, spec=message.spec))
    assert rm.policies["p"].status == "VALID" and rm.policies["p"].pending_input is None


async def test_rejections_restore_the_previous_view() -> None:
    rm, port = ReadModel(), QueuedPort()
    gateway = Gateway(rm, port)
    port.reject = "Scheduling policy p is broken"
    with pytest.raises(ClientException, match="Scheduling policy p is broken"):
        await gateway.call("CreateSchedulingPolicy", Params({"name": "p"}))
    assert "p" not in rm.policies


def confirm(rm: ReadModel, port: QueuedPort) -> None:
    """Play the scheduler: every resource command sent so far is accepted."""
    for n, sent in enumerate(port.sent):
        if isinstance(sent, inp.CreateSchedulingPolicy):
            rm.apply(ev.SchedulingPolicyChanged(event_id=f"{n}", occurred_at=1, spec=sent.spec))
        elif isinstance(sent, inp.CreateServiceEnvironment):
            rm.apply(ev.ServiceEnvironmentChanged(event_id=f"{n}", occurred_at=1, spec=sent.spec))
        elif isinstance(sent, inp.CreateJobQueue):
            rm.apply(ev.JobQueueChanged(event_id=f"{n}", occurred_at=1, spec=sent.spec))
        elif isinstance(sent, inp.CreateQuotaShare):
            rm.apply(ev.QuotaShareChanged(event_id=f"{n}", occurred_at=1, spec=sent.spec))
    port.sent.clear()


SHARE = {
    "quotaShareName": "QS1",
    "jobQueue": "jq",
    "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
    "resourceSharingConfiguration": {"strategy": "LEND"},
    "preemptionConfiguration": {"inSharePreemption": "DISABLED"},
}


async def test_shares_need_a_valid_queue_and_jobs_are_visible_when_submitted() -> None:
    rm, port = ReadModel(), QueuedPort()
    gateway = Gateway(rm, port, clock=lambda: 5)
    await gateway.call("CreateSchedulingPolicy", Params({"name": "p"}))
    await gateway.call(
        "CreateServiceEnvironment",
        Params(
            {
                "serviceEnvironmentName": "se",
                "serviceEnvironmentType": "SAGEMAKER_TRAINING",
                "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
            }
        ),
    )
    confirm(rm, port)
    queue = {
        "jobQueueName": "jq",
        "priority": 1,
        "schedulingPolicyArn": "p",
        "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}],
    }
    await gateway.call("CreateJobQueue", Params(queue))
    assert rm.queues["jq"].status == "CREATING"
    with pytest.raises(ClientException, match="VALID job queue"):
        await gateway.call("CreateQuotaShare", Params(SHARE))
    confirm(rm, port)
    await gateway.call("CreateQuotaShare", Params(SHARE))
    confirm(rm, port)
    body = {
        "jobName": "j",
        "jobQueue": "jq",
        "serviceJobType": "SAGEMAKER_TRAINING",
        "quotaShareName": "QS1",
        "serviceRequestPayload": json.dumps({"ResourceConfig": {"InstanceType": "ml.g5.xlarge"}}),
    }
    submitted = await gateway.call("SubmitServiceJob", Params(body))
    described = await gateway.call("DescribeServiceJob", Params({"jobId": submitted["jobId"]}))
    assert described["status"] == "SUBMITTED" and described["createdAt"] == 5
    (message,) = port.sent
    assert isinstance(message, inp.SubmitJob)
    rm.apply(ev.JobAccepted(event_id="x/0", occurred_at=6, job=message.job))
    described = await gateway.call("DescribeServiceJob", Params({"jobId": submitted["jobArn"]}))
    assert described["status"] == "RUNNABLE"


def rejected(message: SchedulerInput, n: int) -> ev.InputRejected:
    return ev.InputRejected(
        event_id=f"r/{n}",
        occurred_at=1,
        input_event_id=message.event_id,
        input_type=message.type,
        reason="no",
    )


async def test_a_rejection_after_the_answer_restores_the_previous_view() -> None:
    """The port answered before the decision (distributed mode, past its decision timeout): the
    rejection event alone restores the view, also under a later command pending on the same resource."""
    rm, port = ReadModel(), QueuedPort()
    gateway = Gateway(rm, port)
    await gateway.call("CreateSchedulingPolicy", Params({"name": "p"}))
    (create,) = port.sent
    rm.apply(rejected(create, 0))
    assert "p" not in rm.policies
    port.sent.clear()
    await gateway.call("CreateSchedulingPolicy", Params({"name": "p"}))
    confirm(rm, port)
    fifo = {"idleResourceAssignmentStrategy": "FIFO"}
    await gateway.call("UpdateSchedulingPolicy", Params({"arn": "p", "quotaSharePolicy": fifo}))
    await gateway.call("DeleteSchedulingPolicy", Params({"arn": "p"}))
    update, delete = port.sent
    assert rm.policies["p"].status == "DELETING"
    rm.apply(rejected(update, 1))  # under the pending delete
    assert rm.policies["p"].status == "DELETING"
    rm.apply(rejected(delete, 2))
    assert rm.policies["p"].status == "VALID" and rm.policies["p"].pending_input is None
