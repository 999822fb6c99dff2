"""Running the pure loop through the real SDK and adapter against the fake Messages API."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrun.api.provider_spec import Provider
from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig, RetryPolicy
from agentrun.loop.events import Checkpoint, Event, RunFinished
from agentrun.loop.protocols import Clock, Observer, ToolCall, ToolDefinition, ToolOutput
from agentrun.loop.running import run_loop
from agentrun.loop.state import RunState
from agentrun.model.access import AwsKeys, ModelAccess
from agentrun.model.anthropic_calling import AnthropicModel, ClientPool
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from agentrun_sandbox.messages.script import Script, Step


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def notify(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def transcript(self) -> list[dict[str, Any]]:
        """The conversation as the checkpoints persisted it, in order."""
        messages: list[dict[str, Any]] = []
        for checkpoint in self.of(Checkpoint):
            messages.extend(checkpoint.new_messages)
        return messages


class FakeClock:
    """Virtual time: sleeps return at once and move the clock, so backoff costs no wall time.

    `jitter` is what `random()` returns; 0.5 makes the backoff exactly base * 2**(attempt-1).
    Only sleeps move time, so the run's deadline is reached only by sleeping (or by real waits
    on I/O that the loop bounds with the remaining time).
    """

    def __init__(self, *, start: float = 1000.0, jitter: float = 0.5) -> None:
        self.now = start
        self.jitter = jitter
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)

    def random(self) -> float:
        return self.jitter


@dataclass
class FakeTool:
    """A tool whose behaviour each test sets: a fixed answer, an error, a delay.

    With a shared `journal`, each call appends ("start", id) and ("end", id) around `steps`
    yields to the event loop, so a test sees from the order alone whether calls overlapped.
    """

    name: str
    answer: str = "ok"
    error: Exception | None = None
    delay: float = 0.0
    write_key: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    journal: list[tuple[str, str]] | None = None
    steps: int = 5

    @property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description=f"test tool {self.name}",
            input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
            write_key=self.write_key,
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        self.calls.append(call)
        if self.journal is not None:
            self.journal.append(("start", call.id))
            for _ in range(self.steps):
                await asyncio.sleep(0)
            self.journal.append(("end", call.id))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return ToolOutput(self.answer)


class Fanout:
    def __init__(self, *observers: Observer) -> None:
        self._observers = observers

    async def notify(self, event: Event) -> None:
        for observer in self._observers:
            await observer.notify(event)


@dataclass
class LoopRun:
    outcome: Outcome
    recorder: Recorder
    requests: list[RecordedRequest]

    @property
    def finished(self) -> RunFinished:
        finished: RunFinished = self.recorder.of(RunFinished)[-1]
        return finished


class ProviderChoice:
    """Which provider's door the harness's runs go through: the loop's scenarios are replayed through
    each (tests/unit/loop/conftest.py sets it per test)."""

    current: Provider = "anthropic"


PROVIDERS = ProviderChoice()


def access_to(api: FakeMessagesAPI, provider: Provider) -> ModelAccess:
    """Credentials the fake's door for ``provider`` accepts, issued by the fake itself."""
    if provider == "bedrock":
        key_id, secret = api.aws.new_key()
        return ModelAccess(
            "bedrock", base_url=api.url, region=api.aws.region, aws_keys=AwsKeys(key_id, secret)
        )
    if provider == "vertex":
        google = api.google
        return ModelAccess(
            "vertex",
            base_url=f"{api.url}/v1",
            region=google.region,
            project_id=google.project,
            google_credentials=google.new_service_account(f"{api.url}/token"),
        )
    return ModelAccess(api_key="sk-test", base_url=api.url)


FAST_RETRIES = RetryPolicy(max_retries=3, base_seconds=0.01, max_seconds=0.05)


async def run_scripted(
    steps: Sequence[Step],
    *,
    tools: Sequence[FakeTool] = (),
    spec: Mapping[str, Any] | None = None,
    cancel: asyncio.Event | None = None,
    retry: RetryPolicy = FAST_RETRIES,
    marker: str = "[scenario:test]",
    clock: Clock | None = None,
    observers: Sequence[Observer] = (),
    context_window: int | None = None,
    state: RunState | None = None,
    prompt_cache: bool = False,
    always_stream: bool = False,
    client: Literal["direct", "sdk"] = "direct",
    provider: Provider | None = None,
) -> LoopRun:
    """`client`: how a request sent without streaming goes, as AGENTRUN_MODEL_CLIENT chooses;
    `provider`: whose wire form carries the requests (default: `PROVIDERS.current`)."""
    raw_spec = {"task": f"{marker} do the thing", **(spec or {})}
    parsed = AgentRunSpec.model_validate(raw_spec)
    api = FakeMessagesAPI(
        scripts=[Script(marker, steps, context_window=context_window)],
        demo_brain=False,
        prompt_cache=prompt_cache,
    )
    recorder = Recorder()
    async with api.running() as server:
        pool = ClientPool(timeout_seconds=30, shards=1, client=client)
        model = pool.model(access_to(server, provider or PROVIDERS.current))
        try:
            outcome = await run_loop(
                LoopConfig.from_spec(parsed, run_id="run-uid", retry=retry),
                model=AnthropicModel(model.client, always_stream=True) if always_stream else model,
                tools={t.name: t for t in tools},
                observer=Fanout(recorder, *observers),
                clock=clock or SystemClock(),
                pricer=PriceTable(),
                cancel=cancel or asyncio.Event(),
                state=state,
            )
        finally:
            await pool.close()
        return LoopRun(outcome, recorder, list(server.requests))
