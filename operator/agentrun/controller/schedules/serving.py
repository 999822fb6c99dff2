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
from agentrun.api.schedule import ActiveRun, AgentScheduleSpec, AgentScheduleStatus
from agentrun.api.status import FINISHED_PHASES
from agentrun.api.times import parse_time, rfc3339
from agentrun.controller.schedules.eventing import ScheduleEvents
from agentrun.controller.status_memory import WrittenStatus
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIAlreadyExistsError, APIConflictError, APIError, APINotFoundError
from agentrun.kube.objects import ObjectMeta
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
        meta = ObjectMeta.of(run)
        phase = (run.get("status") or {}).get("phase")
        records.append(
            RunRecord(
                name=meta.name,
                uid=meta.uid,
                scheduled=meta.annotations.get(ANNOTATION_SCHEDULED_TIME) or meta.creation_timestamp,
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
        meta = ObjectMeta.of(schedule)
        status = AgentScheduleStatus.model_validate(self.written.current(schedule))
        stored = parse_time(
            AgentScheduleStatus.model_validate(schedule.get("status") or {}).last_schedule_time
        )
        mine = self.handled.get(meta.uid)
        last_handled = max(stored, mine) if stored is not None and mine is not None else stored or mine
        now = self.clock()
        valid = check(schedule.get("spec") or {})
        if isinstance(valid, str):
            await self._refuse(schedule, meta, status, valid, rfc3339(now))
            return None
        spec = valid.spec
        runs = await self._runs(meta)
        active = [r for r in runs if (r.get("status") or {}).get("phase") not in FINISHED_PHASES]
        active_names = sorted(ObjectMeta.of(r).name for r in active)

        since = last_handled or parse_time(meta.creation_timestamp) or now
        owed = due(
            valid.cron, valid.tz, since=since, now=now, deadline_seconds=spec.starting_deadline_seconds
        )
        if owed.handled is not None:
            created = await self._act(schedule, spec, owed, active_names)
            if created is not None:
                active.append(created)
            last_handled = self.handled[meta.uid] = owed.handled
        records = _records(runs)
        await self._prune(meta, spec, records)
        succeeded = [r.scheduled for r in records if r.succeeded and r.scheduled]
        if status.last_successful_time:
            succeeded.append(status.last_successful_time)

        next_time = None if spec.suspend else owed.next_time
        actives = sorted((ObjectMeta.of(r) for r in active), key=lambda m: m.name)
        written = AgentScheduleStatus(
            observed_generation=meta.generation,
            last_schedule_time=rfc3339(last_handled) if last_handled else None,
            last_successful_time=max(succeeded, default=None),
            next_schedule_time=rfc3339(next_time) if next_time else None,
            active=[ActiveRun(name=m.name, uid=m.uid) for m in actives],
            conditions=await self._conditions(
                schedule, spec, owed, next_time, status.conditions, rfc3339(now)
            ),
        )
        await self._write(schedule, written)
        self.metrics.schedule_next(meta.namespace, meta.name, next_time.timestamp() if next_time else None)
        return next_time

    async def _refuse(
        self,
        schedule: dict[str, Any],
        meta: ObjectMeta,
        status: AgentScheduleStatus,
        problem: str,
        stamp: str,
    ) -> None:
        """An invalid spec: Ready False naming the field (and an Event when the message is new); no runs."""
        conditions = status.conditions
        said = [c.get("message") for c in conditions if c.get("type") == "Ready"]
        if said != [problem]:
            await self.events.post(schedule, "Warning", INVALID_SPEC, problem)
        ready = condition("Ready", "False", INVALID_SPEC, problem, now=stamp, previous=conditions)
        refused = AgentScheduleStatus(
            observed_generation=meta.generation,
            conditions=[ready],
            next_schedule_time=None,
            active=status.active,
        )
        await self._write(schedule, refused)
        self.metrics.schedule_next(meta.namespace, meta.name, None)

    async def _prune(self, meta: ObjectMeta, spec: AgentScheduleSpec, records: list[RunRecord]) -> None:
        """Finished runs beyond the history limits are deleted, oldest first."""
        for doomed in to_prune(
            records,
            successful=spec.successful_runs_history_limit,
            failed=spec.failed_runs_history_limit,
        ):
            try:
                await self.kube.delete_run(meta.namespace, doomed.name, doomed.uid)
                logger.info(
                    "AgentSchedule %s/%s: deleted run %s (history limit)",
                    meta.namespace,
                    meta.name,
                    doomed.name,
                )
            except (APINotFoundError, APIConflictError):
                pass

    async def _conditions(
        self,
        schedule: dict[str, Any],
        spec: AgentScheduleSpec,
        owed: Due,
        next_time: dt.datetime | None,
        conditions: list[dict[str, Any]],
        stamp: str,
    ) -> list[dict[str, Any]]:
        """Ready (scheduled or suspended) and MissedSchedules (kept, set or caught up)."""
        if spec.suspend:
            message = "spec.suspend is true: no runs are created"
            ready = condition("Ready", "True", "Suspended", message, now=stamp, previous=conditions)
        else:
            when = rfc3339(next_time) if next_time else "never"
            ready = condition(
                "Ready", "True", "Scheduled", f"next run at {when}", now=stamp, previous=conditions
            )
        kept = next((c for c in conditions if c.get("type") == "MissedSchedules"), None)
        if owed.too_many_missed:
            message = (
                f"more than {owed.missed - 1} scheduled times were missed (operator down, or the schedule "
                "fires more often than runs can be created); only the most recent was considered"
            )
            await self.events.post(schedule, "Warning", "TooManyMissedTimes", message)
            missed = condition(
                "MissedSchedules", "True", "TooManyMissedTimes", message, now=stamp, previous=conditions
            )
        elif kept is not None and owed.handled is not None:
            message = "no times missed"
            missed = condition(
                "MissedSchedules", "False", "CaughtUp", message, now=stamp, previous=conditions
            )
        else:
            return [ready] if kept is None else [ready, kept]
        return [ready, missed]

    async def _runs(self, meta: ObjectMeta) -> list[dict[str, Any]]:
        """The schedule's runs: labelled with its name and owned by it (not a namesake's)."""
        listing = await self.kube.list_runs(meta.namespace, label_selector=f"{LABEL_SCHEDULE}={meta.name}")
        return [item for item in listing.get("items") or [] if ObjectMeta.of(item).owned_by(meta.uid)]

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
        # runSpec as declared (the fields it sets, nothing filled in): what it leaves out stays the Agent's.
        declared = spec.run_spec
        run_spec = declared.model_dump(mode="json", by_alias=True, exclude_unset=True) if declared else {}
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

    async def _write(self, schedule: Mapping[str, Any], status: AgentScheduleStatus) -> None:
        """The one status writer of schedules: a merge patch, sent only when something changed; a null
        only clears nextScheduleTime (never one over a value someone else wrote, e.g. lastScheduleTime
        set by hand)."""
        meta = ObjectMeta.of(schedule)

        async def send(patch: dict[str, Any]) -> None:
            await self.kube.patch_schedule_status(meta.namespace, meta.name, patch)

        with contextlib.suppress(APINotFoundError):
            await self.written.write(schedule, status, send, cleared={"next_schedule_time"})

    def forget(self, uid: str) -> None:
        self.written.forget(uid)
        self.handled.pop(uid, None)


__all__ = ["APIError", "ScheduleServer", "check"]
