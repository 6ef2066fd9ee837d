"""The Pod Security Standards as functions: one per control, named after it (issue #27).

The standards (kubernetes.io/docs/concepts/security/pod-security-standards, as of Kubernetes 1.30: the
version deploy/k8s/namespace.yaml pins) are lists of *controls*; a control names fields of a pod and the
values they may hold. Each function takes a pod spec (``spec.template.spec`` of a workload, with the
template's ``metadata`` beside it for the AppArmor annotations) and answers the *violations* it finds, each
saying where (none: the pod meets the control). ``BASELINE`` holds the baseline controls; ``RESTRICTED``
adds the restricted ones, two of which (seccomp, capabilities) are stricter versions of baseline's.
Windows-only exemptions of the restricted level are left out: every gpuquota pod is a Linux one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Pod = dict[str, Any]
Control = Callable[[Pod], list[str]]


def _all_containers(pod: Pod) -> Iterator[dict[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(field) or []


def _contexts(pod: Pod) -> Iterator[tuple[str, dict[str, Any]]]:
    """The pod's securityContext and each container's, with where it is (for the messages)."""
    yield "pod", pod.get("securityContext") or {}
    for container in _all_containers(pod):
        yield f"container {container['name']}", container.get("securityContext") or {}


# --- baseline controls ---------------------------------------------------------------------------------

BASELINE_CAPABILITIES = frozenset(
    "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD NET_BIND_SERVICE SETFCAP SETGID SETPCAP SETUID "
    "SYS_CHROOT".split()
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)


def host_process(pod: Pod) -> list[str]:
    """Windows HostProcess containers are privileged access to the host."""
    return [
        f"{where}: windowsOptions.hostProcess"
        for where, ctx in _contexts(pod)
        if (ctx.get("windowsOptions") or {}).get("hostProcess")
    ]


def host_namespaces(pod: Pod) -> list[str]:
    """No sharing of the host's network, PID or IPC namespace."""
    return [field for field in ("hostNetwork", "hostPID", "hostIPC") if pod.get(field)]


def privileged_containers(pod: Pod) -> list[str]:
    return [f"{where}: privileged" for where, ctx in _contexts(pod) if ctx.get("privileged")]


def capabilities_baseline(pod: Pod) -> list[str]:
    """Capabilities added beyond the default set of container runtimes."""
    return [
        f"{where}: adds {cap}"
        for where, ctx in _contexts(pod)
        for cap in (ctx.get("capabilities") or {}).get("add") or []
        if cap not in BASELINE_CAPABILITIES
    ]


def host_path_volumes(pod: Pod) -> list[str]:
    return [f"volume {v['name']}: hostPath" for v in pod.get("volumes") or [] if "hostPath" in v]


def host_ports(pod: Pod) -> list[str]:
    return [
        f"container {c['name']}: hostPort {p['hostPort']}"
        for c in _all_containers(pod)
        for p in c.get("ports") or []
        if p.get("hostPort", 0) != 0
    ]


def apparmor(pod: Pod) -> list[str]:
    """Only the runtime's default or a profile loaded on the node, never unconfined."""
    problems = [
        f"{where}: appArmorProfile {ctx['appArmorProfile']['type']}"
        for where, ctx in _contexts(pod)
        if "appArmorProfile" in ctx and ctx["appArmorProfile"]["type"] not in ("RuntimeDefault", "Localhost")
    ]
    annotations = pod.get("metadata", {}).get("annotations") or {}
    problems += [
        f"annotation {key}: {value}"
        for key, value in annotations.items()
        if key.startswith("container.apparmor.security.beta.kubernetes.io/")
        and not (value == "runtime/default" or value.startswith("localhost/"))
    ]
    return problems


def selinux(pod: Pod) -> list[str]:
    """Only the container SELinux types, and no custom user or role."""
    problems = []
    for where, ctx in _contexts(pod):
        options = ctx.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            problems.append(f"{where}: seLinuxOptions.type {options['type']}")
        problems += [f"{where}: seLinuxOptions.{key}" for key in ("user", "role") if options.get(key)]
    return problems


def proc_mount_type(pod: Pod) -> list[str]:
    """The default masked /proc."""
    return [
        f"{where}: procMount {ctx['procMount']}"
        for where, ctx in _contexts(pod)
        if ctx.get("procMount", "Default") != "Default"
    ]


def seccomp_baseline(pod: Pod) -> list[str]:
    return [
        f"{where}: seccompProfile Unconfined"
        for where, ctx in _contexts(pod)
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined"
    ]


def sysctls(pod: Pod) -> list[str]:
    """Only the namespaced sysctls that cannot affect other pods on the node."""
    found = (pod.get("securityContext") or {}).get("sysctls") or []
    return [f"sysctl {s['name']}" for s in found if s["name"] not in SAFE_SYSCTLS]


# --- restricted controls -------------------------------------------------------------------------------

RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)


def volume_types(pod: Pod) -> list[str]:
    """Only volumes that bring no host or network storage the cluster administrator did not set up."""
    return [
        f"volume {v['name']}: {sorted(set(v) - {'name'})}"
        for v in pod.get("volumes") or []
        if not set(v) - {"name"} <= RESTRICTED_VOLUME_TYPES
    ]


def privilege_escalation(pod: Pod) -> list[str]:
    """Every container says ``allowPrivilegeEscalation: false`` (setuid binaries cannot gain privileges)."""
    return [
        f"container {c['name']}: allowPrivilegeEscalation is not false"
        for c in _all_containers(pod)
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]


def running_as_non_root(pod: Pod) -> list[str]:
    """``runAsNonRoot: true`` on the pod or on every container, and false on none."""
    pod_says = (pod.get("securityContext") or {}).get("runAsNonRoot")
    problems = [] if pod_says in (True, None) else ["pod: runAsNonRoot false"]
    for c in _all_containers(pod):
        says = (c.get("securityContext") or {}).get("runAsNonRoot")
        if says is False or (says is None and pod_says is not True):
            problems.append(f"container {c['name']}: runAsNonRoot not true")
    return problems


def running_as_non_root_user(pod: Pod) -> list[str]:
    return [f"{where}: runAsUser 0" for where, ctx in _contexts(pod) if ctx.get("runAsUser") == 0]


def seccomp_restricted(pod: Pod) -> list[str]:
    """RuntimeDefault or Localhost, on the pod or on every container; Unconfined nowhere."""
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    problems = [] if pod_type in (*allowed, None) else [f"pod: seccompProfile {pod_type}"]
    for c in _all_containers(pod):
        own = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if (own or pod_type) not in allowed:
            problems.append(f"container {c['name']}: seccompProfile {own or pod_type}")
    return problems


def capabilities_restricted(pod: Pod) -> list[str]:
    """Every container drops ALL and adds back at most NET_BIND_SERVICE."""
    problems = []
    for c in _all_containers(pod):
        capabilities = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"container {c['name']}: does not drop ALL")
        problems += [
            f"container {c['name']}: adds {cap}"
            for cap in capabilities.get("add") or []
            if cap != "NET_BIND_SERVICE"
        ]
    return problems


BASELINE: tuple[Control, ...] = (
    host_process,
    host_namespaces,
    privileged_containers,
    capabilities_baseline,
    host_path_volumes,
    host_ports,
    apparmor,
    selinux,
    proc_mount_type,
    seccomp_baseline,
    sysctls,
)
RESTRICTED: tuple[Control, ...] = (
    *BASELINE,
    volume_types,
    privilege_escalation,
    running_as_non_root,
    running_as_non_root_user,
    seccomp_restricted,
    capabilities_restricted,
)
LEVELS: dict[str, tuple[Control, ...]] = {"privileged": (), "baseline": BASELINE, "restricted": RESTRICTED}
