"""AgentSchedules with the real operator: runs created on time from an Agent, concurrency policies,
history limits, suspend, an operator outage (missed times as a CronJob handles them), a SIGKILL at the
minute of a run, invalid specs.

Waiting for a real minute boundary is what a schedule is about, so two scenarios do (at most ~75 s);
the others start from what a stopped operator leaves behind (status.lastScheduleTime in the past), and
the fine-grained rules are unit tests with a fake clock (tests/unit/schedules/).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, SlowResponse, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import until, wait_finished
from tests.support.operator_process import OperatorProcess
from tests.support.schedules import (
    LABEL_SCHEDULE,
    create_agent,
    create_schedule,
    events_of,
    get_schedule,
    install_schedule_crd,
    runs_of,
    schedules_path,
    set_schedule_status,
)

# Schedules fire at minute boundaries of the real clock (the operator's): started first in a parallel run.
pytestmark = pytest.mark.slow

API_KEY = "sk-ant-schedules-test-0123456789"
MODEL = {"name": "claude-haiku-4-5", "maxTokens": 256}
HOLD = 150.0  # a run that stays active while the test looks at the next scheduled time
MINUTE_WAIT = 80.0  # the next minute boundary, plus a loaded machine or a slow real server
WAIT = 45.0
SCHEDULED_TIME = "agentrun.dev/scheduled-time"

SCRIPTS = [
    Script("[sched:answer]", [Reply([text_block("done")])]),
    Script("[sched:held]", [Reply([text_block("late")], faults=(SlowResponse(seconds=HOLD),))]),
]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY)
    async with api.running() as server:
        yield server


def operator_env(model: FakeMessagesAPI) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    await install_schedule_crd(cluster)
    async with cluster.operator(tmp_path / "operator.log", operator_env(model)) as process:
        yield process


def when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def rfc3339(instant: dt.datetime) -> str:
    return instant.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def minute_of(run: dict[str, Any]) -> int:
    return int(when(run["metadata"]["annotations"][SCHEDULED_TIME]).timestamp()) // 60


async def wait_runs(cluster: TestCluster, schedule: str, count: int, timeout: float) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal found
        found = await runs_of(cluster, schedule)
        return len(found) >= count

    await until(enough, f"{count} run(s) of {schedule}", timeout)
    return found


async def condition(cluster: TestCluster, schedule: str, type_: str) -> dict[str, Any]:
    status = (await get_schedule(cluster, schedule)).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


async def test_a_schedule_creates_a_run_of_its_agent_at_the_next_minute_and_the_run_succeeds(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    await create_agent(cluster, "reporter", model=MODEL, systemPrompt="Answer briefly.")
    schedule = await create_schedule(
        cluster,
        "every-minute",
        schedule="* * * * *",
        agentRef={"name": "reporter"},
        task="[sched:answer] report for {{scheduledTime}} by {{ scheduleName }} in {{namespace}}",
        runSpec={"priority": 7, "limits": {"maxIterations": 3}},
    )
    created = when(schedule["metadata"]["creationTimestamp"])
    (run,) = (await wait_runs(cluster, "every-minute", 1, MINUTE_WAIT))[:1]

    scheduled_text = run["metadata"]["annotations"][SCHEDULED_TIME]
    scheduled = when(scheduled_text)
    assert scheduled.second == 0 and created < scheduled <= created + dt.timedelta(minutes=1)
    assert run["metadata"]["name"] == f"every-minute-{int(scheduled.timestamp()) // 60}"
    assert run["metadata"]["labels"][LABEL_SCHEDULE] == "every-minute"
    assert run["metadata"]["labels"]["agentrun.dev/agent"] == "reporter"
    (owner,) = run["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "AgentSchedule",
        "every-minute",
        schedule["metadata"]["uid"],
        True,
    )
    assert run["spec"] == {
        "agentRef": {"name": "reporter"},
        "task": f"[sched:answer] report for {scheduled_text} by every-minute in {cluster.namespace}",
        "priority": 7,
        "limits": {"maxIterations": 3},
    }

    async def recorded() -> bool:
        status = (await get_schedule(cluster, "every-minute")).get("status") or {}
        return status.get("lastScheduleTime") == scheduled_text and status.get("nextScheduleTime") == rfc3339(
            scheduled + dt.timedelta(minutes=1)
        )

    await until(recorded, "lastScheduleTime and nextScheduleTime", WAIT)
    assert (await condition(cluster, "every-minute", "Ready"))["status"] == "True"

    finished = (await wait_finished(cluster, run["metadata"]["name"], timeout=WAIT))["status"]
    assert (finished["phase"], finished["result"]) == ("Succeeded", "done"), finished

    async def success_recorded() -> bool:
        status = (await get_schedule(cluster, "every-minute")).get("status") or {}
        return status.get("lastSuccessfulTime") == scheduled_text

    await until(success_recorded, "lastSuccessfulTime", WAIT)
    scrape = await operator.scrape()
    assert (
        f'agentrun_schedule_runs_total{{namespace="{cluster.namespace}",result="created",'
        f'schedule="every-minute"}} 1.0' in scrape
    )
    assert "agentrun_schedule_next_run_timestamp_seconds{" in scrape


async def test_forbid_skips_a_time_while_its_run_is_active_and_replace_cancels_it(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await install_schedule_crd(cluster)
    await create_agent(cluster, "holder", model=MODEL)
    for name, policy in (("forbid", "Forbid"), ("replace", "Replace")):
        await create_schedule(
            cluster,
            name,
            schedule="* * * * *",
            agentRef={"name": "holder"},
            task="[sched:held] {{scheduleName}}",
            concurrencyPolicy=policy,
        )
        # As a stopped operator leaves it: the first run is owed at once when the operator starts.
        await set_schedule_status(
            cluster, name, {"lastScheduleTime": rfc3339(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5))}
        )
    async with cluster.operator(tmp_path / "operator.log", operator_env(model)) as operator:
        (forbid_first,) = await wait_runs(cluster, "forbid", 1, WAIT)
        (replace_first,) = await wait_runs(cluster, "replace", 1, WAIT)
        await until(
            lambda: len(model.requests_for("[sched:held]")) >= 2, "both first runs to ask the model", WAIT
        )

        # The next minute: Replace cancels its active run and creates the next one.
        replaced = await wait_runs(cluster, "replace", 2, MINUTE_WAIT)
        assert minute_of(replaced[1]) > minute_of(replace_first)
        first = await wait_finished(cluster, replace_first["metadata"]["name"], timeout=WAIT)
        assert first["spec"]["cancel"] is True and first["status"]["phase"] == "Cancelled"

        # Forbid skipped the same minute: still its first run alone, an Event says why.
        async def skipped() -> bool:
            return any(e["reason"] == "Skipped" for e in await events_of(cluster, "forbid"))

        await until(skipped, "the Skipped event of the Forbid schedule", WAIT)
        (still,) = await runs_of(cluster, "forbid")
        assert still["metadata"]["uid"] == forbid_first["metadata"]["uid"]
        assert "spec" in still and not still["spec"].get("cancel")
        scrape = await operator.scrape()
        for schedule, result in (("forbid", "skipped_forbid"), ("replace", "replaced")):
            assert (
                f'agentrun_schedule_runs_total{{namespace="{cluster.namespace}",result="{result}",'
                f'schedule="{schedule}"}}' in scrape
            ), result


async def test_after_an_outage_only_the_most_recent_missed_time_runs_and_a_kill_at_that_minute_adds_none(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await install_schedule_crd(cluster)
    await create_agent(cluster, "reporter", model=MODEL)
    common = {"agentRef": {"name": "reporter"}, "task": "[sched:answer] {{scheduleName}}"}
    hours_ago = rfc3339(dt.datetime.now(dt.UTC) - dt.timedelta(hours=3))
    await create_schedule(cluster, "missed", schedule="* * * * *", **common)
    await create_schedule(cluster, "late", schedule="0 0 1 1 *", startingDeadlineSeconds=60, **common)
    await create_schedule(cluster, "paused", schedule="* * * * *", suspend=True, **common)
    for name in ("missed", "paused"):
        await set_schedule_status(cluster, name, {"lastScheduleTime": hours_ago})
    await set_schedule_status(cluster, "late", {"lastScheduleTime": "2024-06-01T00:00:00Z"})

    operator = cluster.operator_process(tmp_path / "operator.log", operator_env(model))
    await operator.start()
    try:
        (run,) = await wait_runs(cluster, "missed", 1, WAIT)
        scheduled = when(run["metadata"]["annotations"][SCHEDULED_TIME])
        started = dt.datetime.now(dt.UTC)
        assert started - dt.timedelta(minutes=2) < scheduled <= started

        async def caught_up() -> bool:
            status = (await get_schedule(cluster, "missed")).get("status") or {}
            return status.get("lastScheduleTime") == rfc3339(scheduled)

        await until(caught_up, "lastScheduleTime of the missed schedule", WAIT)
        missed = await condition(cluster, "missed", "MissedSchedules")
        assert (missed["status"], missed["reason"]) == ("True", "TooManyMissedTimes"), missed
        assert any(e["reason"] == "TooManyMissedTimes" for e in await events_of(cluster, "missed"))

        # Past its starting deadline: no run, the time is recorded as handled, an Event says so.
        async def late_handled() -> bool:
            status = (await get_schedule(cluster, "late")).get("status") or {}
            return status.get("lastScheduleTime") == f"{started.year}-01-01T00:00:00Z"

        await until(late_handled, "the late schedule's missed time handled", WAIT)
        assert await runs_of(cluster, "late") == []
        assert any(e["reason"] == "MissedSchedule" for e in await events_of(cluster, "late"))

        # Suspended: nothing, whatever was missed.
        async def paused() -> bool:
            return (await condition(cluster, "paused", "Ready")).get("reason") == "Suspended"

        await until(paused, "the suspended schedule's Ready condition", WAIT)
        assert await runs_of(cluster, "paused") == []

        scrape = await operator.scrape()
        for schedule, result in (("missed", "created"), ("late", "missed_deadline"), ("paused", "suspended")):
            assert (
                f'agentrun_schedule_runs_total{{namespace="{cluster.namespace}",result="{result}",'
                f'schedule="{schedule}"}} 1.0' in scrape
            ), result

        # SIGKILL, and the status as if the kill came before lastScheduleTime was written: the restarted
        # operator finds the run of that minute (409) instead of creating a second one.
        await operator.stop(kill=True)
        await set_schedule_status(cluster, "missed", {"lastScheduleTime": hours_ago})
        await operator.start()
        await until(_later_than(cluster, "missed", hours_ago), "a pass after the restart", WAIT)
        runs = await runs_of(cluster, "missed")
        same = [r for r in runs if r["metadata"]["name"] == run["metadata"]["name"]]
        assert [r["metadata"]["uid"] for r in same] == [run["metadata"]["uid"]]
        minutes = [minute_of(r) for r in runs]
        assert len(set(minutes)) == len(minutes)
        assert all(r["metadata"]["name"] == f"missed-{minute_of(r)}" for r in runs)
    finally:
        await operator.stop()


def _later_than(cluster: TestCluster, schedule: str, stamp: str) -> Any:
    async def check() -> bool:
        status = (await get_schedule(cluster, schedule)).get("status") or {}
        return str(status.get("lastScheduleTime") or "") > stamp

    return check


async def test_finished_runs_beyond_the_history_limits_are_deleted_oldest_first(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    schedule = await create_schedule(
        cluster,
        "history",
        schedule="0 0 1 1 *",
        agentRef={"name": "nobody"},
        task="[sched:answer] never due in this test",
        successfulRunsHistoryLimit=1,
        failedRunsHistoryLimit=0,
    )
    owner = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentSchedule",
        "name": "history",
        "uid": schedule["metadata"]["uid"],
        "controller": True,
    }
    # Runs as the schedule would have created them (plain runs: the history does not care how they run).
    for minute, name, task, cancel in (
        (1, "history-1", "[sched:answer] a", False),
        (2, "history-2", "[sched:answer] b", False),
        (3, "history-3", "[sched:answer] c", False),
        (4, "history-4", "[sched:held] d", True),
    ):
        manifest = agentrun(name, task, namespace=cluster.namespace, model=MODEL, cancel=cancel)
        manifest["metadata"].update(
            labels={LABEL_SCHEDULE: "history"},
            annotations={SCHEDULED_TIME: f"2026-01-01T00:0{minute}:00Z"},
            ownerReferences=[owner],
        )
        await cluster.request("POST", cluster.runs_path, json=manifest)

    async def pruned() -> bool:
        return [r["metadata"]["name"] for r in await runs_of(cluster, "history")] == ["history-3"]

    await until(pruned, "the history to keep only the newest succeeded run", WAIT)

    # The pass that pruned writes the status after its deletions: wait for that write, not for luck.
    async def written() -> bool:
        status = (await get_schedule(cluster, "history")).get("status") or {}
        return bool(status.get("lastSuccessfulTime") == "2026-01-01T00:03:00Z")

    await until(written, "the schedule's status to name the newest succeeded run", WAIT)
    assert [r["metadata"]["name"] for r in await runs_of(cluster, "history")] == ["history-3"]


async def test_an_invalid_schedule_is_not_ready_and_creates_nothing(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    common = {"agentRef": {"name": "reporter"}, "task": "[sched:answer] x"}
    await create_schedule(cluster, "bad-minute", schedule="61 * * * *", **common)
    await create_schedule(cluster, "bad-zone", schedule="* * * * *", timeZone="Mars/Olympus_Mons", **common)
    await create_schedule(cluster, "bad-task", schedule="* * * * *", agentRef={"name": "r"}, task="{{date}}")
    expected = {
        "bad-minute": "spec.schedule: minute 61 is outside 0-59",
        "bad-zone": "spec.timeZone: unknown time zone 'Mars/Olympus_Mons'",
        "bad-task": "spec.task has unknown placeholder(s) {{date}}",
    }
    for name, message in expected.items():

        async def invalid(name: str = name, message: str = message) -> bool:
            ready = await condition(cluster, name, "Ready")
            return ready.get("reason") == "InvalidSpec" and ready.get("message", "").startswith(message)

        await until(invalid, f"{name} to be InvalidSpec", WAIT)
        ready = await condition(cluster, name, "Ready")
        assert ready["status"] == "False" and "\n" not in ready["message"]
        assert any(e["reason"] == "InvalidSpec" for e in await events_of(cluster, name))
    # What the schema and CEL can tell, the API server refuses outright.
    for change, said in (
        ({"schedule": "* * * *"}, "5 fields"),
        ({"concurrencyPolicy": "Sometimes"}, "Sometimes"),
    ):
        code, body = await cluster.status_of(
            "POST",
            schedules_path(cluster),
            json={
                "apiVersion": "agentrun.dev/v1alpha1",
                "kind": "AgentSchedule",
                "metadata": {"name": "refused"},
                "spec": {"schedule": "* * * * *", **common, **change},
            },
        )
        assert code == 422 and said in body["message"], body
    for name in expected:
        assert await runs_of(cluster, name) == []
