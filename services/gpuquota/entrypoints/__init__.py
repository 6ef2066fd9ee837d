"""The entry points: the ``gpuquota`` command line and the assemblies that wire services into processes.

``cli`` dispatches the subcommands; ``embedded`` assembles ``gpuquota up`` (one process: shell, gateway,
node agents), ``distributed`` the Kafka/PostgreSQL services (``gpuquota gateway``, ``scheduler``, ``up
--kafka``), ``node_agent`` ``gpuquota node-agent``. Nothing below this layer imports it
(``pyproject.toml``: the import-linter layers contract).

Also here: ``demo_stack`` (the embedded stack ``gpuquota demo`` drives), ``metrics_port`` (the
scheduler's and node agents' ``--metrics-port``) and the tools run with ``python -m``:
``build_native`` (the mypyc build), ``docs_config`` and ``helpdoc`` (the doc generators).
"""
