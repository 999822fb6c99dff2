"""Sandbox paths: the operator's own mounts (/tmp, /agentrun) cannot be reached by another spelling."""

from __future__ import annotations

import pydantic
import pytest

from agentrun.api.sandbox_spec import SandboxSpec, SandboxVolume

SANDBOX = {
    "image": "localhost/agentrun-sandbox:dev",
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}},
}


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/./tmp", "must be a clean absolute path"),
        ("//tmp", "must be a clean absolute path"),
        ("/workspace/../agentrun", "must be a clean absolute path"),
        ("/data/..", "must be a clean absolute path"),
        ("/tmp/", "may not be /, nor /tmp or /agentrun"),
        ("/agentrun/calls", "may not be /, nor /tmp or /agentrun"),
        ("/", "may not be /, nor /tmp or /agentrun"),
    ],
)
def test_a_volume_or_workspace_path_onto_the_operators_mounts_is_refused(path: str, said: str) -> None:
    with pytest.raises(pydantic.ValidationError) as volume:
        SandboxVolume.model_validate({"name": "data", "mountPath": path, "emptyDir": {}})
    assert f"mountPath {said}" in str(volume.value)
    with pytest.raises(pydantic.ValidationError) as workspace:
        SandboxSpec.model_validate({**SANDBOX, "workingDir": path})
    assert f"workingDir {said}" in str(workspace.value)


@pytest.mark.parametrize("path", ["/data", "/data/", "/home/.config", "/workspace/src", "/tmpfiles"])
def test_a_clean_path_of_the_users_own_is_accepted(path: str) -> None:
    volume = SandboxVolume.model_validate({"name": "data", "mountPath": path, "emptyDir": {}})
    assert volume.mount_path == path
    assert SandboxSpec.model_validate({**SANDBOX, "workingDir": path}).working_dir == path
