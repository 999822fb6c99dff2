"""GitOps: Argo CD's health check and Flux's kstatus read real AgentRun status; kustomize; immutability.

The status objects come from the real operator process against the emulator, captured once per
module in each phase a GitOps tool can meet: Pending (its Secret is missing), Running,
AwaitingApproval, Succeeded, Failed (InvalidSpec) and Cancelled. The Argo CD health check is the
Lua file we ship (docs/argocd-health.lua), run by a real Lua VM (lupa) with the object converted
the way Argo CD passes it: a table of tables, arrays 1-based.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lupa  # type: ignore[import-untyped]
import pytest
import yaml

from agentrun.sandbox.kube_api import KubeAPI
from agentrun.sandbox.messages_api import FakeMessagesAPI
from agentrun.sandbox.messages_script import Reply, Script, text_block, tool_use_block
from tests.support import kstatus
from tests.support.builders import agentrun
from tests.support.kube_client import KubeClient
from tests.support.operator_process import OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
HEALTH_LUA = ROOT / "docs" / "argocd-health.lua"
EXAMPLES = ROOT / "examples"
RUNS = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
API_KEY = "sk-ant-gitops-0123456789"
MODEL = {"name": "claude-haiku-4-5"}
FINISHED = ("Succeeded", "Failed", "Cancelled")

SCRIPTS = [
    Script(
        "[gitops:tools]",
        [
            Reply([tool_use_block("calculator", {"expression": "2+2"})]),
            Reply([text_block("4")]),
        ],
    ),
    Script("[gitops:slow]", [Reply([text_block("late")], delay_seconds=120)]),
    Script(
        "[gitops:approval]",
        [Reply([tool_use_block("calculator", {"expression": "1+1"})]), Reply([text_block("2")])],
    ),
]


# --- capturing real status objects ------------------------------------------------------------------


async def _wait(
    client: KubeClient, name: str, phase: str | tuple[str, ...], timeout: float = 30
) -> dict[str, Any]:
    phases = (phase,) if isinstance(phase, str) else phase
    deadline = time.monotonic() + timeout
    obj: dict[str, Any] = {}
    while time.monotonic() < deadline:
        answer = await client.get(f"{RUNS}/{name}")
        assert answer.status == 200, answer.body
        obj = answer.body
        if obj.get("status", {}).get("phase") in phases:
            return dict(obj)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} did not reach {phases}: {obj.get('status')}")


async def _capture(tmp: Path) -> dict[str, dict[str, Any]]:
    """One AgentRun object per state, as the API server returned it."""
    model = FakeMessagesAPI(scripts=SCRIPTS)
    async with model.running() as served, KubeAPI.running(crd_paths=[CRD]) as kube:
        operator = OperatorProcess(
            kubeconfig=kube.kubeconfig_path,
            log_path=tmp / "operator.log",
            env={"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": served.url},
        )
        await operator.start()
        try:
            async with KubeClient(kube.url) as client:
                manifests = [
                    agentrun(
                        "succeeded",
                        "[gitops:tools] 2+2",
                        model=MODEL,
                        tools=[{"builtin": {"name": "calculator"}}],
                    ),
                    # A cost budget for a model without a price: refused before any request.
                    agentrun(
                        "invalid",
                        "[gitops:tools] unpriced",
                        model={"name": "my-unpriced-proxy-model"},
                        limits={"costBudgetUSD": 1},
                    ),
                    agentrun(
                        "pending",
                        "[gitops:tools] key",
                        model={**MODEL, "apiKeySecretRef": {"name": "not-there-yet", "key": "api-key"}},
                    ),
                    agentrun("running", "[gitops:slow] wait", model=MODEL),
                    agentrun(
                        "approval",
                        "[gitops:approval] ask",
                        model=MODEL,
                        tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}],
                    ),
                ]
                for manifest in manifests:
                    answer = await client.post(RUNS, manifest)
                    assert answer.status == 201, answer.body
                captured = {
                    "succeeded": await _wait(client, "succeeded", "Succeeded"),
                    "invalid": await _wait(client, "invalid", "Failed"),
                    "pending": await _wait(client, "pending", "Pending"),
                    "running": await _wait(client, "running", "Running"),
                    "approval": await _wait(client, "approval", "AwaitingApproval"),
                }
                await client.patch(f"{RUNS}/running", {"spec": {"cancel": True}})
                captured["cancelled"] = await _wait(client, "running", "Cancelled")
                # A finished run whose spec still changes (a TTL added later): generation moves on.
                patched = await client.patch(f"{RUNS}/succeeded", {"spec": {"ttlSecondsAfterFinished": 3600}})
                assert patched.status == 200, patched.body
                await asyncio.sleep(1)  # give the operator a chance to react (it must not need to)
                captured["finished-then-patched"] = (await client.get(f"{RUNS}/succeeded")).body
        finally:
            await operator.stop()
    return captured


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    # A sync module fixture with its own event loop: one operator for all the status objects.
    return asyncio.run(_capture(tmp_path_factory.mktemp("gitops")))


def test_the_captured_runs_are_in_the_states_gitops_tools_meet(runs: dict[str, dict[str, Any]]) -> None:
    phases = {name: (obj["status"]["phase"], obj["status"].get("stopReason")) for name, obj in runs.items()}
    assert phases["succeeded"] == ("Succeeded", "EndTurn")
    assert phases["invalid"] == ("Failed", "InvalidSpec")
    assert phases["pending"][0] == "Pending"
    assert phases["running"][0] == "Running"
    assert phases["approval"][0] == "AwaitingApproval"
    assert phases["cancelled"] == ("Cancelled", "Cancelled")
    conditions = {c["type"]: c for c in runs["pending"]["status"]["conditions"]}
    assert conditions["Succeeded"]["reason"] == "SecretNotFound"


# --- Argo CD ------------------------------------------------------------------------------------------


def _lua_value(lua: Any, value: Any) -> Any:
    """A Python value as Argo CD hands JSON to Lua: objects and arrays become tables."""
    if isinstance(value, Mapping):
        return lua.table_from({k: _lua_value(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_lua_value(lua, v) for v in value])
    return value


def argo_health(obj: Mapping[str, Any]) -> tuple[str, str]:
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = _lua_value(lua, json.loads(json.dumps(obj)))
    result = lua.execute(HEALTH_LUA.read_text())
    return str(result["status"]), str(result["message"])


ARGO_EXPECTED = {
    "pending": "Progressing",
    "running": "Progressing",
    "approval": "Progressing",
    "succeeded": "Healthy",
    "invalid": "Degraded",
    "cancelled": "Degraded",
    "finished-then-patched": "Healthy",
}


@pytest.mark.parametrize("state", ARGO_EXPECTED)
def test_argo_cd_health_check_reads_real_status(runs: dict[str, dict[str, Any]], state: str) -> None:
    status, message = argo_health(runs[state])
    assert status == ARGO_EXPECTED[state], message
    assert runs[state]["status"]["phase"] in message


def test_argo_cd_health_message_carries_the_stop_reason_and_the_conditions_message(
    runs: dict[str, dict[str, Any]],
) -> None:
    _, message = argo_health(runs["invalid"])
    assert message.startswith("Failed (InvalidSpec): ")
    assert "costBudgetUSD" in message
    _, pending = argo_health(runs["pending"])
    assert "not-there-yet" in pending


def test_argo_cd_sees_a_new_run_without_status_as_progressing() -> None:
    fresh = agentrun("fresh", "x")
    fresh["metadata"]["generation"] = 1
    assert argo_health(fresh)[0] == "Progressing"


def test_argo_cd_waits_for_an_unobserved_generation_of_an_unfinished_run(
    runs: dict[str, dict[str, Any]],
) -> None:
    running = copy.deepcopy(runs["running"])
    running["metadata"]["generation"] = running["status"]["observedGeneration"] + 1
    status, message = argo_health(running)
    assert status == "Progressing" and "generation" in message


# --- Flux (kstatus) -----------------------------------------------------------------------------------

KSTATUS_EXPECTED = {
    "pending": "InProgress",
    "running": "InProgress",
    "approval": "InProgress",
    "succeeded": "Current",
    "invalid": "Failed",
    "cancelled": "Failed",
    "finished-then-patched": "Current",
}


@pytest.mark.parametrize("state", KSTATUS_EXPECTED)
def test_flux_kstatus_reads_real_status(runs: dict[str, dict[str, Any]], state: str) -> None:
    obj = runs[state]
    result = kstatus.compute(obj)
    assert result.status == KSTATUS_EXPECTED[state], result
    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert {"Ready", "Reconciling", "Stalled", "Succeeded"} <= set(conditions)
    for condition in conditions.values():
        assert condition["status"] in ("True", "False", "Unknown")
        assert condition["reason"] and condition["lastTransitionTime"]
        assert condition["observedGeneration"] == obj["metadata"]["generation"]
    # Ready is True exactly when kstatus says Current.
    assert (conditions["Ready"]["status"] == "True") == (result.status == "Current")


def test_kstatus_rules_follow_cli_utils_for_custom_resources() -> None:
    base: dict[str, Any] = {"kind": "AgentRun", "metadata": {"generation": 2}, "status": {}}
    assert kstatus.compute(base).status == "Current"
    stale = {**base, "status": {"observedGeneration": 1}}
    assert kstatus.compute(stale).reason == "LatestGenerationNotObserved"
    stalled = {**base, "status": {"conditions": [{"type": "Stalled", "status": "True"}]}}
    assert kstatus.compute(stalled).status == "Failed"
    reconciling = {**base, "status": {"conditions": [{"type": "Reconciling", "status": "True"}]}}
    assert kstatus.compute(reconciling).status == "InProgress"
    deleting = {**base, "metadata": {"generation": 2, "deletionTimestamp": "2025-01-01T00:00:00Z"}}
    assert kstatus.compute(deleting).status == "Terminating"


# --- kustomize ----------------------------------------------------------------------------------------


def test_examples_kustomization_renders_every_example_into_one_namespace() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(EXAMPLES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kustomization = yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())
    example_files = sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == example_files, "list every example in the kustomization"
    names = sorted(
        d["metadata"]["name"]
        for p in example_files
        for d in yaml.safe_load_all((EXAMPLES / p).read_text())
        if d and d.get("kind") == "AgentRun"
    )
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "AgentRun") == names
    assert {d["metadata"]["namespace"] for d in docs} == {kustomization["namespace"]}


# --- immutability and re-apply ------------------------------------------------------------------------


async def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> tuple[int, str]:
    """kubectl as a child process; async, because the emulator serves from this very event loop."""
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        str(kubeconfig),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_a_started_runs_spec_is_immutable_except_cancel_approvals_and_ttl_and_reapply_is_a_no_op(
    tmp_path: Path,
) -> None:
    manifest = agentrun(
        "immutable",
        "[gitops:slow] the task",
        model=MODEL,
        tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}],
    )
    manifest_file = tmp_path / "run.yaml"
    manifest_file.write_text(yaml.safe_dump(manifest))
    model = FakeMessagesAPI(scripts=SCRIPTS)
    async with model.running() as served, KubeAPI.running(crd_paths=[CRD]) as kube:
        config = kube.kubeconfig_path
        operator = OperatorProcess(
            kubeconfig=config,
            log_path=tmp_path / "operator.log",
            env={"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": served.url},
        )
        await operator.start()
        try:
            async with KubeClient(kube.url) as client:
                code, out = await _kubectl(config, "apply", "-f", str(manifest_file))
                assert (code, out.strip()) == (0, "agentrun.agentrun.dev/immutable created")
                before = await _wait(client, "immutable", "Running")

                code, out = await _kubectl(config, "apply", "-f", str(manifest_file))
                assert (code, out.strip()) == (0, "agentrun.agentrun.dev/immutable unchanged")
                after = (await client.get(f"{RUNS}/immutable")).body
                assert after["metadata"]["generation"] == before["metadata"]["generation"] == 1
                assert after["status"] == before["status"]

                changed = copy.deepcopy(manifest)
                changed["spec"]["task"] = "[gitops:slow] another task"
                code, out = await _kubectl(config, "apply", "-f", "-", stdin=yaml.safe_dump(changed))
                assert code != 0
                assert "spec.task: Invalid value" in out
                assert "spec.task is immutable once created" in out
                for field, value in [
                    ("systemPrompt", "added later"),  # adding an optional field is a change too
                    ("limits", {"maxIterations": 3}),
                ]:
                    patch = json.dumps({"spec": {field: value}})
                    code, out = await _kubectl(
                        config, "patch", "agentrun", "immutable", "--type=merge", "-p", patch
                    )
                    assert code != 0 and "immutable" in out, (field, out)
                assert (await client.get(f"{RUNS}/immutable")).body["metadata"]["generation"] == 1

                approval = {"toolUseId": "toolu_none", "decision": "deny", "by": "jane", "reason": "no"}
                for patch_body in [
                    {"spec": {"ttlSecondsAfterFinished": 600}},
                    {"spec": {"approvals": [approval]}},
                    {"spec": {"cancel": True}},
                ]:
                    code, out = await _kubectl(
                        config, "patch", "agentrun", "immutable", "--type=merge", "-p", json.dumps(patch_body)
                    )
                    assert code == 0, out
                cancelled = await _wait(client, "immutable", "Cancelled")
                assert cancelled["metadata"]["generation"] == 4
                assert cancelled["spec"]["task"] == "[gitops:slow] the task"
        finally:
            await operator.stop()
