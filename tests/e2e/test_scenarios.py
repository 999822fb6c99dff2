"""The key integration scenarios against a real API server (`make e2e`; `make e2e-kind` on kind).

The operator runs as a local process with the caller's kubeconfig, serving only the test's own
namespace; the model is the scripted fake Messages API on 127.0.0.1. Where the emulator and a real
API server disagree on these scenarios, the emulator is wrong.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrun.sandbox.messages_api import FakeMessagesAPI
from agentrun.sandbox.messages_script import Reply, Script, text_block, tool_use_block
from tests.e2e.cluster import Cluster
from tests.integration.test_gitops import argo_health
from tests.support import kstatus
from tests.support.builders import agentrun
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-e2e-0123456789"
MODEL = {"name": "claude-haiku-4-5"}
SCRIPTS = [
    Script(
        "[e2e:tools]",
        [Reply([tool_use_block("calculator", {"expression": "17*23+4"})]), Reply([text_block("395 pods.")])],
    ),
    Script("[e2e:answer]", [Reply([text_block("done")])]),
    Script("[e2e:slow]", [Reply([text_block("late")], delay_seconds=300)]),
]


@pytest.fixture
async def operator(cluster: Cluster, tmp_path: Path) -> AsyncIterator[OperatorProcess]:
    model = FakeMessagesAPI(scripts=SCRIPTS)
    async with model.running() as served:
        process = OperatorProcess(
            kubeconfig=cluster.kubeconfig,
            log_path=tmp_path / "operator.log",
            env={
                "ANTHROPIC_API_KEY": API_KEY,
                "ANTHROPIC_BASE_URL": served.url,
                "AGENTRUN_SECRET_RETRY_SECONDS": "1",
            },
            args=("--namespace", cluster.namespace),
        )
        await process.start()
        try:
            yield process
        finally:
            await process.stop()


def _run(cluster: Cluster, name: str, task: str, **spec: object) -> dict[str, object]:
    spec.setdefault("model", MODEL)
    return agentrun(name, task, namespace=cluster.namespace, **spec)


async def test_a_run_with_a_tool_succeeds_and_kubectl_wait_sees_it(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    await cluster.apply(
        _run(cluster, "calc", "[e2e:tools] pods?", tools=[{"builtin": {"name": "calculator"}}])
    )
    code, out = await cluster.kubectl("wait", "--for=condition=Succeeded", "agentrun/calc", "--timeout=90s")
    assert code == 0, out
    obj = await cluster.get("calc")
    assert obj is not None
    status = obj["status"]
    assert (status["phase"], status["stopReason"], status["result"]) == ("Succeeded", "EndTurn", "395 pods.")
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert kstatus.compute(obj).status == "Current"
    assert argo_health(obj)[0] == "Healthy"


async def test_a_run_waits_for_its_secret_and_starts_when_it_appears(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    ref = {"name": "late-key", "key": "api-key"}
    await cluster.apply(_run(cluster, "late", "[e2e:answer] key", model={**MODEL, "apiKeySecretRef": ref}))
    pending = await cluster.wait_phase("late", "Pending")
    assert kstatus.compute(pending).status == "InProgress"
    assert argo_health(pending)[0] == "Progressing"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "late-key", "namespace": cluster.namespace},
        "data": {"api-key": base64.b64encode(API_KEY.encode()).decode()},
    }
    await cluster.apply(secret)
    assert (await cluster.wait_phase("late", "Succeeded", "Failed"))["status"]["phase"] == "Succeeded"


async def test_cancel_stops_a_running_run_and_flux_reads_it_as_failed(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    await cluster.apply(_run(cluster, "cancel-me", "[e2e:slow] forever"))
    await cluster.wait_phase("cancel-me", "Running")
    code, out = await cluster.kubectl(
        "patch", "agentrun", "cancel-me", "--type=merge", "-p", json.dumps({"spec": {"cancel": True}})
    )
    assert code == 0, out
    obj = await cluster.wait_phase("cancel-me", "Cancelled")
    assert obj["status"]["stopReason"] == "Cancelled"
    # The cancel patch made a new generation; once the operator records it as observed, Flux stops
    # waiting and reports the run as failed (cancelled runs are final).
    for _ in range(60):
        later = await cluster.get("cancel-me")
        if later is not None and kstatus.compute(later).status == "Failed":
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError(f"kstatus never read the cancelled run as Failed: {later}")
    assert argo_health(later)[0] == "Degraded"


async def test_reapplying_is_a_no_op_and_a_changed_task_is_rejected(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    manifest = _run(cluster, "fixed", "[e2e:slow] the task")
    assert await cluster.apply(manifest) == "agentrun.agentrun.dev/fixed created"
    before = await cluster.wait_phase("fixed", "Running")
    assert await cluster.apply(manifest) == "agentrun.agentrun.dev/fixed unchanged"
    after = await cluster.get("fixed")
    assert after is not None and after["metadata"]["generation"] == before["metadata"]["generation"]
    changed = json.loads(json.dumps(manifest))
    changed["spec"]["task"] = "[e2e:slow] another task"
    code, out = await cluster.kubectl("apply", "-f", "-", stdin=json.dumps(changed))
    assert code != 0 and "spec.task is immutable once created" in out
    code, out = await cluster.kubectl(
        "patch", "agentrun", "fixed", "--type=merge", "-p", json.dumps({"spec": {"cancel": True}})
    )
    assert code == 0, out
    await cluster.wait_phase("fixed", "Cancelled")
