"""A run parses the same from decoded JSON and from Kopf's views; only the views are copied first."""

from __future__ import annotations

import copy
from typing import Any

import kopf

from agentrun.controller.agentruns.run_objects import RunObject


def _body() -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "r", "namespace": "team-a", "uid": "u-1", "generation": 2},
        "spec": {
            "task": "add two numbers",
            "model": {"name": "claude-sonnet-4-5", "maxTokens": 512},
            "tools": [{"builtin": {"name": "calculator"}}],
        },
        "status": {"phase": "Running", "iterations": 3, "startTime": "2026-11-29T00:00:00Z"},
    }


def test_a_run_parses_alike_from_decoded_json_and_from_kopfs_view_of_it() -> None:
    raw = _body()
    from_json = RunObject.parse(raw)
    from_kopf = RunObject.parse(kopf.Body(copy.deepcopy(raw)))
    assert from_json == from_kopf
    assert from_json.spec.task == "add two numbers"  # type: ignore[union-attr]
    assert from_json.status.iterations == 3
    assert raw == _body()  # parsing leaves the decoded body as it was


def test_a_run_parsed_from_kopfs_live_view_keeps_its_values_when_the_view_changes() -> None:
    raw = _body()
    body = kopf.Body(raw)
    run = RunObject.parse(body)
    raw["spec"]["task"] = "something else"
    raw["status"]["iterations"] = 9
    assert run.spec.task == "add two numbers"  # type: ignore[union-attr]
    assert run.status.iterations == 3
