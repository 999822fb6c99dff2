"""Observers of one run's loop events that are not I/O of their own: the fan-out and the log lines."""

from __future__ import annotations

import logging

from agentrun import logs
from agentrun.loop.events import ApprovalDecided, ApprovalRequested, Event, ModelRequestFinished, RunFinished
from agentrun.loop.protocols import Observer


class Fanout:
    """Delivers each event to every observer in order; the status writer comes first.

    With `terminal_last`, the first observer hears RunFinished after the others: the terminal status
    patch is the run's last word (once it is stored, nothing reruns or resumes the run), so metrics,
    Events and logs are recorded before it.
    """

    def __init__(self, *observers: Observer, terminal_last: bool = False) -> None:
        self._observers = observers
        self._terminal_last = terminal_last

    async def notify(self, event: Event) -> None:
        observers = self._observers
        if self._terminal_last and isinstance(event, RunFinished) and observers:
            observers = (*observers[1:], observers[0])
        for observer in observers:
            await observer.notify(event)


class LogObserver:
    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        self._log = log

    async def notify(self, event: Event) -> None:
        context = logs.current_run()
        if context is not None and isinstance(getattr(event, "iteration", None), int):
            context.iteration = getattr(event, "iteration", 0)
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
            case ApprovalRequested(tool_name=tool, tool_use_id=call_id):
                self._log.info("tool call %s (%s) is waiting for approval in spec.approvals", tool, call_id)
            case ApprovalDecided(tool_name=tool, tool_use_id=call_id, approved=ok, by=by, reason=why):
                self._log.info(
                    "tool call %s (%s) %s by %s: %s",
                    tool,
                    call_id,
                    "approved" if ok else "denied",
                    by or "the operator",
                    why or "no reason given",
                )
            case _:
                pass
