"""Clients of a running gpuquota: ``events``, the Kafka event client for training platforms
(interface I4, docs/events.md).
"""
