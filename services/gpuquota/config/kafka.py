"""A Kafka client's settings, what every gpuquota service reads: the brokers, their credentials, logs.

It lives in ``gpuquota.config``, below the adapters: ``adapters/kafka.py`` and the event client
import :class:`KafkaSecurity`, so it cannot live in ``gpuquota.entrypoints``. Each credential is
checked against ``GPUQUOTA_KAFKA_SECURITY_PROTOCOL`` by one validator of :class:`KafkaClientSettings`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from gpuquota.config.environ import EnvSettings, read_secret

_HOST_PORT = re.compile(r"^[A-Za-z0-9._-]+:\d{1,5}$")

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
_SASL: frozenset[str] = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
_TLS: frozenset[str] = frozenset({"SSL", "SASL_SSL"})
_NEEDS_SASL = "needs GPUQUOTA_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT or SASL_SSL"


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


class KafkaClientSettings(EnvSettings):
    """A Kafka client's settings: GPUQUOTA_KAFKA and its credentials (``gpuquota up``, event clients),
    and the base of every service's settings.

    ``KafkaClientSettings.from_env(os.environ).kafka_security`` is what ``EventsClient`` takes.
    """

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
