"""One pass over one AgentSchedule: read its runs, act on what is due, prune its history, write its status.

Called by the schedule's task whenever it wakes (its next time, a change of the schedule or of one of its
runs, a periodic look). Every pass is idempotent: the run for a time has a name derived from that time,
so a pass repeated after a crash, or by a second replica during a handoff, finds it (409 AlreadyExists)
instead of creating another; status.lastScheduleTime then records the time as handled.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from agentrun.api import (
    ANNOTATION_SCHEDULED_TIME,
    API_VERSION,
    KIND,
    LABEL_AGENT,
    LABEL_SCHEDULE,
    SCHEDULE_KIND,
)
from agentrun.api.conditions import INVALID_SPEC, condition
from agentrun.api.schedule import AgentScheduleSpec
from agentrun.api.status import FINISHED_PHASES
from agentrun.api.times import parse_time, rfc3339
from agentrun.controller.schedules.eventing import ScheduleEvents
from agentrun.controller.status_memory import WrittenStatus
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIAlreadyExistsError, APIConflictError, APIError, APINotFoundError
from agentrun.metrics.definitions import Metrics
from agentrun.schedules.cron import Cron, CronError, zone
from agentrun.schedules.deciding import (
    Concurrency,
    Due,
    Replace,
    RunRecord,
    Skip,
    admit,
    due,
    to_prune,
)
from agentrun.schedules.templates import TemplateError, render, run_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Valid:
    spec: AgentScheduleSpec
    cron: Cron
    tz: dt.tzinfo


def check(spec: Mapping[str, Any]) -> Valid | str:
    """The parsed spec, or a one-line reason it cannot be served."""
    try:
        parsed = AgentScheduleSpec.model_validate(spec)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"spec.{where}: {first['msg']}"
    try:
        cron, tz = Cron.parse(parsed.schedule), zone(parsed.time_zone)
    except CronError as exc:
        field = "spec.timeZone" if "time zone" in str(exc) else "spec.schedule"
        return f"{field}: {exc}"
    try:
        render(parsed.task, scheduled=dt.datetime.now(dt.UTC), schedule="x", namespace="x")
    except TemplateError as exc:
        return str(exc)
    return Valid(parsed, cron, tz)


def _records(runs: Sequence[Mapping[str, Any]]) -> list[RunRecord]:
    records = []
    for run in runs:
        metadata = run.get("metadata") or {}
        phase = (run.get("status") or {}).get("phase")
        scheduled = (metadata.get("annotations") or {}).get(ANNOTATION_SCHEDULED_TIME)
        records.append(
            RunRecord(
                name=metadata.get("name") or "",
                uid=metadata.get("uid") or "",
                scheduled=str(scheduled or metadata.get("creationTimestamp") or ""),
                finished=phase in FINISHED_PHASES,
                succeeded=phase == "Succeeded",
            )
        )
    return records


class ScheduleServer:
    """One pass at a time over a schedule of this replica (its task calls :meth:`serve`)."""

    def __init__(
        self,
        kube: KubeClient,
        metrics: Metrics,
        *,
        instance: str,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.clock = clock
        self.events = ScheduleEvents(kube, instance=instance)
        self.written = WrittenStatus()
        # The latest time this process handled, by uid: a pass on a body older than that write must not
        # act on the time again. (A newer lastScheduleTime written by anyone else is taken as it is.)
        self.handled: dict[str, dt.datetime] = {}

    async def serve(self, body: Mapping[str, Any]) -> dt.datetime | None:
        """One pass; returns when the schedule is next due (None: not due, e.g. invalid or suspended)."""
        schedule = dict(body)
        metadata = schedule.get("metadata") or {}
        namespace, name, uid = (
            metadata.get("namespace") or "",
            metadata.get("name") or "",
            metadata.get("uid") or "",
        )
        status = self.written.current(schedule)
        stored = parse_time((schedule.get("status") or {}).get("lastScheduleTime"))
        mine = self.handled.get(uid)
        last_handled = max(stored, mine) if stored is not None and mine is not None else stored or mine
        now = self.clock()
        stamp = rfc3339(now)
        conditions = list(status.get("conditions") or [])
        valid = check(schedule.get("spec") or {})
        if isinstance(valid, str):
            said = [c.get("message") for c in conditions if c.get("type") == "Ready"]
            if said != [valid]:
                await self.events.post(schedule, "Warning", INVALID_SPEC, valid)
            ready = condition("Ready", "False", INVALID_SPEC, valid, now=stamp, previous=conditions)
            await self._write(
                schedule,
                {
                    "observedGeneration": metadata.get("generation"),
                    "conditions": [ready],
                    "nextScheduleTime": None,
                    "active": status.get("active") or [],
                },
            )
            self.metrics.schedule_next(namespace, name, None)
            return None
        spec, cron, tz = valid.spec, valid.cron, valid.tz

        runs = await self._runs(namespace, name, uid)
        active = [r for r in runs if (r.get("status") or {}).get("phase") not in FINISHED_PHASES]
        active_names = sorted((r.get("metadata") or {}).get("name") or "" for r in active)

        since = last_handled or parse_time(metadata.get("creationTimestamp")) or now
        owed = due(cron, tz, since=since, now=now, deadline_seconds=spec.starting_deadline_seconds)
        if owed.handled is not None:
            created = await self._act(schedule, spec, owed, active_names)
            if created is not None:
                active.append(created)
                active_names.append((created.get("metadata") or {}).get("name") or "")
            last_handled = self.handled[uid] = owed.handled

        records = _records(runs)
        for doomed in to_prune(
            records,
            successful=spec.successful_runs_history_limit,
            failed=spec.failed_runs_history_limit,
        ):
            try:
                await self.kube.delete_run(namespace, doomed.name, doomed.uid)
                logger.info(
                    "AgentSchedule %s/%s: deleted run %s (history limit)", namespace, name, doomed.name
                )
            except (APINotFoundError, APIConflictError):
                pass

        succeeded = [r.scheduled for r in records if r.succeeded and r.scheduled]
        last_success = max(
            [*succeeded, *([status["lastSuccessfulTime"]] if status.get("lastSuccessfulTime") else [])],
            default=None,
        )

        next_time = None if spec.suspend else owed.next_time
        if spec.suspend:
            ready = condition(
                "Ready",
                "True",
                "Suspended",
                "spec.suspend is true: no runs are created",
                now=stamp,
                previous=conditions,
            )
        else:
            when = rfc3339(next_time) if next_time else "never"
            ready = condition(
                "Ready", "True", "Scheduled", f"next run at {when}", now=stamp, previous=conditions
            )
        new_conditions = [ready]
        if owed.too_many_missed:
            message = (
                f"more than {owed.missed - 1} scheduled times were missed (operator down, or the schedule "
                "fires more often than runs can be created); only the most recent was considered"
            )
            await self.events.post(schedule, "Warning", "TooManyMissedTimes", message)
            new_conditions.append(
                condition(
                    "MissedSchedules", "True", "TooManyMissedTimes", message, now=stamp, previous=conditions
                )
            )
        else:
            kept = next((c for c in conditions if c.get("type") == "MissedSchedules"), None)
            if kept is not None and owed.handled is None:
                new_conditions.append(kept)
            elif kept is not None:
                new_conditions.append(
                    condition(
                        "MissedSchedules",
                        "False",
                        "CaughtUp",
                        "no times missed",
                        now=stamp,
                        previous=conditions,
                    )
                )
        await self._write(
            schedule,
            {
                "observedGeneration": metadata.get("generation"),
                "lastScheduleTime": rfc3339(last_handled) if last_handled else None,
                "lastSuccessfulTime": last_success,
                "nextScheduleTime": rfc3339(next_time) if next_time else None,
                "active": [
                    {
                        "name": (r.get("metadata") or {}).get("name"),
                        "uid": (r.get("metadata") or {}).get("uid"),
                    }
                    for r in sorted(active, key=lambda r: (r.get("metadata") or {}).get("name") or "")
                ],
                "conditions": new_conditions,
            },
        )
        self.metrics.schedule_next(namespace, name, next_time.timestamp() if next_time else None)
        return next_time

    async def _runs(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        listing = await self.kube.list_runs(namespace, label_selector=f"{LABEL_SCHEDULE}={name}")
        return [
            item
            for item in listing.get("items") or []
            if any(ref.get("uid") == uid for ref in (item.get("metadata") or {}).get("ownerReferences") or [])
        ]

    async def _no_run(
        self, schedule: dict[str, Any], result: str, kind: str, reason: str, message: str
    ) -> None:
        """A due time that gets no run is always both counted and told on the schedule."""
        metadata = schedule["metadata"]
        self.metrics.schedule_time_handled(metadata["namespace"], metadata["name"], result)
        await self.events.post(schedule, kind, reason, message)

    async def _act(
        self, schedule: dict[str, Any], spec: AgentScheduleSpec, owed: Due, active: list[str]
    ) -> dict[str, Any] | None:
        """What becomes of the due time; returns the run created, if any."""
        metadata = schedule["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if owed.start is None:
            assert owed.late is not None
            await self._no_run(
                schedule,
                "missed_deadline",
                "Warning",
                "MissedSchedule",
                f"the run for {rfc3339(owed.late)} was not created: it is more than "
                f"startingDeadlineSeconds ({spec.starting_deadline_seconds}) late",
            )
            return None
        scheduled = owed.start
        if spec.suspend:
            self.metrics.schedule_time_handled(namespace, name, "suspended")
            return None
        decision = admit(Concurrency(spec.concurrency_policy), active)
        if isinstance(decision, Skip):
            await self._no_run(
                schedule,
                "skipped_forbid",
                "Normal",
                "Skipped",
                f"no run for {rfc3339(scheduled)}: {', '.join(decision.active)} still running "
                "(concurrencyPolicy Forbid)",
            )
            return None
        if isinstance(decision, Replace):
            for run in decision.cancel:
                with contextlib.suppress(APINotFoundError):
                    await self.kube.patch_run(namespace, run, {"spec": {"cancel": True}})
        body = self._run_body(schedule, spec, scheduled)
        run = body["metadata"]["name"]
        try:
            created = await self.kube.create_run(namespace, body)
        except APIAlreadyExistsError:
            logger.info("AgentSchedule %s/%s: run %s exists already", namespace, name, run)
            return None
        result = "replaced" if isinstance(decision, Replace) else "created"
        self.metrics.schedule_time_handled(namespace, name, result)
        replaced = f", after cancelling {', '.join(decision.cancel)}" if isinstance(decision, Replace) else ""
        await self.events.post(
            schedule, "Normal", "Created", f"created run {run} for {rfc3339(scheduled)}{replaced}"
        )
        return created

    def _run_body(
        self, schedule: dict[str, Any], spec: AgentScheduleSpec, scheduled: dt.datetime
    ) -> dict[str, Any]:
        metadata = schedule["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        raw = schedule.get("spec") or {}
        # runSpec as written (not pydantic's dump): what it leaves out stays the Agent's.
        run_spec: dict[str, Any] = dict(raw.get("runSpec") or {})
        run_spec["agentRef"] = {"name": spec.agent_ref.name}
        run_spec["task"] = render(spec.task, scheduled=scheduled, schedule=name, namespace=namespace)
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": run_name(name, scheduled),
                "namespace": namespace,
                "labels": {LABEL_SCHEDULE: name, LABEL_AGENT: spec.agent_ref.name},
                "annotations": {ANNOTATION_SCHEDULED_TIME: rfc3339(scheduled)},
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": SCHEDULE_KIND,
                        "name": name,
                        "uid": metadata["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": run_spec,
        }

    async def _write(self, schedule: Mapping[str, Any], status: dict[str, Any]) -> None:
        """The one status writer of schedules: a merge patch, sent only when something changed."""
        metadata = schedule.get("metadata") or {}
        uid = metadata.get("uid") or ""
        current = self.written.current(schedule)
        # Never a null over a value someone else wrote (e.g. lastScheduleTime set by hand).
        status = {k: v for k, v in status.items() if v is not None or k == "nextScheduleTime"}
        if all(current.get(k) == v for k, v in status.items()):
            return
        try:
            await self.kube.patch_schedule_status(
                metadata.get("namespace") or "", metadata.get("name") or "", status
            )
        except APINotFoundError:
            return
        self.written.wrote(uid, status)

    def forget(self, uid: str) -> None:
        self.written.forget(uid)
        self.handled.pop(uid, None)


__all__ = ["APIError", "ScheduleServer", "check"]
