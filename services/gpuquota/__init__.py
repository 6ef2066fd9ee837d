"""gpuquota: a self-hosted GPU job scheduler with AWS Batch-style quota shares."""

__version__ = "0.1.0"
