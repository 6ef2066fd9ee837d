"""The seed's SageMaker SDK code (shared/seeds, the AWS blog post), unchanged but for INSTANCE_COUNT
(defined in the blog's notebook) and the notebook's utils helpers (await_jobs), replaced by a poll.
Run by tests/gateway/test_blog_sdk.py after eval "$(gpuquota env)"."""
# ruff: noqa
# mypy: ignore-errors
import logging, time
logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
logging.getLogger("botocore.client").setLevel(level=logging.WARN)
logger = logging.getLogger(__name__)
INSTANCE_TYPE = "ml.g5.xlarge"; INSTANCE_COUNT = 1; JOB_QUEUE_NAME = "my-sm-training-qm-jq"
from sagemaker.core.helper.session_helper import Session
from sagemaker.core import image_uris
session = Session()
image_uri = image_uris.retrieve(framework="pytorch", region=session.boto_session.region_name, version="2.5", instance_type=INSTANCE_TYPE, image_scope="training")
from sagemaker.train.model_trainer import ModelTrainer
from sagemaker.train.configs import SourceCode, Compute, StoppingCondition
TRAINING_JOB_NAME = "hello-world-simple-job"
MAX_RUN_TIME = 300
source_code = SourceCode(command="echo 'Hello World'")
model_trainer = ModelTrainer(training_image=image_uri, source_code=source_code, base_job_name=TRAINING_JOB_NAME,
    compute=Compute(instance_type=INSTANCE_TYPE, instance_count=INSTANCE_COUNT),
    stopping_condition=StoppingCondition(max_runtime_in_seconds=MAX_RUN_TIME))
from sagemaker.train.aws_batch.training_queue import TrainingQueue, TrainingQueuedJob
queue = TrainingQueue(JOB_QUEUE_NAME)
logger.info(f"Using queue: {queue.queue_name}")
DISPATCHED = {"SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"}
def await_jobs(pairs, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = {j.job_name: j.describe()["status"] for js, _ in pairs for j in js}
        if all(st[j.job_name] in want for js, want in pairs for j in js):
            print("  states:", st); return
        time.sleep(0.5)
    raise AssertionError(f"not reached: {st}")
qs1_job_high = queue.submit(job_name="qs1_job_high", training_job=model_trainer, quota_share_name="QS1", priority=3, inputs=None)
qs1_job_med = queue.submit(job_name="qs1_job_med", training_job=model_trainer, quota_share_name="QS1", priority=2, inputs=None)
qs1_job_low = queue.submit(job_name="qs1_job_low", training_job=model_trainer, quota_share_name="QS1", priority=1, inputs=None)
logger.info(f"Submitted jobs: {qs1_job_high.job_name}, {qs1_job_med.job_name}, {qs1_job_low.job_name}")
await_jobs([([qs1_job_high, qs1_job_med], DISPATCHED)])
qs2_job_1 = queue.submit(job_name="qs2_job_1", training_job=model_trainer, quota_share_name="QS2", priority=1, inputs=None)
logger.info(f"Submitted job {qs2_job_1.job_name}")
await_jobs([([qs2_job_1], DISPATCHED), ([qs1_job_med], {"RUNNABLE"})])
qs1_job_low.update(scheduling_priority=4)
logger.info(f"Updated job {qs1_job_low.job_name} to increase its priority")
await_jobs([([qs1_job_low], DISPATCHED), ([qs1_job_high], {"RUNNABLE"})])
import boto3
keys = boto3.client("s3").list_objects_v2(Bucket=session.default_bucket()).get("KeyCount")
print("objects uploaded to", session.default_bucket(), ":", keys)
