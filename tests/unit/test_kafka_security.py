"""The Kafka and PostgreSQL credentials settings: cross-checks, secrets kept out of errors, what clients get.

The real broker with SASL/SCRAM is tests/integration/test_kafka_sasl.py; these are the rules.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import faust
import pytest

from gpuquota.adapters.kafka import client_options
from gpuquota.config.environ import SettingsError
from gpuquota.config.kafka import PLAINTEXT, KafkaClientSettings
from gpuquota.config.settings import GatewaySettings, NodeAgentSettings, SchedulerSettings
from gpuquota.scheduler.faust_app import faust_credentials

KAFKA = {"GPUQUOTA_KAFKA": "kafka:9092"}
SECRET = "s3cret-Kafka-pw"
SCRAM = {
    **KAFKA,
    "GPUQUOTA_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "GPUQUOTA_KAFKA_SASL_USERNAME": "gateway",
    "GPUQUOTA_KAFKA_SASL_PASSWORD": SECRET,
}


def problems(env: dict[str, str]) -> dict[str, str]:
    with pytest.raises(SettingsError) as raised:
        KafkaClientSettings.from_env(env)
    assert SECRET not in str(raised.value)
    return raised.value.problems


def test_plaintext_by_default_and_every_service_reads_the_credentials() -> None:
    assert KafkaClientSettings.from_env(KAFKA).kafka_security == PLAINTEXT
    assert client_options(PLAINTEXT) == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(PLAINTEXT) is None
    for cls in (GatewaySettings, SchedulerSettings, NodeAgentSettings, KafkaClientSettings):
        assert "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE" in cls.ENV_VARS


def test_scram_settings_give_aiokafka_and_faust_the_same_credentials() -> None:
    security = KafkaClientSettings.from_env(SCRAM).kafka_security
    assert client_options(security) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "gateway",
        "sasl_plain_password": SECRET,
    }
    credentials = faust_credentials(security)
    assert isinstance(credentials, faust.SASLCredentials)
    assert (credentials.username, credentials.password) == ("gateway", SECRET)
    assert (credentials.protocol.value, credentials.mechanism.value) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")


def test_the_password_is_never_printed() -> None:
    settings = KafkaClientSettings.from_env(SCRAM)
    for shown in (
        repr(settings),
        str(settings),
        repr(settings.kafka_security),
        repr(faust_credentials(settings.kafka_security)),
    ):
        assert SECRET not in shown
    assert SECRET not in str(problems({**SCRAM, "GPUQUOTA_KAFKA_SECURITY_PROTOCOL": "SSL"}))


def test_password_file_one_trailing_newline_dropped(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(SECRET + "\n")
    env = {k: v for k, v in SCRAM.items() if k != "GPUQUOTA_KAFKA_SASL_PASSWORD"}
    settings = KafkaClientSettings.from_env({**env, "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE": str(secret)})
    password = settings.kafka_security.password
    assert password is not None and password.get_secret_value() == SECRET
    secret.write_text("rotated\n")  # read when a client is made: a rotated secret is picked up
    password = settings.kafka_security.password
    assert password is not None and password.get_secret_value() == "rotated"

    both = {**SCRAM, "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE": str(secret)}
    assert "not both" in problems(both)["GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"]
    missing = {**env, "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "absent")}
    assert "cannot read" in problems(missing)["GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"]
    (tmp_path / "empty").write_text("\n")
    empty = {**env, "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "empty")}
    assert "empty" in problems(empty)["GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"]


@pytest.mark.parametrize(
    ("change", "bad_key"),
    [
        ({"GPUQUOTA_KAFKA_SECURITY_PROTOCOL": "TLS"}, "GPUQUOTA_KAFKA_SECURITY_PROTOCOL"),
        ({"GPUQUOTA_KAFKA_SASL_MECHANISM": "GSSAPI"}, "GPUQUOTA_KAFKA_SASL_MECHANISM"),
        ({"GPUQUOTA_KAFKA_SASL_USERNAME": ""}, "GPUQUOTA_KAFKA_SASL_USERNAME"),
        ({"GPUQUOTA_KAFKA_SASL_PASSWORD": ""}, "GPUQUOTA_KAFKA_SASL_PASSWORD"),
        ({"GPUQUOTA_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}, "GPUQUOTA_KAFKA_SASL_USERNAME"),  # creds unused
        ({"GPUQUOTA_KAFKA_SSL_CAFILE": "/etc/hostname"}, "GPUQUOTA_KAFKA_SSL_CAFILE"),  # TLS is off
    ],
)
def test_inconsistent_credentials_name_the_variable(change: dict[str, str], bad_key: str) -> None:
    assert bad_key in problems({**SCRAM, **change})


def test_sasl_without_user_or_password_is_refused() -> None:
    found = problems({**KAFKA, "GPUQUOTA_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    assert set(found) == {"GPUQUOTA_KAFKA_SASL_USERNAME", "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"}


def test_tls_files_are_checked_and_build_a_verifying_context(tmp_path: Path) -> None:
    tls = {**SCRAM, "GPUQUOTA_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}
    missing = problems({**tls, "GPUQUOTA_KAFKA_SSL_CAFILE": str(tmp_path / "ca.pem")})
    assert "no such file" in missing["GPUQUOTA_KAFKA_SSL_CAFILE"]
    key_alone = problems({**tls, "GPUQUOTA_KAFKA_SSL_KEYFILE": "/etc/hostname"})
    assert "CERTFILE" in key_alone["GPUQUOTA_KAFKA_SSL_KEYFILE"]

    security = KafkaClientSettings.from_env(tls).kafka_security  # no CA file: the system's
    options = client_options(security)
    context = options.pop("ssl_context")
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert options["security_protocol"] == "SASL_SSL"
    credentials = faust_credentials(security)
    assert isinstance(credentials, faust.SASLCredentials) and credentials.protocol.value == "SASL_SSL"

    plain_tls = KafkaClientSettings.from_env({**KAFKA, "GPUQUOTA_KAFKA_SECURITY_PROTOCOL": "SSL"})
    assert isinstance(faust_credentials(plain_tls.kafka_security), faust.SSLCredentials)
    assert set(client_options(plain_tls.kafka_security)) == {"security_protocol", "ssl_context"}


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://gq:pw@db:5432/gpuquota?sslmode=require",
        "postgresql://gq:pw@db:5432/gpuquota?sslmode=verify-full&sslrootcert=/etc/gpuquota/pg/ca.crt",
        "postgres://gq@db/gpuquota?sslmode=verify-ca&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
    ],
)
def test_database_url_with_tls_parameters_passes_unchanged(url: str) -> None:
    assert SchedulerSettings.from_env({**KAFKA, "GPUQUOTA_DATABASE_URL": url}).database_url == url


def test_database_url_with_an_unknown_sslmode_is_refused() -> None:
    url = "postgresql://gq:hunter2@db:5432/gpuquota?sslmode=required"
    with pytest.raises(SettingsError) as raised:
        SchedulerSettings.from_env({**KAFKA, "GPUQUOTA_DATABASE_URL": url})
    assert "verify-full" in raised.value.problems["GPUQUOTA_DATABASE_URL"]
    assert "hunter2" not in str(raised.value)
