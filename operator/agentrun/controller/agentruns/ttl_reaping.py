"""Deleting finished runs once their time to live is over (spec.ttlSecondsAfterFinished).

Why not a Kopf timer or daemon: Kopf puts its finalizer on every object a timer or daemon serves,
so each finished run would keep a finalizer, and deleting it would hang while the operator is down.
Instead the watch handler tells the reaper about every finished run it sees (including all of them
when the operator starts and lists the runs), and the reaper keeps one sleeping task per run that
has a TTL. The delete carries a uid precondition, so a new run with the same name is never hit, and
its transcript chunks go with it through their ownerReferences (garbage collection).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging

from agentrun.api.times import parse_time
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIConflictError, APIError, APIGoneError, APINotFoundError

logger = logging.getLogger(__name__)
RETRY_SECONDS = 5.0


def due_time(completion_time: str | None, ttl: int, now: dt.datetime) -> dt.datetime:
    """completionTime + ttl; a finished run without completionTime counts from now."""
    finished = parse_time(completion_time) or now
    return finished + dt.timedelta(seconds=ttl)


class TTLReaper:
    def __init__(self, kube: KubeClient, default_ttl: int | None) -> None:
        self._kube = kube
        self._default = default_ttl
        self._tasks: dict[str, tuple[dt.datetime, asyncio.Task[None]]] = {}

    @property
    def scheduled(self) -> int:
        return len(self._tasks)

    def ttl(self, declared: int | None) -> int | None:
        """A run's time to live: its spec.ttlSecondsAfterFinished, else the operator's default."""
        return declared if declared is not None else self._default

    def observe(
        self, namespace: str, name: str, uid: str, ttl: int | None, completion_time: str | None
    ) -> None:
        """Called with every event of a finished run: (re)schedules or drops its deletion."""
        if ttl is None:
            self.forget(uid)
            return
        due = due_time(completion_time, ttl, dt.datetime.now(dt.UTC))
        current = self._tasks.get(uid)
        if current is not None and current[0] == due and not current[1].done():
            return
        self.forget(uid)
        task = asyncio.get_running_loop().create_task(self._reap(namespace, name, uid, due))
        self._tasks[uid] = (due, task)

    def forget(self, uid: str) -> None:
        entry = self._tasks.pop(uid, None)
        if entry is not None and not entry[1].done():
            entry[1].cancel()

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _reap(self, namespace: str, name: str, uid: str, due: dt.datetime) -> None:
        while True:
            delay = (due - dt.datetime.now(dt.UTC)).total_seconds()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self._kube.delete_run(namespace, name, uid)
            except (APINotFoundError, APIConflictError, APIGoneError):
                break  # gone already, or a different run by that name (the uid precondition failed)
            except APIError as exc:
                if not exc.retryable:
                    logger.error("deleting finished run %s/%s after its TTL failed: %s", namespace, name, exc)
                    break
                # Until it is done, however long: a TTL is a promise, and a retry every few seconds is cheap.
                logger.warning("deleting finished run %s/%s failed (%s); retrying", namespace, name, exc)
            else:
                logger.info("deleted finished run %s/%s: ttlSecondsAfterFinished passed", namespace, name)
                break
            due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=RETRY_SECONDS)
        with contextlib.suppress(KeyError):
            if self._tasks[uid][1] is asyncio.current_task():
                del self._tasks[uid]
