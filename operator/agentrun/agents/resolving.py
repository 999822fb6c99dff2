"""The effective spec of a run with spec.agentRef: the Agent's spec, overridden where a run may.

A run may narrow what its Agent allows, never widen it: the platform team that wrote the Agent
decided how much one run may spend, and whoever creates runs from it cannot raise that. Every
numeric limit of the run is therefore compared with the Agent's (its explicit value, or the built-in
default when the Agent left it out), and loop detection cannot be switched off by a run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agentrun.api.spec import AGENT_OWNED_FIELDS, Limits

__all__ = ["AGENT_OWNED_FIELDS", "AgentSpecConflict", "resolve"]

#: The run's fields that are not part of the effective spec's definition (they select the Agent).
_SELECTING = ("agentRef",)
#: Merged per key instead of replaced: a run sets model.maxTokens without repeating model.name.
_PER_KEY = ("model", "limits")


class AgentSpecConflict(ValueError):
    """The run asks for something its Agent does not allow; the message is one line for the user."""


def resolve(agent_spec: Mapping[str, Any], run_spec: Mapping[str, Any], agent_name: str) -> dict[str, Any]:
    """The spec the run executes (camelCase, as stored), without agentRef.

    Agent fields come first; the run's model and limits override per key (loopDetection too);
    any other field the run sets replaces the Agent's. The Agent's own spec is never changed.
    """
    for name in AGENT_OWNED_FIELDS:
        if name in run_spec:
            raise AgentSpecConflict(
                f"spec.{name} comes from the Agent (spec.agentRef {agent_name}); a run cannot set it"
            )
    effective: dict[str, Any] = copy.deepcopy(dict(agent_spec))
    for name, value in run_spec.items():
        if name in _SELECTING:
            continue
        if name in _PER_KEY and isinstance(value, Mapping) and isinstance(effective.get(name), Mapping):
            effective[name] = _merged(effective[name], value)
        else:
            effective[name] = copy.deepcopy(value)
    limits = run_spec.get("limits")
    if isinstance(limits, Mapping):
        _check_tightened(agent_spec.get("limits") or {}, limits, agent_name)
    return effective


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if key == "loopDetection" and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **copy.deepcopy(dict(value))}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _builtin_limits() -> dict[str, Any]:
    defaults: dict[str, Any] = Limits().model_dump(by_alias=True, mode="json")
    return defaults


def _check_tightened(agent_limits: Mapping[str, Any], run_limits: Mapping[str, Any], agent_name: str) -> None:
    builtin = _builtin_limits()
    allowed = {**builtin, **agent_limits}
    for key, value in run_limits.items():
        if key == "loopDetection":
            nested = value if isinstance(value, Mapping) else {}
            agent_nested = {**builtin["loopDetection"], **(agent_limits.get("loopDetection") or {})}
            _check_values(f"limits.{key}", agent_nested, nested, agent_name)
        else:
            _check_values("limits", allowed, {key: value}, agent_name)


def _check_values(
    prefix: str, allowed: Mapping[str, Any], wanted: Mapping[str, Any], agent_name: str
) -> None:
    for key, value in wanted.items():
        limit = allowed.get(key)
        field = f"spec.{prefix}.{key}"
        if isinstance(value, bool) or isinstance(limit, bool):
            if limit is True and value is False:
                raise AgentSpecConflict(
                    f"{field} false would switch off what the Agent {agent_name} enables; "
                    "a run can only tighten its Agent's limits"
                )
            continue
        if not _number(limit):
            continue  # the Agent sets no limit here (e.g. no tokenBudget): the run may set any
        if not _number(value) or value > limit:
            shown = "null (no limit)" if value is None else value
            raise AgentSpecConflict(
                f"{field} {shown} is above the Agent {agent_name}'s {limit}; "
                "a run can only tighten its Agent's limits"
            )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
