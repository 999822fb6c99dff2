"""A run read as an A2A task, and an Agent's card, checked against a2a-sdk's own message types: what
the server sends must parse as the protocol's Task and AgentCard (the SDK parses strictly by field name)."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.client.card_resolver import parse_agent_card
from a2a.types.a2a_pb2 import StreamResponse, Task, TaskState
from google.protobuf.json_format import ParseDict

from agentrun.a2a import cards, protocol, tasks
from agentrun.a2a.task_handling import Caller, Target, parse_send, run_name
from agentrun.console.identities import Identity


def run(phase: str | None, **status: Any) -> dict[str, Any]:
    metadata = {
        "name": "answerer-a2a-1",
        "namespace": "team-a",
        "uid": "u-1",
        "labels": {"agentrun.dev/agent": "answerer", tasks.LABEL_A2A: "true"},
        "annotations": {tasks.CONTEXT_ANNOTATION: "ctx-1"},
        "creationTimestamp": "2026-11-28T12:00:00Z",
    }
    return {"metadata": metadata, "status": {"phase": phase, **status} if phase else {}}


@pytest.mark.parametrize(
    ("phase", "state"),
    [
        (None, TaskState.TASK_STATE_SUBMITTED),
        ("Pending", TaskState.TASK_STATE_SUBMITTED),
        ("Running", TaskState.TASK_STATE_WORKING),
        ("AwaitingApproval", TaskState.TASK_STATE_WORKING),
        ("Succeeded", TaskState.TASK_STATE_COMPLETED),
        ("Failed", TaskState.TASK_STATE_FAILED),
        ("Cancelled", TaskState.TASK_STATE_CANCELED),
    ],
)
def test_each_run_phase_is_the_task_state_the_sdk_reads(phase: str | None, state: int) -> None:
    parsed = ParseDict(tasks.task(run(phase, result="42")), Task())
    assert (parsed.id, parsed.context_id, parsed.status.state) == ("answerer-a2a-1", "ctx-1", state)


def test_a_succeeded_run_answers_with_its_result_and_a_structured_one_with_its_output() -> None:
    text = ParseDict(tasks.task(run("Succeeded", result="42")), Task())
    assert [p.text for p in text.artifacts[0].parts] == ["42"]
    data = tasks.task(run("Succeeded", result="{}", output={"sum": 42}))
    assert data["artifacts"][0]["parts"][0]["data"] == {"sum": 42}
    assert protocol.task_text(data) == '{"sum": 42}'


def test_a_run_waiting_for_approval_says_which_tool_waits_and_a_failed_one_why() -> None:
    pending = [{"toolUseId": "t1", "toolName": "calculator"}]
    waiting = tasks.task(run("AwaitingApproval", pendingApprovals=pending, message="1 call waits"))
    assert "approve a tool call (calculator)" in protocol.status_text(waiting)
    failed = tasks.task(run("Failed", message="token budget exceeded"))
    assert protocol.status_text(failed) == "token budget exceeded"


def test_streamed_updates_parse_as_the_sdks_stream_responses() -> None:
    finished = run("Succeeded", result="42")
    artifact = tasks.result_artifact(finished)
    assert artifact is not None
    update = ParseDict(tasks.artifact_update(finished, artifact), StreamResponse())
    assert update.artifact_update.last_chunk and update.artifact_update.task_id == "answerer-a2a-1"
    status = ParseDict(tasks.status_update(finished), StreamResponse())
    assert status.status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_the_card_parses_as_the_sdks_agent_card_with_a_skill_even_when_none_is_declared() -> None:
    agent = {
        "metadata": {"name": "answerer", "namespace": "team-a", "generation": 3},
        "spec": {"a2a": {"expose": True}},
    }
    exposure = cards.exposure(agent)
    assert exposure is not None
    card = parse_agent_card(cards.card(agent, exposure, "https://a.example/agents/team-a/answerer"))
    assert card.name == "answerer" and [s.id for s in card.skills] == ["answerer"]
    assert card.supported_interfaces[0].protocol_version == "1.0"
    assert card.security_schemes["kubernetes"].http_auth_security_scheme.scheme == "Bearer"


def test_an_agent_is_exposed_only_when_it_says_so() -> None:
    assert cards.exposure({"spec": {}}) is None
    assert cards.exposure({"spec": {"a2a": {"expose": False, "description": "x"}}}) is None


def test_a_retried_message_names_the_same_run_and_another_caller_another() -> None:
    target = Target("team-a", "answerer")
    alice, bob = Caller("alice", Identity("alice")), Caller("bob", Identity("bob"))
    assert run_name(target, alice, "m-1") == run_name(target, alice, "m-1")
    assert run_name(target, alice, "m-1") != run_name(target, bob, "m-1")
    assert run_name(target, alice, "m-1").startswith("answerer-a2a-")


def test_a_send_takes_the_text_and_data_parts_and_refuses_what_a_run_cannot_take() -> None:
    message = {"messageId": "m", "parts": [{"text": "sum these"}, {"data": [1, 2]}], "contextId": "c"}
    sent = parse_send({"message": message, "configuration": {"returnImmediately": True}})
    assert (sent.text, sent.context_id, sent.return_immediately) == ("sum these\n[1, 2]", "c", True)
    with pytest.raises(protocol.RPCError) as caught:
        parse_send({})
    assert caught.value.code == protocol.INVALID_PARAMS


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--public-url", "agents.example.com"], "is not an http:// or https:// URL"),
        (["--wait-seconds", "0"], "must be positive"),
    ],
)
def test_the_command_refuses_settings_it_cannot_serve_with_a_one_line_error(
    args: list[str], words: str
) -> None:
    from agentrun.cli.a2a_command import config_of
    from agentrun.cli.main import _parser

    with pytest.raises(SystemExit, match=words):
        config_of(_parser().parse_args(["a2a", *args]))


async def test_a_wait_for_a_run_ends_when_the_caller_leaves_instead_of_reading_on_for_nobody() -> None:
    """An API server (real HTTP, on 127.0.0.1) whose run keeps running: the wait stops reading it once
    the caller is gone, long before its wait would have ended."""
    from aiohttp import web

    from agentrun.a2a.task_handling import TaskHandler
    from agentrun.console.api_calling import ClusterAPI
    from agentrun.kube.kubeconfig_loading import ClusterAccess
    from tests.support.local_servers import serving_app

    reads: list[str] = []

    async def get_run(request: web.Request) -> web.Response:
        reads.append(request.headers["Authorization"])
        return web.json_response(run("Running"))

    app = web.Application()
    app.router.add_get("/apis/agentrun.dev/v1alpha1/namespaces/team-a/agentruns/{name}", get_run)
    async with serving_app(app) as url:
        api = ClusterAPI(ClusterAccess(server=url, source="test"), own_credentials=False)
        handler = TaskHandler(api, poll_seconds=0.01)
        caller = Caller("alice", Identity("alice", bearer="alice-token"))
        target = Target("team-a", "answerer")
        last = await handler.settled(target, caller, "answerer-a2a-1", 60, lambda: len(reads) >= 3)
        await api.close()
    assert reads == ["Bearer alice-token"] * 3
    assert last is not None and tasks.state(last) == protocol.WORKING
