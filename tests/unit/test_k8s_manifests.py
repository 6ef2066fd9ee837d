"""deploy/k8s stays consistent with the gpuquota settings classes (the approach of test_compose.py), is
valid against the Kubernetes schemas (``kubernetes-validate``, strict), and is hardened.

Every container runs ``gpuquota gateway|scheduler|node-agent``; the variables it gets (``env`` plus the
ConfigMaps and Secrets of ``envFrom``) are all read by that service's settings class, include every
required one, and validate. Every container has probes on ``/health/*``, resources, and a restrictive
securityContext (non-root, read-only root filesystem, no capabilities); every workload has its own
ServiceAccount and a PodDisruptionBudget; the node agent keeps its work directory in an emptyDir. The Pod
Security Standards and the NetworkPolicies are test_k8s_security.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuquota.config.settings import SERVICE_SETTINGS, NodeAgentSettings
from gpuquota.node_agent.slots import parse_slots

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
KUBERNETES_VERSION = "1.30.0"

#: stand-ins for values Kubernetes fills in (valueFrom.fieldRef)
FIELD_VALUES = {
    "metadata.name": "gpuquota-scheduler-0",
    "spec.nodeName": "gpu-node-1",
    "status.podIP": "10.0.0.7",
}


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


DOCS = _documents()
WORKLOADS = {doc["metadata"]["name"]: doc for doc in DOCS if doc["kind"] in WORKLOAD_KINDS}
CONFIG_MAPS = {doc["metadata"]["name"]: doc for doc in DOCS if doc["kind"] == "ConfigMap"}
SECRETS = {doc["metadata"]["name"]: doc for doc in DOCS if doc["kind"] == "Secret"}


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The service containers (init containers only prepare volumes: see ``test_init_containers``)."""
    containers: list[dict[str, Any]] = _pod(workload)["containers"]
    return containers


def _command(container: dict[str, Any]) -> list[str]:
    return [str(part) for part in [*container.get("command", []), *container.get("args", [])]]


def _service(workload: dict[str, Any]) -> str:
    (container,) = _containers(workload)
    return _command(container)[1]


def _environment(container: dict[str, Any]) -> dict[str, str]:
    """The variables the container gets, resolved like the kubelet (``env`` wins over ``envFrom``)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            data = CONFIG_MAPS[source["configMapRef"]["name"]].get("data", {})
        else:
            secret = SECRETS[source["secretRef"]["name"]]
            data = {**secret.get("data", {}), **secret.get("stringData", {})}
        env.update({prefix + key: str(value) for key, value in data.items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = FIELD_VALUES[field]
    return env


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_one_workload_per_service() -> None:
    kinds = {_service(w): w["kind"] for w in WORKLOADS.values()}
    assert sorted(_service(w) for w in WORKLOADS.values()) == sorted(SERVICE_SETTINGS)
    assert kinds["node-agent"] == "DaemonSet"
    assert kinds["gateway"] == "Deployment"
    assert kinds["scheduler"] in ("StatefulSet", "Deployment")


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_container_command_and_env(name: str) -> None:
    for container in _containers(WORKLOADS[name]):
        command = _command(container)
        assert len(command) == 2 and command[0] == "gpuquota" and command[1] in SERVICE_SETTINGS, command
        settings_cls = SERVICE_SETTINGS[command[1]]
        env = _environment(container)
        unknown = set(env) - settings_cls.ENV_VARS
        assert not unknown, f"{name} sets variables {settings_cls.__name__} does not read: {sorted(unknown)}"
        missing = settings_cls.REQUIRED_ENV_VARS - set(env)
        assert not missing, f"{name} lacks required variables: {sorted(missing)}"
        settings_cls.from_env(env)  # values are valid, not just names


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_selector_matches_pod_labels(name: str) -> None:
    spec = WORKLOADS[name]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()


def test_gateway_service_reaches_the_gateway_port() -> None:
    (gateway,) = [w for w in WORKLOADS.values() if _service(w) == "gateway"]
    (container,) = _containers(gateway)
    port = int(_environment(container)["GPUQUOTA_PORT"])
    assert {"name": "http", "containerPort": port} in container["ports"]
    assert _environment(container)["GPUQUOTA_HOST"] == "0.0.0.0"
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    services = [
        d for d in DOCS if d["kind"] == "Service" and d["spec"]["selector"].items() <= pod_labels.items()
    ]
    (service,) = services
    assert service["spec"]["ports"][0]["targetPort"] in ("http", port)


def test_scheduler_has_a_stable_instance_id_and_matching_heartbeat() -> None:
    (scheduler,) = [w for w in WORKLOADS.values() if _service(w) == "scheduler"]
    (agent,) = [w for w in WORKLOADS.values() if _service(w) == "node-agent"]
    scheduler_env = _environment(_containers(scheduler)[0])
    agent_env = _environment(_containers(agent)[0])
    if scheduler["kind"] == "StatefulSet":
        assert scheduler["spec"]["serviceName"] in {
            d["metadata"]["name"] for d in DOCS if d["kind"] == "Service"
        }
        assert "GPUQUOTA_INSTANCE_ID" in scheduler_env
    assert scheduler_env.get("GPUQUOTA_HEARTBEAT_SECONDS") == agent_env.get("GPUQUOTA_HEARTBEAT_SECONDS")


def test_node_agent_runs_on_gpu_nodes_with_their_gpus() -> None:
    (agent,) = [w for w in WORKLOADS.values() if _service(w) == "node-agent"]
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"]
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
    (container,) = pod["containers"]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    settings = NodeAgentSettings.from_env(_environment(container))
    assert settings.runtime_kind == "process"
    needed = sum(len(slot.gpus) for slot in parse_slots(settings.slot_spec))
    assert 0 < needed <= gpus, f"slots {settings.slot_spec} need {needed} GPUs, the pod gets {gpus}"
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > settings.preemption_grace


def test_pool_is_shared_by_gateway_and_node_agents() -> None:
    pools = {
        _service(w): _environment(_containers(w)[0]).get("GPUQUOTA_POOL", "default")
        for w in WORKLOADS.values()
        if _service(w) in ("gateway", "node-agent")
    }
    assert len(set(pools.values())) == 1, pools


@pytest.mark.parametrize("index", range(len(DOCS)))
def test_valid_against_the_kubernetes_schemas(index: int) -> None:
    doc = DOCS[index]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


def _port(container: dict[str, Any], port: int | str) -> int:
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    return int(named[port]) if isinstance(port, str) else port


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_probes_ask_the_service_health_port(name: str) -> None:
    for container in _containers(WORKLOADS[name]):
        env = _environment(container)
        port = int(env.get("GPUQUOTA_METRICS_PORT") or env["GPUQUOTA_PORT"])
        expected = {
            "startupProbe": "/health/live",
            "livenessProbe": "/health/live",
            "readinessProbe": "/health/ready",
        }
        for probe, path in expected.items():
            get = container[probe]["httpGet"]
            assert (get["path"], _port(container, get["port"])) == (path, port), f"{name} {probe}"
        annotations = WORKLOADS[name]["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == port


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_pods_run_unprivileged_with_a_read_only_root(name: str) -> None:
    pod = _pod(WORKLOADS[name])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for container in _containers(WORKLOADS[name]):
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, "a read-only root needs /tmp"


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_container_has_resources(name: str) -> None:
    pod = _pod(WORKLOADS[name])
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        resources = container["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys()
        assert {"cpu", "memory"} <= resources["limits"].keys()


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_workload_has_its_service_account_and_disruption_budget(name: str) -> None:
    workload = WORKLOADS[name]
    pod = _pod(workload)
    accounts = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "ServiceAccount"}
    assert accounts[pod["serviceAccountName"]]["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is False
    labels = workload["spec"]["template"]["metadata"]["labels"]
    budgets = [
        d
        for d in DOCS
        if d["kind"] == "PodDisruptionBudget"
        and d["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    (budget,) = budgets
    assert budget["spec"]["maxUnavailable"] == 1


def test_node_agent_keeps_its_work_dir_in_an_empty_dir() -> None:
    """An emptyDir outlives restarts of the agent's container; a hostPath, which would outlive the pod,
    is forbidden by the baseline Pod Security Standard (node-agent.yaml)."""
    (agent,) = [w for w in WORKLOADS.values() if _service(w) == "node-agent"]
    pod = _pod(agent)
    (container,) = pod["containers"]
    data_dir = _environment(container)["GPUQUOTA_DATA_DIR"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == data_dir]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume
