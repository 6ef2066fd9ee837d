"""The services' configuration: ``settings`` reads the ``GPUQUOTA_*`` environment variables into
typed settings. It sits below the services and the adapters, which read it.
"""
