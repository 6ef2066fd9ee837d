"""gpuquota: a self-hosted GPU job scheduler with AWS Batch-style quota shares."""

from gpuquota.native import loader as _native

__version__ = "0.1.0"

_native.install()  # before anything imports gpuquota.core: its compiled build, when current
