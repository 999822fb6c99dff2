"""The steps of the loop as plain data, apart from the code that runs them.

A loop's steps lead back to each other (answering leads to preparing the next request), so the
modules that run them would import each other in a circle if each step class carried its own
behaviour. Kept here as data, the modules that run steps import this one and none of each other
(an import contract holds them to it), and the return type of the function that runs a step still
names the steps allowed next:

    Prepare   -> CallModel | Compact | Finish  (limiting)
    Compact   -> Prepare | Finish              (compacting)
    CallModel -> Handle | Compact | Finish     (requesting)
    Handle    -> RunTools | Prepare | Finish   (responding)
    RunTools  -> Prepare | Finish              (tool_calling)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrun.api.stops import Outcome
from agentrun.loop.protocols import ModelResponse


@dataclass(frozen=True)
class Finish:
    outcome: Outcome


@dataclass(frozen=True)
class Prepare:
    """Limits are checked here, so no request is ever sent past a budget or the deadline."""


@dataclass(frozen=True)
class Compact:
    """The next request would pass the compaction threshold (or the API said it was too long)."""

    estimated_tokens: int
    # The API's message when it refused the request as too long (the estimate was below the threshold).
    refused: str | None = None


@dataclass(frozen=True)
class CallModel:
    final: bool  # the answer turn after maxIterations: tools are switched off


@dataclass(frozen=True)
class Handle:
    response: ModelResponse
    final: bool
    elapsed: float | None = None  # the answering attempt's latency, for the trace row


@dataclass(frozen=True)
class RunTools:
    response: ModelResponse | None  # None when resuming a turn that was in flight
    truncated: bool
    recovered: tuple[str, dict[str, Any]] | None = None


Step = Prepare | Compact | CallModel | Handle | RunTools
