"""Which stored tool results the model no longer sees in full: the loop sends old successful results as a
marker (spec.context.clearToolResults). Worked out with the loop's own rule (loop/windowing.py) from
the run's context settings and its latest compaction, so the console marks what the model was sent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from agentrun.api.context_spec import ContextSpec
from agentrun.loop.config import ContextConfig
from agentrun.loop.windowing import cleared


def _context_of(run: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """spec.context and the model: the run's own, else those of the Agent it was made from."""
    spec = run.get("spec") or {}
    agent = (run.get("status") or {}).get("agentSpec") or {}
    context = spec.get("context") or agent.get("context") or {}
    model = (spec.get("model") or agent.get("model") or {}).get("name", "")
    return context, str(model)


def cleared_results(
    run: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], state: Mapping[str, Any]
) -> set[tuple[int, int]]:
    """(turn number, block index) of every tool result the next request sends as a marker."""
    context, model = _context_of(run)
    try:
        cfg = ContextConfig.of(ContextSpec.model_validate(context), model)
    except pydantic.ValidationError:
        return set()  # a spec the CRD admitted but this console cannot read: nothing marked
    compaction = (state.get("context") or {}).get("compaction")
    boundary = int(compaction.get("boundary") or 0) if isinstance(compaction, Mapping) else 0
    numbers = [1, *range(boundary + 1, len(messages) + 1)] if boundary else list(range(1, len(messages) + 1))
    view = [dict(messages[n - 1]) for n in numbers if n <= len(messages)]
    marked = set()
    for number, stored, sent in zip(numbers, view, cleared(view, cfg), strict=False):
        stored_blocks, sent_blocks = stored.get("content"), sent.get("content")
        if (
            not isinstance(stored_blocks, list)
            or not isinstance(sent_blocks, list)
            or stored_blocks is sent_blocks
        ):
            continue
        for index, (before, after) in enumerate(zip(stored_blocks, sent_blocks, strict=False)):
            if before is not after and before != after:
                marked.add((number, index))
    return marked
