"""The sandbox pod's manifest and its NetworkPolicy, fixed isolation included (pods.py starts them)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from agentrun.api import API_VERSION
from agentrun.api.sandbox_spec import SandboxSpec, SandboxVolume
from agentrun.tools.sandbox.commands import STATE_DIR

__all__ = [
    "CONTAINER",
    "PoolOwner",
    "RunIdentity",
    "claim_patch",
    "network_policy_manifest",
    "pod_manifest",
    "pool_key",
    "pool_network_policy_manifest",
    "pool_pod_manifest",
    "sandbox_pod_name",
    "workspace_persists",
    "workspace_volume",
]

CONTAINER = "sandbox"
LABEL_RUN_UID = "agentrun.dev/run-uid"
LABEL_SANDBOX = "agentrun.dev/sandbox"
#: On warm pool pods: which pool (pool_key) and which Agent keeps it (its uid; removed when claimed).
LABEL_POOL = "agentrun.dev/sandbox-pool"
LABEL_POOL_AGENT = "agentrun.dev/sandbox-pool-agent"
SANDBOX_USER = 65532


@dataclass(frozen=True)
class RunIdentity:
    namespace: str
    name: str
    uid: str
    service_account: str | None  # None: the namespace's default


@dataclass(frozen=True)
class PoolOwner:
    """The Agent that keeps a warm pool, and the identity its pods are created with."""

    namespace: str
    name: str
    uid: str
    service_account: str | None  # None: the namespace's default


def pool_key(namespace: str, service_account: str | None, spec: SandboxSpec) -> str:
    """Names a pool by what makes its pods interchangeable: the namespace, the ServiceAccount and the
    sandbox spec (the pool size aside, so resizing keeps the pods). A run of the Agent computes the same
    key from its effective spec; an Agent whose sandbox changed gets a new key, and its old pods go."""
    fields = spec.model_dump(mode="json", by_alias=True, exclude={"warm_pool"})
    text = json.dumps([namespace, service_account or "default", fields], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def sandbox_pod_name(run_name: str, run_uid: str) -> str:
    """`<run>-sandbox-<uid hash>`, at most 63 characters (the pod's hostname)."""
    suffix = hashlib.sha256(run_uid.encode()).hexdigest()[:8]
    return f"{run_name[:46].rstrip('-.')}-sandbox-{suffix}"


def _labels(run: RunIdentity) -> dict[str, str]:
    return {
        LABEL_SANDBOX: "true",
        LABEL_RUN_UID: run.uid,
        "app.kubernetes.io/managed-by": "agentrun-operator",
    }


def _owner(kind: str, name: str, uid: str) -> dict[str, Any]:
    # blockOwnerDeletion stays false: setting it needs update on the owner's finalizers, which the
    # ServiceAccount that creates the pod (the run's, the Agent's) should not need.
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def _env(spec: SandboxSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": spec.working_dir},
        {"name": "TMPDIR", "value": "/tmp"},
    ]
    for entry in spec.env:
        if entry.secret_key_ref is not None:
            ref = entry.secret_key_ref
            env.append(
                {"name": entry.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
            )
        else:
            env.append({"name": entry.name, "value": entry.value or ""})
    return env


def pod_manifest(spec: SandboxSpec, run: RunIdentity) -> dict[str, Any]:
    """The sandbox pod: restricted Pod Security, whatever the run declares."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": sandbox_pod_name(run.name, run.uid),
            "namespace": run.namespace,
            "labels": _labels(run),
            "ownerReferences": [_owner("AgentRun", run.name, run.uid)],
        },
        "spec": _pod_spec(spec, run.service_account),
    }


def pool_pod_manifest(spec: SandboxSpec, agent: PoolOwner) -> dict[str, Any]:
    """A warm pool pod: the same pod as a run's, owned by the Agent until a run claims it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{agent.name[:40].rstrip('-.')}-sandbox-pool-",
            "namespace": agent.namespace,
            "labels": _pool_labels(spec, agent),
            "ownerReferences": [_owner("Agent", agent.name, agent.uid)],
        },
        "spec": _pod_spec(spec, agent.service_account),
    }


def pool_network_policy_manifest(spec: SandboxSpec, agent: PoolOwner) -> dict[str, Any]:
    """The egress of a pool's pods while they wait (the same rules a run's NetworkPolicy has)."""
    key = pool_key(agent.namespace, agent.service_account, spec)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{agent.name[:40].rstrip('-.')}-sandbox-pool-{key[:8]}",
            "namespace": agent.namespace,
            "labels": _pool_labels(spec, agent),
            "ownerReferences": [_owner("Agent", agent.name, agent.uid)],
        },
        "spec": _policy_spec(spec, {LABEL_POOL: key, LABEL_SANDBOX: "true"}),
    }


def claim_patch(run: RunIdentity, resource_version: str) -> dict[str, Any]:
    """A merge patch that makes a pool pod the run's: the resourceVersion is the precondition (two
    runs claiming one pod: the second gets 409 Conflict), the run becomes its only owner (the pod goes
    with the run, not with the Agent) and the Agent's label goes (its pool no longer counts it)."""
    return {
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {LABEL_RUN_UID: run.uid, LABEL_POOL_AGENT: None},
            "ownerReferences": [_owner("AgentRun", run.name, run.uid)],
        }
    }


def _pool_labels(spec: SandboxSpec, agent: PoolOwner) -> dict[str, str]:
    return {
        LABEL_SANDBOX: "true",
        LABEL_POOL: pool_key(agent.namespace, agent.service_account, spec),
        LABEL_POOL_AGENT: agent.uid,
        "app.kubernetes.io/managed-by": "agentrun-operator",
    }


def _pod_spec(spec: SandboxSpec, service_account: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        # PID 1 waits and ends at once on SIGTERM, so a deleted sandbox goes in a second.
        "command": ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"],
        "workingDir": spec.working_dir,
        "env": _env(spec),
        "resources": spec.resources.model_dump(by_alias=True),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
        },
        "volumeMounts": _volume_mounts(spec),
    }
    if spec.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.image_pull_policy
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_USER,
            "runAsGroup": SANDBOX_USER,
            "fsGroup": SANDBOX_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": _volumes(spec),
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    return pod_spec


#: File modes of the kubelet-written ConfigMap and Secret files: root owns them and the pod's fsGroup
#: (the sandbox user's group) is their group, so a Secret is readable by the sandbox user and nobody
#: else, a ConfigMap by all; neither is writable (the mounts are read-only as well).
SECRET_FILE_MODE = 0o440
CONFIG_MAP_FILE_MODE = 0o444


def workspace_volume(spec: SandboxSpec) -> SandboxVolume | None:
    """The volume of spec.sandbox.volumes mounted at workingDir, which is then the workspace (a
    PersistentVolumeClaim there outlives the pod), or None: the workspace is the pod's emptyDir."""
    working_dir = _path(spec.working_dir)
    return next((v for v in spec.volumes if _path(v.mount_path) == working_dir), None)


def workspace_persists(spec: SandboxSpec) -> bool:
    """Whether the workspace outlives a lost pod: a PersistentVolumeClaim mounted at workingDir."""
    volume = workspace_volume(spec)
    return volume is not None and volume.persistent_volume_claim is not None


def _path(path: str) -> str:
    return path.rstrip("/") or "/"


def _volumes(spec: SandboxSpec) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = []
    if workspace_volume(spec) is None:
        volumes.append({"name": "workspace", "emptyDir": {"sizeLimit": spec.workspace_size_limit}})
    volumes += [
        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
        {"name": "agentrun", "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    return volumes + [{"name": volume.name, **_source(volume)} for volume in spec.volumes]


def _source(volume: SandboxVolume) -> dict[str, Any]:
    if volume.config_map is not None:
        return {"configMap": {"name": volume.config_map.name, "defaultMode": CONFIG_MAP_FILE_MODE}}
    if volume.secret is not None:
        return {"secret": {"secretName": volume.secret.secret_name, "defaultMode": SECRET_FILE_MODE}}
    if volume.persistent_volume_claim is not None:
        claim = volume.persistent_volume_claim
        return {"persistentVolumeClaim": {"claimName": claim.claim_name, "readOnly": claim.read_only}}
    assert volume.empty_dir is not None  # SandboxVolume has exactly one source
    return {"emptyDir": {"sizeLimit": volume.empty_dir.size_limit}}


def _volume_mounts(spec: SandboxSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    if workspace_volume(spec) is None:
        mounts.append({"name": "workspace", "mountPath": spec.working_dir})
    mounts += [{"name": "tmp", "mountPath": "/tmp"}, {"name": "agentrun", "mountPath": STATE_DIR}]
    for volume in spec.volumes:
        mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount_path}
        claim = volume.persistent_volume_claim
        if volume.config_map is not None or volume.secret is not None or (claim and claim.read_only):
            mount["readOnly"] = True
        mounts.append(mount)
    return mounts


def network_policy_manifest(spec: SandboxSpec, run: RunIdentity) -> dict[str, Any]:
    """Egress of the sandbox: denied but for spec.sandbox.egress; ingress: denied."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": sandbox_pod_name(run.name, run.uid),
            "namespace": run.namespace,
            "labels": _labels(run),
            "ownerReferences": [_owner("AgentRun", run.name, run.uid)],
        },
        "spec": _policy_spec(spec, {LABEL_RUN_UID: run.uid, LABEL_SANDBOX: "true"}),
    }


def _policy_spec(spec: SandboxSpec, selector: dict[str, str]) -> dict[str, Any]:
    egress = []
    for rule in spec.egress:
        entry: dict[str, Any] = {"to": [{"ipBlock": {"cidr": rule.cidr}}]}
        if rule.ports:
            entry["ports"] = [{"protocol": "TCP", "port": port} for port in rule.ports]
        egress.append(entry)
    return {
        "podSelector": {"matchLabels": selector},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": egress,
    }
