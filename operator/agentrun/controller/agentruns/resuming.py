"""Where an unfinished run picks up after an operator restart: its last persisted checkpoint.

Resume semantics (docs/durable-runs.md, "Resume after a restart"):

* the conversation, iteration count, token usage per model (so cost), tool call count and the
  loop's corrective counters come from the last transcript record; nothing after it happened as far
  as the run is concerned, and finished iterations are never repeated;
* if that record ends with an assistant turn whose tool calls have no results, those calls run
  again with the same ids, hence the same idempotency keys (`<run uid>:<tool_use id>`), and the
  iteration's trace row is completed from the stored model answer;
* if it records the run's outcome, the run is finished from it without calling anything;
* the wall clock counts from `status.startTime`, downtime included, so `timeoutSeconds` holds.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from agentrun.api.status import AgentRunStatus
from agentrun.api.stops import Outcome
from agentrun.api.times import seconds_since
from agentrun.api.traces import Progress
from agentrun.api.transcripts import Transcript
from agentrun.api.usage import TokenUsage
from agentrun.controller.agentruns.transcript_storing import TranscriptStore
from agentrun.loop.state import RunState

NO_PROGRESS = Progress(0, 0, TokenUsage(), None)


@dataclass(frozen=True)
class ResumePoint:
    state: RunState | None  # None: start from the task
    elapsed_before: float
    progress: Progress  # what the run had spent before this start
    outcome: Outcome | None = None  # the transcript recorded the run's end
    transcript: Transcript | None = None


def resume_point_of(
    transcript: Transcript | None, start_time: Any, now: dt.datetime | None = None
) -> ResumePoint:
    """Pure part of `find_resume_point`, for tests."""
    elapsed = seconds_since(start_time, now)
    if transcript is None or transcript.empty:
        return ResumePoint(state=None, elapsed_before=elapsed, progress=NO_PROGRESS, transcript=transcript)
    progress = transcript.progress or NO_PROGRESS
    return ResumePoint(
        state=RunState.restore(transcript.messages, transcript.state),
        elapsed_before=elapsed,
        progress=progress,
        outcome=transcript.outcome,
        transcript=transcript,
    )


async def find_resume_point(store: TranscriptStore, status: AgentRunStatus) -> ResumePoint:
    """A run whose loop never started (no status.startTime) wrote no chunks: nothing to read.

    The others are read by name from what their status counts on (see `read_chunk_objects`).
    """
    if not status.start_time:
        return resume_point_of(None, None)
    return resume_point_of(await store.load(counted=store.counted(status.transcript)), status.start_time)
