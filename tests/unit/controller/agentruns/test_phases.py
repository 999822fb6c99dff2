"""The phases of a run end it for the right reason, say why it waits, and hold nothing they give up."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from kubernetes_asyncio import client

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import StopReason
from agentrun.controller.agentruns import phases
from agentrun.controller.agentruns.phases import Ending
from agentrun.controller.agentruns.tool_environment import RunToolEnvironment
from agentrun.kube.calling import KubeClient
from agentrun.model.access import ModelAccess

SPEC: dict[str, Any] = {"task": "t", "model": {"name": "claude-sonnet-4-6"}}


class Announcements:
    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    async def __call__(self, reason: str, message: str) -> None:
        self.said.append((reason, message))
        self.changed.set()


def test_admit_ends_an_invalid_spec_naming_every_wrong_field() -> None:
    ending = phases.read_spec({"task": "", "model": {"name": "m", "maxTokens": 0}, "extra": 1})
    assert isinstance(ending, Ending)
    assert ending.outcome.stop_reason is StopReason.INVALID_SPEC
    assert "spec.model.maxTokens" in ending.outcome.message
    assert "spec.extra" in ending.outcome.message


def test_admit_ends_a_tool_configuration_the_schema_cannot_check() -> None:
    ending = phases.read_spec(
        {**SPEC, "tools": [{"builtin": {"name": "http_fetch", "config": {"bogus": 1}}}]}
    )
    assert isinstance(ending, Ending)
    assert ending.outcome.stop_reason is StopReason.INVALID_SPEC
    assert ending.outcome.message.startswith(
        "spec.tools[0].builtin.config: http_fetch: unknown keys ['bogus']"
    )


def test_admit_ends_an_unknown_builtin_naming_the_known_ones() -> None:
    """What a run applied before its CRD had the enum, or run with `agentrun run`, is told."""
    ending = phases.read_spec({**SPEC, "tools": [{"builtin": {"name": "no_such_tool"}}]})
    assert isinstance(ending, Ending)
    assert ending.outcome.message.startswith("spec.tools[0].builtin.name: Input should be 'calculator', ")


def test_admit_returns_the_validated_spec() -> None:
    spec = phases.read_spec(SPEC)
    assert isinstance(spec, AgentRunSpec) and spec.task == "t"


async def test_a_run_waits_pending_once_for_its_key_secret_and_starts_when_it_appears(
    kube: KubeClient, core: client.CoreV1Api
) -> None:
    spec = phases.read_spec(
        {**SPEC, "model": {**SPEC["model"], "apiKeySecretRef": {"name": "key", "key": "k"}}}
    )
    assert isinstance(spec, AgentRunSpec)
    announce, cancel = Announcements(), asyncio.Event()
    env = RunToolEnvironment(kube, "default", "uid-1", None)
    waiting = asyncio.create_task(
        phases.wait_for_secrets(
            spec, env, operator_key=None, cancel=cancel, announce=announce, retry_seconds=0.05
        )
    )
    await asyncio.wait_for(announce.changed.wait(), 5)
    await asyncio.sleep(0.2)  # several more looks, no new announcement
    assert announce.said == [
        (
            "SecretNotFound",
            "Secret default/key with key 'k' (spec.model.apiKeySecretRef) does not exist yet; "
            "the run starts once it does",
        )
    ]
    secret = {
        "metadata": {"name": "key", "namespace": "default"},
        "data": {"k": base64.b64encode(b"sk").decode()},
    }
    await core.create_namespaced_secret("default", secret)
    found = await asyncio.wait_for(waiting, 5)
    assert isinstance(found, ModelAccess) and found.api_key == "sk"


async def test_a_run_waits_for_each_config_map_and_secret_its_sandbox_mounts_in_turn(
    kube: KubeClient, core: client.CoreV1Api
) -> None:
    sandbox = {
        "image": "localhost/agentrun-sandbox:dev",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "volumes": [
            {"name": "settings", "mountPath": "/etc/settings", "configMap": {"name": "settings"}},
            {"name": "token", "mountPath": "/etc/token", "secret": {"secretName": "token"}},
        ],
    }
    spec = phases.read_spec({**SPEC, "sandbox": sandbox})
    assert isinstance(spec, AgentRunSpec)
    announce, cancel = Announcements(), asyncio.Event()
    env = RunToolEnvironment(kube, "default", "uid-1", None)
    waiting = asyncio.create_task(
        phases.wait_for_secrets(
            spec, env, operator_key="sk", cancel=cancel, announce=announce, retry_seconds=0.05
        )
    )
    await asyncio.wait_for(announce.changed.wait(), 5)
    announce.changed.clear()
    await core.create_namespaced_config_map("default", {"metadata": {"name": "settings"}})
    await asyncio.wait_for(announce.changed.wait(), 5)
    await core.create_namespaced_secret("default", {"metadata": {"name": "token"}, "data": {"t": "c2VjcmV0"}})
    found = await asyncio.wait_for(waiting, 5)
    assert isinstance(found, ModelAccess) and found.api_key == "sk"
    assert announce.said == [
        (
            "ConfigMapNotFound",
            "ConfigMap default/settings (spec.sandbox.volumes[0].configMap) does not exist yet; "
            "the run starts once it does",
        ),
        (
            "SecretNotFound",
            "Secret default/token (spec.sandbox.volumes[1].secret) does not exist yet; "
            "the run starts once it does",
        ),
    ]


async def test_without_a_key_anywhere_the_run_says_so_and_a_cancel_ends_it() -> None:
    spec = phases.read_spec(SPEC)
    assert isinstance(spec, AgentRunSpec)
    announce, cancel = Announcements(), asyncio.Event()
    env = RunToolEnvironment(None, "default", "uid-1", None)
    waiting = asyncio.create_task(
        phases.wait_for_secrets(
            spec, env, operator_key=None, cancel=cancel, announce=announce, retry_seconds=60
        )
    )
    await asyncio.wait_for(announce.changed.wait(), 5)
    assert announce.said[0][0] == "APIKeyMissing"
    cancel.set()
    ending = await asyncio.wait_for(waiting, 5)
    assert isinstance(ending, Ending) and ending.outcome.stop_reason is StopReason.CANCELLED
    assert ending.outcome.message == "spec.cancel was set while pending"


async def test_the_operators_key_is_used_when_the_spec_names_none() -> None:
    spec = phases.read_spec(SPEC)
    assert isinstance(spec, AgentRunSpec)
    env = RunToolEnvironment(None, "default", "uid-1", None)
    found = await phases.secrets_ready(spec, env, operator_key="sk-operator")
    assert isinstance(found, ModelAccess) and found.api_key == "sk-operator"
