"""`agentrun a2a` with the real operator, on the emulator and on a real API server: a2a-sdk's own client
sends tasks to an exposed Agent as a person, each task is an AgentRun created with that person's token
(RBAC and quotas apply as to any run), its state follows the run; and a run's A2A tool calls the server.

alice may create, read and cancel runs; bob may only read them. The server's own kubeconfig is the
cluster's admin here: a task that succeeded with the server's rights would prove nothing, so bob's
refusal is the proof that the caller's identity is the one used.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from a2a.client import A2AClientError
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError

from agentrun.a2a import tasks
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.a2a_serving import a2a_process, agent_url, running_a2a, sdk_client
from tests.support.builders import agent, agentrun
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.console import Person, person
from tests.support.kube_requests import until, wait_finished
from tests.support.operator_process import OperatorProcess
from tests.support.quotas import create_quota, install_quota_crd

API_KEY = "sk-ant-a2a-0123456789"
RUNS = {
    "apiGroups": ["agentrun.dev"],
    "resources": ["agentruns"],
    "verbs": ["create", "get", "list", "patch"],
}
READ_RUNS = {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"], "verbs": ["get", "list"]}
EXPOSED = {
    "expose": True,
    "description": "Answers arithmetic questions.",
    "skills": [{"id": "sums", "name": "Sums", "description": "Adds numbers.", "examples": ["6*7?"]}],
}
MODEL = {"name": "claude-haiku-4-5", "maxTokens": 500}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script("[scenario:a2a-answer]", [Reply([text_block("the answer is 42")])]),
            Script(
                "[scenario:a2a-gated]",
                [Reply([tool_use_block("calculator", {"expression": "6*7"})]), Reply([text_block("42")])],
            ),
            Script(
                "[scenario:a2a-caller]",
                [
                    Reply([tool_use_block("arithmetic", {"message": "[scenario:a2a-answer] what is 6*7?"})]),
                    Reply([text_block("the remote agent said 42")]),
                ],
            ),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def people(cluster: TestCluster) -> dict[str, Person]:
    return {"alice": await person(cluster, "alice", [RUNS]), "bob": await person(cluster, "bob", [READ_RUNS])}


@pytest.fixture
async def a2a(cluster: TestCluster) -> AsyncIterator[str]:
    specs: dict[str, dict[str, Any]] = {
        "answerer": {"model": MODEL, "a2a": EXPOSED},
        "gated": {
            "model": MODEL,
            "tools": [{"builtin": {"name": "calculator"}, "requiresApproval": True}],
            "a2a": {"expose": True},
        },
        "private": {"model": MODEL},
    }
    for name, spec in specs.items():
        await cluster.request("POST", _agents(cluster), json=agent(name, namespace=cluster.namespace, **spec))
    async with running_a2a(cluster) as root:
        yield root


def _agents(cluster: TestCluster) -> str:
    return f"{RUNS_API}/namespaces/{cluster.namespace}/agents"


def _request(text: str, message_id: str, *, immediately: bool = False) -> SendMessageRequest:
    request = SendMessageRequest(
        message=Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])
    )
    request.configuration.return_immediately = immediately
    return request


async def _runs(cluster: TestCluster) -> list[dict[str, Any]]:
    listed = await cluster.request("GET", cluster.runs_path)
    return [r for r in listed["items"] if tasks.LABEL_A2A in (r["metadata"].get("labels") or {})]


async def test_an_exposed_agents_card_is_published_at_the_well_known_path_and_no_other_agents(
    cluster: TestCluster, a2a: str
) -> None:
    base = agent_url(a2a, cluster.namespace, "answerer")
    async with sdk_client(base, None) as (_, card):
        assert (card.name, card.description) == ("answerer", "Answers arithmetic questions.")
        assert [(s.id, list(s.examples)) for s in card.skills] == [("sums", ["6*7?"])]
        assert card.supported_interfaces[0].url == base
        assert card.capabilities.streaming
        assert "kubernetes" in card.security_schemes
    async with aiohttp.ClientSession() as http:
        for name in ("private", "absent"):
            answer = await http.get(agent_url(a2a, cluster.namespace, name) + "/.well-known/agent-card.json")
            assert answer.status == 404, name
            assert "is exposed here" in (await answer.json())["error"]


async def test_the_sdks_client_sends_a_task_that_becomes_a_run_of_the_agent_and_answers_its_result(
    cluster: TestCluster, operator: OperatorProcess, people: dict[str, Person], a2a: str
) -> None:
    async with sdk_client(agent_url(a2a, cluster.namespace, "answerer"), people["alice"].token) as (
        client,
        _,
    ):
        events = [e async for e in client.send_message(_request("[scenario:a2a-answer] 6*7?", "m-1"))]
    task = events[-1].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    assert [p.text for p in task.artifacts[0].parts] == ["the answer is 42"]
    (run,) = await _runs(cluster)
    assert run["metadata"]["name"] == task.id
    assert run["spec"] == {"task": "[scenario:a2a-answer] 6*7?", "agentRef": {"name": "answerer"}}
    assert run["metadata"]["annotations"][tasks.CALLER_ANNOTATION] == people["alice"].username
    assert run["status"]["phase"] == "Succeeded"


async def test_a_caller_whose_rbac_forbids_creating_runs_is_refused_and_nothing_is_created(
    cluster: TestCluster, people: dict[str, Person], a2a: str
) -> None:
    base = agent_url(a2a, cluster.namespace, "answerer")
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "SendMessage",
        "params": {"message": {"messageId": "m-b", "role": "ROLE_USER", "parts": [{"text": "6*7?"}]}},
    }
    async with aiohttp.ClientSession() as http:
        anonymous = await http.post(base, json=body)
        assert anonymous.status == 401 and anonymous.headers["WWW-Authenticate"].startswith("Bearer")
        refused = await http.post(base, json=body, headers={"Authorization": f"Bearer {people['bob'].token}"})
        error = (await refused.json())["error"]
    assert refused.status == 403, error
    assert "cannot create resource" in error["message"] and people["bob"].username in error["message"]
    async with sdk_client(base, people["bob"].token) as (client, _):
        with pytest.raises(A2AClientError, match="403"):
            _ = [e async for e in client.send_message(_request("6*7?", "m-b2"))]
    assert await _runs(cluster) == []


@pytest.mark.real_only("the emulator authenticates nobody: an unknown token acts as its admin")
async def test_a_token_the_api_server_does_not_accept_is_refused(cluster: TestCluster, a2a: str) -> None:
    async with aiohttp.ClientSession() as http:
        answer = await http.post(
            agent_url(a2a, cluster.namespace, "answerer"),
            json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
            headers={"Authorization": "Bearer not-a-token"},
        )
        assert answer.status == 401
        assert "does not accept this token" in (await answer.json())["error"]["message"]


async def test_a_streamed_task_follows_the_runs_phase_to_completed(
    cluster: TestCluster, operator: OperatorProcess, people: dict[str, Person], a2a: str
) -> None:
    base = agent_url(a2a, cluster.namespace, "answerer")
    async with sdk_client(base, people["alice"].token, streaming=True) as (client, _):
        events = [e async for e in client.send_message(_request("[scenario:a2a-answer] streamed", "m-s"))]
    assert events[0].HasField("task") and events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED and len(set(states)) == len(states), states
    (artifact,) = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert [p.text for p in artifact.parts] == ["the answer is 42"]


async def test_a_task_waiting_for_approval_is_working_and_canceling_it_cancels_the_run(
    cluster: TestCluster, operator: OperatorProcess, people: dict[str, Person], a2a: str
) -> None:
    base = agent_url(a2a, cluster.namespace, "gated")
    async with sdk_client(base, people["alice"].token) as (client, _):
        sent = [
            e
            async for e in client.send_message(_request("[scenario:a2a-gated] 6*7", "m-g", immediately=True))
        ]
        task_id = sent[-1].task.id

        async def waiting() -> Any:
            task = await client.get_task(GetTaskRequest(id=task_id))
            said = " ".join(p.text for p in task.status.message.parts)
            return task if "approve a tool call (calculator)" in said else None

        task: Any = await until(waiting, "the task to wait for approval", timeout=60)
        assert task.status.state == TaskState.TASK_STATE_WORKING
        canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="has ended"):  # the SDK reads our -32002
            await client.cancel_task(CancelTaskRequest(id=task_id))
    run = await wait_finished(cluster, task_id)
    assert run["spec"]["cancel"] is True and run["status"]["phase"] == "Cancelled"


async def test_bad_requests_are_answered_with_the_json_rpc_error_that_names_them(
    cluster: TestCluster, people: dict[str, Person], a2a: str
) -> None:
    base = agent_url(a2a, cluster.namespace, "answerer")
    auth = {"Authorization": f"Bearer {people['alice'].token}"}
    message = {"messageId": "m-x", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    cases: list[tuple[Any, dict[str, str], int, str]] = [
        ("{not json", {}, -32700, "not JSON"),
        ({"jsonrpc": "2.0", "id": 1, "method": "ListTasks"}, {}, -32601, "is not served here"),
        (_call("SendMessage", {"message": {**message, "parts": [{"url": "x"}]}}), {}, -32005, "file parts"),
        (_call("SendMessage", {"message": {**message, "parts": [{"text": " "}]}}), {}, -32005, "has no text"),
        (_call("SendMessage", {"message": {**message, "taskId": "t"}}), {}, -32004, "no further message"),
        (
            _call("SendMessage", {"message": {**message, "messageId": ""}}),
            {},
            -32602,
            "messageId is required",
        ),
        (_call("GetTask", {"id": "nothing-here"}), {}, -32001, "no task 'nothing-here'"),
        (_call("GetTask", {}), {}, -32602, "params.id"),
        (_call("GetTask", {"id": "x"}), {"A2A-Version": "0.3"}, -32009, "speaks 1.0"),
    ]
    async with aiohttp.ClientSession() as http:
        for body, headers, code, words in cases:
            data = body if isinstance(body, str) else json.dumps(body)
            answer = await http.post(base, data=data, headers={**auth, **headers})
            error = (await answer.json())["error"]
            assert (answer.status, error["code"]) == (200, code) and words in error["message"], (body, error)


def _call(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}


async def test_a_runs_a2a_tool_calls_an_exposed_agent_as_the_identity_its_secret_holds(
    cluster: TestCluster, operator: OperatorProcess, people: dict[str, Person], a2a: str
) -> None:
    headers = {"Authorization": f"Bearer {people['alice'].token}"}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "remote-agent"},
        "data": {"headers": base64.b64encode(json.dumps(headers).encode()).decode()},
    }
    await cluster.request("POST", cluster.path("secrets"), json=secret)
    tool = {
        "name": "arithmetic",
        "url": agent_url(a2a, cluster.namespace, "answerer"),
        "headersFrom": {"name": "remote-agent", "key": "headers"},
    }
    manifest = agentrun(
        "caller", "[scenario:a2a-caller] go", namespace=cluster.namespace, tools=[{"a2a": tool}]
    )
    await cluster.request("POST", cluster.runs_path, json=manifest)
    run = await wait_finished(cluster, "caller", timeout=90)
    assert (run["status"]["phase"], run["status"]["result"]) == ("Succeeded", "the remote agent said 42")
    (remote,) = await _runs(cluster)
    assert remote["metadata"]["annotations"][tasks.CALLER_ANNOTATION] == people["alice"].username
    assert remote["status"]["result"] == "the answer is 42"


async def test_a_task_is_admitted_by_the_namespaces_quotas_like_any_run(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    operator: OperatorProcess,
    people: dict[str, Person],
    a2a: str,
) -> None:
    """An Agent whose runs ask for more than the quota's per-run maximum: its task fails, saying why."""
    await install_quota_crd(cluster)
    await create_quota(cluster, "caps", perRun={"tokenBudget": {"max": 1000}})
    spender = agent("spender", namespace=cluster.namespace, model=MODEL, limits={"tokenBudget": 5000})
    await cluster.request(
        "POST", _agents(cluster), json={**spender, "spec": {**spender["spec"], "a2a": {"expose": True}}}
    )
    async with sdk_client(agent_url(a2a, cluster.namespace, "spender"), people["alice"].token) as (client, _):
        events = [e async for e in client.send_message(_request("[scenario:a2a-answer] spend", "m-q"))]
    task = events[-1].task
    assert task.status.state == TaskState.TASK_STATE_FAILED, task
    said = " ".join(p.text for p in task.status.message.parts)
    assert f"{cluster.namespace}/caps" in said and "tokenBudget" in said, said
    assert not task.artifacts and model.requests_for("[scenario:a2a-answer]") == []


async def test_the_agentrun_a2a_command_serves_the_cards_at_its_public_url(
    cluster: TestCluster, a2a: str, tmp_path: Path
) -> None:
    """The subcommand the chart's pod runs, as its own process: the cards name --public-url."""
    async with a2a_process(cluster, tmp_path / "a2a.log") as root, aiohttp.ClientSession() as http:
        answer = await http.get(
            agent_url(root, cluster.namespace, "answerer") + "/.well-known/agent-card.json"
        )
        card = await answer.json()
    assert answer.status == 200, card
    expected = agent_url("https://agents.example.com", cluster.namespace, "answerer")
    assert card["supportedInterfaces"][0]["url"] == expected


async def test_a_client_speaking_a2a_0_3_sends_streams_gets_and_cancels_in_0_3s_shapes(
    cluster: TestCluster, operator: OperatorProcess, people: dict[str, Person], a2a: str
) -> None:
    """message/send, message/stream, tasks/get and tasks/cancel, as a 0.3 client writes them by hand."""
    auth = {"Authorization": f"Bearer {people['alice'].token}"}

    def message(text: str, message_id: str) -> dict[str, Any]:
        parts = [{"kind": "text", "text": text}]
        return {"kind": "message", "messageId": message_id, "role": "user", "parts": parts}

    async with aiohttp.ClientSession() as http:
        sent = await http.post(
            agent_url(a2a, cluster.namespace, "answerer"),
            json=_call("message/send", {"message": message("[scenario:a2a-answer] 0.3", "m-03")}),
            headers=auth,
        )
        task = (await sent.json())["result"]
        assert (task["kind"], task["status"]["state"]) == ("task", "completed"), task
        assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": "the answer is 42"}]
        got = await http.post(
            agent_url(a2a, cluster.namespace, "answerer"),
            json=_call("tasks/get", {"id": task["id"]}),
            headers=auth,
        )
        assert (await got.json())["result"]["status"]["state"] == "completed"

        streamed = await http.post(
            agent_url(a2a, cluster.namespace, "answerer"),
            json=_call("message/stream", {"message": message("[scenario:a2a-answer] 0.3 streamed", "m-03s")}),
            headers=auth,
        )
        events = [
            json.loads(line.removeprefix(b"data: "))["result"]
            async for line in streamed.content
            if line.startswith(b"data: ")
        ]
        assert events[0]["kind"] == "task" and events[0]["status"]["state"] == "submitted"
        assert [e["kind"] for e in events[1:]][-2:] == ["artifact-update", "status-update"]
        assert events[-1]["status"]["state"] == "completed" and events[-1]["final"] is True

        gated = {
            "message": message("[scenario:a2a-gated] 0.3", "m-03g"),
            "configuration": {"blocking": False},
        }
        waiting = await http.post(
            agent_url(a2a, cluster.namespace, "gated"), json=_call("message/send", gated), headers=auth
        )
        task_id = (await waiting.json())["result"]["id"]
        await until(
            lambda: _phase(cluster, task_id),
            "the gated task's run to wait for approval",
            60,
            done=lambda phase: phase == "AwaitingApproval",
        )
        canceled = await http.post(
            agent_url(a2a, cluster.namespace, "gated"),
            json=_call("tasks/cancel", {"id": task_id}),
            headers=auth,
        )
        answer = (await canceled.json())["result"]
    assert (answer["kind"], answer["status"]["state"]) == ("task", "canceled"), answer


async def _phase(cluster: TestCluster, name: str) -> str:
    run = await cluster.request("GET", f"{cluster.runs_path}/{name}")
    return str((run.get("status") or {}).get("phase"))
