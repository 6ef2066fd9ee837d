"""gpuquota.config.settings: explicit env var lists, typed values, fail-fast errors naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuquota.config.settings as settings_module
from gpuquota.config.environ import SettingsError
from gpuquota.config.settings import (
    SERVICE_SETTINGS,
    GatewaySettings,
    NodeAgentSettings,
    NodeSpec,
    SchedulerSettings,
)

KAFKA = {"GPUQUOTA_KAFKA": "kafka:9092"}
NODE = {**KAFKA, "GPUQUOTA_NODE_ID": "n"}
DB = {"GPUQUOTA_DATABASE_URL": "postgresql://u:secret-pw@db:5432/gpuquota"}


def test_env_var_lists() -> None:
    assert {
        "GPUQUOTA_KAFKA",
        "GPUQUOTA_KAFKA_SECURITY_PROTOCOL",
        "GPUQUOTA_KAFKA_SASL_MECHANISM",
        "GPUQUOTA_KAFKA_SASL_USERNAME",
        "GPUQUOTA_KAFKA_SASL_PASSWORD",
        "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE",
        "GPUQUOTA_KAFKA_SSL_CAFILE",
        "GPUQUOTA_KAFKA_SSL_CERTFILE",
        "GPUQUOTA_KAFKA_SSL_KEYFILE",
        "GPUQUOTA_LOG_LEVEL",
        "GPUQUOTA_DATABASE_URL",
        "GPUQUOTA_HOST",
        "GPUQUOTA_PORT",
        "GPUQUOTA_POOL",
        "GPUQUOTA_AUTH_KEYS",
        "GPUQUOTA_ALLOW_UNAUTHENTICATED",
        "GPUQUOTA_NODE_LOGS_URL",
        "GPUQUOTA_NODE_TOKEN",
        "GPUQUOTA_NODE_TOKEN_FILE",
        "GPUQUOTA_ALLOWED_HOSTS",
        "GPUQUOTA_ALLOWED_ORIGINS",
        "GPUQUOTA_PRODUCE_TIMEOUT",
        "GPUQUOTA_ADMISSION_MAX_BACKLOG",
        "GPUQUOTA_ADMISSION_MAX_SECONDS",
        "GPUQUOTA_TOPIC_PREFIX",
        "GPUQUOTA_LOG_FORMAT",
        "GPUQUOTA_STARTUP_TIMEOUT",
        "GPUQUOTA_SECRETS_DIR",
    } == GatewaySettings.ENV_VARS
    assert {"GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL"} == GatewaySettings.REQUIRED_ENV_VARS
    assert {"GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL"} == SchedulerSettings.REQUIRED_ENV_VARS
    assert {"GPUQUOTA_KAFKA", "GPUQUOTA_NODE_ID"} == NodeAgentSettings.REQUIRED_ENV_VARS
    for cls in SERVICE_SETTINGS.values():
        assert all(name.startswith("GPUQUOTA_") for name in cls.ENV_VARS)
        assert cls.REQUIRED_ENV_VARS <= cls.ENV_VARS


def test_every_variable_is_documented() -> None:
    doc = settings_module.__doc__ or ""
    for cls in SERVICE_SETTINGS.values():
        for name in cls.ENV_VARS:
            assert name in doc, f"{name} missing from the gpuquota.config.settings docstring"


def test_defaults_and_parsing() -> None:
    gw = GatewaySettings.from_env({**KAFKA, **DB, "GPUQUOTA_PORT": "9000", "UNRELATED": "x"})
    assert (gw.host, gw.port, gw.log_level) == ("127.0.0.1", 9000, "INFO")

    sched = SchedulerSettings.from_env(
        {**KAFKA, **DB, "GPUQUOTA_NODES": "node-1:8, node-2:4", "GPUQUOTA_PREEMPTION_GRACE": "2.5"}
    )
    assert sched.nodes == (NodeSpec(node_id="node-1", gpus=8), NodeSpec(node_id="node-2", gpus=4))
    assert sched.preemption_grace == 2.5
    assert sched.data_dir == Path(".gpuquota")

    agent = NodeAgentSettings.from_env(
        {"GPUQUOTA_KAFKA": "a:1, b:2", "GPUQUOTA_NODE_ID": "n1", "GPUQUOTA_LOG_LEVEL": "debug"}
    )
    assert (agent.kafka, agent.node_id, agent.runtime, agent.gpus) == ("a:1,b:2", "n1", "subprocess", 1)
    assert agent.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("cls", "env", "bad_key"),
    [
        (GatewaySettings, {**DB}, "GPUQUOTA_KAFKA"),
        (GatewaySettings, {**KAFKA, **DB, "GPUQUOTA_PORT": "http"}, "GPUQUOTA_PORT"),
        (GatewaySettings, {**KAFKA, **DB, "GPUQUOTA_PORT": "70000"}, "GPUQUOTA_PORT"),
        (GatewaySettings, {**KAFKA, "GPUQUOTA_DATABASE_URL": "mysql://x/y"}, "GPUQUOTA_DATABASE_URL"),
        (SchedulerSettings, {**KAFKA, **DB, "GPUQUOTA_NODES": "n1"}, "GPUQUOTA_NODES"),
        (SchedulerSettings, {**KAFKA, **DB, "GPUQUOTA_NODES": "a:1,a:2"}, "GPUQUOTA_NODES"),
        (SchedulerSettings, {**KAFKA, **DB, "GPUQUOTA_HEARTBEAT_SECONDS": "0"}, "GPUQUOTA_HEARTBEAT_SECONDS"),
        (NodeAgentSettings, {**KAFKA}, "GPUQUOTA_NODE_ID"),
        (NodeAgentSettings, {**KAFKA, "GPUQUOTA_NODE_ID": "bad id"}, "GPUQUOTA_NODE_ID"),
        (NodeAgentSettings, {**NODE, "GPUQUOTA_RUNTIME": "k8s"}, "GPUQUOTA_RUNTIME"),
        (NodeAgentSettings, {"GPUQUOTA_KAFKA": "no-port", "GPUQUOTA_NODE_ID": "n"}, "GPUQUOTA_KAFKA"),
        (NodeAgentSettings, {**NODE, "GPUQUOTA_LOG_LEVEL": "loud"}, "GPUQUOTA_LOG_LEVEL"),
    ],
)
def test_bad_values_fail_fast_naming_the_variable(cls, env, bad_key) -> None:
    with pytest.raises(SettingsError) as info:
        cls.from_env(env)
    assert bad_key in info.value.problems
    assert str(info.value).startswith(bad_key)


def test_database_url_is_not_echoed_in_errors() -> None:
    with pytest.raises(SettingsError) as info:
        GatewaySettings.from_env({**KAFKA, "GPUQUOTA_DATABASE_URL": "mysql://u:hunter2@db/x"})
    assert "hunter2" not in str(info.value)


def test_settings_are_immutable() -> None:
    gw = GatewaySettings.from_env({**KAFKA, **DB})
    with pytest.raises(ValueError):
        gw.port = 1  # type: ignore[misc]


def test_secrets_come_from_the_files_of_the_secrets_dir(tmp_path: Path) -> None:
    (tmp_path / "GPUQUOTA_DATABASE_URL").write_text("postgresql://u:file-pw@db:5432/gpuquota\n")
    (tmp_path / "gpuquota_node_token").write_text("token-from-a-file")  # the name in any case
    env = {**KAFKA, "GPUQUOTA_SECRETS_DIR": str(tmp_path)}
    gw = GatewaySettings.from_env(env)
    assert gw.database_url == "postgresql://u:file-pw@db:5432/gpuquota"
    assert gw.node_token == "token-from-a-file"
    assert GatewaySettings.from_env({**env, **DB}).database_url == DB["GPUQUOTA_DATABASE_URL"]  # env wins
    assert "GPUQUOTA_SECRETS_DIR" in GatewaySettings.ENV_VARS - GatewaySettings.REQUIRED_ENV_VARS


def test_a_bad_secret_file_names_its_variable_not_its_value(tmp_path: Path) -> None:
    (tmp_path / "GPUQUOTA_DATABASE_URL").write_text("mysql://u:hunter2@db/x")
    (tmp_path / "GPUQUOTA_PORT").write_text("http")
    with pytest.raises(SettingsError) as info:
        GatewaySettings.from_env({**KAFKA, "GPUQUOTA_SECRETS_DIR": str(tmp_path)})
    assert {"GPUQUOTA_DATABASE_URL", "GPUQUOTA_PORT"} <= info.value.problems.keys()
    assert "hunter2" not in str(info.value) and "http" not in info.value.problems["GPUQUOTA_PORT"]


def test_a_secrets_dir_that_is_not_there_is_refused(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    with pytest.raises(SettingsError) as info:
        GatewaySettings.from_env({**KAFKA, **DB, "GPUQUOTA_SECRETS_DIR": str(absent)})
    want = f"Value error, no such directory (got {str(absent)!r})"
    assert info.value.problems == {"GPUQUOTA_SECRETS_DIR": want}


def test_only_the_given_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUQUOTA_PORT", "9999")
    assert GatewaySettings.from_env({**KAFKA, **DB}).port == 8080  # not os.environ behind the caller's back
