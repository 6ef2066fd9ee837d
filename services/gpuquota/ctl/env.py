"""``gpuquota env``: the shell set-up of boto3 and the SageMaker SDK for one stack (interface I10).

Theory of operation
-------------------
``eval "$(gpuquota env)"`` is the whole set-up: afterwards the SageMaker SDK's unchanged code (the
blog's ``ModelTrainer`` and ``TrainingQueue``) and any boto3 client reach this stack. The command asks
the gateway (``GET /gpuquota/v1/env``) what it cannot know itself, the account, region, S3 endpoint
and whether requests must be signed, and prints, for a POSIX shell:

- **endpoints**: ``AWS_ENDPOINT_URL_BATCH``, ``_STS`` and ``_IAM`` (the gateway answers the SDK's
  identity calls: ``gpuquota.gateway.identity``) and ``AWS_ENDPOINT_URL_S3`` (the stack's S3 server,
  when it names one); boto3 reads a service's own endpoint variable before anything else but an
  explicit ``endpoint_url``;
- **region**: ``AWS_DEFAULT_REGION`` and ``AWS_REGION`` (botocore reads the first, other SDKs the
  second), the region of the stack's ARNs;
- **keys** (the *key rule*): with authentication off, any key is accepted, so the key printed is
  the one S3 needs: the key pair of the S3 server the stack runs itself (``gpuquota up --s3 local``,
  which the gateway reports then only), else the dummy key ``gpuquota``/``gpuquota``. With it on,
  the keys are the user's and are never printed (an S3 server must then take the same key): the
  command keeps what the environment has (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or a profile),
  checks it with STS and says in a comment whom it signs as, or tells on stderr which variables to
  set;
- **the SageMaker SDK's defaults**: ``SAGEMAKER_VALIDATE_ROLE=false`` (gpuquota has no IAM policies
  to validate against) and ``SAGEMAKER_USER_CONFIG_OVERRIDE``, a config file this command writes
  that names the default bucket (``sagemaker-<region>-<account>``, the name the SDK would choose)
  and opts out of the SDK's telemetry. The file is needed because the SDK names its default bucket
  with an STS client of its own whose ``endpoint_url`` is AWS's regional one, which no variable
  can redirect;
- **unset** what would interfere: ``AWS_PROFILE`` (another profile's keys would sign) and
  ``AWS_SESSION_TOKEN``/``AWS_SECURITY_TOKEN`` (temporary credentials, which gpuquota does not
  accept), ``AWS_ENDPOINT_URL`` (everything else would go to it), ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``
  (it turns the endpoint variables off);
- ``GPUQUOTA_ENDPOINT``, so the ``gpuquota`` commands talk to the same stack.

Nothing is printed on stdout when the gateway cannot be asked (the ``eval`` then changes nothing);
the reason goes to stderr and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuquota.ctl.api import Api, CliError, default_endpoint

DUMMY_KEY = "gpuquota"
"""The key printed for a stack without authentication (any key is accepted)."""
INTERFERING = (
    "AWS_ENDPOINT_URL",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
)
"""Always unset; ``AWS_PROFILE`` too unless it holds the user's key for a stack with authentication."""
CONFIG_NAME = "sagemaker-{account}-{region}.yaml"


def configure_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        default=argparse.SUPPRESS,
        help="gateway URL (default $GPUQUOTA_ENDPOINT or http://127.0.0.1:8642)",
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="where to write the SageMaker SDK's config file (default $XDG_CONFIG_HOME/gpuquota or "
        "~/.config/gpuquota)",
    )


def run_env(args: argparse.Namespace) -> int:
    endpoint = getattr(args, "endpoint", None) or default_endpoint()
    try:
        api = Api(endpoint)
        stack = api.get("/gpuquota/v1/env")
        lines = env_lines(api.endpoint, stack, os.environ, config_dir(args.config_dir), whoami(api, stack))
    except CliError as exc:
        print(f"gpuquota env: {exc}", file=sys.stderr)
        if "authorized" in str(exc) or "signature" in str(exc).lower() or "token" in str(exc).lower():
            print(f"gpuquota env: {KEYS_HINT}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


KEYS_HINT = (
    "authentication is on: export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (a key of the gateway's "
    'keys file, docs/authentication.md) and run `eval "$(gpuquota env)"` again'
)


def config_dir(given: Path | None) -> Path:
    if given is not None:
        return given
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuquota"


def whoami(api: Api, stack: Mapping[str, Any]) -> str | None:
    """The caller ARN the environment's key signs as (stacks with authentication), else ``None``."""
    if not stack.get("authentication"):
        return None
    import boto3
    from botocore.config import Config

    sts = boto3.client(
        "sts",
        endpoint_url=api.endpoint,
        region_name=str(stack["region"]),
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=30),
    )
    with api.errors():
        return str(sts.get_caller_identity()["Arn"])


def sagemaker_config(bucket: str) -> str:
    """The SageMaker SDK's config file (its intelligent-defaults schema) for this stack."""
    return (
        "# written by `gpuquota env`: the SageMaker Python SDK's defaults for a gpuquota stack\n"
        'SchemaVersion: "1.0"\n'
        "SageMaker:\n"
        "  PythonSDK:\n"
        "    Modules:\n"
        "      TelemetryOptOut: true\n"
        "      Session:\n"
        f"        DefaultS3Bucket: {bucket}\n"
    )


def write_config(directory: Path, stack: Mapping[str, Any]) -> Path:
    """The config file, written (atomically, only when its text changes) under ``directory``."""
    path = directory / CONFIG_NAME.format(account=stack["account"], region=stack["region"])
    text = sagemaker_config(str(stack["defaultBucket"]))
    try:
        if path.exists() and path.read_text(encoding="utf-8") == text:
            return path
        directory.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(text, encoding="utf-8")
        scratch.replace(path)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def env_lines(
    endpoint: str,
    stack: Mapping[str, Any],
    environ: Mapping[str, str],
    directory: Path,
    caller: str | None,
) -> list[str]:
    """The lines to ``eval``: comments, ``export NAME=value`` and one ``unset``."""
    region = str(stack["region"])
    s3 = (stack.get("endpoints") or {}).get("s3")
    exports: dict[str, str] = {
        "AWS_ENDPOINT_URL_BATCH": endpoint,
        "AWS_ENDPOINT_URL_STS": endpoint,
        "AWS_ENDPOINT_URL_IAM": endpoint,
    }
    comments = [f'# gpuquota at {endpoint}: eval "$(gpuquota env)" sets up boto3 and the SageMaker SDK']
    if s3:
        exports["AWS_ENDPOINT_URL_S3"] = str(s3)
    else:
        comments.append("# this stack names no S3 endpoint (gpuquota up --s3 local|URL): S3 stays AWS's")
    exports |= {"AWS_DEFAULT_REGION": region, "AWS_REGION": region}
    unset = list(INTERFERING)
    if stack.get("authentication"):
        comments.append(f"# authentication is on: your own key signs, as {caller}")
        if "AWS_ACCESS_KEY_ID" in environ:
            unset.append("AWS_PROFILE")  # the environment's key is the one that was checked
    else:
        key = stack.get("s3Key") or {}
        access, secret = key.get("accessKeyId", DUMMY_KEY), key.get("secretAccessKey", DUMMY_KEY)
        if key:
            comments.append(
                "# the key of the stack's own S3 server (gpuquota up --s3 local); the gateway takes any"
            )
        exports |= {"AWS_ACCESS_KEY_ID": str(access), "AWS_SECRET_ACCESS_KEY": str(secret)}
        unset.append("AWS_PROFILE")
    exports |= {
        "SAGEMAKER_VALIDATE_ROLE": "false",
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(write_config(directory, stack)),
        "GPUQUOTA_ENDPOINT": endpoint,
    }
    return [
        *comments,
        *(f"export {name}={shlex.quote(value)}" for name, value in exports.items()),
        "unset " + " ".join(unset),
    ]
