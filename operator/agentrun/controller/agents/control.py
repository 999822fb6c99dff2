"""The Agents this replica validates, and the one writer of their status.

Kopf's event handler on agents passes every body here. Only the owner of an Agent's uid (controller/
replicas/, as for schedules and quota collection) writes its status, so replicas never disagree in
turns; a handoff needs no barrier, since two replicas judging one generation reach the same verdict.
A write happens only when the status would change: an Agent's own status write comes back as a watch
event, and that event must not cause another write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from agentrun.api.times import now_rfc3339
from agentrun.controller.agents.pools import WarmPools
from agentrun.controller.agents.validating import agent_status
from agentrun.controller.replicas.ownership import Ownership, Standalone
from agentrun.controller.status_memory import WrittenStatus
from agentrun.kube.errors import APIError, APINotFoundError
from agentrun.kube.objects import ObjectMeta

__all__ = ["AgentStatusTarget", "AgentValidator"]

logger = logging.getLogger(__name__)

#: After a failed status write (API server unreachable, refused), the next try comes this much later.
RETRY_SECONDS = 5.0


class AgentStatusTarget(Protocol):
    """Where Agent status goes: the API server's status subresource (kube/calling.py)."""

    async def patch_agent_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...


class AgentValidator:
    def __init__(
        self,
        kube: AgentStatusTarget,
        ownership: Ownership | None = None,
        *,
        clock: Callable[[], str] = now_rfc3339,
        retry_seconds: float = RETRY_SECONDS,
        pools: WarmPools | None = None,
    ) -> None:
        self.kube = kube
        self.ownership: Ownership = ownership if ownership is not None else Standalone()
        self.clock = clock
        self.retry_seconds = retry_seconds
        #: Warm sandbox pools (pools.py), kept by the same owner: fed every Agent event.
        self.pools = pools
        if pools is not None:
            pools.changed = lambda uid: self._spawn(self.validate(uid))
        #: The latest body seen, by uid: what a replica that becomes the owner validates.
        self.agents: dict[str, Mapping[str, Any]] = {}
        self.written = WrittenStatus()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[object]] = set()
        self.ownership.subscribe(self._rebalance)

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of an Agent (None: from the initial listing)."""
        meta = ObjectMeta.of(body)
        if not meta.uid:
            return
        if self.pools is not None:
            self.pools.observe(event_type, body)
        if event_type == "DELETED" or meta.deletion_timestamp is not None:
            self.agents.pop(meta.uid, None)
            self.written.forget(meta.uid)
            return
        self.agents[meta.uid] = body
        if self._owns(meta.uid):
            await self.validate(meta.uid)
            if self.pools is not None:
                self._spawn(self.pools.fill(meta.uid))

    async def validate(self, uid: str) -> bool:
        """Writes the Agent's status if it would change; False when the write failed (retried later)."""
        async with self._lock:
            body = self.agents.get(uid)
            if body is None or not self._owns(uid):
                return True
            meta = ObjectMeta.of(body)
            pool = self.pools.states.get(uid) if self.pools is not None else None
            wanted = agent_status({**body, "status": self.written.current(body)}, self.clock(), pool)

            async def send(patch: dict[str, Any]) -> None:
                await self.kube.patch_agent_status(meta.namespace, meta.name, patch)

            try:
                cleared = () if pool is not None else ("warm_pool",)
                written = await self.written.write(body, wanted, send, cleared=cleared)
            except APINotFoundError:
                return True  # deleted meanwhile: its DELETED event follows
            except APIError as exc:
                logger.warning(
                    "Agent %s/%s: status not written, trying again in %.0f s: %s",
                    meta.namespace,
                    meta.name,
                    self.retry_seconds,
                    exc,
                )
                self._spawn(self._retry(uid))
                return False
            if written is not None:
                ready = wanted.conditions[0]
                logger.info(
                    "Agent %s/%s generation %s: Ready %s (%s)",
                    meta.namespace,
                    meta.name,
                    wanted.observed_generation,
                    ready.status,
                    ready.message,
                )
            return True

    def _owns(self, uid: str) -> bool:
        return not self.ownership.fenced and self.ownership.owns(uid)

    def _rebalance(self) -> None:
        """Agents newly owned here are judged at once (their status may be stale after a handoff)."""
        for uid in list(self.agents):
            if self._owns(uid):
                self._spawn(self.validate(uid))
                if self.pools is not None:
                    self._spawn(self.pools.fill(uid))

    async def _retry(self, uid: str) -> None:
        await asyncio.sleep(self.retry_seconds)
        await self.validate(uid)

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Returns once the validations (and retries) under way are done: for tests and shutdown."""
        pending = [task for task in self._tasks if not task.done()]
        await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
