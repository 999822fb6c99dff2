"""The sandbox pod's manifest and its NetworkPolicy, fixed isolation included (pods.py starts them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.tools.sandbox.commands import STATE_DIR

__all__ = ["CONTAINER", "RunIdentity", "network_policy_manifest", "pod_manifest", "sandbox_pod_name"]

CONTAINER = "sandbox"
LABEL_RUN_UID = "agentrun.dev/run-uid"
LABEL_SANDBOX = "agentrun.dev/sandbox"
SANDBOX_USER = 65532


@dataclass(frozen=True)
class RunIdentity:
    namespace: str
    name: str
    uid: str
    service_account: str | None  # None: the namespace's default


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


def _owner(run: RunIdentity) -> dict[str, Any]:
    # blockOwnerDeletion stays false: setting it needs update on agentruns/finalizers, which the run's
    # ServiceAccount (the pod's creator) should not need.
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "name": run.name,
        "uid": run.uid,
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
        "volumeMounts": [
            {"name": "workspace", "mountPath": spec.working_dir},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "agentrun", "mountPath": STATE_DIR},
        ],
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
        "volumes": [
            {"name": "workspace", "emptyDir": {"sizeLimit": spec.workspace_size_limit}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            {"name": "agentrun", "emptyDir": {"sizeLimit": "256Mi"}},
        ],
    }
    if run.service_account:
        pod_spec["serviceAccountName"] = run.service_account
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": sandbox_pod_name(run.name, run.uid),
            "namespace": run.namespace,
            "labels": _labels(run),
            "ownerReferences": [_owner(run)],
        },
        "spec": pod_spec,
    }


def network_policy_manifest(spec: SandboxSpec, run: RunIdentity) -> dict[str, Any]:
    """Egress of the sandbox: denied but for spec.sandbox.egress; ingress: denied."""
    egress = []
    for rule in spec.egress:
        entry: dict[str, Any] = {"to": [{"ipBlock": {"cidr": rule.cidr}}]}
        if rule.ports:
            entry["ports"] = [{"protocol": "TCP", "port": port} for port in rule.ports]
        egress.append(entry)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": sandbox_pod_name(run.name, run.uid),
            "namespace": run.namespace,
            "labels": _labels(run),
            "ownerReferences": [_owner(run)],
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_RUN_UID: run.uid, LABEL_SANDBOX: "true"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }
