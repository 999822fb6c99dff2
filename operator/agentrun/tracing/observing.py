"""OpenTelemetry traces of runs, following the GenAI semantic conventions. Optional and off by default.

The `otel` extra installs OpenTelemetry; nothing here imports it until tracing is switched on
(`AGENTRUN_OTEL_ENABLED=true`), so the operator runs without it.

Spans are built from loop events, which arrive when something has finished and carry its duration:
each model and tool span starts at (now - duration) and ends now. The tree is

    invoke_agent <run>            one per run (per operator process that executed it)
      iteration <n>               one per model request that may use tools, with its tools
        chat <model>              one per attempt, retries included (error.type = retry class)
        execute_tool <tool>       one per tool call

Attributes carry names, ids, counts and stop reasons, never prompts, tool input or output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentrun import __version__
from agentrun.api.model_spec import ModelSpec
from agentrun.api.usage import TokenUsage
from agentrun.loop.events import (
    ApprovalDecided,
    ApprovalRequested,
    Event,
    LoopDetected,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallRecovered,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

#: The GenAI semantic conventions' gen_ai.provider.name of each spec.model.provider.
PROVIDER_NAMES = {"anthropic": "anthropic", "bedrock": "aws.bedrock", "vertex": "gcp.vertex_ai"}
INSTRUMENTATION = "agentrun"


class TracingUnavailable(RuntimeError):
    pass


def configure_tracer_provider(environ: Mapping[str, str]) -> TracerProvider:
    """An SDK provider exporting over OTLP/HTTP, configured by the standard OTEL_* variables."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            "AGENTRUN_OTEL_ENABLED is set but OpenTelemetry is not installed "
            f"({exc.name} is missing): install agentrun-operator[otel]"
        ) from exc
    service = environ.get("OTEL_SERVICE_NAME", "agentrun-operator")
    resource = Resource.create({"service.name": service, "service.version": __version__})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def tracer_of(provider: Any) -> Tracer:
    tracer: Tracer = provider.get_tracer(INSTRUMENTATION, __version__)
    return tracer


class TracingObserver:
    """Per-run observer turning loop events into spans."""

    def __init__(
        self,
        tracer: Tracer,
        *,
        namespace: str,
        name: str,
        uid: str,
        model: str,
        provider: str = "anthropic",
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._tracer = tracer
        self._namespace, self._name, self._uid, self._model = namespace, name, uid, model
        self._provider = PROVIDER_NAMES.get(provider, provider)
        self._clock_ns = clock_ns
        self._run: Span | None = None
        self._iteration: Span | None = None
        self._iteration_number = 0
        self._usage = TokenUsage()
        self._finish_reasons: list[str] = []

    @classmethod
    def of(cls, tracer: Tracer, namespace: str, name: str, uid: str, model: ModelSpec) -> TracingObserver:
        """A run's observer: its model's name and who serves it (gen_ai.provider.name)."""
        return cls(tracer, namespace=namespace, name=name, uid=uid, model=model.name, provider=model.provider)

    def _common(self) -> dict[str, Any]:
        return {
            "gen_ai.system": self._provider,
            "gen_ai.provider.name": self._provider,
            "k8s.namespace.name": self._namespace,
        }

    def _context(self, span: Span | None) -> Any:
        from opentelemetry import trace

        return trace.set_span_in_context(span) if span is not None else None

    async def notify(self, event: Event) -> None:
        match event:
            case RunStarted(resumed=resumed):
                self._start_run(resumed)
            case ModelRequestFinished() as finished:
                self._model_call(finished)
            case ModelRetryScheduled(retry_class=retry_class, attempt=attempt, delay_seconds=delay):
                self._add_event(
                    "agentrun.model.retry",
                    {
                        "error.type": retry_class,
                        "agentrun.retry.attempt": attempt,
                        "agentrun.retry.delay": delay,
                    },
                )
            case ToolCallFinished(trace=trace):
                self._tool_call(
                    trace.name, trace.tool_use_id, trace.duration_seconds, trace.ok, trace.error_code
                )
            case ToolCallRecovered(tool_name=tool):
                self._add_event("agentrun.tool_call.recovered_from_text", {"gen_ai.tool.name": tool})
            case ApprovalRequested(tool_name=tool, tool_use_id=call_id):
                self._add_event(
                    "agentrun.approval.requested", {"gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id}
                )
            case ApprovalDecided(tool_name=tool, tool_use_id=call_id, approved=approved, timed_out=timed_out):
                self._add_event(
                    "agentrun.approval.decided",
                    {
                        "gen_ai.tool.name": tool,
                        "gen_ai.tool.call.id": call_id,
                        "agentrun.approval.approved": approved,
                        "agentrun.approval.timed_out": timed_out,
                    },
                )
            case LoopDetected(pattern=pattern, tool_name=tool):
                self._add_event(
                    "agentrun.loop_detected", {"gen_ai.tool.name": tool, "agentrun.pattern": pattern}
                )
            case RunFinished(outcome=outcome, progress=progress):
                self._finish_run(
                    outcome.stop_reason.value, outcome.stop_reason.succeeded, progress.iterations
                )
            case _:
                pass

    def _start_run(self, resumed: bool) -> None:
        self._run = self._tracer.start_span(
            f"invoke_agent {self._name}",
            start_time=self._clock_ns(),
            attributes={
                **self._common(),
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self._name,
                "gen_ai.agent.id": self._uid,
                "gen_ai.request.model": self._model,
                "agentrun.resumed": resumed,
            },
        )

    def _enter_iteration(self, number: int, start_ns: int) -> Span:
        if self._iteration is not None and number == self._iteration_number:
            return self._iteration
        if self._iteration is not None:
            self._iteration.end(end_time=start_ns)
        self._iteration_number = number
        self._iteration = self._tracer.start_span(
            f"iteration {number}",
            context=self._context(self._run),
            start_time=start_ns,
            attributes={**self._common(), "agentrun.iteration": number},
        )
        return self._iteration

    def _model_call(self, finished: ModelRequestFinished) -> None:
        from opentelemetry.trace import SpanKind, StatusCode

        now = self._clock_ns()
        start = now - int(finished.duration_seconds * 1e9)
        iteration = self._enter_iteration(finished.iteration, start)
        attributes: dict[str, Any] = {
            **self._common(),
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": finished.model,
            "agentrun.iteration": finished.iteration,
        }
        if finished.outcome == "ok":
            usage = finished.usage
            self._usage = self._usage + usage
            attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_input_tokens
            attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_creation_input_tokens
            if finished.stop_reason:
                attributes["gen_ai.response.finish_reasons"] = [finished.stop_reason]
                self._finish_reasons.append(finished.stop_reason)
        else:
            attributes["error.type"] = finished.outcome
        span = self._tracer.start_span(
            f"chat {finished.model}",
            context=self._context(iteration),
            kind=SpanKind.CLIENT,
            start_time=start,
            attributes=attributes,
        )
        if finished.outcome != "ok":
            span.set_status(StatusCode.ERROR, finished.outcome)
        span.end(end_time=now)

    def _tool_call(self, name: str, call_id: str, seconds: float, ok: bool, code: str | None) -> None:
        from opentelemetry.trace import StatusCode

        now = self._clock_ns()
        start = now - int(seconds * 1e9)
        attributes: dict[str, Any] = {
            **self._common(),
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        if not ok:
            attributes["error.type"] = code or "error"
        span = self._tracer.start_span(
            f"execute_tool {name}",
            context=self._context(self._iteration or self._run),
            start_time=start,
            attributes=attributes,
        )
        if not ok:
            span.set_status(StatusCode.ERROR, code or "error")
        span.end(end_time=now)

    def _add_event(self, name: str, attributes: dict[str, Any]) -> None:
        span = self._iteration or self._run
        if span is not None:
            span.add_event(name, attributes=attributes, timestamp=self._clock_ns())

    def _finish_run(self, stop_reason: str, succeeded: bool, iterations: int) -> None:
        from opentelemetry.trace import StatusCode

        now = self._clock_ns()
        if self._iteration is not None:
            self._iteration.end(end_time=now)
            self._iteration = None
        if self._run is None:
            return
        self._run.set_attributes(
            {
                "agentrun.stop_reason": stop_reason,
                "agentrun.iterations": iterations,
                "gen_ai.usage.input_tokens": self._usage.input_tokens,
                "gen_ai.usage.output_tokens": self._usage.output_tokens,
            }
        )
        if self._finish_reasons:
            self._run.set_attribute("gen_ai.response.finish_reasons", self._finish_reasons[-1:])
        if not succeeded:
            self._run.set_status(StatusCode.ERROR, stop_reason)
        self._run.end(end_time=now)
        self._run = None

    def close(self) -> None:
        """The run stopped without finishing here (shutdown, deletion): end what is open."""
        now = self._clock_ns()
        for span in (self._iteration, self._run):
            if span is not None:
                span.set_attribute("agentrun.interrupted", True)
                span.end(end_time=now)
        self._iteration = self._run = None
