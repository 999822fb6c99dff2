"""A2A 0.3's method names and shapes, read into 1.0's and answered in 0.3's, from the same run."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.a2a import protocol, protocol_v03, tasks


def run(phase: str, **status: Any) -> dict[str, Any]:
    metadata = {"name": "answerer-a2a-1", "namespace": "team-a", "uid": "u-1", "annotations": {}}
    return {"metadata": metadata, "status": {"phase": phase, **status}}


@pytest.mark.parametrize(
    ("state", "v03"),
    [
        (protocol.SUBMITTED, "submitted"),
        (protocol.WORKING, "working"),
        (protocol.INPUT_REQUIRED, "input-required"),
        (protocol.AUTH_REQUIRED, "auth-required"),
        (protocol.COMPLETED, "completed"),
        (protocol.CANCELED, "canceled"),
        (protocol.FAILED, "failed"),
        (protocol.REJECTED, "rejected"),
    ],
)
def test_task_states_are_spelled_as_0_3_spells_them(state: str, v03: str) -> None:
    assert protocol_v03.state(state) == v03


def test_a_finished_run_is_a_0_3_task_with_kinds_on_the_task_and_its_parts() -> None:
    answer = protocol_v03.result({"task": tasks.task(run("Succeeded", result="42"))})
    assert answer["kind"] == "task" and answer["id"] == "answerer-a2a-1"
    assert answer["status"]["state"] == "completed"
    assert answer["artifacts"][0]["parts"] == [{"kind": "text", "text": "42"}]


def test_a_failed_runs_status_message_is_a_0_3_agent_message() -> None:
    answer = protocol_v03.result(tasks.task(run("Failed", message="the budget ran out")))
    message = answer["status"]["message"]
    assert (message["kind"], message["role"]) == ("message", "agent")
    assert message["parts"] == [{"kind": "text", "text": "the budget ran out"}]


def test_streamed_updates_carry_their_kind_and_the_last_one_is_final() -> None:
    finished = run("Succeeded", output={"total": 42})
    artifact = tasks.result_artifact(finished)
    assert artifact is not None
    update = protocol_v03.result(tasks.artifact_update(finished, artifact))
    assert update["kind"] == "artifact-update" and update["artifact"]["parts"] == [
        {"kind": "data", "data": {"total": 42}}
    ]
    status = protocol_v03.result(tasks.status_update(finished))
    assert (status["kind"], status["status"]["state"], status["final"]) == (
        "status-update",
        "completed",
        True,
    )
    working = protocol_v03.result(tasks.status_update(run("Running")))
    assert working["final"] is False


def test_0_3_params_are_read_as_1_0_s_and_blocking_false_returns_at_once() -> None:
    given = {
        "message": {
            "kind": "message",
            "messageId": "m",
            "role": "user",
            "parts": [{"kind": "text", "text": "6*7?"}],
        },
        "configuration": {"blocking": False},
    }
    read = protocol_v03.params("message/send", given)
    assert read["message"]["parts"] == [{"text": "6*7?"}]
    assert read["configuration"]["returnImmediately"] is True
    files = protocol_v03.params(
        "message/send", {"message": {"parts": [{"kind": "file", "file": {"uri": "s3://x"}}]}}
    )
    assert files["message"]["parts"] == [{"url": "s3://x"}]  # refused as 1.0 refuses file parts
    assert protocol_v03.params("tasks/get", {"id": "t"}) == {"id": "t"}
