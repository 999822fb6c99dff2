"""A controller reads status as the body's, overlaid with what it wrote since (until the watch brings it)."""

from __future__ import annotations

from typing import Any

from agentrun.api.schedule import AgentScheduleStatus
from agentrun.controller.status_memory import WrittenStatus, status_patch


def test_what_was_written_overlays_an_older_body_until_forgotten() -> None:
    written = WrittenStatus()
    body = {"metadata": {"uid": "u1"}, "status": {"lastScheduleTime": "2026-11-24T10:00:00Z", "active": []}}
    written.wrote("u1", {"lastScheduleTime": "2026-11-24T11:00:00Z"})
    written.wrote("u1", {"active": [{"name": "run-1"}]})
    assert written.current(body) == {
        "lastScheduleTime": "2026-11-24T11:00:00Z",
        "active": [{"name": "run-1"}],
    }
    other = {"metadata": {"uid": "u2"}, "status": {"active": []}}
    assert written.current(other) == {"active": []}
    written.forget("u1")
    assert written.current(body) == body["status"]


def test_a_body_without_status_reads_as_what_was_written() -> None:
    written = WrittenStatus()
    assert written.current({"metadata": {"uid": "u1"}}) == {}
    written.wrote("u1", {"observedGeneration": 2})
    assert written.current({"metadata": {"uid": "u1"}, "status": None}) == {"observedGeneration": 2}


def test_a_status_model_is_patched_as_the_fields_it_sets_and_a_none_only_clears_what_is_named() -> None:
    status = AgentScheduleStatus(last_schedule_time=None, next_schedule_time=None, active=[])
    assert status_patch(status) == {"active": []}
    assert status_patch(status, cleared={"next_schedule_time"}) == {"active": [], "nextScheduleTime": None}


async def test_the_writer_sends_a_patch_only_when_it_changes_what_this_process_knows() -> None:
    written, sent = WrittenStatus(), []

    async def send(patch: dict[str, Any]) -> None:
        sent.append(patch)

    body = {"metadata": {"uid": "u1"}, "status": {"observedGeneration": 1}}
    assert await written.write(body, AgentScheduleStatus(observed_generation=1), send) is None
    patch = await written.write(body, AgentScheduleStatus(observed_generation=2), send)
    assert patch == {"observedGeneration": 2} and sent == [patch]
    assert (
        await written.write(body, AgentScheduleStatus(observed_generation=2), send) is None
    )  # its own write
    assert sent == [patch]
