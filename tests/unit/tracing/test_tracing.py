"""OpenTelemetry spans of a real loop run (real SDK against the fake Messages API), in memory."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentrun.api.model_spec import ModelSpec
from agentrun.api.provider_spec import Provider
from agentrun.loop.errors import ToolError
from agentrun.tracing.observing import TracingObserver, tracer_of
from agentrun_sandbox.messages.script import HttpError, Reply, ScriptUsage, text_block, tool_use_block
from tests.support.loop_harness import FakeTool, run_scripted


def _tracing() -> tuple[InMemorySpanExporter, TracingObserver]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = TracingObserver(
        tracer_of(provider), namespace="team-a", name="my-run", uid="uid-1", model="claude-haiku-4-5"
    )
    return exporter, observer


def _named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_run_is_one_trace_of_run_iteration_model_and_tool_spans_with_genai_attributes() -> None:
    exporter, observer = _tracing()
    lookup = FakeTool("lookup", answer="3 pods")
    broken = FakeTool("broken", error=ToolError("unavailable", "backend down"))
    await run_scripted(
        [
            Reply(
                [
                    tool_use_block("lookup", {"q": "pods"}, id="toolu_L1"),
                    tool_use_block("broken", {"q": "x"}, id="toolu_B1"),
                ],
                usage=ScriptUsage(120, 30),
                faults=[HttpError.rate_limit(retry_after=0.01)],
            ),
            Reply([text_block("3 pods.")], usage=ScriptUsage(200, 8)),
        ],
        tools=[lookup, broken],
        spec={"model": {"name": "claude-haiku-4-5"}},
        observers=[observer],
    )
    spans = exporter.get_finished_spans()
    [run] = _named(spans, "invoke_agent")
    iterations = _named(spans, "iteration")
    chats = _named(spans, "chat")
    tools = {s.attributes["gen_ai.tool.name"]: s for s in _named(spans, "execute_tool") if s.attributes}

    assert len({s.context.trace_id for s in spans}) == 1
    assert run.parent is None and run.name == "invoke_agent my-run"
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.id"] == "uid-1"
    assert run.attributes["agentrun.stop_reason"] == "EndTurn"
    assert (run.attributes["gen_ai.usage.input_tokens"], run.attributes["gen_ai.usage.output_tokens"]) == (
        320,
        38,
    )
    assert run.status.status_code is StatusCode.UNSET

    assert [s.name for s in iterations] == ["iteration 1", "iteration 2"]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in iterations)
    # The rate-limited attempt and its retry both belong to iteration 1; the answer to iteration 2.
    assert [s.parent.span_id for s in chats if s.parent] == [iterations[0].context.span_id] * 2 + [
        iterations[1].context.span_id
    ]
    failed, first, second = chats
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == "rate_limited"
    assert first.kind is SpanKind.CLIENT and first.name == "chat claude-haiku-4-5"
    assert first.attributes is not None
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.system"] == "anthropic"
    assert first.attributes["gen_ai.request.model"] == "claude-haiku-4-5"
    assert (
        first.attributes["gen_ai.usage.input_tokens"],
        first.attributes["gen_ai.usage.output_tokens"],
    ) == (
        120,
        30,
    )
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert second.attributes is not None and second.attributes["gen_ai.response.finish_reasons"] == (
        "end_turn",
    )
    assert [e.name for e in iterations[0].events] == ["agentrun.model.retry"]

    assert set(tools) == {"lookup", "broken"}
    for tool in tools.values():
        assert tool.parent is not None and tool.parent.span_id == iterations[0].context.span_id
        assert tool.attributes is not None and tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert (
        tools["lookup"].attributes is not None
        and tools["lookup"].attributes["gen_ai.tool.call.id"] == "toolu_L1"
    )
    assert tools["lookup"].status.status_code is StatusCode.UNSET
    assert tools["broken"].status.status_code is StatusCode.ERROR
    assert (
        tools["broken"].attributes is not None and tools["broken"].attributes["error.type"] == "unavailable"
    )
    # Nothing of the conversation leaks into the trace.
    assert not any("pods" in str(value) for s in spans for value in (s.attributes or {}).values())


async def test_a_failed_run_marks_its_span_as_an_error() -> None:
    exporter, observer = _tracing()
    await run_scripted(
        [HttpError(status=400, error_type="invalid_request_error", message="bad")],
        spec={"model": {"name": "claude-haiku-4-5"}},
        observers=[observer],
    )
    [run] = _named(exporter.get_finished_spans(), "invoke_agent")
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes is not None and run.attributes["agentrun.stop_reason"] == "ModelError"


async def test_closing_an_unfinished_run_ends_its_open_spans() -> None:
    exporter, observer = _tracing()
    from agentrun.api.traces import Progress
    from agentrun.api.usage import TokenUsage
    from agentrun.loop.events import ModelRequestFinished, RunStarted

    await observer.notify(RunStarted(resumed=True, progress=Progress(0, 0, TokenUsage(), None)))
    await observer.notify(
        ModelRequestFinished(1, "claude-haiku-4-5", 0.5, "ok", TokenUsage(1, 1), "tool_use")
    )
    observer.close()
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["chat claude-haiku-4-5", "invoke_agent my-run", "iteration 1"]
    [run] = _named(exporter.get_finished_spans(), "invoke_agent")
    assert run.attributes is not None and run.attributes["agentrun.interrupted"] is True
    assert run.attributes["agentrun.resumed"] is True


@pytest.mark.parametrize(("provider", "name"), [("bedrock", "aws.bedrock"), ("vertex", "gcp.vertex_ai")])
async def test_a_run_on_a_cloud_names_the_cloud_as_its_genai_provider(provider: Provider, name: str) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ModelSpec.model_validate({"provider": provider, "name": "claude-haiku-4-5@20251001"})
    observer = TracingObserver.of(tracer_of(tracer_provider), "team-a", "my-run", "uid-1", model)
    await run_scripted(
        [Reply([text_block("done")])],
        observers=[observer],
        provider=provider,
        spec={"model": {"name": model.name}},
    )
    observer.close()
    spans = exporter.get_finished_spans()
    assert spans and {s.attributes["gen_ai.provider.name"] for s in spans if s.attributes} == {name}
    [chat] = _named(spans, "chat ")
    assert (
        chat.attributes is not None and chat.attributes["gen_ai.request.model"] == "claude-haiku-4-5@20251001"
    )
