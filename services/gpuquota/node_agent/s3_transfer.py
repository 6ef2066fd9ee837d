"""S3 as a node agent sees it: one boto3 client per agent, transfers on worker threads.

Theory of operation
-------------------
A node agent reads and writes S3 through boto3 against any S3-compatible endpoint (AWS S3, MinIO,
Ceph RGW, S3Proxy): an :class:`S3Config` names the endpoint, region and key pair. Every call here is
blocking and runs on a worker thread (``asyncio.to_thread`` in ``s3_stage``): a download of a few
gigabytes must not stall the agent's heartbeats. boto3's clients are thread-safe once made, so the
:class:`S3Store` makes one, lazily, under a lock, and shares it.

Terms:

- **object URI**: ``s3://bucket/key``; a **prefix URI** names every object whose key starts with it.
- **relative path**: where an object lands under a local directory: its key less the prefix (less
  the prefix's parent when the prefix ends inside a name, as ``s3://b/train`` matches
  ``train-2/x``); a key that would land outside the directory (``..``) is refused.
- **transfer failure** (:class:`TransferFailed`): what went wrong, in words that end up in the
  attempt's ``statusReason`` (``s3_stage`` adds SageMaker's ``ClientError: ...`` prefixes).

Progress: every transfer is counted in :attr:`S3Store.moved` (bytes and seconds per direction, the
``gpuquota_agent_transfer_*`` metrics), logged when it ends, and logged every ``PROGRESS_SECONDS`` while it
runs. An upload logs ``uploading ... to s3://...`` before its first byte, so a test (or an operator)
sees that it began.

A multipart upload that an agent did not finish (it was killed) leaves parts that no reader sees:
an object appears only when its upload completes, whole. :meth:`S3Store.abort_incomplete` drops
those parts before the upload is done again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 5.0
"""A transfer longer than this logs its progress this often."""
MULTIPART_BYTES = 8 * 1024 * 1024
"""Files from this size up are uploaded in parts (boto3's default threshold)."""


class TransferFailed(Exception):
    """A download or upload failed; the message says which object and why."""


@dataclass(frozen=True)
class S3Config:
    """Where a node agent's S3 is (``GPUQUOTA_S3_*`` settings)."""

    endpoint_url: str
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    checkpoint_seconds: float = 30.0
    """How often a running attempt's checkpoint directory is uploaded (``CheckpointConfig.S3Uri``)."""


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key); :class:`TransferFailed` for anything else."""
    if not uri.startswith("s3://"):
        raise TransferFailed(f"{uri} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise TransferFailed(f"{uri} names no bucket")
    return bucket, key


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join_uri(base: str, *parts: str) -> str:
    """``s3://b/out`` + ``job``, ``output`` -> ``s3://b/out/job/output`` (one ``/`` between)."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def relative_path(prefix: str, key: str) -> PurePosixPath:
    """Where ``key`` lands under a directory for ``prefix`` (module doc: relative path)."""
    if key == prefix:
        rel = PurePosixPath(key).name
    elif prefix == "" or prefix.endswith("/") or key[len(prefix)] == "/":
        rel = key[len(prefix) :].lstrip("/")
    else:  # the prefix ends inside a name: keep the names below its parent
        parent = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        rel = key[len(parent) :]
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts:
        raise TransferFailed(f"object {key} would land outside the channel directory")
    return path


def describe_error(exc: BaseException) -> str:
    """botocore's errors as a short text: ``NoSuchKey (404): The specified key does not exist.``"""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        error = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = error.get("Code") or "Error"
        message = error.get("Message") or ""
        return f"{code} ({status}): {message}".rstrip(": ")
    return str(exc) or type(exc).__name__


class _Progress:
    """boto3's transfer callback: counts bytes, logs every ``PROGRESS_SECONDS``."""

    def __init__(self, what: str, total: int | None) -> None:
        self.what, self.total, self.done = what, total, 0
        self.started = self.last = time.monotonic()
        self._lock = threading.Lock()  # boto3 calls back from its own threads

    def __call__(self, amount: int) -> None:
        with self._lock:
            self.done += amount
            now = time.monotonic()
            if now - self.last >= PROGRESS_SECONDS:
                self.last = now
                total = f" of {self.total}" if self.total is not None else ""
                log.info("%s: %d%s bytes in %.1f s", self.what, self.done, total, now - self.started)


class S3Store:
    """One agent's S3: blocking calls, for worker threads."""

    def __init__(self, config: S3Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._client: Any = None
        self.moved: dict[str, list[float]] = {"download": [0, 0.0], "upload": [0, 0.0]}
        """Bytes and seconds so far, per direction (metrics)."""

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                cfg = self.config
                self._client = boto3.session.Session().client(
                    "s3",
                    endpoint_url=cfg.endpoint_url,
                    region_name=cfg.region,
                    aws_access_key_id=cfg.access_key_id,
                    aws_secret_access_key=cfg.secret_access_key,
                    config=Config(
                        s3={"addressing_style": "path"},
                        retries={"max_attempts": 4, "mode": "standard"},
                        connect_timeout=10,
                        read_timeout=60,
                        # S3-compatible servers do not all know boto3's newer checksum headers
                        request_checksum_calculation="when_required",
                        response_checksum_validation="when_required",
                    ),
                )
            return self._client

    def _count(self, direction: str, size: int, started: float) -> None:
        with self._lock:
            self.moved[direction][0] += size
            self.moved[direction][1] += time.monotonic() - started

    # ----- reading --------------------------------------------------------------------------------

    def list_prefix(self, uri: str) -> list[tuple[str, int]]:
        """(key, size) of every object under a prefix URI, directory markers left out."""
        bucket, prefix = split_uri(uri)
        found: list[tuple[str, int]] = []
        try:
            pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):
                        found.append((item["Key"], int(item["Size"])))
        except Exception as exc:
            raise TransferFailed(f"Could not list {uri}: {describe_error(exc)}") from None
        return found

    def download(self, bucket: str, key: str, dest: Path, size: int | None = None) -> int:
        """One object into ``dest`` (written beside it, then renamed: never half a file)."""
        uri = f"s3://{bucket}/{key}"
        started = time.monotonic()
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".gpuquota-part")
        try:
            self.client().download_file(bucket, key, str(part), Callback=_Progress(f"download {uri}", size))
            os.replace(part, dest)
        except Exception as exc:
            part.unlink(missing_ok=True)
            raise TransferFailed(f"Could not download {uri}: {describe_error(exc)}") from None
        got = dest.stat().st_size
        self._count("download", got, started)
        return got

    def download_prefix(self, uri: str, dest: Path, *, required: bool = True) -> tuple[int, int]:
        """Every object under ``uri`` into ``dest``; (objects, bytes). ``required``: none is a failure."""
        bucket, prefix = split_uri(uri)
        objects = self.list_prefix(uri)
        if not objects and required:
            raise TransferFailed(f'No S3 objects found under S3 URL "{uri}"')
        total = 0
        for key, size in objects:
            total += self.download(bucket, key, dest / relative_path(prefix, key), size)
        return len(objects), total

    def download_manifest(self, uri: str, dest: Path) -> tuple[int, int]:
        """A ``ManifestFile`` channel: ``[{"prefix": "s3://b/p/"}, "rel/a", ...]``; each object lands at
        its relative name."""
        bucket, key = split_uri(uri)
        try:
            body = self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
            doc = json.loads(body)
        except ValueError:
            raise TransferFailed(f"Manifest file {uri} is not valid JSON") from None
        except Exception as exc:
            raise TransferFailed(f"Could not download {uri}: {describe_error(exc)}") from None
        if (
            not isinstance(doc, list)
            or not doc
            or not isinstance(doc[0], dict)
            or not isinstance(doc[0].get("prefix"), str)
            or not all(isinstance(p, str) for p in doc[1:])
        ):
            raise TransferFailed(f'Manifest file {uri} must be [{{"prefix": "s3://..."}}, "name", ...]')
        base_bucket, base = split_uri(doc[0]["prefix"])
        total = 0
        for rel in doc[1:]:
            path = relative_path("", rel)
            total += self.download(base_bucket, base + rel, dest / path)
        return len(doc) - 1, total

    # ----- writing --------------------------------------------------------------------------------

    def upload(self, path: Path, uri: str) -> int:
        """One file to an object URI (in parts from ``MULTIPART_BYTES`` up); its size."""
        from boto3.s3.transfer import TransferConfig

        bucket, key = split_uri(uri)
        size = path.stat().st_size
        started = time.monotonic()
        log.info("uploading %s (%d bytes) to %s", path.name, size, uri)
        try:
            self.client().upload_file(
                str(path),
                bucket,
                key,
                Config=TransferConfig(multipart_threshold=MULTIPART_BYTES),
                Callback=_Progress(f"upload {uri}", size),
            )
        except Exception as exc:
            raise TransferFailed(f"Could not upload {path.name} to {uri}: {describe_error(exc)}") from None
        self._count("upload", size, started)
        seconds = time.monotonic() - started
        log.info("uploaded %s (%d bytes) to %s in %.2f s", path.name, size, uri, seconds)
        return size

    def abort_incomplete(self, uri: str) -> int:
        """Drops the parts of unfinished multipart uploads of ``uri`` (best effort); how many."""
        bucket, key = split_uri(uri)
        aborted = 0
        try:
            client = self.client()
            listed = client.list_multipart_uploads(Bucket=bucket, Prefix=key)
            for upload in listed.get("Uploads", []):
                if upload.get("Key") == key:
                    client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
                    aborted += 1
        except Exception as exc:  # a server without the listing: the parts stay unseen
            log.info("could not list unfinished uploads of %s: %s", uri, describe_error(exc))
        if aborted:
            log.warning("aborted %d unfinished upload(s) of %s", aborted, uri)
        return aborted

    def sync_up(self, local: Path, uri: str, seen: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """Uploads the files of ``local`` that changed since ``seen`` (relative name: size, mtime),
        which it updates; (files, bytes). Files deleted locally stay in S3."""
        files = total = 0
        for path in sorted(
            p for p in local.rglob("*") if p.is_file() and not p.name.endswith(".gpuquota-part")
        ):
            rel = path.relative_to(local).as_posix()
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # removed while we walked
            stamp = (st.st_size, st.st_mtime_ns)
            if seen.get(rel) == stamp:
                continue
            total += self.upload(path, join_uri(uri, rel))
            seen[rel] = stamp
            files += 1
        return files, total
