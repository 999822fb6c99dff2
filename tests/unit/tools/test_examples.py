"""The tool examples in examples/tools/ are valid AgentRuns whose tools pass the operator's checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api.sandbox_spec import SandboxTemplateSpec, resolve_sandbox
from agentrun.api.spec import AgentRunSpec
from agentrun.tools.registry import check_tools, secret_uses

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tools"


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_each_example_run_passes_the_tool_checks_and_ships_its_secrets(name: str) -> None:
    documents = _documents(name)
    [run] = [d for d in documents if d["kind"] == "AgentRun"]
    spec = AgentRunSpec.model_validate(run["spec"])
    check_tools(spec)
    secrets = {
        (d["metadata"]["name"], key) for d in documents if d["kind"] == "Secret" for key in d["stringData"]
    }
    assert {(u.ref.name, u.ref.key) for u in secret_uses(spec)} <= secrets


def test_the_kubernetes_example_binds_read_only_rules_to_the_runs_service_account() -> None:
    documents = {d["kind"]: d for d in _documents("kubernetes-reader.yaml")}
    account = documents["AgentRun"]["spec"]["serviceAccountName"]
    assert documents["ServiceAccount"]["metadata"]["name"] == account
    binding = documents["RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert binding["roleRef"]["name"] == documents["Role"]["metadata"]["name"]
    verbs = {verb for rule in documents["Role"]["rules"] for verb in rule["verbs"]}
    assert verbs == {"get", "list"}


def test_the_sandbox_example_lets_its_account_start_pods_and_exec_into_them_and_nothing_else() -> None:
    documents = {d["kind"]: d for d in _documents("sandbox.yaml")}
    account = documents["AgentRun"]["spec"]["serviceAccountName"]
    assert documents["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    granted = {
        (r, v) for rule in documents["Role"]["rules"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert granted == {
        ("pods", "create"),
        ("pods", "get"),
        ("pods", "delete"),
        ("pods/exec", "get"),
        ("pods/exec", "create"),
    }


def test_the_template_example_is_a_valid_template_and_its_run_resolves_against_it() -> None:
    documents = {d["kind"]: d for d in _documents("sandbox-template.yaml")}
    template = SandboxTemplateSpec.model_validate(documents["SandboxTemplate"]["spec"])
    run = AgentRunSpec.model_validate(documents["AgentRun"]["spec"])
    assert run.sandbox is not None and run.sandbox.template_ref is not None
    assert run.sandbox.template_ref.name == documents["SandboxTemplate"]["metadata"]["name"]
    resolved = resolve_sandbox(run.sandbox, template)
    assert resolved.image == template.image and resolved.idle_timeout_seconds == 600
    assert resolved.command_timeout_seconds == 60  # the run's own value, not the template's 300
