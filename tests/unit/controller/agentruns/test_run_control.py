"""One run's stop signals: which cause wins, what each lets the run still do, and who is told."""

from __future__ import annotations

from agentrun.controller.agentruns.run_control import RunControl, StopCause


class Tenure:
    """Stands in for ownership.Held: held until ``ok`` is False; then it stops the run, as Held does."""

    def __init__(self, control: RunControl) -> None:
        self.control = control
        self.ok = True

    def __call__(self) -> bool:
        if not self.ok:
            self.control.stop(StopCause.FENCED)
        return self.ok


def test_a_fresh_run_goes_on_and_may_write() -> None:
    control = RunControl()
    assert control.why() is None and control.held() and not control.silenced() and not control.stopped


def test_a_cancelled_run_keeps_writing_so_it_can_record_that_it_was_cancelled() -> None:
    control = RunControl()
    control.request_cancel()
    assert control.cancel.is_set() and control.why() is StopCause.CANCELLED
    assert control.held() and not control.silenced()


def test_a_run_asked_to_stop_at_its_checkpoint_still_writes_until_it_gets_there() -> None:
    stops: list[str] = []
    control = RunControl(on_stop=lambda: stops.append("task cancelled"))
    control.request_cancel()
    control.stop_at_checkpoint(StopCause.HANDED_OFF)
    control.stop_at_checkpoint(StopCause.SHUTTING_DOWN)  # the first reason stays
    assert control.checkpoint.is_set() and control.why() is StopCause.HANDED_OFF
    assert not control.silenced() and stops == []


def test_a_stop_silences_the_run_cancels_its_task_once_and_keeps_its_first_cause() -> None:
    stops: list[str] = []
    control = RunControl(on_stop=lambda: stops.append("task cancelled"))
    control.stop_at_checkpoint(StopCause.HANDED_OFF)
    control.stop()  # the grace ran out
    control.stop(StopCause.FENCED)
    assert control.why() is StopCause.STOPPED and stops == ["task cancelled"]
    assert control.stopped and control.silenced() and not control.held()


def test_a_lapsed_hold_fences_the_run_at_the_first_question_whoever_asks() -> None:
    stops: list[str] = []
    control = RunControl(on_stop=lambda: stops.append("task cancelled"))
    tenure = Tenure(control)
    control.hold(tenure)
    control.request_cancel()
    assert control.why() is StopCause.CANCELLED
    tenure.ok = False
    assert control.silenced(), "a write after the lapse"
    assert control.why() is StopCause.FENCED and stops == ["task cancelled"]


async def test_waiting_for_a_stop_returns_once_the_run_is_stopped() -> None:
    control = RunControl()
    control.stop(StopCause.SHUTTING_DOWN)
    await control.wait_stopped()
    assert control.why() is StopCause.SHUTTING_DOWN
