"""Warm sandbox pools: an Agent's spec.sandbox.warmPool pods, started before any run needs them.

Why the Agent and not each run: a run's first command would otherwise wait for a pod start (the
scheduler, the image, the container); a pool pod is already running, and a run of the Agent claims
one (tools/sandbox/pods.py) in one PATCH. Only the owner replica of an Agent's uid keeps its pool,
as it alone writes the Agent's status (control.py). The pods are created as the Agent's
ServiceAccount (impersonation), exactly as a run's own sandbox, so RBAC decides the same way; they
are owned by the Agent until a run claims one, so deleting the Agent deletes its unclaimed pods.

What the last refill found (pods ready, or why the pool cannot be filled) is the Agent's
status.warmPool, written by the Agent's one status writer (control.py) when it changes: whoever
runs the Agent sees a pool that cannot fill without reading the operator's logs.

The pool is refilled by a short poll (POLL_SECONDS) and at once on every event of the Agent: a claim
is a pod event the operator does not watch, and one list per Agent with a pool every few seconds is
cheaper than a pod watch across every namespace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from agentrun.api.agent import WarmPoolStatus
from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.controller.agents.templates import SandboxTemplates
from agentrun.controller.replicas.ownership import Ownership, Standalone
from agentrun.kube.objects import ObjectMeta
from agentrun.loop.errors import ToolError
from agentrun.tools.environment import KubeConnection
from agentrun.tools.kube_reading import service_account_user
from agentrun.tools.sandbox.manifests import (
    LABEL_POOL,
    LABEL_POOL_AGENT,
    LABEL_RUN_UID,
    PoolOwner,
    pool_key,
    pool_network_policy_manifest,
    pool_pod_manifest,
)
from agentrun.tools.sandbox.pods import ApiRequests, container_running

__all__ = ["POLL_SECONDS", "WarmPools"]

logger = logging.getLogger(__name__)

POLL_SECONDS = 2.0


class WarmPools:
    """Keeps every owned Agent's warm pool at its size; fed the Agents' bodies by AgentValidator."""

    def __init__(
        self,
        connection: KubeConnection,
        ownership: Ownership | None = None,
        *,
        poll_seconds: float = POLL_SECONDS,
        templates: SandboxTemplates | None = None,
    ) -> None:
        #: The SandboxTemplates an Agent's sandbox may name (spec.sandbox.templateRef), as watched.
        self.templates = templates if templates is not None else SandboxTemplates()
        self.ownership: Ownership = ownership if ownership is not None else Standalone()
        self.poll_seconds = poll_seconds
        self._api = ApiRequests(connection)
        #: Every Agent with a valid sandbox, by uid: who owns its pool and the sandbox it is made of,
        #: parsed once per event rather than at every poll.
        self.agents: dict[str, tuple[PoolOwner, SandboxSpec]] = {}
        #: Agents whose pool this process filled: kept in step even when their warmPool drops to 0.
        self._kept: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        #: The last error per Agent, so a pool that cannot be filled is logged once, not every poll.
        self._errors: dict[str, str] = {}
        self._closed = False  # shut down: the poll loop may outlive close() by a round
        #: What the last refill found, by Agent uid: its status.warmPool.
        self.states: dict[str, WarmPoolStatus] = {}
        #: Called with an Agent's uid when its state changed (control.py writes the status).
        self.changed: Callable[[str], None] = lambda uid: None

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = ObjectMeta.of(body)
        if not meta.uid:
            return
        if event_type == "DELETED" or meta.deletion_timestamp is not None:
            # Its unclaimed pods and the pool's NetworkPolicy are owned by it: garbage collection.
            self.agents.pop(meta.uid, None)
            self._kept.discard(meta.uid)
            self._errors.pop(meta.uid, None)
            self.states.pop(meta.uid, None)
            return
        spec = body.get("spec") or {}
        # None as well for an invalid sandbox (the Agent's Ready condition says what is wrong) and for
        # a template not seen yet (its event re-feeds the Agent: controller/kopf_registry.py).
        sandbox = self.templates.resolved(meta.namespace, spec.get("sandbox"))
        if sandbox is None:
            self.agents.pop(meta.uid, None)
            self._forget_state(meta.uid)
            return
        owner = PoolOwner(meta.namespace, meta.name, meta.uid, spec.get("serviceAccountName"))
        self.agents[meta.uid] = (owner, sandbox)

    async def keep_filling(self) -> None:
        """The poll loop (a background task of the operator)."""
        while True:
            try:
                await self.fill_all()
            except Exception as exc:  # the loop must outlive one bad round; the next one tries again
                logger.warning("warm sandbox pools: a round failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.poll_seconds)

    async def fill_all(self) -> None:
        for uid in list(self.agents):
            if not self.ownership.fenced and self.ownership.owns(uid):
                await self.fill(uid)

    async def fill(self, uid: str) -> None:
        """One Agent's pool brought to its size: missing pods created, extra or outdated ones deleted."""
        lock = self._locks.setdefault(uid, asyncio.Lock())
        async with lock:
            pool = self.agents.get(uid)
            if pool is None or self._closed:
                return
            agent, spec = pool
            if spec.warm_pool == 0 and uid not in self._kept:
                return
            try:
                ready = await self._fill(agent, spec)
            except ToolError as exc:
                said = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
                if self._errors.get(uid) != exc.message:
                    logger.warning(
                        "Agent %s/%s: the warm sandbox pool is not filled: %s",
                        agent.namespace,
                        agent.name,
                        said,
                    )
                self._errors[uid] = exc.message
                before = self.states.get(uid)
                self._set_state(
                    uid,
                    WarmPoolStatus(size=spec.warm_pool, ready=before.ready if before else 0, message=said),
                )
                return
            self._errors.pop(uid, None)
            self._set_state(uid, WarmPoolStatus(size=spec.warm_pool, ready=ready, message=None))
            if spec.warm_pool:
                self._kept.add(uid)
            else:
                self._kept.discard(uid)

    def _set_state(self, uid: str, state: WarmPoolStatus) -> None:
        if self.states.get(uid) != state:
            self.states[uid] = state
            self.changed(uid)

    def _forget_state(self, uid: str) -> None:
        if self.states.pop(uid, None) is not None:
            self.changed(uid)

    async def _fill(self, agent: PoolOwner, spec: SandboxSpec) -> int:
        """Returns how many of the pods kept were ready (their container running) when listed."""
        user = service_account_user(agent.namespace, agent.service_account)
        pods = f"/api/v1/namespaces/{quote(agent.namespace, safe='')}/pods"
        selector = quote(f"{LABEL_POOL_AGENT}={agent.uid},!{LABEL_RUN_UID}", safe="")
        status, answer = await self._api.request("GET", f"{pods}?labelSelector={selector}", user=user)
        if status != 200:
            raise _error(user, "list", status, answer)
        key = pool_key(agent.namespace, agent.service_account, spec)
        keep: list[str] = []
        drop: list[str] = []
        ready: set[str] = set()
        for pod in answer.get("items") or []:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") is not None:
                continue
            ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            current = (meta.get("labels") or {}).get(LABEL_POOL) == key
            (keep if current and not ended else drop).append(str(meta.get("name")))
            if current and not ended and container_running(pod):
                ready.add(str(meta.get("name")))
        drop += keep[spec.warm_pool :]
        for name in drop:
            status, answer = await self._api.request("DELETE", f"{pods}/{quote(name, safe='')}", user=user)
            if status not in (200, 202, 404):
                raise _error(user, "delete", status, answer)
        if len(keep) < spec.warm_pool:
            await self._ensure_network_policy(agent, spec)
        for _ in range(spec.warm_pool - len(keep)):
            status, answer = await self._api.request(
                "POST", pods, user=user, body=pool_pod_manifest(spec, agent)
            )
            if status not in (200, 201):
                raise _error(user, "create", status, answer)
            logger.info(
                "Agent %s/%s: started the warm sandbox pod %s",
                agent.namespace,
                agent.name,
                (answer.get("metadata") or {}).get("name"),
            )
        return len(ready.intersection(keep[: spec.warm_pool]))

    async def _ensure_network_policy(self, agent: PoolOwner, spec: SandboxSpec) -> None:
        path = f"/apis/networking.k8s.io/v1/namespaces/{quote(agent.namespace, safe='')}/networkpolicies"
        # As the operator, as for a run's sandbox: the ServiceAccount must not open its own egress.
        status, answer = await self._api.request(
            "POST", path, user=None, body=pool_network_policy_manifest(spec, agent)
        )
        if status not in (200, 201, 409):
            raise ToolError(
                "sandbox_unavailable",
                f"could not create the pool's NetworkPolicy: {answer.get('message') or status}",
                hint="the operator needs create on networkpolicies",
            )

    async def close(self) -> None:
        self._closed = True
        await self._api.close()


def _error(user: str, action: str, status: int, answer: Mapping[str, Any]) -> ToolError:
    message = str(answer.get("message") or f"HTTP {status}")
    hint = (
        "the Agent's ServiceAccount needs create, list and delete on pods for a warm pool"
        if status == 403
        else ""
    )
    return ToolError("sandbox_unavailable", f"{user} could not {action} pool pods: {message}", hint=hint)
