"""A node agent's S3 (``GPUQUOTA_S3_*``): where the jobs' channels, checkpoints and artifacts are."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from gpuquota.config.environ import SettingsError, env_var, read_secret


class S3Settings(BaseModel):
    """A node agent's S3 (``GPUQUOTA_S3_*``): ``gpuquota node-agent`` and ``gpuquota up`` read them.

    ``gpuquota.node_agent.s3_transfer.S3Config`` is what the agent takes (:meth:`s3_secret`)."""

    # pydantic-settings' kind of config: NodeAgentSettings is both these fields and an EnvSettings
    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(frozen=True, extra="forbid")

    s3_endpoint_url: Annotated[str, Field(pattern=r"^(https?://[^\s/]+/?)?$")] = ""
    s3_region: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,64}$")] = "us-east-1"
    s3_access_key_id: str = ""
    s3_secret_access_key: SecretStr | None = None
    s3_secret_access_key_file: Path | None = Field(None, validate_default=True)
    s3_checkpoint_seconds: Annotated[float, Field(ge=0, le=86400)] = 30.0

    @classmethod
    def s3_from_env(cls, environ: Mapping[str, str]) -> S3Settings:
        """Only the ``GPUQUOTA_S3_*`` variables of ``environ`` (``gpuquota up``); raises SettingsError."""
        raw = {name: environ[env_var(name)] for name in S3Settings.model_fields if env_var(name) in environ}
        try:
            return S3Settings.model_validate(raw)
        except ValidationError as exc:
            problems = {env_var(str(e["loc"][0])) if e["loc"] else "S3": e["msg"] for e in exc.errors()}
            raise SettingsError(problems) from None

    @field_validator("s3_secret_access_key_file")
    @classmethod
    def _check_s3_secret_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None:
            if info.data.get("s3_secret_access_key") is not None:
                raise ValueError("set GPUQUOTA_S3_SECRET_ACCESS_KEY or this file, not both")
            read_secret(value)  # fail at start-up, not at the first upload
        return value

    def s3_secret(self) -> str | None:
        """The secret key; its file is read now (a rotated secret is picked up at the next start)."""
        if self.s3_secret_access_key_file is not None:
            return read_secret(self.s3_secret_access_key_file)
        return None if self.s3_secret_access_key is None else self.s3_secret_access_key.get_secret_value()
