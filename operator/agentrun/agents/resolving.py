"""The effective spec of a run with spec.agentRef: the Agent's spec, overridden where a run may.

A run may narrow what its Agent allows, never widen it: the platform team that wrote the Agent
decided how much one run may spend, and whoever creates runs from it cannot raise that. Every
numeric limit the run declares is therefore compared with the Agent's (its explicit value, or the
built-in default when the Agent left it out: the model's value either way), and loop detection
cannot be switched off by a run.

Both specs come in parsed; what each declares is its model's ``model_fields_set``, so a field left
out is never mistaken for one set to its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from agentrun.api.agent import AGENT_ONLY_FIELDS, AgentSpec
from agentrun.api.spec import AGENT_OWNED_FIELDS, AgentRunSpec, Limits

__all__ = ["AGENT_OWNED_FIELDS", "AgentSpecConflict", "resolve"]

#: The run's fields that are not part of the effective spec's definition (they select the Agent).
_SELECTING = frozenset({"agent_ref"})
#: Merged field by field instead of replaced (a run sets model.maxTokens without repeating
#: model.name), recursively: what is merged within each.
_PER_FIELD: Mapping[str, Mapping[str, Any]] = {"model": {}, "limits": {"loop_detection": {}}}


class AgentSpecConflict(ValueError):
    """The run asks for something its Agent does not allow; the message is one line for the user."""


def resolve(agent: AgentSpec, run: AgentRunSpec, agent_name: str) -> AgentRunSpec:
    """The spec the run executes, without agentRef; its declared fields are the Agent's and the run's.

    The run's model and limits override the Agent's field by field (loopDetection too); any other
    field the run declares replaces the Agent's. Raises AgentSpecConflict for a field the Agent owns
    or a limit the run loosens, and pydantic's ValidationError when the two together are refused
    (e.g. the run's toolChoice forcing a tool of an Agent that thinks).
    """
    declared = {_alias(run, name) for name in run.model_fields_set}
    for name in AGENT_OWNED_FIELDS:
        if name in declared:
            raise AgentSpecConflict(
                f"spec.{name} comes from the Agent (spec.agentRef {agent_name}); a run cannot set it"
            )
    _check_tightened(agent.limits, run.limits, agent_name)
    merged = _overlay(agent, run, _PER_FIELD, skip=_SELECTING)
    for name in AGENT_ONLY_FIELDS:  # about the Agent (its A2A card), never part of a run
        merged.pop(name, None)
    return AgentRunSpec.model_validate(merged)


def _overlay(
    base: BaseModel, over: BaseModel, per_field: Mapping[str, Any], skip: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``base``'s declared fields with ``over``'s on top, as the API spells them (so that a refusal of
    the whole names each field as the manifest does)."""
    merged = base.model_dump(by_alias=True, exclude_unset=True)
    for name in over.model_fields_set - skip:
        alias, below = _alias(over, name), getattr(base, name, None)
        if name in per_field and isinstance(below, BaseModel) and name in base.model_fields_set:
            merged[alias] = _overlay(below, getattr(over, name), per_field[name])
        else:
            merged[alias] = over.model_dump(by_alias=True, exclude_unset=True, include={name})[alias]
    return merged


def _alias(model: BaseModel, name: str) -> str:
    return type(model).model_fields[name].alias or name


def _check_tightened(allowed: Limits, wanted: Limits, agent_name: str) -> None:
    for name in sorted(wanted.model_fields_set, key=list(Limits.model_fields).index):
        if name == "loop_detection":
            nested = wanted.loop_detection
            for inner in sorted(nested.model_fields_set, key=list(type(nested).model_fields).index):
                field = f"spec.limits.loopDetection.{_alias(nested, inner)}"
                _check_value(
                    field, getattr(allowed.loop_detection, inner), getattr(nested, inner), agent_name
                )
        else:
            field = f"spec.limits.{_alias(wanted, name)}"
            _check_value(field, getattr(allowed, name), getattr(wanted, name), agent_name)


def _check_value(field: str, limit: Any, value: Any, agent_name: str) -> None:
    if isinstance(value, bool) or isinstance(limit, bool):
        if limit is True and value is False:
            raise AgentSpecConflict(
                f"{field} false would switch off what the Agent {agent_name} enables; "
                "a run can only tighten its Agent's limits"
            )
        return
    if limit is None:
        return  # the Agent sets no limit here (e.g. no tokenBudget): the run may set any
    if value is None or value > limit:
        shown = "null (no limit)" if value is None else _number(value)
        raise AgentSpecConflict(
            f"{field} {shown} is above the Agent {agent_name}'s {_number(limit)}; "
            "a run can only tighten its Agent's limits"
        )


def _number(value: int | float) -> str:
    """As a manifest writes it: a whole number of dollars without a decimal point."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
