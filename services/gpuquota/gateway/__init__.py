"""The AWS Batch-compatible HTTP gateway (interface I2)."""

from gpuquota.gateway.app import Gateway
from gpuquota.gateway.errors import ClientException, ServerException
from gpuquota.gateway.ports import CommandPort, CommandRejected, EmbeddedCommandPort

__all__ = [
    "ClientException",
    "CommandPort",
    "CommandRejected",
    "EmbeddedCommandPort",
    "Gateway",
    "ServerException",
]
