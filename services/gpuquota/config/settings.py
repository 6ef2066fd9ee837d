"""Typed settings of the gpuquota services, read from an explicit list of environment variables.

It lives in ``gpuquota.config``, below the adapters: ``adapters/kafka.py`` and the event client
import its ``KafkaSecurity``, so it cannot live in ``gpuquota.entrypoints``.

Every field ``foo`` of a settings class is read from ``GPUQUOTA_FOO``; nothing else is read.
``<Class>.ENV_VARS`` is the set of variables a class reads and ``<Class>.REQUIRED_ENV_VARS`` the
ones without a default. ``from_env`` fails fast with :class:`SettingsError`, whose message names
every offending variable.

=============================  ======================================================  =========
variable                       meaning                                                 services
=============================  ======================================================  =========
GPUQUOTA_KAFKA                 Kafka bootstrap servers, ``host:port[,host:port...]``    all
GPUQUOTA_KAFKA_SECURITY_PROTOCOL ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``   all
                               or ``SASL_SSL``: how clients reach the brokers
GPUQUOTA_KAFKA_SASL_MECHANISM  ``SCRAM-SHA-512`` (default), ``SCRAM-SHA-256`` or         all
                               ``PLAIN`` (SASL_* protocols)
GPUQUOTA_KAFKA_SASL_USERNAME   the SASL user (required with SASL_*)                     all
GPUQUOTA_KAFKA_SASL_PASSWORD   the SASL password (secret; or ..._PASSWORD_FILE)         all
GPUQUOTA_KAFKA_SASL_PASSWORD_FILE file holding the SASL password (e.g. a mounted        all
                               Kubernetes secret; one trailing newline is dropped)
GPUQUOTA_KAFKA_SSL_CAFILE      CA bundle that signs the brokers' certificates (SSL,     all
                               SASL_SSL; default: the system's CAs)
GPUQUOTA_KAFKA_SSL_CERTFILE    client certificate (PEM) for mutual TLS (optional)       all
GPUQUOTA_KAFKA_SSL_KEYFILE     its private key, if not in the certificate file          all
GPUQUOTA_LOG_LEVEL             DEBUG, INFO, WARNING or ERROR (default INFO)             all
GPUQUOTA_LOG_FORMAT            ``text`` (with timestamps) or ``json`` (one object/line)  all
GPUQUOTA_STARTUP_TIMEOUT       seconds to wait for Kafka/PostgreSQL at start-up (60)     all
GPUQUOTA_METRICS_PORT          port of /metrics and /health/* (default: none served)    scheduler, node-agent
GPUQUOTA_DATABASE_URL          ``postgresql://user:pass@host:port/db[?sslmode=...]``;   gateway, scheduler
                               TLS: ``sslmode=verify-full&sslrootcert=/ca.pem``
GPUQUOTA_HOST                  HTTP bind address (default 127.0.0.1)                    gateway
GPUQUOTA_PORT                  HTTP port (default 8080)                                 gateway
GPUQUOTA_AUTH_KEYS             YAML/JSON file of SigV4 keys; unset: no authentication   gateway
GPUQUOTA_ALLOW_UNAUTHENTICATED serve without credentials off loopback (default false)  gateway, node-agent
GPUQUOTA_ALLOWED_HOSTS         names the API answers to besides its bind address and    gateway
                               localhost: ``gw.example,.example.com`` (a domain), ``*``
GPUQUOTA_ALLOWED_ORIGINS       web origins whose pages may call the API (a proxy's),    gateway
                               ``https://gw.example`` (default: only its own)
GPUQUOTA_NODE_LOGS_URL         node agents' log servers, ``http://{node_id}:8643`` or    gateway
                               ``http://{address}:8643`` (a node's advertised address);
                               unset: ``gpuquota jobs logs`` is unavailable
GPUQUOTA_PRODUCE_TIMEOUT       seconds the broker has to acknowledge a write before     gateway
                               the request is a 503 ``ServerException`` (default 5)
GPUQUOTA_ADMISSION_MAX_BACKLOG undecided inputs at most before submissions get a 429    gateway, up
                               ``TooManyRequestsException`` (default 2000; 0: none)
GPUQUOTA_ADMISSION_MAX_SECONDS seconds the oldest undecided input may wait before       gateway, up
                               submissions get a 429 (default 1; 0: no bound)
GPUQUOTA_LOGS_PORT             serve this node's attempt logs over HTTP on this port    node-agent
                               (0 or unset: no log server)
GPUQUOTA_LOGS_HOST             bind address of the log server (default 0.0.0.0)         node-agent
GPUQUOTA_NODE_TOKEN_FILE       file holding the token the gateway shows node agents'    gateway, node-agent
                               log servers (required off loopback)
GPUQUOTA_NODE_TOKEN            the node token itself (instead of the file)              gateway, node-agent
GPUQUOTA_TOPIC_PREFIX          prefix of every Kafka topic and group id (default none)  all
GPUQUOTA_POOL                  GPU pool: the gateway's and node's pool; the scheduler's  all
                               pool for keyless input records (default ``default``)
GPUQUOTA_NODES                 static inventory ``node-1:8,node-2:4`` (id:gpus, opt.)   scheduler
GPUQUOTA_PREEMPTION_GRACE      seconds between SIGTERM and SIGKILL on preemption (30)   scheduler, node-agent
GPUQUOTA_HEARTBEAT_SECONDS     node heartbeat period in seconds (default 5); the        scheduler, node-agent
                               scheduler declares a node lost after 6 periods
GPUQUOTA_SNAPSHOT_EVERY        snapshot a pool's state every N decided inputs (1000)    scheduler
GPUQUOTA_TICK_SECONDS          period of the scheduler's Tick (default 1)               scheduler
GPUQUOTA_INSTANCE_ID           static Kafka group membership id of this scheduler       scheduler
                               (optional; a restart with the same id resumes at once)
GPUQUOTA_DATA_DIR              local state directory (default ``.gpuquota``)            scheduler, node-agent
GPUQUOTA_NODE_ID               this node's id (required)                                node-agent
GPUQUOTA_GPUS                  number of GPUs this node offers (default 1)              node-agent
GPUQUOTA_SLOTS                 offered instances ``ml.g5.xlarge=3,...`` (default:       node-agent
                               ``ml.g5.xlarge=<GPUQUOTA_GPUS>``)
GPUQUOTA_RUNTIME               how jobs run: ``process``, ``simulated`` or ``container``  node-agent
                               (aliases ``subprocess``, ``fake``; default ``subprocess``)
GPUQUOTA_CONTAINER_ENGINE      ``podman`` or ``docker`` for the ``container`` runtime     node-agent
                               (default: the first found)
GPUQUOTA_IMAGE_MAP             the ``container`` runtime's image rewrites, ``from=to``   node-agent
                               pairs (commas) or a JSON object; ``from`` without a tag
                               maps every tag (docs/runtimes.md)
GPUQUOTA_ADVERTISE_ADDRESS     how other nodes reach this one (attempts spread over     node-agent
                               nodes; default: the host name)
GPUQUOTA_S3_ENDPOINT_URL       S3-compatible endpoint of the jobs' data (channels,      node-agent
                               checkpoints, model.tar.gz); unset: no S3, outputs stay
GPUQUOTA_S3_REGION             region the S3 requests are signed for (us-east-1)        node-agent
GPUQUOTA_S3_ACCESS_KEY_ID      S3 access key id (unset: boto3's default chain)          node-agent
GPUQUOTA_S3_SECRET_ACCESS_KEY  its secret key (secret; or ..._SECRET_ACCESS_KEY_FILE)   node-agent
GPUQUOTA_S3_SECRET_ACCESS_KEY_FILE file holding the S3 secret key (one trailing         node-agent
                               newline is dropped)
GPUQUOTA_S3_CHECKPOINT_SECONDS seconds between uploads of a running attempt's           node-agent
                               checkpoints to ``CheckpointConfig.S3Uri`` (30; 0: at
                               its end only)
=============================  ======================================================  =========
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar
from urllib.parse import parse_qs, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from gpuquota.config.image_map import ImageMap
from gpuquota.core.policy import DEFAULT_POLICY

ENV_PREFIX = "GPUQUOTA_"

_HOST_PORT = re.compile(r"^[A-Za-z0-9._-]+:\d{1,5}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

#: fields whose values never appear in error messages (may contain passwords)
_SECRET_FIELDS = frozenset({"database_url", "node_token", "kafka_sasl_password", "s3_secret_access_key"})

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
Name = Annotated[str, Field(pattern=_NAME.pattern)]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
_SASL: frozenset[str] = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
_TLS: frozenset[str] = frozenset({"SSL", "SASL_SSL"})
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How a Kafka client authenticates and encrypts: the ``GPUQUOTA_KAFKA_*`` credentials, resolved.

    ``gpuquota.adapters.kafka.client_options`` turns it into aiokafka's keyword arguments. The
    password is a ``SecretStr``: printing or logging this value shows ``**********``.
    """

    protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    username: str = ""
    password: SecretStr | None = None
    cafile: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None

    @property
    def sasl(self) -> bool:
        return self.protocol in _SASL

    @property
    def tls(self) -> bool:
        return self.protocol in _TLS


PLAINTEXT = KafkaSecurity()
"""No TLS, no authentication: the default, and what a broker on loopback for tests speaks."""


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


class SettingsError(ValueError):
    """Raised by ``from_env`` for missing or invalid variables; the message names them."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(f"{key}: {msg}" for key, msg in self.problems.items()))


def env_var(field_name: str) -> str:
    """The environment variable that holds a settings field."""
    return ENV_PREFIX + field_name.upper()


def forget_secrets(environ: MutableMapping[str, str]) -> None:
    """Remove the variables of secret fields from ``environ`` (``os.environ``, once the settings are
    read): the jobs a node agent starts, and the container engine, inherit the process's environment,
    and must not learn the database's password or the node token from it."""
    for name in _SECRET_FIELDS:
        environ.pop(env_var(name), None)


class NodeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    node_id: Name
    gpus: Annotated[int, Field(ge=1, le=1024)]


SettingsT = TypeVar("SettingsT", bound=BaseModel)


def _from_env(cls: type[SettingsT], environ: Mapping[str, str]) -> SettingsT:
    """``cls`` from its variables in ``environ``; ``SettingsError`` naming each bad or missing one."""
    raw = {name: environ[env_var(name)] for name in cls.model_fields if env_var(name) in environ}
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        problems: dict[str, str] = {}
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            key = env_var(field) if field in cls.model_fields else cls.__name__
            msg = "is required" if err["type"] == "missing" else err["msg"]
            if field in raw and field not in _SECRET_FIELDS and err["type"] != "missing":
                msg = f"{msg} (got {raw[field]!r})"
            problems.setdefault(key, msg)
        raise SettingsError(problems) from None


class AdmissionSettings(BaseModel):
    """The bounds of the gateway's admission control (``gateway.admission``, whose docstring says how
    to choose them), read by ``gpuquota gateway`` and by ``gpuquota up`` in both its modes:
    GPUQUOTA_ADMISSION_MAX_BACKLOG, GPUQUOTA_ADMISSION_MAX_SECONDS."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    admission_max_backlog: Annotated[int, Field(ge=0)] = 2000
    """Undecided inputs at most before submissions get a 429 (``gateway.admission``; 0: no bound)."""
    admission_max_seconds: Annotated[float, Field(ge=0)] = 1.0
    """Wait of the oldest undecided input at most before submissions get a 429 (0: no bound)."""


ADMISSION_DEFAULTS = AdmissionSettings()


def admission_from_env(environ: Mapping[str, str]) -> AdmissionSettings:
    """The admission bounds of ``environ`` (``gpuquota up``; ``gpuquota gateway`` reads them with the
    rest of its ``GatewaySettings``); ``SettingsError`` naming a bad one."""
    return _from_env(AdmissionSettings, environ)


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ENV_VARS: ClassVar[frozenset[str]] = frozenset()
    REQUIRED_ENV_VARS: ClassVar[frozenset[str]] = frozenset()

    kafka: str
    log_level: LogLevel = "INFO"
    log_format: Literal["text", "json"] = "text"
    startup_timeout: Annotated[float, Field(gt=0, le=86400)] = 60.0
    topic_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{0,100}$")] = ""
    # the Kafka credentials (KafkaSecurity); each validator below checks one against the protocol
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    kafka_sasl_username: str = Field("", validate_default=True)
    kafka_sasl_password: SecretStr | None = None
    kafka_sasl_password_file: Path | None = Field(None, validate_default=True)
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.ENV_VARS = frozenset(env_var(name) for name in cls.model_fields)
        cls.REQUIRED_ENV_VARS = frozenset(
            env_var(name) for name, info in cls.model_fields.items() if info.is_required()
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Builds the settings from ``environ`` (e.g. ``os.environ``); ignores unrelated variables."""
        return _from_env(cls, environ)

    @field_validator("kafka")
    @classmethod
    def _check_kafka(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",")]
        if not servers or not all(_HOST_PORT.match(s) for s in servers):
            raise ValueError("expected host:port[,host:port...]")
        return ",".join(servers)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_log_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def kafka_security(self) -> KafkaSecurity:
        """The Kafka credentials; the password file is read now (a rotated secret is picked up)."""
        password = self.kafka_sasl_password
        if self.kafka_sasl_password_file is not None:
            password = SecretStr(read_secret(self.kafka_sasl_password_file))
        return KafkaSecurity(
            self.kafka_security_protocol,
            self.kafka_sasl_mechanism,
            self.kafka_sasl_username,
            password,
            self.kafka_ssl_cafile,
            self.kafka_ssl_certfile,
            self.kafka_ssl_keyfile,
        )

    @field_validator("kafka_sasl_username")
    @classmethod
    def _check_sasl_username(cls, value: str, info: ValidationInfo) -> str:
        protocol = info.data.get("kafka_security_protocol")  # absent: invalid, reported already
        if protocol in _SASL and not value:
            raise ValueError(f"is required with GPUQUOTA_KAFKA_SECURITY_PROTOCOL={protocol}")
        if value and protocol not in _SASL | {None}:
            raise ValueError(_NEEDS_SASL)
        return value

    @field_validator("kafka_sasl_password")
    @classmethod
    def _check_sasl_password(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            raise ValueError("is empty")
        if value is not None and info.data.get("kafka_security_protocol") not in _SASL | {None}:
            raise ValueError(_NEEDS_SASL)
        return value

    @field_validator("kafka_sasl_password_file")
    @classmethod
    def _check_sasl_password_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        """One of the password and its file with SASL (the file readable), neither without."""
        protocol = info.data.get("kafka_security_protocol")
        password = info.data.get("kafka_sasl_password", "invalid")  # None: not given
        if value is None:
            if protocol in _SASL and password is None:
                raise ValueError(
                    f"GPUQUOTA_KAFKA_SASL_PASSWORD or GPUQUOTA_KAFKA_SASL_PASSWORD_FILE is required "
                    f"with GPUQUOTA_KAFKA_SECURITY_PROTOCOL={protocol}"
                )
            return value
        if protocol not in _SASL | {None}:
            raise ValueError(_NEEDS_SASL)
        if password is not None:
            raise ValueError("set GPUQUOTA_KAFKA_SASL_PASSWORD or this file, not both")
        read_secret(value)  # fail at start-up, not at the first connection
        return value

    @field_validator("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile")
    @classmethod
    def _check_ssl_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return value
        if info.data.get("kafka_security_protocol") not in _TLS | {None}:
            raise ValueError("needs GPUQUOTA_KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL")
        if not value.is_file():
            raise ValueError("no such file")
        if info.field_name == "kafka_ssl_keyfile" and info.data.get("kafka_ssl_certfile", value) is None:
            raise ValueError("needs GPUQUOTA_KAFKA_SSL_CERTFILE (the certificate of this key)")
        return value


_NEEDS_SASL = "needs GPUQUOTA_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT or SASL_SSL"


class KafkaClientSettings(_Settings):
    """A Kafka client's settings: GPUQUOTA_KAFKA and its credentials (``gpuquota up``, event clients).

    ``KafkaClientSettings.from_env(os.environ).kafka_security`` is what ``EventsClient`` takes.
    """


class _DatabaseSettings(_Settings):
    database_url: str

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        # asyncpg reads the query itself (sslmode, sslrootcert, sslcert, sslkey): passed on unchanged
        if not re.match(r"^postgres(ql)?://[^/\s]+/[^/\s?#]+(\?[^\s#]*)?$", value):
            raise ValueError("expected postgresql://user:password@host:port/database[?sslmode=...]")
        modes = parse_qs(urlsplit(value).query).get("sslmode", [])
        if any(mode not in _SSLMODES for mode in modes):
            raise ValueError(f"sslmode must be one of {', '.join(_SSLMODES)}")
        return value


class GatewaySettings(_DatabaseSettings, AdmissionSettings):
    """``gpuquota gateway``: HTTP API in front of the scheduler.

    Reads GPUQUOTA_KAFKA, GPUQUOTA_DATABASE_URL, GPUQUOTA_HOST, GPUQUOTA_PORT, GPUQUOTA_POOL,
    GPUQUOTA_AUTH_KEYS, GPUQUOTA_ALLOW_UNAUTHENTICATED, GPUQUOTA_NODE_LOGS_URL, GPUQUOTA_NODE_TOKEN_FILE,
    GPUQUOTA_NODE_TOKEN, GPUQUOTA_ALLOWED_HOSTS, GPUQUOTA_ALLOWED_ORIGINS, GPUQUOTA_TOPIC_PREFIX,
    GPUQUOTA_PRODUCE_TIMEOUT, GPUQUOTA_ADMISSION_MAX_BACKLOG, GPUQUOTA_ADMISSION_MAX_SECONDS,
    GPUQUOTA_LOG_LEVEL.
    ``auth_keys``: the keys file of ``gpuquota.gateway.auth`` (SigV4 authentication); unset means no
    authentication. ``node_logs_url``: where node agents serve attempt logs (``gpuquota jobs logs``).
    ``allowed_hosts`` and ``allowed_origins``: comma-separated, checked by
    ``gpuquota.gateway.browser_guard.BrowserPolicy.parse`` when the gateway starts.
    """

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8080
    pool: Name = "default"
    auth_keys: Path | None = None
    allow_unauthenticated: bool = False
    """Serve the API off loopback without ``auth_keys`` (``gpuquota.support.exposure``: refused otherwise)."""
    node_logs_url: str = ""
    node_token: str = ""
    """What the gateway shows the node agents' log servers (``gpuquota.support.exposure``); or
    ``node_token_file``."""
    node_token_file: Path | None = None
    allowed_hosts: str = ""
    allowed_origins: str = ""
    produce_timeout: Annotated[float, Field(gt=0, le=300)] = 5.0
    """Seconds the broker has to acknowledge an input before the request is a 503 (``kafka_port``)."""

    @field_validator("node_logs_url")
    @classmethod
    def _check_logs_url(cls, value: str) -> str:
        try:
            value.format(node_id="node", address="address")
        except (KeyError, IndexError, ValueError):
            raise ValueError("the only fields are {node_id} and {address}") from None
        return value


class SchedulerSettings(_DatabaseSettings):
    """``gpuquota scheduler``: consumes inputs, decides placements and preemptions.

    Reads GPUQUOTA_KAFKA, GPUQUOTA_DATABASE_URL, GPUQUOTA_POOL, GPUQUOTA_NODES,
    GPUQUOTA_PREEMPTION_GRACE, GPUQUOTA_HEARTBEAT_SECONDS, GPUQUOTA_DATA_DIR, GPUQUOTA_SNAPSHOT_EVERY,
    GPUQUOTA_TICK_SECONDS, GPUQUOTA_INSTANCE_ID, GPUQUOTA_TOPIC_PREFIX, GPUQUOTA_LOG_LEVEL.
    ``nodes`` (a static inventory) is not used by the Kafka scheduler: nodes register themselves.
    """

    pool: Name = "default"
    nodes: tuple[NodeSpec, ...] = ()
    preemption_grace: Annotated[float, Field(ge=0, le=86400)] = DEFAULT_POLICY.preemption_grace_seconds
    heartbeat_seconds: Annotated[float, Field(gt=0, le=3600)] = DEFAULT_POLICY.heartbeat_seconds
    data_dir: Path = Path(".gpuquota")
    snapshot_every: Annotated[int, Field(ge=1)] = 1000
    tick_seconds: Annotated[float, Field(gt=0, le=3600)] = DEFAULT_POLICY.tick_seconds
    instance_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{0,128}$")] = ""
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = None

    @field_validator("nodes", mode="before")
    @classmethod
    def _parse_nodes(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        specs: list[dict[str, str]] = []
        for item in filter(None, (part.strip() for part in value.split(","))):
            node_id, sep, gpus = item.partition(":")
            if not sep:
                raise ValueError(f"expected node_id:gpus, got {item!r}")
            specs.append({"node_id": node_id, "gpus": gpus})
        ids = [s["node_id"] for s in specs]
        if len(ids) != len(set(ids)):
            raise ValueError("duplicate node id")
        return specs


class S3Settings(BaseModel):
    """A node agent's S3 (``GPUQUOTA_S3_*``): ``gpuquota node-agent`` and ``gpuquota up`` read them.

    ``gpuquota.node_agent.s3_transfer.S3Config`` is what the agent takes (:meth:`s3_secret`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


class NodeAgentSettings(_Settings, S3Settings):
    """``gpuquota node-agent``: runs the jobs placed on one node and reports heartbeats.

    Reads GPUQUOTA_KAFKA, GPUQUOTA_NODE_ID, GPUQUOTA_POOL, GPUQUOTA_GPUS, GPUQUOTA_SLOTS,
    GPUQUOTA_RUNTIME, GPUQUOTA_CONTAINER_ENGINE, GPUQUOTA_IMAGE_MAP, GPUQUOTA_PREEMPTION_GRACE,
    GPUQUOTA_HEARTBEAT_SECONDS,
    GPUQUOTA_DATA_DIR, GPUQUOTA_LOGS_PORT, GPUQUOTA_LOGS_HOST, GPUQUOTA_NODE_TOKEN_FILE, GPUQUOTA_NODE_TOKEN,
    GPUQUOTA_ALLOW_UNAUTHENTICATED, GPUQUOTA_METRICS_PORT, GPUQUOTA_TOPIC_PREFIX, GPUQUOTA_LOG_LEVEL,
    GPUQUOTA_ADVERTISE_ADDRESS and GPUQUOTA_S3_* (:class:`S3Settings`). ``runtime`` ``subprocess`` means
    ``process`` and ``fake`` means ``simulated`` (see :attr:`runtime_kind`); ``data_dir`` is the agent's
    work directory.
    """

    node_id: Name
    pool: Name = "default"
    gpus: Annotated[int, Field(ge=1, le=1024)] = 1
    slots: str = ""
    runtime: Literal["process", "simulated", "subprocess", "fake", "container"] = "subprocess"
    container_engine: Literal["podman", "docker"] | None = None
    image_map: str = ""
    """:class:`~gpuquota.config.image_map.ImageMap`'s text, checked at start-up."""
    preemption_grace: Annotated[float, Field(ge=0, le=86400)] = DEFAULT_POLICY.preemption_grace_seconds
    heartbeat_seconds: Annotated[float, Field(gt=0, le=3600)] = DEFAULT_POLICY.heartbeat_seconds
    data_dir: Path = Path(".gpuquota")
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    logs_port: Annotated[int, Field(ge=0, le=65535)] = 0
    logs_host: Annotated[str, Field(min_length=1, max_length=256)] = "0.0.0.0"
    node_token: str = ""
    """The token the log server requires (``gpuquota.support.exposure``); or ``node_token_file``."""
    node_token_file: Path | None = None
    allow_unauthenticated: bool = False
    """Serve the log server off loopback without a node token (refused otherwise)."""
    advertise_address: Annotated[str, Field(max_length=256)] = ""
    """How the other nodes reach this one (attempts spread over nodes); empty: the host name."""

    @field_validator("image_map")
    @classmethod
    def _check_image_map(cls, value: str) -> str:
        ImageMap.parse(value)  # ValueError: the message says what is wrong
        return value

    @property
    def runtime_kind(self) -> Literal["process", "simulated", "container"]:
        if self.runtime == "container":
            return "container"
        return "simulated" if self.runtime in ("simulated", "fake") else "process"

    @property
    def slot_spec(self) -> str:
        """The ``--slots`` spec: ``slots``, or one ``ml.g5.xlarge`` per GPU when unset."""
        return self.slots.strip() or f"ml.g5.xlarge={self.gpus}"


#: settings class per service command (``gpuquota <command>``)
SERVICE_SETTINGS: Mapping[str, type[_Settings]] = {
    "gateway": GatewaySettings,
    "scheduler": SchedulerSettings,
    "node-agent": NodeAgentSettings,
}
