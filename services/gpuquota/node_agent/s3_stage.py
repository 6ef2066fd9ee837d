"""SageMaker's training contract, its S3 half: what a node agent downloads before an attempt and
uploads after it (I6, I10).

Theory of operation
-------------------
Three moments of an attempt touch S3, each on worker threads (``asyncio.to_thread``), never the loop:

1. **Stage in** (:meth:`DataPlane.stage_in`, before the launch): each ``S3DataSource`` channel is
   downloaded into the attempt's **channel directory**, ``<attempt dir>/input/data/<channel>/``
   (bound read-write to ``/opt/ml/input/data/<channel>`` in a container, named by
   ``SM_CHANNEL_<NAME>`` for a process). ``S3Prefix`` takes every object under the URI,
   ``ManifestFile`` the objects its manifest lists; ``File`` and ``FastFile`` modes are both served
   as File; ``Pipe`` is refused. Then the job's checkpoint directory is **restored** from
   ``CheckpointConfig.S3Uri``: what S3 holds is written over what the node holds, so an attempt on
   another node starts from the checkpoint the last one uploaded.
2. **While it runs** (:meth:`DataPlane.checkpoints`): every ``checkpoint_seconds`` the checkpoint
   directory's changed files are uploaded to ``CheckpointConfig.S3Uri``.
3. **Stage out** (:meth:`DataPlane.stage_out`, after the process is gone, SIGTERM included, and
   before the final report): the checkpoint directory once more; then, from the attempt's first
   instance (``algo-1``, wherever it runs), ``/opt/ml/model`` packed as ``model.tar.gz`` (a
   SUCCEEDED or STOPPED attempt) and ``/opt/ml/output/data`` as ``output.tar.gz`` (any attempt), to
   ``<S3OutputPath>/<TrainingJobName>/output/``. ``/opt/ml/output/failure`` stays the reason.

Failures become the attempt's ``statusReason`` in SageMaker's words, prefixed as AWS Batch shows a
SageMaker job's (``Received status from SageMaker: ClientError: Data download failed:...``). A
download failure fails the attempt at launch; an upload failure fails a SUCCEEDED attempt and is
added to the reason of a STOPPED one. Either is a FAILED attempt, which counts against the job's
retries as any failure does (``retryStrategy``, ``evaluateOnExit`` may match the text).

Exactly once: the final report is recorded only after stage out, so an agent killed during an
upload leaves the attempt unreported; the agent that restarts adopts it (its exit status is on
disk), and stage out runs again. Each artifact that reached S3 is noted in the attempt's **upload
record** (``<attempt dir>/s3-uploads.json``) right after its upload completed; stage out skips what
it holds, and aborts the parts of an upload the dead agent left unfinished before it uploads again.
An object appears in S3 only when its upload completes, so each artifact is there once, whole, or
the attempt's reason says why not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import tarfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

from gpuquota.config.s3 import S3Settings
from gpuquota.node_agent.instances import attempt_root, host_name
from gpuquota.node_agent.launch import LaunchError, LaunchSpec
from gpuquota.node_agent.outcomes import FinalStatus
from gpuquota.node_agent.payload import BadPayload, InputChannel, TrainingRequest, parse_payload
from gpuquota.node_agent.prepare import checkpoint_dir
from gpuquota.node_agent.s3_transfer import S3Config, S3Store, TransferFailed, is_s3, join_uri, split_uri
from gpuquota.wire.node_commands import RunAttempt

log = logging.getLogger(__name__)

UPLOAD_RECORD = "s3-uploads.json"
_SAGEMAKER = "Received status from SageMaker: "
_SERVED_MODES = ("File", "FastFile")


def client_error(detail: str) -> str:
    """A SageMaker ``ClientError`` as AWS Batch reports it (beside ``lifecycle.algorithm_error``)."""
    return f"{_SAGEMAKER}ClientError: {detail}"


def channel_dir(work_dir: Path, attempt_id: str, channel: str) -> Path:
    """Where an S3 channel of the attempt is downloaded (module doc: channel directory)."""
    return attempt_root(work_dir, attempt_id) / "input" / "data" / channel


def channel_env(names: list[str], dirs: list[Path]) -> dict[str, str]:
    """``SM_CHANNELS`` and ``SM_CHANNEL_<NAME>`` of a process (a container's are its own paths)."""
    env = {"SM_CHANNELS": json.dumps(names)}
    env |= {
        "SM_CHANNEL_" + re.sub(r"[^A-Z0-9_]", "_", n.upper()): str(d)
        for n, d in zip(names, dirs, strict=True)
    }
    return env


def job_name(cmd: RunAttempt, request: TrainingRequest) -> str:
    """The training job's name in the S3 layout: the payload's ``TrainingJobName``, else the job's."""
    return request.training_job_name or cmd.job_name


@dataclass(frozen=True)
class Artifact:
    """One tarball of stage out: its name, the directory it packs and where it goes."""

    name: str
    source: Path
    uri: str


class DataPlane:
    """A node agent's S3 half of the contract; ``store`` None: no S3 (outputs stay on the node)."""

    def __init__(self, store: S3Store | None, checkpoint_seconds: float = 30.0) -> None:
        self.store = store
        self.checkpoint_seconds = checkpoint_seconds
        self.uploaded: dict[str, int] = {}
        """S12: per running attempt, the newest mtime (epoch ms) of what its last upload carried."""

    # ----- stage in -------------------------------------------------------------------------------

    async def stage_in(self, spec: LaunchSpec) -> LaunchSpec:
        """Downloads the channels and restores the checkpoints; the spec with the channels' variables.
        Raises :class:`LaunchError` (the attempt's reason)."""
        request = spec.request
        names, dirs = [], []
        for channel in request.channels:
            path = await self._channel(spec, channel)
            if path is not None:
                names.append(channel.name)
                dirs.append(path)
        if self.store is not None and request.checkpoint_uri:
            await self._restore(spec.env["SM_CHECKPOINT_DIR"], request.checkpoint_uri)
        if not names:
            return spec
        return replace(spec, env={**spec.env, **channel_env(names, dirs)})

    async def _channel(self, spec: LaunchSpec, channel: InputChannel) -> Path | None:
        """The channel's directory on the node (None: an S3 channel on a node without S3)."""
        if not is_s3(channel.uri):
            return Path(unquote(urlparse(channel.uri).path))  # a node path (the container checks it)
        if self.store is None:
            return None
        if channel.input_mode not in _SERVED_MODES:
            raise LaunchError(
                client_error(
                    f"Channel {channel.name}: TrainingInputMode {channel.input_mode} is not supported "
                    "by gpuquota's node agents; use File or FastFile (served as File)"
                )
            )
        dest = channel_dir(spec.cwd, spec.attempt_id, channel.name)
        started = time.monotonic()
        try:
            if channel.data_type == "ManifestFile":
                count, size = await asyncio.to_thread(self.store.download_manifest, channel.uri, dest)
            elif channel.data_type == "S3Prefix":
                count, size = await asyncio.to_thread(self.store.download_prefix, channel.uri, dest)
            else:
                raise TransferFailed(
                    f"S3DataType {channel.data_type} is not supported (S3Prefix, ManifestFile)"
                )
        except TransferFailed as exc:
            raise LaunchError(client_error(self._download_text(channel, spec.request, exc))) from None
        log.info(
            "channel %s: %d objects, %d bytes from %s in %.2f s",
            channel.name,
            count,
            size,
            channel.uri,
            time.monotonic() - started,
        )
        dest.mkdir(parents=True, exist_ok=True)
        return dest

    def _download_text(self, channel: InputChannel, request: TrainingRequest, exc: TransferFailed) -> str:
        text = str(exc)
        if not text.startswith("No S3 objects found"):
            return f"Data download failed:{text}"
        bucket, _ = split_uri(channel.uri)
        region = self.store.config.region if self.store is not None else "us-east-1"
        role = f' and that the role "{request.role_arn}" has' if request.role_arn else " and that you have"
        return (
            f"{text} given in input data source. Please ensure that the bucket exists in the selected "
            f'region ({region}), that objects exist under that S3 prefix,{role} "s3:ListBucket" '
            f'permissions on bucket "{bucket}".'
        )

    async def _restore(self, local: str, uri: str) -> None:
        assert self.store is not None
        started = time.monotonic()
        try:
            count, size = await asyncio.to_thread(
                self.store.download_prefix, uri, Path(local), required=False
            )
        except TransferFailed as exc:
            raise LaunchError(client_error(f"Data download failed:checkpoints: {exc}")) from None
        log.info(
            "checkpoints: %d objects, %d bytes restored from %s in %.2f s",
            count,
            size,
            uri,
            time.monotonic() - started,
        )

    # ----- while it runs --------------------------------------------------------------------------

    def checkpoints(self, cmd: RunAttempt, work_dir: Path, contained: bool) -> asyncio.Task[None] | None:
        """The task that uploads the checkpoint directory every ``checkpoint_seconds`` (None: nothing
        to upload); cancel it when the process is gone (stage out uploads once more)."""
        uri = _request(cmd).checkpoint_uri
        if self.store is None or not uri or self.checkpoint_seconds <= 0:
            return None
        local = checkpoint_dir(cmd, work_dir, contained=contained)
        if local is None:
            return None
        task = self._sync_loop(local, uri, cmd.attempt_id)
        return asyncio.create_task(task, name=f"checkpoints-{cmd.attempt_id}")

    async def _sync_loop(self, local: Path, uri: str, attempt_id: str) -> None:
        seen: dict[str, tuple[int, int]] = {}
        try:
            while True:
                await asyncio.sleep(self.checkpoint_seconds)  # the upload period
                try:
                    await self._sync(local, uri, seen)
                except TransferFailed as exc:  # the next period tries again; stage out reports it
                    period = self.checkpoint_seconds
                    log.warning("checkpoint upload failed (retried in %g s): %s", period, exc)
                    continue
                if seen:  # S12: the newest file S3 now holds is the checkpoint another node resumes from
                    self.uploaded[attempt_id] = max(mtime for _, mtime in seen.values()) // 1_000_000
        finally:
            self.uploaded.pop(attempt_id, None)

    async def _sync(self, local: Path, uri: str, seen: dict[str, tuple[int, int]]) -> None:
        assert self.store is not None
        started = time.monotonic()
        files, size = await asyncio.to_thread(self.store.sync_up, local, uri, seen)
        if files:
            log.info(
                "checkpoints: %d files, %d bytes to %s in %.2f s",
                files,
                size,
                uri,
                time.monotonic() - started,
            )

    # ----- stage out ------------------------------------------------------------------------------

    async def stage_out(
        self, cmd: RunAttempt, work_dir: Path, contained: bool, final: FinalStatus | None
    ) -> FinalStatus | None:
        """Uploads what the ended attempt leaves (module doc); ``final`` as it is, or with the upload
        failure in it. An attempt whose end is unknown (None) uploads nothing: it is lost."""
        if self.store is None or final is None:
            return final
        request = _request(cmd)
        failures: list[str] = []
        local = checkpoint_dir(cmd, work_dir, contained=contained) if request.checkpoint_uri else None
        if request.checkpoint_uri and local is not None:
            try:
                await self._sync(local, request.checkpoint_uri, {})
            except TransferFailed as exc:
                failures.append(f"checkpoints: {exc}")
        record = attempt_root(work_dir, cmd.attempt_id) / UPLOAD_RECORD
        for artifact in self._artifacts(cmd, request, work_dir, final[0]):
            try:
                await asyncio.to_thread(self._upload_once, artifact, record)
            except (TransferFailed, OSError) as exc:
                failures.append(str(exc))
        return _with_failures(final, failures)

    def _artifacts(
        self, cmd: RunAttempt, request: TrainingRequest, work_dir: Path, status: str
    ) -> list[Artifact]:
        """model.tar.gz and output.tar.gz of the attempt's first instance, when it ran on this node."""
        if not request.output_path:
            return []
        root = attempt_root(work_dir, cmd.attempt_id) / host_name(0)
        first = next((n.first_rank for n in cmd.gang if n.node_id == cmd.node_id), 0)
        if first != 0 or not root.is_dir():
            return []
        base = join_uri(request.output_path, job_name(cmd, request), "output")
        found = []
        if status in ("SUCCEEDED", "STOPPED"):
            found.append(Artifact("model.tar.gz", root / "model", join_uri(base, "model.tar.gz")))
        found.append(Artifact("output.tar.gz", root / "output" / "data", join_uri(base, "output.tar.gz")))
        return found

    def _upload_once(self, artifact: Artifact, record: Path) -> None:
        """Packs and uploads ``artifact`` unless the upload record has it; notes it there once done."""
        assert self.store is not None
        done = _read_record(record)
        if done.get(artifact.name) == artifact.uri:
            log.info("%s: already in %s (upload record)", artifact.name, artifact.uri)
            return
        self.store.abort_incomplete(artifact.uri)  # parts a killed agent left
        tarball = record.parent / artifact.name
        _pack(artifact.source, tarball)
        try:
            self.store.upload(tarball, artifact.uri)
        except TransferFailed as exc:
            raise TransferFailed(f"Artifact upload failed:{exc}") from None
        done[artifact.name] = artifact.uri
        _write_record(record, done)
        tarball.unlink(missing_ok=True)


def _request(cmd: RunAttempt) -> TrainingRequest:
    try:
        return parse_payload(cmd.payload)
    except BadPayload:
        return TrainingRequest()


def _with_failures(final: FinalStatus, failures: list[str]) -> FinalStatus:
    """A SUCCEEDED attempt whose uploads failed FAILED; a STOPPED one says so in its reason; a FAILED
    one keeps its own reason (the failure that came first)."""
    if not failures:
        return final
    status, reason, code = final
    text = "; ".join(failures)
    log.warning("attempt's uploads failed: %s", text)
    if status == "SUCCEEDED":
        return (
            "FAILED",
            client_error(text if text.startswith("Artifact") else f"Artifact upload failed:{text}"),
            code,
        )
    if status == "STOPPED":
        return status, f"{reason}; {client_error(text)}" if reason else client_error(text), code
    return final


def _pack(source: Path, tarball: Path) -> None:
    """``source``'s files as a gzipped tarball, names relative to it (``model.pth``, not ``./model.pth``)."""
    part = tarball.with_name(tarball.name + ".part")
    with tarfile.open(part, "w:gz", compresslevel=6) as tar:  # gzip's own default: 9 costs 2x
        if source.is_dir():
            for path in sorted(source.rglob("*")):
                tar.add(path, arcname=path.relative_to(source).as_posix(), recursive=False)
    part.replace(tarball)


def _read_record(path: Path) -> dict[str, str]:
    with contextlib.suppress(FileNotFoundError, ValueError):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict):
            return {str(k): str(v) for k, v in doc.items()}
    return {}


def _write_record(path: Path, done: dict[str, str]) -> None:
    """Atomically, and on disk before the final report is (a rename after an fsync)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as out:
        out.write(json.dumps(done, sort_keys=True))
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


def data_plane(settings: S3Settings) -> DataPlane:
    """The agent's data plane from its ``GPUQUOTA_S3_*`` settings: no endpoint, no S3."""
    if not settings.s3_endpoint_url:
        return DataPlane(None)
    config = S3Config(
        endpoint_url=settings.s3_endpoint_url,
        region=settings.s3_region,
        access_key_id=settings.s3_access_key_id or None,
        secret_access_key=settings.s3_secret(),
        checkpoint_seconds=settings.s3_checkpoint_seconds,
    )
    return DataPlane(S3Store(config), settings.s3_checkpoint_seconds)
