"""A controller reads status as the body's, overlaid with what it wrote since (until the watch brings it)."""

from __future__ import annotations

from agentrun.controller.status_memory import WrittenStatus


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
