"""gpuquota extensions carried by AWS tags: gpuquota:backfill (policies), gpuquota:pool (SEs)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.gateway.helpers import G5


def wait_policy(stack: Any, name: str) -> Any:
    from tests.gateway.conftest import wait_for

    return wait_for(lambda: stack.state.policies.get(name))


def test_backfill_tag_turns_backfill_on_and_off(stack: Any, batch: Any) -> None:
    batch.create_scheduling_policy(
        name="bf",
        quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"},
        tags={"gpuquota:backfill": "true"},
    )
    assert wait_policy(stack, "bf").backfill is True
    arn = "arn:aws:batch:us-east-1:000000000000:scheduling-policy/bf"
    batch.tag_resource(resourceArn=arn, tags={"gpuquota:backfill": "false"})
    from tests.gateway.conftest import wait_for

    wait_for(lambda: stack.state.policies["bf"].backfill is False)


def test_backfill_tag_must_be_a_boolean(batch: Any) -> None:
    with pytest.raises(ClientError) as info:
        batch.create_scheduling_policy(
            name="bad",
            quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"},
            tags={"gpuquota:backfill": "yes"},
        )
    assert "gpuquota:backfill must be true or false" in str(info.value)


def test_pool_tag_must_name_the_gateways_pool(stack: Any, batch: Any) -> None:
    limits = [{"capacityUnit": G5, "maxCapacity": 3}]
    with pytest.raises(ClientError) as info:
        batch.create_service_environment(
            serviceEnvironmentName="elsewhere",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=limits,
            tags={"gpuquota:pool": "other-pool"},
        )
    assert "needs a gateway of that pool" in str(info.value)
    batch.create_service_environment(
        serviceEnvironmentName="here",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=limits,
        tags={"gpuquota:pool": stack.pool},
    )
