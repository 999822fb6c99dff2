"""spec.sandbox.volumes in the sandbox pod: each source mounted as declared (ConfigMaps and Secrets
read-only, with modes the sandbox user can read), a volume at workingDir taking the workspace's
place, and a warm pool's key changing with the volumes."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.tools.sandbox.manifests import (
    SANDBOX_USER,
    RunIdentity,
    pod_manifest,
    pool_key,
    workspace_persists,
)

RUN = RunIdentity("team-a", "fix-build", "0b6c1f1e-6a39-4ad5-9d1e-3f0a0c0de001", "runner")
BASE: dict[str, Any] = {
    "image": "localhost/agentrun-sandbox:dev",
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}},
}


def spec_with(*volumes: dict[str, Any], **fields: Any) -> SandboxSpec:
    return SandboxSpec.model_validate({**BASE, **fields, "volumes": list(volumes)})


def pod_volumes(spec: SandboxSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's volumes and the container's mounts, each by name."""
    pod = pod_manifest(spec, RUN)["spec"]
    [container] = pod["containers"]
    return (
        {v["name"]: v for v in pod["volumes"]},
        {m["name"]: m for m in container["volumeMounts"]},
    )


def test_a_config_map_and_a_secret_are_mounted_read_only_and_readable_by_the_sandbox_user() -> None:
    spec = spec_with(
        {"name": "settings", "mountPath": "/etc/settings", "configMap": {"name": "app-settings"}},
        {"name": "token", "mountPath": "/var/run/token", "secret": {"secretName": "git-token"}},
    )
    volumes, mounts = pod_volumes(spec)
    assert volumes["settings"] == {
        "name": "settings",
        "configMap": {"name": "app-settings", "defaultMode": 0o444},
    }
    # Root owns the files, the pod's fsGroup is their group: 0440 lets the sandbox user read a Secret.
    assert volumes["token"] == {"name": "token", "secret": {"secretName": "git-token", "defaultMode": 0o440}}
    assert pod_manifest(spec, RUN)["spec"]["securityContext"]["fsGroup"] == SANDBOX_USER
    assert mounts["settings"] == {"name": "settings", "mountPath": "/etc/settings", "readOnly": True}
    assert mounts["token"] == {"name": "token", "mountPath": "/var/run/token", "readOnly": True}
    # The operator's own volumes stay.
    assert {"workspace", "tmp", "agentrun"} <= volumes.keys() and {
        "workspace",
        "tmp",
        "agentrun",
    } <= mounts.keys()


@pytest.mark.parametrize("read_only", [False, True])
def test_a_claim_is_mounted_read_only_exactly_when_declared(read_only: bool) -> None:
    claim = {"claimName": "cache", "readOnly": read_only}
    volumes, mounts = pod_volumes(
        spec_with({"name": "cache", "mountPath": "/cache", "persistentVolumeClaim": claim})
    )
    assert volumes["cache"] == {
        "name": "cache",
        "persistentVolumeClaim": {"claimName": "cache", "readOnly": read_only},
    }
    assert mounts["cache"].get("readOnly", False) is read_only


def test_an_empty_dir_keeps_its_size_limit_and_is_writable() -> None:
    volumes, mounts = pod_volumes(
        spec_with({"name": "scratch", "mountPath": "/scratch", "emptyDir": {"sizeLimit": "2Gi"}})
    )
    assert volumes["scratch"] == {"name": "scratch", "emptyDir": {"sizeLimit": "2Gi"}}
    assert mounts["scratch"] == {"name": "scratch", "mountPath": "/scratch"}


def test_a_claim_at_the_working_dir_is_the_workspace_and_outlives_the_pod() -> None:
    spec = spec_with(
        {"name": "repo", "mountPath": "/work/", "persistentVolumeClaim": {"claimName": "repo"}},
        workingDir="/work",
    )
    volumes, mounts = pod_volumes(spec)
    assert "workspace" not in volumes and "workspace" not in mounts
    assert mounts["repo"]["mountPath"] == "/work/" and "readOnly" not in mounts["repo"]
    assert [m["mountPath"] for m in mounts.values()].count("/work/") == 1
    assert workspace_persists(spec)


def test_an_empty_dir_at_the_working_dir_replaces_the_workspace_but_does_not_outlive_the_pod() -> None:
    spec = spec_with({"name": "big", "mountPath": "/workspace", "emptyDir": {"sizeLimit": "20Gi"}})
    volumes, _ = pod_volumes(spec)
    assert "workspace" not in volumes and volumes["big"]["emptyDir"] == {"sizeLimit": "20Gi"}
    assert not workspace_persists(spec)


def test_without_volumes_the_workspace_is_the_pods_empty_dir() -> None:
    spec = spec_with(workspaceSizeLimit="3Gi")
    volumes, mounts = pod_volumes(spec)
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {"sizeLimit": "3Gi"}}
    assert mounts["workspace"] == {"name": "workspace", "mountPath": "/workspace"}
    assert not workspace_persists(spec)
    # A claim elsewhere does not make the workspace last.
    assert not workspace_persists(
        spec_with({"name": "cache", "mountPath": "/cache", "persistentVolumeClaim": {"claimName": "cache"}})
    )


def test_a_warm_pools_key_changes_when_its_volumes_change() -> None:
    settings = {"name": "settings", "mountPath": "/etc/settings", "configMap": {"name": "app-settings"}}
    plain = pool_key("team-a", "runner", spec_with())
    with_settings = pool_key("team-a", "runner", spec_with(settings))
    other_map = pool_key("team-a", "runner", spec_with({**settings, "configMap": {"name": "other"}}))
    elsewhere = pool_key("team-a", "runner", spec_with({**settings, "mountPath": "/etc/other"}))
    assert len({plain, with_settings, other_map, elsewhere}) == 4
    # The pool size alone does not (resizing keeps the pods).
    assert pool_key("team-a", "runner", spec_with(settings, warmPool=3)) == with_settings
