"""The run service: turns one AgentRun object into one loop execution. Handlers stay thin.

Errors are translated here, once: invalid specs become InvalidSpec outcomes, a missing Secret
keeps the run Pending until it appears, everything the model or tools do is the loop's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from agentrun.api.spec import AgentRunSpec
from agentrun.controller.kubeapi import KubeAPI
from agentrun.controller.status_writing import StatusWriter
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.events import Event, ModelRequestFinished, Progress, RunFinished
from agentrun.loop.running import run_loop
from agentrun.loop.stops import Outcome, StopReason
from agentrun.loop.usage import TokenUsage
from agentrun.metrics.observing import Metrics, MetricsObserver
from agentrun.model.messaging import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings
from agentrun.tools.registry import InvalidToolSpec, build_tools

logger = logging.getLogger(__name__)


def describe_validation_error(exc: pydantic.ValidationError, prefix: str = "spec") -> str:
    """One line per problem, each naming the field as a user would write it in YAML."""
    lines = []
    for error in exc.errors():
        path = prefix
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        lines.append(f"{path}: {error['msg']}")
    return "; ".join(lines)


class Fanout:
    """Delivers each event to every observer in order; the status writer comes first."""

    def __init__(self, *observers: Any) -> None:
        self._observers = observers

    async def notify(self, event: Event) -> None:
        for observer in self._observers:
            await observer.notify(event)


class LogObserver:
    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        self._log = log

    async def notify(self, event: Event) -> None:
        match event:
            case ModelRequestFinished(iteration=i, outcome=outcome, duration_seconds=s, usage=u):
                self._log.info(
                    "iteration %d: model request %s in %.2fs (in=%d out=%d)",
                    i,
                    outcome,
                    s,
                    u.input_tokens,
                    u.output_tokens,
                )
            case RunFinished(outcome=outcome, progress=p):
                self._log.info(
                    "finished: %s after %d iterations (%s)",
                    outcome.stop_reason.value,
                    p.iterations,
                    outcome.message,
                )
            case _:
                pass


@dataclass
class RunRef:
    namespace: str
    name: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]


@dataclass
class RunService:
    settings: Settings
    kube: KubeAPI
    metrics: Metrics
    clients: ClientPool
    prices: PriceTable
    slots: asyncio.Semaphore
    cancels: dict[str, asyncio.Event] = field(default_factory=dict)

    def request_cancel(self, uid: str) -> None:
        self.cancels.setdefault(uid, asyncio.Event()).set()

    async def execute(
        self,
        run: RunRef,
        *,
        stopping: Callable[[], bool],
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        writer = StatusWriter(
            self.kube,
            namespace=run.namespace,
            name=run.name,
            generation=run.generation,
            status=run.status,
            stopping=stopping,
        )
        cancel = self.cancels.setdefault(run.uid, asyncio.Event())
        if run.spec.get("cancel"):
            cancel.set()
        try:
            await self._execute(run, writer, cancel, log)
        finally:
            self.cancels.pop(run.uid, None)

    async def _execute(
        self,
        run: RunRef,
        writer: StatusWriter,
        cancel: asyncio.Event,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        try:
            spec = AgentRunSpec.model_validate(run.spec)
            tools = build_tools(spec)
        except pydantic.ValidationError as exc:
            await self._finish_early(run, writer, StopReason.INVALID_SPEC, describe_validation_error(exc))
            return
        except InvalidToolSpec as exc:
            await self._finish_early(run, writer, StopReason.INVALID_SPEC, str(exc))
            return
        if cancel.is_set():
            await self._finish_early(
                run, writer, StopReason.CANCELLED, "spec.cancel was set before the run started"
            )
            return
        api_key = await self._api_key(spec, run, writer, cancel)
        if api_key is None:
            if cancel.is_set():
                await self._finish_early(
                    run, writer, StopReason.CANCELLED, "spec.cancel was set while pending"
                )
            return
        if self.slots.locked():
            await writer.pending(
                "Queued", f"waiting for one of {self.settings.max_concurrent_runs} run slots"
            )
        self.metrics.runs_queued.inc()
        try:
            await self.slots.acquire()
        finally:
            self.metrics.runs_queued.dec()
        try:
            self.metrics.runs_active.inc()
            clock = SystemClock()
            metrics_observer = MetricsObserver(
                self.metrics, namespace=run.namespace, started_monotonic=clock.monotonic()
            )
            model = self.clients.model(
                api_key=api_key, base_url=spec.model.base_url or self.settings.anthropic_base_url
            )
            await run_loop(
                LoopConfig.from_spec(spec, run_id=run.uid),
                model=model,
                tools=tools,
                observer=Fanout(writer, metrics_observer, LogObserver(log)),
                clock=clock,
                pricer=self.prices,
                cancel=cancel,
            )
            metrics_observer.finished(clock.monotonic())
        finally:
            self.metrics.runs_active.dec()
            self.slots.release()

    async def _api_key(
        self, spec: AgentRunSpec, run: RunRef, writer: StatusWriter, cancel: asyncio.Event
    ) -> str | None:
        """Wait, Pending, until the key is available; a Secret created later unblocks the run."""
        ref = spec.model.api_key_secret_ref
        announced = False
        while not cancel.is_set():
            if ref is None:
                if self.settings.anthropic_api_key is not None:
                    return self.settings.anthropic_api_key.get_secret_value()
                reason, message = (
                    "APIKeyMissing",
                    ("no spec.model.apiKeySecretRef and the operator has no ANTHROPIC_API_KEY"),
                )
            else:
                value = await self.kube.read_secret_key(run.namespace, ref.name, ref.key)
                if value:
                    return value
                reason, message = (
                    "SecretNotFound",
                    (
                        f"Secret {run.namespace}/{ref.name} with key {ref.key!r} "
                        "(spec.model.apiKeySecretRef) does not exist yet; the run starts once it does"
                    ),
                )
            if not announced:
                await writer.pending(reason, message)
                announced = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cancel.wait(), timeout=self.settings.secret_retry_seconds)
        return None

    async def _finish_early(
        self, run: RunRef, writer: StatusWriter, reason: StopReason, message: str
    ) -> None:
        outcome = Outcome(reason, message)
        progress = Progress(0, 0, TokenUsage(), None)
        self.metrics.runs_finished.labels(
            run.namespace, reason.value, "succeeded" if reason.succeeded else "failed"
        ).inc()
        await writer.notify(RunFinished(outcome=outcome, progress=progress))
