"""The pytest plugin's defaults, shared by the plugin (``gpuquota.testing``) and
``GpuquotaContainer`` (``gpuquota.testing.container``, which the plugin imports lazily: it needs
testcontainers).
"""

DEFAULT_NODES = "ml.g5.xlarge=3"
DEFAULT_IMAGE = "gpuquota:dev"
CONTAINER_PORT = 8642
REGION = "us-east-1"
