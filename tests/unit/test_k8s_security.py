"""deploy/k8s meets the Pod Security Standards and says who may talk to whom (issue #27).

The standards' controls are functions in ``tests.unit.pod_security``, one per control, named after it, so
a failing test names the rule. These tests check:

- the gateway and the scheduler against every restricted control, the node agent against every baseline
  one, and every workload against the level its namespace enforces (so, as shipped, all three meet
  restricted: namespace.yaml says why one namespace);
- the namespace's ``pod-security.kubernetes.io`` labels: enforce, warn and audit, each with a pinned version;
- no init container runs as root, and the pods' user is the one the image creates (deploy/docker/Dockerfile);
- the NetworkPolicies: a default deny of ingress and egress for the whole namespace, each service selected by
  a policy of its own, and each service's *paths* (the union of the rules of every policy that selects it:
  peer, protocol, port) exactly those of network-policies.yaml's table, to ports its containers serve.

That every document, NetworkPolicies included, is valid against the Kubernetes schemas
(``kubernetes-validate``, strict, offline) is checked by test_k8s_manifests.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.pod_security import LEVELS, Control, Pod

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
PSS_VERSION = "v1.30"

KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())
DOCS = [
    doc for name in KUSTOMIZATION["resources"] for doc in yaml.safe_load_all((K8S / name).read_text()) if doc
]
WORKLOADS = {
    d["metadata"]["name"]: d for d in DOCS if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
}
NAMESPACES = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "Namespace"}
POLICIES = [d for d in DOCS if d["kind"] == "NetworkPolicy"]
GATEWAY, SCHEDULER, NODE_AGENT = "gpuquota-gateway", "gpuquota-scheduler", "gpuquota-node-agent"


def _pod(workload: dict[str, Any]) -> Pod:
    pod: Pod = workload["spec"]["template"]["spec"]
    return pod


def _namespace(doc: dict[str, Any]) -> str:
    """Where ``kubectl apply -k`` puts a document: the kustomization's namespace wins over the document's."""
    return str(KUSTOMIZATION.get("namespace") or doc["metadata"].get("namespace", "default"))


#: the level each service must meet (issue #27), whatever its namespace allows
REQUIRED = {GATEWAY: "restricted", SCHEDULER: "restricted", NODE_AGENT: "baseline"}


def _template(name: str) -> Pod:
    """The pod template with its metadata (the AppArmor annotations live there)."""
    template = WORKLOADS[name]["spec"]["template"]
    return {**template["spec"], "metadata": template.get("metadata", {})}


@pytest.mark.parametrize(
    ("name", "control"),
    [(name, control) for name, level in REQUIRED.items() for control in LEVELS[level]],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_service_meets_its_required_level(name: str, control: Control) -> None:
    assert not control(_template(name)), f"{name} breaks {control.__name__}: {control(_template(name))}"


def _enforced(name: str) -> str:
    labels = NAMESPACES[_namespace(WORKLOADS[name])]["metadata"].get("labels") or {}
    return str(labels.get("pod-security.kubernetes.io/enforce", "privileged"))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_meets_the_level_its_namespace_enforces(name: str) -> None:
    pod = _template(name)
    broken = {c.__name__: c(pod) for c in LEVELS[_enforced(name)] if c(pod)}
    assert not broken, f"{name} would be refused in its namespace ({_enforced(name)}): {broken}"


def test_every_service_is_in_a_namespace_that_enforces_its_level() -> None:
    assert set(REQUIRED) == set(WORKLOADS)
    order = list(LEVELS)
    for name, level in REQUIRED.items():
        assert order.index(_enforced(name)) >= order.index(level), f"{name}: {_enforced(name)} < {level}"


@pytest.mark.parametrize("namespace", sorted(NAMESPACES))
def test_namespace_labels_enforce_warn_and_audit_one_pinned_level(namespace: str) -> None:
    labels = NAMESPACES[namespace]["metadata"].get("labels") or {}
    level = labels.get("pod-security.kubernetes.io/enforce")
    assert level in ("baseline", "restricted"), f"{namespace}: enforce is {level}"
    for mode in ("enforce", "warn", "audit"):
        assert labels.get(f"pod-security.kubernetes.io/{mode}") == level, f"{namespace}: {mode}"
        assert labels.get(f"pod-security.kubernetes.io/{mode}-version") == PSS_VERSION, f"{namespace}: {mode}"


def test_every_workload_is_in_a_namespace_of_the_manifests() -> None:
    assert {_namespace(w) for w in WORKLOADS.values()} <= set(NAMESPACES)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_no_init_container_runs_as_root(name: str) -> None:
    pod = _pod(WORKLOADS[name])
    pod_context = pod.get("securityContext") or {}
    for init in pod.get("initContainers") or []:
        context = {**pod_context, **(init.get("securityContext") or {})}
        assert context.get("runAsNonRoot") is True, f"{name}: init container {init['name']} may run as root"
        assert context.get("runAsUser", 1) != 0, f"{name}: init container {init['name']} runs as root"


def _image_user() -> tuple[int, int]:
    """The uid and gid of the image's user: its final ``USER uid:gid``, and the account created for it."""
    (user, group) = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE, re.MULTILINE)[-1]
    assert re.search(rf"useradd [^\n]*--uid {user} [^\n]*--gid {group} ", DOCKERFILE), "no such user"
    assert re.search(rf"groupadd [^\n]*--gid {group} ", DOCKERFILE), "no such group"
    return int(user), int(group)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_pods_run_as_the_images_user(name: str) -> None:
    context = _pod(WORKLOADS[name])["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == _image_user()
    assert context.get("fsGroup", context["runAsGroup"]) == context["runAsGroup"]


# --- NetworkPolicies -------------------------------------------------------------------------------------

ANYWHERE, ANY = "anywhere", "any"
PROMETHEUS = (
    'namespaces {"kubernetes.io/metadata.name": "monitoring"} pods {"app.kubernetes.io/name": "prometheus"}'
)
KUBE_DNS = 'namespaces {"kubernetes.io/metadata.name": "kube-system"} pods {"k8s-app": "kube-dns"}'
DNS = {(KUBE_DNS, "UDP", "53"), (KUBE_DNS, "TCP", "53")}
KAFKA = (ANYWHERE, "TCP", "9092")
POSTGRESQL = (ANYWHERE, "TCP", "5432")

#: network-policies.yaml's table: (peer, protocol, port) each service may be reached from / may reach
INGRESS = {
    GATEWAY: {(ANYWHERE, "TCP", "8080")},
    SCHEDULER: {(PROMETHEUS, "TCP", "9464")},
    NODE_AGENT: {(PROMETHEUS, "TCP", "9464"), (GATEWAY, "TCP", "8643"), (NODE_AGENT, ANY, ANY)},
}
EGRESS = {
    GATEWAY: {KAFKA, POSTGRESQL, (NODE_AGENT, "TCP", "8643"), *DNS},
    SCHEDULER: {KAFKA, POSTGRESQL, *DNS},
    NODE_AGENT: {KAFKA, (NODE_AGENT, ANY, ANY), *DNS},
}


def _labels(name: str) -> dict[str, str]:
    labels: dict[str, str] = WORKLOADS[name]["spec"]["template"]["metadata"]["labels"]
    return labels


def _matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, values = expression["key"], expression.get("values", [])
    return {
        "In": labels.get(key) in values,
        "NotIn": labels.get(key) not in values,
        "Exists": key in labels,
        "DoesNotExist": key not in labels,
    }[expression["operator"]]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics (an empty selector selects everything)."""
    return selector.get("matchLabels", {}).items() <= labels.items() and all(
        _matches(e, labels) for e in selector.get("matchExpressions", [])
    )


def _policies_of(name: str) -> list[dict[str, Any]]:
    return [p for p in POLICIES if _selects(p["spec"]["podSelector"], _labels(name))]


def _peer(peer: dict[str, Any]) -> list[str]:
    """A peer as the paths name it: the gpuquota workloads a same-namespace pod selector picks, else its
    selectors or CIDR spelled out."""
    if "ipBlock" in peer:
        return [f"ipBlock {peer['ipBlock']}"]
    if "namespaceSelector" in peer:
        namespaces = json.dumps(peer["namespaceSelector"].get("matchLabels", {}))
        pods = json.dumps(peer.get("podSelector", {}).get("matchLabels", {}))
        return [f"namespaces {namespaces} pods {pods}"]
    return [name for name in WORKLOADS if _selects(peer["podSelector"], _labels(name))]


def _ports(rule: dict[str, Any], container_ports: dict[str, int]) -> list[tuple[str, str]]:
    if not rule.get("ports"):
        return [(ANY, ANY)]
    return [
        (p.get("protocol", "TCP"), str(container_ports.get(p["port"], p["port"])) if "port" in p else ANY)
        for p in rule["ports"]
    ]


def _container_ports(name: str) -> dict[str, int]:
    return {
        port["name"]: int(port["containerPort"])
        for container in _pod(WORKLOADS[name])["containers"]
        for port in container.get("ports") or []
    }


def _paths(name: str, direction: str) -> set[tuple[str, str, str]]:
    """Every (peer, protocol, port) the policies that select ``name`` open in ``direction``."""
    peers_key = "from" if direction == "ingress" else "to"
    own_ports = _container_ports(name) if direction == "ingress" else {}
    paths = set()
    for policy in _policies_of(name):
        for rule in policy["spec"].get(direction) or []:
            peers = [p for peer in rule.get(peers_key) or [] for p in _peer(peer)] or [ANYWHERE]
            paths |= {(peer, *port) for peer in peers for port in _ports(rule, own_ports)}
    return paths


def test_a_default_deny_isolates_every_pod_both_ways() -> None:
    deny = [
        p
        for p in POLICIES
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, "no NetworkPolicy denies all ingress and egress of the namespace"
    assert {_namespace(p) for p in deny} >= {_namespace(w) for w in WORKLOADS.values()}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_service_has_a_network_policy_of_its_own(name: str) -> None:
    own = [
        p
        for p in _policies_of(name)
        if p["spec"]["podSelector"].get("matchLabels") == {"app.kubernetes.io/name": name}
    ]
    assert len(own) == 1, f"{name}: {[p['metadata']['name'] for p in own]}"
    assert set(own[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_who_may_reach_each_service(name: str) -> None:
    assert _paths(name, "ingress") == INGRESS[name]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_whom_each_service_may_reach(name: str) -> None:
    assert _paths(name, "egress") == EGRESS[name]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_ingress_ports_are_ports_the_service_serves(name: str) -> None:
    served = {str(port) for port in _container_ports(name).values()}
    for peer, _, port in _paths(name, "ingress"):
        assert port == ANY or port in served, f"{name} is opened on {port} for {peer}, serves {served}"


def test_egress_to_a_service_reaches_a_port_it_serves_and_admits() -> None:
    for name in WORKLOADS:
        for peer, protocol, port in _paths(name, "egress"):
            if peer in WORKLOADS and port != ANY:
                assert port in {str(p) for p in _container_ports(peer).values()}, (name, peer, port)
                admitted = {(p, pr, po) for p, pr, po in _paths(peer, "ingress") if p in (name, ANYWHERE)}
                assert admitted & {
                    (name, protocol, port),
                    (ANYWHERE, protocol, port),
                    (name, ANY, ANY),
                }, f"{name} may send to {peer}:{port}, which does not admit it"
