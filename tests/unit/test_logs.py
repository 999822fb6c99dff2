"""Log lines: JSON with the run's identity and iteration, or text for a terminal."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from agentrun import logs


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.RunContextFilter())
    logger = logging.getLogger("agentrun.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield stream, handler
    finally:
        logger.removeHandler(handler)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


async def test_every_line_logged_inside_a_run_carries_its_identity_and_current_iteration(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(logs.JSONFormatter())
    log = logging.getLogger("agentrun.test_logs")
    context = logs.RunLogContext("team-a", "my-run", "uid-1")
    with logs.bound_run(context):
        log.info("preparing")
        context.iteration = 2

        async def tool() -> None:
            log.warning("tool %s slow", "lookup")

        await asyncio.gather(tool())
    log.info("outside any run")
    preparing, tool_line, outside = (json.loads(line) for line in _lines(stream))
    assert preparing | {"time": ""} == {
        "time": "",
        "level": "info",
        "logger": "agentrun.test_logs",
        "message": "preparing",
        "namespace": "team-a",
        "name": "my-run",
        "uid": "uid-1",
        "iteration": 0,
    }
    assert preparing["time"].endswith("Z")
    assert (tool_line["message"], tool_line["iteration"], tool_line["level"]) == (
        "tool lookup slow",
        2,
        "warning",
    )
    assert "uid" not in outside and "iteration" not in outside


def test_kopf_object_loggers_identity_is_used_outside_a_bound_run(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(logs.JSONFormatter())
    ref = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "namespace": "ns",
        "name": "r",
        "uid": "u",
    }
    logging.getLogger("agentrun.test_logs").info("daemon started", extra={"k8s_ref": ref, "k8s_skip": False})
    [line] = (json.loads(line) for line in _lines(stream))
    assert (line["namespace"], line["name"], line["uid"]) == ("ns", "r", "u")
    assert "k8s_ref" not in line and "k8s_skip" not in line


def test_text_lines_name_the_run_and_iteration_for_humans(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(logs.TextFormatter())
    log = logging.getLogger("agentrun.test_logs")
    with logs.bound_run(logs.RunLogContext("team-a", "my-run", "uid-1", iteration=3)):
        log.info("model request ok")
    log.info("no run here")
    inside, outside = _lines(stream)
    assert inside.endswith("INFO    agentrun.test_logs [team-a/my-run #3] model request ok")
    assert outside.endswith("INFO    agentrun.test_logs no run here")
    assert "{" not in inside


def test_configure_installs_one_handler_in_the_chosen_format() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("text", "debug")
        [handler] = root.handlers
        assert isinstance(handler.formatter, logs.TextFormatter)
        assert root.level == logging.DEBUG
        logs.configure("json")
        assert isinstance(root.handlers[0].formatter, logs.JSONFormatter)
        assert any(isinstance(f, logs.RunContextFilter) for f in root.handlers[0].filters)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_kopfs_per_event_success_lines_are_dropped_at_info_but_its_warnings_are_kept() -> None:
    root = logging.getLogger()
    kopf_objects = logging.getLogger("kopf.objects")
    saved = root.handlers[:], root.level, kopf_objects.level
    try:
        logs.configure("json", "INFO")
        assert not kopf_objects.isEnabledFor(logging.INFO)
        assert kopf_objects.isEnabledFor(logging.WARNING)
        assert logging.getLogger("agentrun.run").isEnabledFor(logging.INFO)
        logs.configure("json", "DEBUG")
        assert kopf_objects.isEnabledFor(logging.INFO)
    finally:
        root.handlers[:], level, kopf_level = saved
        root.setLevel(level)
        kopf_objects.setLevel(kopf_level)
