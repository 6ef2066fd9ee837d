"""The settings of each gpuquota service: the variables it reads, typed and checked.

``GatewaySettings``, ``SchedulerSettings`` and ``NodeAgentSettings`` (:data:`SERVICE_SETTINGS`) are
pydantic-settings classes, read by ``from_env`` as ``gpuquota.config.environ`` says: ``GPUQUOTA_FOO``
for a field ``foo``, else the file ``GPUQUOTA_FOO`` in ``GPUQUOTA_SECRETS_DIR``. What they all read
is a Kafka client's settings (``config.kafka``); the node agent's S3 is ``config.s3``. The table
below is every variable, what it means and who reads it (``docs/configuration.md`` is generated from
it and the classes: ``gpuquota.entrypoints.docs_config``).

=============================  ======================================================  =========
variable                       meaning                                                 services
=============================  ======================================================  =========
GPUQUOTA_SECRETS_DIR           directory of secret files, one per variable and named    all
                               after it (``GPUQUOTA_DATABASE_URL``...); a variable
                               set in the environment wins over its file
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
GPUQUOTA_TRAINING_PLAN         the training plan the node belongs to (S11): its slots   node-agent
                               are used only in the plan's windows
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
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, ClassVar, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import SettingsConfigDict

from gpuquota.config.environ import model_from_env
from gpuquota.config.image_map import ImageMap
from gpuquota.config.kafka import KafkaClientSettings
from gpuquota.config.s3 import S3Settings
from gpuquota.core.policy import DEFAULT_POLICY

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

Name = Annotated[str, Field(pattern=_NAME.pattern)]


class NodeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    node_id: Name
    gpus: Annotated[int, Field(ge=1, le=1024)]


class AdmissionSettings(BaseModel):
    """The bounds of the gateway's admission control (``gateway.admission``, whose docstring says how
    to choose them), read by ``gpuquota gateway`` and by ``gpuquota up`` in both its modes:
    GPUQUOTA_ADMISSION_MAX_BACKLOG, GPUQUOTA_ADMISSION_MAX_SECONDS."""

    # pydantic-settings' kind of config: GatewaySettings is both these fields and an EnvSettings
    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(frozen=True, extra="forbid")

    admission_max_backlog: Annotated[int, Field(ge=0)] = 2000
    """Undecided inputs at most before submissions get a 429 (``gateway.admission``; 0: no bound)."""
    admission_max_seconds: Annotated[float, Field(ge=0)] = 1.0
    """Wait of the oldest undecided input at most before submissions get a 429 (0: no bound)."""


ADMISSION_DEFAULTS = AdmissionSettings()


def admission_from_env(environ: Mapping[str, str]) -> AdmissionSettings:
    """The admission bounds of ``environ`` (``gpuquota up``; ``gpuquota gateway`` reads them with the
    rest of its ``GatewaySettings``); ``SettingsError`` naming a bad one."""
    return model_from_env(AdmissionSettings, environ)


class _DatabaseSettings(KafkaClientSettings):
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


class NodeAgentSettings(KafkaClientSettings, S3Settings):
    """``gpuquota node-agent``: runs the jobs placed on one node and reports heartbeats.

    Reads GPUQUOTA_KAFKA, GPUQUOTA_NODE_ID, GPUQUOTA_POOL, GPUQUOTA_GPUS, GPUQUOTA_SLOTS,
    GPUQUOTA_RUNTIME, GPUQUOTA_CONTAINER_ENGINE, GPUQUOTA_IMAGE_MAP, GPUQUOTA_PREEMPTION_GRACE,
    GPUQUOTA_HEARTBEAT_SECONDS,
    GPUQUOTA_DATA_DIR, GPUQUOTA_LOGS_PORT, GPUQUOTA_LOGS_HOST, GPUQUOTA_NODE_TOKEN_FILE, GPUQUOTA_NODE_TOKEN,
    GPUQUOTA_ALLOW_UNAUTHENTICATED, GPUQUOTA_METRICS_PORT, GPUQUOTA_TOPIC_PREFIX, GPUQUOTA_LOG_LEVEL,
    GPUQUOTA_ADVERTISE_ADDRESS, GPUQUOTA_TRAINING_PLAN and GPUQUOTA_S3_* (:class:`S3Settings`).
    ``runtime`` ``subprocess`` means ``process`` and ``fake`` means ``simulated`` (see
    :attr:`runtime_kind`); ``data_dir`` is the agent's work directory.
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
    training_plan: Name | None = None
    """The training plan the node belongs to (S11): its slots are usable only in the plan's windows."""

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
SERVICE_SETTINGS: Mapping[str, type[KafkaClientSettings]] = {
    "gateway": GatewaySettings,
    "scheduler": SchedulerSettings,
    "node-agent": NodeAgentSettings,
}
