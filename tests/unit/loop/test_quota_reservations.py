"""Quota reservations in the loop: every attempt of every model request is reserved before it is
sent, for at least what the API then bills, and settled to what the outcome says it cost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from agentrun.api.stops import StopReason
from agentrun.api.usage import TokenUsage
from agentrun.loop.events import RunFinished
from agentrun.loop.protocols import ModelRequest, ServerContextEdits, ToolDefinition
from agentrun.loop.reserving import API_PROMPT_MARGIN, RequestSizer, utf8_bytes
from agentrun.loop.state import RunState
from agentrun.loop.windowing import SUMMARY_REQUEST
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.recording import Bill, RecordedRequest
from agentrun_sandbox.messages.script import (
    ConnectionReset,
    HttpError,
    Reply,
    SlowResponse,
    Step,
    StreamError,
    TruncatedStream,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)
from tests.support.allowances import MemoryAllowance, QuotaRun, run_with_allowance
from tests.support.loop_harness import FakeTool
from tests.support.waiting import until

MODEL = "claude-sonnet-4-6"
MAX_TOKENS = 1024
BIG = "line of a pod log, with ünïcödé\n" * 400  # about 13,000 characters
WINDOW = 20_000


def _turns(count: int, tool: str = "logs") -> list[Reply]:
    return [Reply([tool_use_block(tool, {"pod": f"p{i}"})]) for i in range(count)]


def _answer(*faults: Any) -> Reply:
    return Reply([text_block("all pods checked")], faults=faults)


def _spec(**extra: Any) -> dict[str, Any]:
    model = {"name": MODEL, "maxTokens": MAX_TOKENS, **extra.pop("model", {})}
    return {"model": model, "limits": {"maxIterations": 50}, **extra}


def _thinking_turns() -> list[Reply]:
    return [
        Reply(
            [
                thinking_block("Which pods? Look first. " * 40),
                redacted_thinking_block("EmwKAhgBEgy3va3pzix"),
                tool_use_block("logs", {"q": "pods"}),
            ]
        ),
        Reply([thinking_block("Now the logs."), tool_use_block("logs", {"q": "logs"})]),
        Reply([thinking_block("Enough to answer."), text_block("All healthy.")]),
    ]


def _context(clear: str = "Client", compact: str = "Client", **compaction: Any) -> dict[str, Any]:
    return {
        "clearToolResults": {"strategy": clear, "keepNewest": 2, "batch": 1, "minChars": 0},
        "compaction": {"strategy": compact, **compaction},
        "contextWindowTokens": WINDOW,
    }


@dataclass(frozen=True)
class Scenario:
    steps: Sequence[Step]
    spec: dict[str, Any] = field(default_factory=_spec)
    tools: Callable[[], list[FakeTool]] = lambda: [FakeTool("logs", BIG)]
    context_window: int | None = None
    prompt_cache: bool = False


SCENARIOS = {
    "a single answer": Scenario([_answer()], tools=list),
    "tool turns with big results": Scenario([*_turns(5), _answer()]),
    "tool results cleared by the loop": Scenario(
        [*_turns(6), _answer()], spec=_spec(context=_context(enabled=False))
    ),
    "thinking kept across tool turns": Scenario(
        _thinking_turns(), spec=_spec(model={"maxTokens": 4096, "thinking": {"budgetTokens": 2048}})
    ),
    "a prompt cache serving the prefix": Scenario([*_turns(5), _answer()], prompt_cache=True),
    "the loop's own compaction": Scenario(
        [*_turns(12), _answer()],
        spec=_spec(context={**_context(), "clearToolResults": {"enabled": False}}),
        context_window=WINDOW,
    ),
    "compaction on the server": Scenario(
        [*_turns(6), _answer()],
        spec=_spec(
            context={
                **_context(compact="Server", thresholdPercent=50),
                "clearToolResults": {"enabled": False},
            }
        ),
    ),
    "clearing on the server": Scenario([*_turns(6), _answer()], spec=_spec(context=_context(clear="Server"))),
    "retries after errors, a fault in the stream and a reset": Scenario(
        [
            Reply([tool_use_block("logs", {"pod": "a"})], faults=[HttpError.overloaded()]),
            Reply([tool_use_block("logs", {"pod": "b"})], faults=[StreamError()]),
            Reply([tool_use_block("logs", {"pod": "c"})], faults=[ConnectionReset(during="body")]),
            _answer(TruncatedStream(mode="cut")),
        ]
    ),
}


def _usage(bill: Bill) -> TokenUsage:
    """What the API bills for a request, a compaction on the server included."""
    keys = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    total = TokenUsage(*(int(bill.usage.get(k) or 0) for k in keys))
    for entry in bill.usage.get("iterations") or ():
        if entry.get("type") == "compaction":
            total += TokenUsage(*(int(entry.get(k) or 0) for k in keys))
    return total


def _pairs(run: QuotaRun, allowance: MemoryAllowance) -> list[tuple[Any, RecordedRequest]]:
    requests = run.messages_requests
    assert len(allowance.reservations) == len(requests), "every attempt is reserved exactly once"
    return list(zip(allowance.reservations, requests, strict=True))


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=list(SCENARIOS))
async def test_every_attempt_reserves_at_least_what_the_api_bills_for_it(scenario: Scenario) -> None:
    allowance = MemoryAllowance()
    run = await run_with_allowance(
        scenario.steps,
        allowance,
        tools=scenario.tools(),
        spec=scenario.spec,
        context_window=scenario.context_window,
        prompt_cache=scenario.prompt_cache,
    )
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN, run.outcome
    billed = 0
    for reservation, request in _pairs(run, allowance):
        assert reservation.settled
        bill = run.bills.get(request.request_id)
        if bill is None:
            continue
        billed += 1
        usage = _usage(bill)
        # The input side alone covers what was read (the compaction's summary included): the
        # output side, max_tokens, is never what makes the bound hold.
        answer_output = int(bill.usage.get("output_tokens") or 0)
        assert answer_output <= request.body["max_tokens"]
        assert reservation.spend.tokens - request.body["max_tokens"] >= usage.total - answer_output, (
            request.step
        )
        cost = PriceTable().cost(bill.model, usage)
        assert cost is not None and reservation.spend.cost_usd is not None
        assert reservation.spend.cost_usd >= cost
    assert billed >= 1


async def test_the_scenarios_exercise_the_compactions_and_edits_they_are_named_after() -> None:
    local = SCENARIOS["the loop's own compaction"]
    allowance = MemoryAllowance()
    run = await run_with_allowance(
        local.steps, allowance, tools=local.tools(), spec=local.spec, context_window=local.context_window
    )
    summaries = [r for r in run.messages_requests if SUMMARY_REQUEST in str(r.body["messages"][-1])]
    assert summaries, "the loop compacted"
    server = SCENARIOS["compaction on the server"]
    allowance = MemoryAllowance()
    run = await run_with_allowance(server.steps, allowance, tools=server.tools(), spec=server.spec)
    compacted = [
        i for i, r in enumerate(run.messages_requests) if run.bills[r.request_id].usage.get("iterations")
    ]
    assert compacted, "the server compacted"
    # The API reports less than the next request holds: that request is measured whole again.
    after = compacted[0] + 1
    assert allowance.reservations[after].spend.tokens >= utf8_bytes(
        run.messages_requests[after].body["messages"]
    )


async def test_a_successful_attempt_settles_to_the_usage_and_price_the_api_reported() -> None:
    allowance = MemoryAllowance()
    run = await run_with_allowance(
        [*_turns(2), _answer()], allowance, tools=[FakeTool("logs", BIG)], spec=_spec()
    )
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN
    for reservation, request in _pairs(run, allowance):
        usage = _usage(run.bills[request.request_id])
        assert reservation.usage == usage
        assert reservation.cost_usd == PriceTable().cost(MODEL, usage)
    finished = run.recorder.of(RunFinished)[-1]
    assert sum(r.charged for r in allowance.reservations) == finished.progress.usage.total


async def test_an_attempt_refused_with_an_http_status_settles_to_nothing_and_is_reserved_again() -> None:
    allowance = MemoryAllowance()
    run = await run_with_allowance(
        [_answer(HttpError.overloaded(), HttpError.rate_limit(retry_after=0))], allowance
    )
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN
    refused, limited, answered = _pairs(run, allowance)
    assert (refused[0].usage, refused[0].cost_usd) == (TokenUsage(), Decimal(0))
    assert (limited[0].usage, limited[0].cost_usd) == (TokenUsage(), Decimal(0))
    assert answered[0].usage == _usage(run.bills[answered[1].request_id])


async def test_a_request_refused_for_good_settles_to_nothing() -> None:
    allowance = MemoryAllowance()
    run = await run_with_allowance(
        [_answer(HttpError(error_type="invalid_request_error", message="messages.0: bad block"))], allowance
    )
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.MODEL_ERROR
    [(reservation, _)] = _pairs(run, allowance)
    assert reservation.usage == TokenUsage()


@pytest.mark.parametrize(
    "fault",
    [
        StreamError(),
        ConnectionReset(during="body"),
        ConnectionReset(during="headers"),
        TruncatedStream(mode="cut"),
    ],
    ids=["an error inside a 200 stream", "a reset in the body", "a reset before the headers", "a cut stream"],
)
async def test_an_attempt_whose_outcome_is_unknown_is_charged_in_full(fault: Any) -> None:
    allowance = MemoryAllowance()
    run = await run_with_allowance([_answer(fault)], allowance, always_stream=True)
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN
    failed, answered = _pairs(run, allowance)
    assert (failed[0].usage, failed[0].cost_usd) == (None, None)
    assert failed[0].charged == failed[0].spend.tokens
    assert answered[0].usage == _usage(run.bills[answered[1].request_id])


async def test_an_attempt_the_client_timed_out_is_charged_in_full() -> None:
    allowance = MemoryAllowance()
    run = await run_with_allowance([_answer(SlowResponse(seconds=3))], allowance, client_timeout=0.3)
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN
    timed_out, answered = _pairs(run, allowance)
    assert timed_out[0].usage is None
    assert isinstance(answered[0].usage, TokenUsage)


async def test_a_request_in_flight_when_the_run_is_cancelled_is_charged_in_full() -> None:
    allowance = MemoryAllowance()
    cancel = asyncio.Event()

    async def cancel_once_sent() -> None:
        await until(lambda: allowance.reservations, "the request's reservation", every=0.005)
        await asyncio.sleep(0.1)
        cancel.set()

    canceller = asyncio.ensure_future(cancel_once_sent())
    run = await run_with_allowance([Reply([text_block("late")], delay_seconds=5)], allowance, cancel=cancel)
    await canceller
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.CANCELLED
    [(reservation, _)] = _pairs(run, allowance)
    assert reservation.settled and reservation.usage is None


async def test_a_request_in_flight_when_the_operator_stops_the_run_is_still_settled_in_full() -> None:
    # Cancelled once mid-request, then again while the settlement is under way: it still finishes.
    allowance = MemoryAllowance(settle_delay=0.3)
    run = await run_with_allowance(
        [Reply([text_block("late")], delay_seconds=5)],
        allowance,
        cancel_task_after_requests=1,
        cancel_again_after=0.1,
    )
    assert run.outcome is None
    [reservation] = allowance.reservations
    await until(lambda: reservation.settled, "the reservation to be settled", every=0.01)
    assert reservation.usage is None


async def test_a_request_the_quota_cannot_hold_is_never_sent_and_the_run_ends_quota_exceeded() -> None:
    allowance = MemoryAllowance(tokens=500)
    run = await run_with_allowance([_answer()], allowance)
    assert run.outcome is not None
    assert run.outcome.stop_reason is StopReason.QUOTA_EXCEEDED
    assert run.outcome.condition_reason == "QuotaExceeded"
    assert "quota default/team: tokens 0 used" in run.outcome.message
    assert run.messages_requests == []
    assert len(allowance.refused) == 1 and allowance.refused[0].tokens > 500
    assert not StopReason.QUOTA_EXCEEDED.succeeded


async def test_a_refusal_mid_run_stops_before_the_next_request_and_keeps_what_was_spent() -> None:
    allowance = MemoryAllowance(refuse_from=2)
    run = await run_with_allowance([*_turns(4), _answer()], allowance, tools=[FakeTool("logs", "ok")])
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.QUOTA_EXCEEDED
    assert len(run.messages_requests) == 2
    finished = run.recorder.of(RunFinished)[-1]
    assert finished.progress.iterations == 2
    assert finished.progress.usage.total == sum(_usage(b).total for b in run.bills.values())


async def test_a_retry_that_the_quota_cannot_hold_is_not_sent() -> None:
    allowance = MemoryAllowance(refuse_from=1)
    run = await run_with_allowance([_answer(HttpError.overloaded())], allowance)
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.QUOTA_EXCEEDED
    assert [r.outcome for r in run.messages_requests] == ["http_error"]


async def test_a_compaction_summary_request_is_reserved_and_is_not_sent_when_refused() -> None:
    scenario = SCENARIOS["the loop's own compaction"]

    def is_summary(request: RecordedRequest) -> bool:
        return SUMMARY_REQUEST in str(request.body["messages"][-1])

    allowance = MemoryAllowance()
    run = await run_with_allowance(
        scenario.steps, allowance, tools=scenario.tools(), spec=scenario.spec, context_window=WINDOW
    )
    first = next(i for i, r in enumerate(run.messages_requests) if is_summary(r))
    summary_reservation, summary = _pairs(run, allowance)[first]
    assert summary_reservation.usage == _usage(run.bills[summary.request_id])

    refusing = MemoryAllowance(refuse_from=first)
    run = await run_with_allowance(
        scenario.steps, refusing, tools=scenario.tools(), spec=scenario.spec, context_window=WINDOW
    )
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.QUOTA_EXCEEDED
    assert len(run.messages_requests) == first
    assert not any(is_summary(r) for r in run.messages_requests)


async def test_a_run_without_an_allowance_sends_what_a_run_whose_quota_always_fits_sends() -> None:
    steps = [*_turns(6), _answer()]
    spec = _spec(context=_context())
    bodies = []
    for allowance in (None, MemoryAllowance()):
        run = await run_with_allowance(
            steps, allowance, tools=[FakeTool("logs", BIG)], spec=spec, context_window=WINDOW
        )
        assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN
        bodies.append([r.body for r in run.messages_requests])
    assert bodies[0] == bodies[1]


async def test_while_no_quota_applies_requests_go_out_without_a_reservation() -> None:
    allowance = MemoryAllowance(tokens=1, quota_exists=False)
    run = await run_with_allowance(
        [*_turns(2), _answer()], allowance, tools=[FakeTool("logs", BIG)], spec=_spec()
    )
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN
    assert allowance.reservations == [] and allowance.refused == []
    assert len(run.messages_requests) == 3


async def test_a_resumed_run_measures_its_first_request_whole() -> None:
    steps = [*_turns(4), _answer()]
    first = await run_with_allowance(steps, MemoryAllowance(), tools=[FakeTool("logs", BIG)], spec=_spec())
    messages = first.recorder.transcript()[:5]  # task, two answered tool turns
    state = RunState.restore(messages, {"iterations": 2, "context": {"lastInputTokens": 1}})
    allowance = MemoryAllowance()
    run = await run_with_allowance(steps, allowance, tools=[FakeTool("logs", BIG)], spec=_spec(), state=state)
    assert run.outcome is not None and run.outcome.stop_reason is StopReason.END_TURN
    reservation, request = _pairs(run, allowance)[0]
    # A persisted count is not trusted as a basis: the first request is measured in bytes.
    assert reservation.spend.tokens - MAX_TOKENS >= utf8_bytes(request.body["messages"])
    for reservation, request in _pairs(run, allowance):
        assert reservation.spend.tokens >= _usage(run.bills[request.request_id]).total


def _request(messages: list[dict[str, Any]], **kwargs: Any) -> ModelRequest:
    tools = (ToolDefinition("logs", "read logs", {"type": "object"}),)
    return ModelRequest(
        model=MODEL, max_tokens=MAX_TOKENS, messages=messages, system="be brief", tools=tools, **kwargs
    )


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def test_text_is_counted_in_utf8_bytes_not_characters() -> None:
    ascii_bound = RequestSizer().bound(_request([_user("a" * 3000)]), None)
    wide_bound = RequestSizer().bound(_request([_user("ü" * 3000)]), None)
    assert wide_bound.input_tokens - ascii_bound.input_tokens == 3000


def test_after_an_answer_only_what_is_new_or_changed_is_counted_on_top_of_the_reported_input() -> None:
    sizer = RequestSizer()
    task, answer = _user("task " * 500), {"role": "assistant", "content": [{"type": "text", "text": "hm"}]}
    sizer.learn(_request([task]), None, input_tokens=700)
    follow_up = _user("more")
    bound = sizer.bound(_request([task, answer, follow_up]), None)
    assert bound.input_tokens == 700 + utf8_bytes(answer) + utf8_bytes(follow_up) + API_PROMPT_MARGIN
    assert bound.output_tokens == MAX_TOKENS
    # A changed earlier message counts whole again; a different tool list measures it all.
    changed = sizer.bound(_request([_user("task"), answer, follow_up]), None)
    assert changed.input_tokens == bound.input_tokens + utf8_bytes(_user("task"))
    other_tools = ModelRequest(model=MODEL, max_tokens=MAX_TOKENS, messages=[task, answer, follow_up])
    whole = utf8_bytes("") + utf8_bytes([]) + utf8_bytes([task, answer, follow_up]) + API_PROMPT_MARGIN
    assert sizer.bound(other_tools, None).input_tokens == whole


def test_a_server_compaction_is_counted_only_when_the_request_can_reach_its_trigger() -> None:
    messages = [_user("x" * 5000)]
    plain = RequestSizer().bound(_request(messages), None)
    low = ServerContextEdits(compact=True, compact_trigger_tokens=plain.input_tokens + 1)
    assert RequestSizer().bound(_request(messages, server_context=low), None) == plain
    high = ServerContextEdits(compact=True, compact_trigger_tokens=plain.input_tokens)
    bound = RequestSizer().bound(_request(messages, server_context=high), None)
    assert bound.input_tokens == 2 * plain.input_tokens + MAX_TOKENS
    assert bound.output_tokens == 2 * MAX_TOKENS


def test_cost_is_priced_at_the_dearest_input_rate_and_unknown_without_a_price() -> None:
    bound = RequestSizer().bound(_request([_user("hello")]), None)
    prices = PriceTable()
    spend = bound.spend(MODEL, prices)
    write = prices.cost(MODEL, TokenUsage(cache_creation_input_tokens=bound.input_tokens))
    out = prices.cost(MODEL, TokenUsage(output_tokens=bound.output_tokens))
    assert write is not None and out is not None
    assert spend.cost_usd == write + out
    assert spend.tokens == bound.input_tokens + bound.output_tokens
    assert bound.spend("a-model-without-a-price", prices).cost_usd is None


def test_a_typed_tools_instructions_which_the_api_adds_are_reserved_though_no_byte_shows_them() -> None:
    plain = ToolDefinition("bash", "", {"type": "object"}, api_type="bash_20250124")
    typed = ToolDefinition("bash", "", {"type": "object"}, api_type="bash_20250124", api_prompt_tokens=245)
    messages = [{"role": "user", "content": "fix the test"}]
    without = RequestSizer().input_bound(ModelRequest("m", 100, messages, tools=[plain]), None)
    assert RequestSizer().input_bound(ModelRequest("m", 100, messages, tools=[typed]), None) == without + 245
    assert without == utf8_bytes([plain.as_api()]) + utf8_bytes(messages) + API_PROMPT_MARGIN
