"""How the settings of every gpuquota process are read: ``GPUQUOTA_*`` variables and secret files.

:class:`EnvSettings` is a pydantic-settings ``BaseSettings``. Every field ``foo`` of a subclass is read
from the variable ``GPUQUOTA_FOO`` of the mapping given to :meth:`~EnvSettings.from_env` (the
process's ``os.environ``, or a test's dict; nothing else is read), else from the file of that name
in the directory ``GPUQUOTA_SECRETS_DIR`` (pydantic-settings' ``secrets_dir``: a mounted Kubernetes
secret, Docker's ``/run/secrets``; the name matched in any case, surrounding whitespace dropped), else
it takes its default. A variable set in the environment wins over its file. ``<Class>.ENV_VARS`` is the
set of variables a class reads and ``<Class>.REQUIRED_ENV_VARS`` the ones without a default.
``from_env`` fails fast with :class:`SettingsError`, whose message names every offending variable and
never shows the value of a secret.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

ENV_PREFIX = "GPUQUOTA_"

ModelT = TypeVar("ModelT", bound=BaseModel)

SECRET_FIELDS = frozenset({"database_url", "node_token", "kafka_sasl_password", "s3_secret_access_key"})
"""Fields whose values never appear in error messages, nor in the environment of a job."""


class SettingsError(ValueError):
    """Raised by ``from_env`` for missing or invalid variables; the message names them."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(f"{key}: {msg}" for key, msg in self.problems.items()))


def env_var(field_name: str) -> str:
    """The environment variable that holds a settings field (and the name of its secret file)."""
    return ENV_PREFIX + field_name.upper()


def read_secret(path: Path) -> str:
    """A secret file's content less one trailing newline (how Kubernetes and editors write them)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the file: {exc.strerror}") from None
    secret = text.removesuffix("\n").removesuffix("\r")
    if not secret:
        raise ValueError("the file is empty")
    return secret


def forget_secrets(environ: MutableMapping[str, str]) -> None:
    """Remove the variables of secret fields from ``environ`` (``os.environ``, once the settings are
    read): the jobs a node agent starts, and the container engine, inherit the process's environment,
    and must not learn the database's password or the node token from it."""
    for name in SECRET_FIELDS:
        environ.pop(env_var(name), None)


def problems(cls: type[BaseModel], exc: ValidationError, raw: Mapping[str, Any]) -> dict[str, str]:
    """Each offending variable of ``cls`` and what is wrong with it; the value shown if it was a
    variable's and is no secret."""
    found: dict[str, str] = {}
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        key = env_var(field) if field in cls.model_fields else cls.__name__
        msg = "is required" if err["type"] == "missing" else err["msg"]
        if field in raw and field not in SECRET_FIELDS and err["type"] != "missing":
            msg = f"{msg} (got {raw[field]!r})"
        found.setdefault(key, msg)
    return found


def model_from_env(cls: type[ModelT], environ: Mapping[str, str]) -> ModelT:
    """A plain model's fields from their variables in ``environ`` (no secret files: the bounds
    ``gpuquota up`` reads beside its flags); ``SettingsError`` naming each bad or missing one."""
    raw = {name: environ[env_var(name)] for name in cls.model_fields if env_var(name) in environ}
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError(problems(cls, exc, raw)) from None


class EnvSettings(BaseSettings):
    """The base of the settings classes: see the module docstring."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        validate_default=False,  # pydantic's own default: only fields that ask are checked unset
        enable_decoding=False,  # a secret file's text is the value, as a variable's is (no JSON)
    )

    ENV_VARS: ClassVar[frozenset[str]] = frozenset()
    REQUIRED_ENV_VARS: ClassVar[frozenset[str]] = frozenset()

    secrets_dir: Path | None = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.ENV_VARS = frozenset(env_var(name) for name in cls.model_fields)
        cls.REQUIRED_ENV_VARS = frozenset(
            env_var(name) for name, info in cls.model_fields.items() if info.is_required()
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The variables ``from_env`` was given, then the secret files: never ``os.environ`` behind
        the caller's back, nor a ``.env`` file."""
        return init_settings, file_secret_settings

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Builds the settings from ``environ`` (e.g. ``os.environ``) and the secret files; ignores
        unrelated variables."""
        raw: dict[str, Any] = {
            name: environ[env_var(name)] for name in cls.model_fields if env_var(name) in environ
        }
        secrets = Path(raw["secrets_dir"]) if "secrets_dir" in raw else None
        try:  # a directory that is not there is the field's error, not pydantic-settings' warning
            return cls(_secrets_dir=secrets if secrets is not None and secrets.is_dir() else None, **raw)
        except ValidationError as exc:
            raise SettingsError(problems(cls, exc, raw)) from None
        except (SourceError, OSError) as exc:  # a secret file that cannot be read
            raise SettingsError({env_var("secrets_dir"): f"cannot read a secret file: {exc}"}) from None

    @field_validator("secrets_dir")
    @classmethod
    def _check_secrets_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError("no such directory")
        return value
