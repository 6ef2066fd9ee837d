"""AWS-style ARNs of gpuquota's resources (region and account are configurable, defaults as in I2)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ArnFactory:
    region: str = "us-east-1"
    account: str = "000000000000"
    partition: str = "aws"

    @property
    def prefix(self) -> str:
        return f"arn:{self.partition}:batch:{self.region}:{self.account}:"

    def policy(self, name: str) -> str:
        return f"{self.prefix}scheduling-policy/{name}"

    def environment(self, name: str) -> str:
        return f"{self.prefix}service-environment/{name}"

    def queue(self, name: str) -> str:
        return f"{self.prefix}job-queue/{name}"

    def share(self, queue: str, name: str) -> str:
        return f"{self.queue(queue)}/quota-share/{name}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}service-job/{job_id}"

    def training_job(self, job_name: str, attempt_id: str) -> str:
        """The SageMaker-style ARN of one attempt: ``AWSBatch<jobName><32 hex>`` (hex from the attempt id)."""
        digest = hashlib.md5(attempt_id.encode(), usedforsecurity=False).hexdigest()
        prefix = f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:training-job/"
        return f"{prefix}AWSBatch{job_name}{digest}"

    def parse(self, arn: str) -> tuple[str, tuple[str, ...]] | None:
        """``(kind, names)`` of one of our ARNs (any region/account), else ``None``.

        Kinds: ``scheduling-policy``, ``service-environment``, ``job-queue``, ``quota-share``
        (names = queue, share) and ``service-job``.
        """
        parts = arn.split(":", 5)
        if len(parts) != 6 or parts[0] != "arn" or parts[2] != "batch":
            return None
        path = parts[5].split("/")
        if len(path) == 2 and path[0] in (
            "scheduling-policy",
            "service-environment",
            "job-queue",
            "service-job",
        ):
            return path[0], (path[1],)
        if len(path) == 4 and path[0] == "job-queue" and path[2] == "quota-share":
            return "quota-share", (path[1], path[3])
        return None
