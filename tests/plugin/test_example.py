"""A training platform's test against gpuquota, with the gpuquota_stack fixture of gpuquota.testing."""

import json

import pytest

G5 = "ml.g5.xlarge"


def training_job(seconds: int) -> str:
    """A SageMaker CreateTrainingJob request; the simulated runtime "runs" it for `seconds`."""
    return json.dumps(
        {
            "TrainingJobName": "train",
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1, "VolumeSizeInGB": 10},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
            "Environment": {"GPUQUOTA_SIM_DURATION_SECONDS": str(seconds)},
        }
    )


@pytest.mark.gpuquota(nodes=f"{G5}=2")  # one node agent offering 2 instances
def test_prod_reclaims_the_instance_research_borrowed(gpuquota_stack):
    batch = gpuquota_stack.batch
    batch.create_scheduling_policy(name="policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName="gpus",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": G5, "maxCapacity": 2}],
    )
    batch.create_job_queue(
        jobQueueName="training",
        jobQueueType="SAGEMAKER_TRAINING",
        priority=1,
        schedulingPolicyArn="arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "gpus"}],
    )
    for share, strategy in (("research", "LEND_AND_BORROW"), ("prod", "LEND")):
        batch.create_quota_share(
            quotaShareName=share,
            jobQueue="training",
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}],
            resourceSharingConfiguration={"strategy": strategy},  # borrowLimit: -1 (unlimited)
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )

    def submit(name: str, share: str) -> str:
        job = batch.submit_service_job(
            jobName=name,
            jobQueue="training",
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName=share,
            serviceRequestPayload=training_job(seconds=600),
        )
        return str(job["jobId"])

    own = submit("research-1", "research")
    gpuquota_stack.wait_for_status(own, "RUNNING")  # in research's quota
    borrowed = submit("research-2", "research")
    gpuquota_stack.wait_for_status(borrowed, "RUNNING")  # borrows prod's idle instance

    urgent = submit("prod-1", "prod")
    gpuquota_stack.wait_for_status(urgent, "RUNNING")  # prod takes its instance back
    preempted = gpuquota_stack.wait_for_status(borrowed, "RUNNABLE")
    assert preempted["preemptionSummary"]["preemptedAttemptCount"] == 1
    assert preempted["statusReason"].startswith("Preempted (cross-share)")
    assert batch.describe_service_job(jobId=own)["status"] == "RUNNING"
