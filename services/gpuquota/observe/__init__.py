"""The operator's side (interface I7): Prometheus metrics, health checks, logs and the start-up checks.

* ``metrics``: the metric families, computed at scrape time from the read model and the core's state
  (custom collectors), plus the few histograms measured on the way (see docs/operations.md).
* ``health``: ``/health/live`` and ``/health/ready`` and the small HTTP server of the scheduler and node
  agents (``--metrics-port``).
* ``logs``: text (with timestamps) or JSON logging (``GPUQUOTA_LOG_FORMAT``).
* ``startup``: unknown ``GPUQUOTA_*`` variables and unreachable dependencies at start-up.
"""
