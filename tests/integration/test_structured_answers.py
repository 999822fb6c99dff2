"""Structured answers through the real operator: spec.output.schema, status.output, InvalidOutput."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun.api.transcripts import chunk_selector, decode_objects
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import wait_finished
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-structured-0123456789"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "unhealthy": {"type": "array", "items": {"type": "string"}},
        "owner": {"type": ["string", "null"]},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
    "required": ["summary", "unhealthy", "owner"],
    "additionalProperties": False,
}
REPORT: dict[str, Any] = {
    "summary": "2 of 3 pods healthy",
    "unhealthy": ["web-2"],
    "owner": None,
    "counts": {"ready": 2, "total": 3},
}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                "[scenario:report]",
                [
                    Reply([text_block(f"Here is the report:\n{json.dumps(REPORT)}")]),
                    Reply([text_block(f"```json\n{json.dumps(REPORT, indent=2)}\n```")]),
                ],
            ),
            Script(
                "[scenario:never-valid]",
                [Reply([text_block('{"summary": 3}')]), Reply([text_block('{"summary": 4}')])],
            ),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


def _report_run(cluster: TestCluster, name: str, task: str, **output: Any) -> dict[str, Any]:
    return agentrun(
        name,
        task,
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        output={"schema": SCHEMA, **output},
    )


async def test_a_run_with_an_output_schema_ends_with_its_json_in_status_output_readable_by_jsonpath(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await cluster.request(
        "POST", cluster.runs_path, json=_report_run(cluster, "report", "[scenario:report] go")
    )
    obj = await wait_finished(cluster, "report")
    status = obj["status"]
    assert (status["phase"], status["stopReason"]) == ("Succeeded", "EndTurn"), status.get("message")
    # A merge patch drops null members; status.result and the transcript keep the exact JSON.
    assert status["output"] == {k: v for k, v in REPORT.items() if v is not None}
    assert json.loads(status["result"]) == REPORT
    assert status["iterations"] == 2

    code, summary = await cluster.kubectl(
        "get", "agentrun", "report", "-o", "jsonpath={.status.output.summary}"
    )
    assert (code, summary) == (0, "2 of 3 pods healthy")
    code, first = await cluster.kubectl(
        "get", "agentrun", "report", "-o", "jsonpath={.status.output.unhealthy[0]}"
    )
    assert (code, first) == (0, "web-2")
    code, ready = await cluster.kubectl(
        "get", "agentrun", "report", "-o", "jsonpath={.status.output.counts.ready}"
    )
    assert (code, ready) == (0, "2")

    # The first answer had prose around the JSON: it went back with the reason, stated as a rule.
    requests = model.requests_for("[scenario:report]")
    system = json.dumps(requests[0].body["system"])
    assert "unhealthy" in system and "nothing before or after it" in system
    retry = "".join(b.get("text", "") for b in requests[1].body["messages"][-1]["content"])
    assert "not JSON" in retry and "retry 1 of 2" in retry

    # The transcript's outcome record holds the structured answer whole, null member included.
    secrets = await cluster.request(
        "GET",
        f"/api/v1/namespaces/{cluster.namespace}/secrets",
        params={"labelSelector": chunk_selector(uid=obj["metadata"]["uid"])},
    )
    transcript = decode_objects(secrets["items"])
    assert transcript.outcome is not None and transcript.outcome.output == REPORT


async def test_an_answer_that_never_matches_the_schema_fails_the_run_with_invalid_output(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    manifest = _report_run(cluster, "never", "[scenario:never-valid] go", maxRetries=1)
    await cluster.request("POST", cluster.runs_path, json=manifest)
    obj = await wait_finished(cluster, "never")
    status = obj["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidOutput")
    assert (
        "after 1 retries" in status["message"]
        and "at $.summary: 4 is not of type 'string'" in status["message"]
    )
    assert "output" not in status and status["result"] == '{"summary": 4}'
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Stalled"]["status"], conditions["Stalled"]["reason"]) == ("True", "InvalidOutput")
    assert len(model.requests_for("[scenario:never-valid]")) == 2


async def test_a_schema_that_is_no_json_schema_ends_the_run_invalid_spec_before_any_request(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    manifest = agentrun(
        "badschema",
        "[scenario:report] go",
        namespace=cluster.namespace,
        output={"schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}}},
    )
    await cluster.request("POST", cluster.runs_path, json=manifest)
    status = (await wait_finished(cluster, "badschema"))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith("spec.output.schema: ")
    assert "'zero' is not of type 'number'" in status["message"]
    assert model.requests_for("[scenario:report]") == []


async def test_spec_output_cannot_be_changed_after_creation(cluster: TestCluster) -> None:
    manifest = _report_run(cluster, "frozen", "[scenario:report] go")
    await cluster.request("POST", cluster.runs_path, json=manifest)
    code, body = await cluster.status_of(
        "PATCH",
        f"{cluster.runs_path}/frozen",
        json={"spec": {"output": {"maxRetries": 5}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert code == 422, body
    assert "spec.output is immutable once created" in body["message"]
