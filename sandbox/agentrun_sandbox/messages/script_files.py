"""Scripts as YAML or JSON files: what `--script FILE` reads, and what tests write for a child process.

The format mirrors the dataclasses of :mod:`agentrun_sandbox.messages.script` field by field; anything
unknown is refused with where it was, so a typo in a script is an error rather than a silent default.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

import yaml

from agentrun_sandbox.messages.script import (
    FAULT_KINDS,
    Fault,
    Reply,
    Script,
    ScriptUsage,
    Step,
)


def load_scripts(path: str | Path) -> list[Script]:
    """Reads a script file; YAML is a superset of JSON, so one loader serves both formats."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML/JSON: {err}") from err
    try:
        return parse_scripts(data)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from err


def parse_scripts(data: object) -> list[Script]:
    """Accepts ``{scripts: [...]}``, a bare list of scripts or a single script mapping."""
    if isinstance(data, Mapping) and "scripts" in data:
        _reject_unknown(data, {"scripts"}, "file")
        data = data["scripts"]
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, list):
        raise ValueError("expected a mapping with a `scripts` list, a list of scripts or one script")
    return [_parse_script(item, f"scripts.{index}") for index, item in enumerate(data)]


def _parse_script(data: object, where: str) -> Script:
    mapping = _mapping(data, where)
    _reject_unknown(mapping, {"name", "match", "model", "steps", "context_window"}, where)
    window = mapping.get("context_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"{where}.context_window: expected a positive integer, got {window!r}")
    steps_data = mapping.get("steps")
    if not isinstance(steps_data, list):
        raise ValueError(f"{where}.steps: expected a list")
    steps = [_parse_step(step, f"{where}.steps.{index}") for index, step in enumerate(steps_data)]
    try:
        return Script(
            _optional_str(mapping, "match", where),
            steps,
            model=_optional_str(mapping, "model", where),
            name=_optional_str(mapping, "name", where),
            context_window=window,
        )
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: {err}") from err


def _parse_step(data: object, where: str) -> Step:
    mapping = _mapping(data, where)
    if "fault" in mapping:
        _reject_unknown(mapping, {"fault"}, where)
        return _parse_fault(mapping["fault"], f"{where}.fault")
    if "reply" not in mapping:
        raise ValueError(f"{where}: a step needs `reply` (with optional `faults`) or `fault`")
    _reject_unknown(mapping, {"reply", "faults"}, where)
    faults_data = mapping.get("faults") or []
    if not isinstance(faults_data, list):
        raise ValueError(f"{where}.faults: expected a list")
    faults = [_parse_fault(item, f"{where}.faults.{index}") for index, item in enumerate(faults_data)]
    reply = _mapping(mapping["reply"], f"{where}.reply")
    allowed = {f.name for f in fields(Reply)} - {"faults", "_"}
    _reject_unknown(reply, allowed, f"{where}.reply")
    kwargs = dict(reply)
    if "usage" in kwargs:
        usage = _mapping(kwargs["usage"], f"{where}.reply.usage")
        _reject_unknown(usage, {f.name for f in fields(ScriptUsage)}, f"{where}.reply.usage")
        kwargs["usage"] = ScriptUsage(**usage)
    content = kwargs.pop("content", [])
    if not isinstance(content, list):
        raise ValueError(f"{where}.reply.content: expected a list of blocks")
    try:
        return Reply(content, faults=faults, **kwargs)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}.reply: {err}") from err


def _parse_fault(data: object, where: str) -> Fault:
    mapping = dict(_mapping(data, where))
    kind = mapping.pop("kind", None)
    cls = FAULT_KINDS.get(str(kind))
    if cls is None:
        raise ValueError(f"{where}: unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
    _reject_unknown(mapping, {f.name for f in fields(cls)}, where)
    try:
        return cls(**mapping)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: {err}") from err


def scripts_to_data(scripts: Iterable[Script]) -> dict[str, Any]:
    """The file form of Python scripts, so a test can hand them to a child server via ``--script``."""
    return {"scripts": [_script_data(script) for script in scripts]}


def _script_data(script: Script) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key in ("name", "match", "model"):
        if getattr(script, key) is not None:
            data[key] = getattr(script, key)
    if script.context_window is not None:
        data["context_window"] = script.context_window
    data["steps"] = [_step_data(step) for step in script.steps]
    return data


def _step_data(step: Step) -> dict[str, Any]:
    if isinstance(step, Fault):
        return {"fault": _fault_data(step)}
    reply: dict[str, Any] = {"content": [copy.deepcopy(dict(block)) for block in step.content]}
    defaults = Reply()
    for f in fields(Reply):
        if f.name in ("content", "faults", "_"):
            continue
        value = getattr(step, f.name)
        if value == getattr(defaults, f.name):
            continue
        if isinstance(value, ScriptUsage):
            value = {uf.name: getattr(value, uf.name) for uf in fields(ScriptUsage)}
        elif isinstance(value, Mapping):
            value = copy.deepcopy(dict(value))
        reply[f.name] = value
    data: dict[str, Any] = {"reply": reply}
    if step.faults:
        data["faults"] = [_fault_data(fault) for fault in step.faults]
    return data


def _fault_data(fault: Fault) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": fault.kind}
    for f in fields(fault):
        value = getattr(fault, f.name)
        data[f.name] = dict(value) if isinstance(value, Mapping) else value
    return data


def _mapping(data: object, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    return cast(Mapping[str, Any], data)


def _reject_unknown(mapping: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")


def _optional_str(mapping: Mapping[str, Any], key: str, where: str) -> str | None:
    value = mapping.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}.{key}: expected a string")
    return value
