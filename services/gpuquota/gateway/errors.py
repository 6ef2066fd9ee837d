"""The two errors of the AWS Batch API, as exceptions the gateway turns into responses."""

from __future__ import annotations


class ApiError(Exception):
    status = 500
    code = "ServerException"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = {}
        """Response headers besides the error type (``Retry-After``)."""


class ClientException(ApiError):
    """HTTP 400, ``x-amzn-ErrorType: ClientException``: the request is wrong or not allowed now."""

    status = 400
    code = "ClientException"


class ServerException(ApiError):
    """HTTP 500, ``x-amzn-ErrorType: ServerException``: our fault."""


class ServiceUnavailable(ServerException):
    """HTTP 503, ``x-amzn-ErrorType: ServerException``: a dependency cannot take the request now (the
    event log cannot be written, ...); nothing was done, and the same request may be retried (boto3's
    retry modes retry a 503)."""

    status = 503


class TooManyRequests(ApiError):
    """HTTP 429, ``x-amzn-ErrorType: TooManyRequestsException`` with ``Retry-After``: admission control
    refused the request before doing anything; boto3 counts the code as throttling and retries it
    with back-off."""

    status = 429
    code = "TooManyRequestsException"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.headers["Retry-After"] = str(retry_after)
