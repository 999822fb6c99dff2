"""A run's sandbox and its SandboxTemplate: the template is the base, what the run declares replaces the
template's field by field, and image and resources are required unless a template is named."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from agentrun.api.sandbox_spec import SandboxDeclaration, SandboxSpec, SandboxTemplateSpec, resolve_sandbox
from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec

RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
TEMPLATE = SandboxTemplateSpec.model_validate(
    {
        "image": "python:3.12",
        "resources": RESOURCES,
        "workingDir": "/src",
        "env": [{"name": "LANG", "value": "C.UTF-8"}],
        "commandTimeoutSeconds": 300,
    }
)


def declared(**fields: Any) -> SandboxDeclaration:
    return SandboxDeclaration.model_validate({"templateRef": {"name": "python"}, **fields})


def test_a_run_naming_a_template_gets_every_field_the_template_sets() -> None:
    sandbox = resolve_sandbox(declared(), TEMPLATE)
    assert (sandbox.image, sandbox.working_dir, sandbox.command_timeout_seconds) == (
        "python:3.12",
        "/src",
        300,
    )
    assert sandbox.resources == TEMPLATE.resources and [e.name for e in sandbox.env] == ["LANG"]


def test_a_field_the_run_declares_replaces_the_templates_and_the_rest_stays() -> None:
    sandbox = resolve_sandbox(declared(image="python:3.13", commandTimeoutSeconds=30), TEMPLATE)
    assert (sandbox.image, sandbox.command_timeout_seconds, sandbox.working_dir) == (
        "python:3.13",
        30,
        "/src",
    )


def test_a_list_or_resources_the_run_declares_replaces_the_templates_as_a_whole() -> None:
    small = {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
    sandbox = resolve_sandbox(declared(env=[{"name": "DEBUG", "value": "1"}], resources=small), TEMPLATE)
    assert [e.name for e in sandbox.env] == ["DEBUG"]
    assert (sandbox.resources.limits.cpu, sandbox.resources.requests.memory) == ("100m", "32Mi")


def test_what_neither_sets_takes_the_built_in_default() -> None:
    sandbox = resolve_sandbox(declared(), TEMPLATE)
    assert (sandbox.output_limit_bytes, sandbox.on_pod_lost, sandbox.workspace_size_limit) == (
        30000,
        "Recreate",
        "1Gi",
    )


def test_the_resolved_sandbox_no_longer_names_its_template_but_keeps_the_agents_pool() -> None:
    sandbox = resolve_sandbox(declared(warmPool=2), TEMPLATE)
    assert sandbox.template_ref is None and sandbox.warm_pool == 2
    assert "template_ref" not in sandbox.model_fields_set


def test_a_sandbox_without_template_is_its_own_declaration() -> None:
    own = SandboxDeclaration.model_validate({"image": "busybox", "resources": RESOURCES})
    assert resolve_sandbox(own, None) == SandboxSpec.model_validate(
        {"image": "busybox", "resources": RESOURCES}
    )


@pytest.mark.parametrize("missing", ["image", "resources"])
def test_a_sandbox_without_template_must_declare_image_and_resources(missing: str) -> None:
    fields: dict[str, Any] = {"image": "busybox", "resources": RESOURCES}
    del fields[missing]
    with pytest.raises(pydantic.ValidationError, match=f"{missing} is required unless templateRef names"):
        SandboxDeclaration.model_validate(fields)


def test_with_a_template_a_sandbox_may_leave_image_and_resources_out() -> None:
    assert declared().image is None and declared().resources is None


def test_volumes_the_run_declares_replace_the_templates_so_a_name_may_be_reused() -> None:
    template = SandboxTemplateSpec.model_validate(
        {
            **TEMPLATE.model_dump(by_alias=True),
            "volumes": [{"name": "cache", "mountPath": "/cache", "emptyDir": {}}],
        }
    )
    sandbox = resolve_sandbox(
        declared(volumes=[{"name": "cache", "mountPath": "/data", "emptyDir": {}}]), template
    )
    assert [(v.name, v.mount_path) for v in sandbox.volumes] == [("cache", "/data")]


def test_the_resolved_run_spec_keeps_what_the_run_declared_and_holds_the_complete_sandbox() -> None:
    spec = AgentRunSpec.model_validate(
        {"task": "t", "limits": {"maxIterations": 5}, "sandbox": {"templateRef": {"name": "python"}}}
    )
    resolved = ResolvedRunSpec.of(spec, resolve_sandbox(spec.sandbox or declared(), TEMPLATE))
    assert isinstance(resolved.sandbox, SandboxSpec) and resolved.sandbox.image == "python:3.12"
    assert resolved.model_fields_set == {"task", "limits", "sandbox"}
    assert resolved.limits.model_fields_set == {"max_iterations"}
    assert ResolvedRunSpec.of(AgentRunSpec(task="t"), None).sandbox is None
