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


def test_an_event_of_the_same_generation_takes_the_earlier_spec_and_a_newer_one_parses_its_own() -> None:
    earlier = RunObject.parse(_body())
    status_patched = _body()
    status_patched["status"]["iterations"] = 4
    again = RunObject.parse(status_patched, earlier)
    assert again.spec is earlier.spec and again.status.iterations == 4

    cancelled = _body()
    cancelled["metadata"]["generation"] = 3
    cancelled["spec"]["cancel"] = True
    assert RunObject.parse(cancelled, earlier).spec.cancel

    other_run = _body()
    other_run["metadata"]["uid"] = "u-2"
    other_run["spec"]["task"] = "another task"
    assert RunObject.parse(other_run, earlier).spec.task == "another task"  # type: ignore[union-attr]

    no_generation = _body()  # a stand-in API server that keeps none: always parsed
    del no_generation["metadata"]["generation"]
    no_generation["spec"]["cancel"] = True
    before = RunObject.parse(no_generation | {"spec": _body()["spec"]})
    assert RunObject.parse(no_generation, before).spec.cancel
