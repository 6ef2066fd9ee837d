"""``python -m gpuquota``: the ``gpuquota`` command line (``gpuquota.entrypoints.cli``)."""

from gpuquota.entrypoints.cli import main

raise SystemExit(main())
