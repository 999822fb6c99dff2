"""The Agent validator against the emulator: it writes status only when it changes, only on the owner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrun.controller.agents.control import AgentValidator
from agentrun.kube.calling import KubeClient

NAMESPACE = "default"
MODEL = {"name": "claude-haiku-4-5"}
BAD_TOOL = [{"builtin": {"name": "kubernetes_get", "config": {"bogus": 1}}}]


class Owned:
    """An Ownership whose answer the test sets, and tells its subscribers about."""

    def __init__(self, owns: bool) -> None:
        self.owned = owns
        self.fenced = False
        self.subscribers: list[Callable[[], None]] = []

    def owns(self, uid: str) -> bool:
        return self.owned

    def subscribe(self, changed: Callable[[], None]) -> None:
        self.subscribers.append(changed)

    def change(self, owns: bool) -> None:
        self.owned = owns
        for changed in self.subscribers:
            changed()


async def create(kube: KubeClient, name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"model": MODEL, **spec},
    }
    created: dict[str, Any] = await kube._custom.create_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", NAMESPACE, "agents", body
    )
    return created


async def read(kube: KubeClient, name: str) -> dict[str, Any]:
    found = await kube.get_agent(NAMESPACE, name)
    assert found is not None
    return found


async def test_a_valid_agent_gets_ready_true_at_its_generation_and_a_repeat_writes_nothing(
    kube: KubeClient,
) -> None:
    validator = AgentValidator(kube)
    created = await create(kube, "good")
    await validator.observe("ADDED", created)
    stored = await read(kube, "good")
    [ready] = stored["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "Valid")
    assert stored["status"]["observedGeneration"] == created["metadata"]["generation"]
    # Its own write comes back as an event, and the stale body of the first event again: no write.
    await validator.observe("MODIFIED", stored)
    await validator.observe("MODIFIED", created)
    assert (await read(kube, "good"))["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


async def test_fixing_an_invalid_agent_flips_ready_to_true_at_the_new_generation(kube: KubeClient) -> None:
    validator = AgentValidator(kube)
    await validator.observe("ADDED", await create(kube, "broken", tools=BAD_TOOL))
    stored = await read(kube, "broken")
    [ready] = stored["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.tools[0].builtin.config: kubernetes_get: unknown keys")
    fixed: dict[str, Any] = await kube._custom.patch_namespaced_custom_object(
        "agentrun.dev",
        "v1alpha1",
        NAMESPACE,
        "agents",
        "broken",
        [{"op": "replace", "path": "/spec/tools/0/builtin/config", "value": {}}],
    )
    await validator.observe("MODIFIED", fixed)
    status = (await read(kube, "broken"))["status"]
    assert status["observedGeneration"] == fixed["metadata"]["generation"] == 2
    [ready] = status["conditions"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("True", "Valid", 2)


async def test_only_the_owner_writes_and_a_replica_that_becomes_the_owner_writes_at_once(
    kube: KubeClient,
) -> None:
    ownership = Owned(False)
    validator = AgentValidator(kube, ownership)
    await validator.observe("ADDED", await create(kube, "elsewhere"))
    assert "status" not in await read(kube, "elsewhere")
    ownership.change(True)
    await validator.idle()
    [ready] = (await read(kube, "elsewhere"))["status"]["conditions"]
    assert ready["status"] == "True"
