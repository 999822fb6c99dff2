"""Context management: clearing old tool results, compaction, client- or server-side (docs/long-runs.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrun.api.spec_base import SpecModel


class ClearToolResults(SpecModel):
    """Old tool results replaced, in what is sent, by a short marker: the lightest way to save context."""

    enabled: bool = Field(default=True, description="Whether old tool results are cleared.")
    keep_newest: int = Field(
        default=8,
        ge=1,
        le=1000,
        description=(
            "Successful tool results kept whole: the newest this many. Older ones larger than minChars "
            "are sent as a marker naming the tool, the call id, the size and how to get it again. "
            "Failed results (is_error) are never cleared. The transcript keeps every result whole."
        ),
    )
    min_chars: int = Field(
        default=1024,
        ge=0,
        le=1_000_000,
        description="Results shorter than this are never cleared: they cost little, and clearing "
        "them would only move the cached prefix.",
    )
    batch: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "Results are cleared this many at a time (so between keepNewest and keepNewest+batch-1 "
            "stay whole): each clearing changes an earlier message, where the cached prefix of the "
            "conversation ends, so batching keeps the cache valid for several turns. 1 clears each "
            "result as soon as it falls out of the newest keepNewest."
        ),
    )
    strategy: Literal["Client", "Server"] = Field(
        default="Client",
        description=(
            "Client: the operator replaces old results in what it sends, so any "
            "Messages-API-compatible server works. Server: the Messages API clears them (its context "
            "editing beta, clear_tool_uses_20250919): tool uses beyond the newest keepNewest once "
            "keepNewest+batch of them are in the request, failed and small results included (minChars "
            "does not apply); only an API that offers the beta accepts it."
        ),
    )


class CompactionSpec(SpecModel):
    """A summary of the work so far replaces the older turns in what is sent, near the window's limit."""

    enabled: bool = Field(default=True, description="Whether the conversation is compacted.")
    threshold_percent: int = Field(
        default=80,
        ge=10,
        le=95,
        description=(
            "Compact when the next request's estimated input reaches this percentage of the model's "
            "context window (the operator's table, or contextWindowTokens). The summary request is "
            "a model request of its own, tools off: its tokens count in usage, tokenBudget and "
            "costBudgetUSD, not in maxIterations."
        ),
    )
    keep_newest_turns: int = Field(
        default=2,
        ge=1,
        le=100,
        description="Model turns (with their tool results) sent whole after the summary.",
    )
    strategy: Literal["Client", "Server"] = Field(
        default="Client",
        description=(
            "Client: the operator asks for the summary in a request of its own, so any "
            "Messages-API-compatible server works. Server: the Messages API compacts (its compaction "
            "beta, compact_20260112) when a request's input reaches thresholdPercent of the window "
            "(the API's default of 150000 tokens when the window is unknown); the summary comes back "
            "in the answer and is sent back with it. keepNewestTurns does not apply; only an API "
            "that offers the beta accepts it."
        ),
    )


class ContextSpec(SpecModel):
    """How the conversation is kept within the model's context window; what is stored never changes."""

    clear_tool_results: ClearToolResults = Field(
        default_factory=ClearToolResults, description="Clearing of old tool results."
    )
    compaction: CompactionSpec = Field(
        default_factory=CompactionSpec, description="Summary-based compaction."
    )
    context_window_tokens: int | None = Field(
        default=None,
        ge=1024,
        le=10_000_000,
        description=(
            "The model's context window in tokens. Defaults to the operator's table of windows per "
            "model (AGENTRUN_CONTEXT_WINDOWS overrides it); set it for a model the table does not know."
        ),
    )
