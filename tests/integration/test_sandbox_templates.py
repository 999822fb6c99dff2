"""SandboxTemplates through the real operator: a run's sandbox taken from a template and overridden field
by field, Pending until its template exists, and never changed by what happens to the template later.

The pods never start here (no kubelet; a node would refuse the image): what is proven is what the
operator asks the API server for, up to the pod it creates as the run's ServiceAccount.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, until, wait_status
from tests.support.operator_process import OperatorProcess
from tests.support.rbac import grant_service_account
from tests.support.sandbox_templates import create_template, install_template_crd, templates_path
from tests.support.sandboxes import SANDBOX_RULES, one_command, unstartable_sandbox

API_KEY = "sk-ant-sandbox-templates-0123456789"
#: Images no node has and none may pull (imagePullPolicy Never): the pod never runs, with or without a node.
IMAGE = "localhost/agentrun-sandbox-absent:template"
OTHER_IMAGE = "localhost/agentrun-sandbox-absent:edited"
TEMPLATE: dict[str, Any] = unstartable_sandbox(
    IMAGE, workingDir="/src", env=[{"name": "LANG", "value": "C.UTF-8"}]
)
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
#: Longer than any wait below: a run waiting for its template is woken by the template's watch event.
RETRY_SECONDS = "120"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            one_command("[scenario:templated-sandbox]", "toolu_tpl1"),
            Script("[scenario:templated-answer]", [Reply([text_block("Answered without a command.")])]),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    await install_template_crd(cluster)  # before the operator: Kopf resolves what it watches at start
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_SECRET_RETRY_SECONDS": RETRY_SECONDS,
    }
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


async def _pod_of(cluster: TestCluster, run_uid: str) -> dict[str, Any] | None:
    pods = await cluster.request(
        "GET", cluster.path("pods"), params={"labelSelector": f"agentrun.dev/run-uid={run_uid}"}
    )
    items: list[dict[str, Any]] = pods["items"]
    return items[0] if items else None


def _ready_reason(status: dict[str, Any]) -> str:
    return str({c["type"]: c for c in status.get("conditions") or []}.get("Ready", {}).get("reason"))


async def test_a_run_from_a_template_gets_the_templates_sandbox_with_its_own_fields_on_top(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await grant_service_account(cluster, "sandboxer", SANDBOX_RULES, probe=cluster.path("pods"))
    await create_template(cluster, "python-dev", **TEMPLATE)
    template = await cluster.request("GET", templates_path(cluster.namespace, "python-dev"))
    override = {"templateRef": {"name": "python-dev"}, "env": [{"name": "CI", "value": "true"}]}
    manifest = agentrun(
        "from-template",
        "[scenario:templated-sandbox] run the tests",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="sandboxer",
        sandbox=override,
    )
    created = await cluster.request("POST", cluster.runs_path, json=manifest)

    pod = await until(lambda: _pod_of(cluster, created["metadata"]["uid"]), "the sandbox pod", timeout=60)
    container = pod["spec"]["containers"][0]
    assert (container["image"], container["workingDir"]) == (IMAGE, "/src")  # the template's
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "128Mi"}
    names = [e["name"] for e in container["env"]]
    assert "CI" in names and "LANG" not in names  # the run's env replaces the template's as a whole
    status = (await cluster.request("GET", f"{cluster.runs_path}/from-template"))["status"]
    assert status["sandboxTemplate"] == {
        "name": "python-dev",
        "uid": template["metadata"]["uid"],
        "generation": template["metadata"]["generation"],
    }
    assert status["sandboxTemplateSpec"]["image"] == IMAGE
    final = await wait_status(cluster, "from-template", phase_in("Succeeded", "Failed"), timeout=120)
    assert (final["phase"], final["stopReason"]) == ("Failed", "FatalToolError"), final.get("message")


async def test_a_run_whose_template_is_missing_waits_pending_and_starts_when_it_is_created(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    manifest = agentrun(
        "waits-for-template",
        "[scenario:templated-answer] answer",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        sandbox={"templateRef": {"name": "later"}},
    )
    await cluster.request("POST", cluster.runs_path, json=manifest)
    pending = await wait_status(
        cluster, "waits-for-template", lambda s: _ready_reason(s) == "SandboxTemplateNotFound", timeout=60
    )
    assert pending["phase"] == "Pending"
    assert pending["message"] == (
        f"SandboxTemplate later (spec.sandbox.templateRef) not found in namespace {cluster.namespace}; "
        "the run starts when it is created"
    )
    assert model.requests_for("[scenario:templated-answer]") == []

    await create_template(cluster, "later", **TEMPLATE)
    # Woken by the template's watch event: the periodic look is two minutes away.
    final = await wait_status(cluster, "waits-for-template", phase_in("Succeeded", "Failed"), timeout=60)
    assert (final["phase"], final["result"]) == ("Succeeded", "Answered without a command."), final
    assert final["sandboxTemplate"]["name"] == "later"
    sent = model.requests_for("[scenario:templated-answer]")[0].body["tools"]
    assert [tool["name"] for tool in sent] == ["bash", "str_replace_based_edit_tool"]


async def test_a_template_edited_and_deleted_after_the_run_started_does_not_change_the_run(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    me = await cluster.whoami()
    await grant_service_account(cluster, "sandboxer", SANDBOX_RULES, probe=cluster.path("pods"))
    await create_template(cluster, "pinned", **TEMPLATE)
    manifest = agentrun(
        "pinned-run",
        "[scenario:templated-sandbox] run the tests",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="sandboxer",
        sandbox={"templateRef": {"name": "pinned"}, "requiresApproval": ["bash"]},
    )
    created = await cluster.request("POST", cluster.runs_path, json=manifest)
    awaiting = await wait_status(cluster, "pinned-run", phase_in("AwaitingApproval"), timeout=60)
    assert awaiting["sandboxTemplate"]["generation"] == 1

    edited = await cluster.request(
        "PATCH",
        templates_path(cluster.namespace, "pinned"),
        data=json.dumps({"spec": {"image": OTHER_IMAGE}}),
        headers=MERGE_PATCH,
    )
    assert edited["metadata"]["generation"] == 2
    await cluster.request("DELETE", templates_path(cluster.namespace, "pinned"))
    # A restarted operator resumes the run from its record, not from the template (gone by now).
    await operator.stop(kill=True)
    await operator.start()
    approval = {"toolUseId": "toolu_tpl1", "decision": "approve", "by": me}
    await cluster.request(
        "PATCH",
        f"{cluster.runs_path}/pinned-run",
        data=json.dumps({"spec": {"approvals": [approval]}}),
        headers=MERGE_PATCH,
    )

    pod = await until(lambda: _pod_of(cluster, created["metadata"]["uid"]), "the sandbox pod", timeout=60)
    assert pod["spec"]["containers"][0]["image"] == IMAGE
    final = await wait_status(cluster, "pinned-run", phase_in("Succeeded", "Failed"), timeout=120)
    assert (final["phase"], final["stopReason"]) == ("Failed", "FatalToolError"), final.get("message")
    assert final["sandboxTemplate"]["generation"] == 1 and final["sandboxTemplateSpec"]["image"] == IMAGE
