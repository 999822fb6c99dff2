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


def _record(created: float, message: str = "hello", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("agentrun.run", logging.INFO, __file__, 1, message, (), None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    record.__dict__.update(extra)
    return record


def test_json_lines_keep_each_records_own_time_across_seconds_and_its_extras_in_order() -> None:
    formatter = logs.JSONFormatter()
    base = 1_764_400_000  # 2025-11-29T07:06:40Z
    lines = [
        json.loads(formatter.format(_record(base + 0.125))),
        json.loads(
            formatter.format(_record(base + 0.875, tool="calculator", attempt=2, k8s_ref={"name": "r"}))
        ),
        json.loads(formatter.format(_record(base + 1.0625, _private=1, code=None))),
        json.loads(formatter.format(_record(base - 59.5))),
    ]
    assert [line["time"] for line in lines] == [
        "2025-11-29T07:06:40.125Z",
        "2025-11-29T07:06:40.875Z",
        "2025-11-29T07:06:41.062Z",
        "2025-11-29T07:05:40.500Z",
    ]
    assert list(lines[1]) == ["time", "level", "logger", "message", "tool", "attempt"]
    assert (lines[1]["tool"], lines[1]["attempt"]) == ("calculator", 2)
    assert list(lines[2]) == ["time", "level", "logger", "message", "code"] and lines[2]["code"] == "None"
    assert list(lines[0]) == ["time", "level", "logger", "message"]


def test_lean_records_drop_caller_and_thread_fields_and_the_json_line_is_unchanged(
    captured: tuple[io.StringIO, logging.Handler],
) -> None:
    stream, handler = captured
    handler.setFormatter(logs.JSONFormatter())
    logger = logging.getLogger("agentrun.test_logs")
    saved = logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing
    seen: list[logging.LogRecord] = []
    handler.addFilter(lambda record: seen.append(record) or True)
    try:
        logger.info("before %d", 1, extra={"tool": "t"})
        logs.lean_records()
        logger.info("before %d", 1, extra={"tool": "t"})
    finally:
        logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved
    full, lean = seen
    assert full.lineno > 0 and full.thread is not None and full.process is not None
    assert (lean.lineno, lean.funcName, lean.thread, lean.threadName, lean.process) == (
        0,
        "(unknown function)",
        None,
        None,
        None,
    )
    before, after = (json.loads(line) for line in _lines(stream))
    before.pop("time"), after.pop("time")
    assert (
        before
        == after
        == {"level": "info", "logger": "agentrun.test_logs", "message": "before 1", "tool": "t"}
    )
