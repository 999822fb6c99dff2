"""GitOps: Argo CD's health check and Flux's kstatus read real AgentRun status; kustomize; immutability.

The status objects come from the real operator process against the scenario's API server (the
emulator, or a real one with --real-cluster), captured once per module in each phase a GitOps tool
can meet: Pending (its Secret is missing), Running, AwaitingApproval, Succeeded, Failed (InvalidSpec)
and Cancelled. The Argo CD health check is the Lua file we ship (docs/argocd-health.lua), run by a
real Lua VM (lupa) with the object converted the way Argo CD passes it: a table of tables, arrays
1-based.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lupa  # type: ignore[import-untyped]
import pytest
import yaml

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support import kstatus
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster, cluster_for
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
HEALTH_LUA = ROOT / "docs" / "argocd-health.lua"
EXAMPLES = ROOT / "examples"
API_KEY = "sk-ant-gitops-0123456789"
MODEL = {"name": "claude-haiku-4-5"}

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
    cluster: TestCluster, name: str, phase: str | tuple[str, ...], timeout: float = 60
) -> dict[str, Any]:
    phases = (phase,) if isinstance(phase, str) else phase
    found: dict[str, Any] = await until(
        lambda: cluster.request("GET", f"{cluster.runs_path}/{name}"),
        f"{name} to reach {phases}",
        timeout,
        done=lambda obj: obj.get("status", {}).get("phase") in phases,
        every=0.1,
        explain=lambda obj: f"its status: {obj.get('status')}",
    )
    return dict(found)


async def _capture(tmp: Path, real_kubeconfig: Path | None) -> dict[str, dict[str, Any]]:
    """One AgentRun object per state, as the API server returned it."""
    model = FakeMessagesAPI(scripts=SCRIPTS)
    async with model.running() as served, cluster_for(real_kubeconfig) as cluster:
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": served.url}
        runs = cluster.runs_path
        async with cluster.operator(tmp / "operator.log", env):
            manifests = [
                agentrun(
                    "succeeded",
                    "[gitops:tools] 2+2",
                    namespace=cluster.namespace,
                    model=MODEL,
                    tools=[{"builtin": {"name": "calculator"}}],
                ),
                # A model the operator's price table does not know: refused before any request.
                agentrun(
                    "invalid",
                    "[gitops:tools] unpriced",
                    namespace=cluster.namespace,
                    model={"name": "my-unpriced-proxy-model"},
                    limits={"costBudgetUSD": 1},
                ),
                agentrun(
                    "pending",
                    "[gitops:tools] key",
                    namespace=cluster.namespace,
                    model={**MODEL, "apiKeySecretRef": {"name": "not-there-yet", "key": "api-key"}},
                ),
                agentrun("running", "[gitops:slow] wait", namespace=cluster.namespace, model=MODEL),
                agentrun(
                    "approval",
                    "[gitops:approval] ask",
                    namespace=cluster.namespace,
                    model=MODEL,
                    tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}],
                ),
            ]
            for manifest in manifests:
                await cluster.request("POST", runs, json=manifest)
            captured = {
                "succeeded": await _wait(cluster, "succeeded", "Succeeded"),
                "invalid": await _wait(cluster, "invalid", "Failed"),
                "pending": await _wait(cluster, "pending", "Pending"),
                "running": await _wait(cluster, "running", "Running"),
                "approval": await _wait(cluster, "approval", "AwaitingApproval"),
            }
            await _merge_patch(cluster, "running", {"spec": {"cancel": True}})
            captured["cancelled"] = await _wait(cluster, "running", "Cancelled")
            # A finished run whose spec still changes (a TTL added later): generation moves on.
            await _merge_patch(cluster, "succeeded", {"spec": {"ttlSecondsAfterFinished": 3600}})
            await asyncio.sleep(1)  # give the operator a chance to react (it must not need to)
            captured["finished-then-patched"] = await cluster.request("GET", f"{runs}/succeeded")
    return captured


async def _merge_patch(cluster: TestCluster, name: str, body: Mapping[str, Any]) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    await cluster.request("PATCH", f"{cluster.runs_path}/{name}", json=body, headers=headers)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, real_kubeconfig: Path | None) -> dict[str, dict[str, Any]]:
    # A sync module fixture with its own event loop: one operator (and one API server or namespace,
    # as the `cluster` fixture would give a test) for all the status objects.
    return asyncio.run(_capture(tmp_path_factory.mktemp("gitops"), real_kubeconfig))


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
    assert 'model "my-unpriced-proxy-model" is not in the operator\'s price table' in message
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


async def test_a_started_runs_spec_is_immutable_except_cancel_approvals_and_ttl_and_reapply_is_a_no_op(
    cluster: TestCluster, tmp_path: Path
) -> None:
    manifest = agentrun(
        "immutable",
        "[gitops:slow] the task",
        namespace=cluster.namespace,
        model=MODEL,
        tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}],
    )
    manifest_file = tmp_path / "run.yaml"
    manifest_file.write_text(yaml.safe_dump(manifest))
    model = FakeMessagesAPI(scripts=SCRIPTS)
    async with model.running() as served:
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": served.url}
        async with cluster.operator(tmp_path / "operator.log", env):
            code, out = await cluster.kubectl("apply", "-f", str(manifest_file))
            assert (code, out.strip()) == (0, "agentrun.agentrun.dev/immutable created")
            before = await _wait(cluster, "immutable", "Running")

            code, out = await cluster.kubectl("apply", "-f", str(manifest_file))
            assert (code, out.strip()) == (0, "agentrun.agentrun.dev/immutable unchanged")
            after = await cluster.request("GET", f"{cluster.runs_path}/immutable")
            assert after["metadata"]["generation"] == before["metadata"]["generation"] == 1
            assert after["status"] == before["status"]

            changed = copy.deepcopy(manifest)
            changed["spec"]["task"] = "[gitops:slow] another task"
            code, out = await cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(changed))
            assert code != 0
            assert "spec.task: Invalid value" in out
            assert "spec.task is immutable once created" in out
            for field, value in [
                ("systemPrompt", "added later"),  # adding an optional field is a change too
                ("limits", {"maxIterations": 3}),
            ]:
                patch = json.dumps({"spec": {field: value}})
                code, out = await cluster.kubectl(
                    "patch", "agentrun", "immutable", "--type=merge", "-p", patch
                )
                assert code != 0 and "immutable" in out, (field, out)
            unchanged = await cluster.request("GET", f"{cluster.runs_path}/immutable")
            assert unchanged["metadata"]["generation"] == 1

            approval = {"toolUseId": "toolu_none", "decision": "deny", "by": "jane", "reason": "no"}
            for patch_body in [
                {"spec": {"ttlSecondsAfterFinished": 600}},
                {"spec": {"approvals": [approval]}},
                {"spec": {"cancel": True}},
            ]:
                code, out = await cluster.kubectl(
                    "patch", "agentrun", "immutable", "--type=merge", "-p", json.dumps(patch_body)
                )
                assert code == 0, out
            cancelled = await _wait(cluster, "immutable", "Cancelled")
            assert cancelled["metadata"]["generation"] == 4
            assert cancelled["spec"]["task"] == "[gitops:slow] the task"
