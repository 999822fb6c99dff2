"""The run's sandbox pod: its manifest, its start on first use, commands into it, its removal.

Why the run's ServiceAccount creates it and execs into it (impersonation, as the Kubernetes tools
read): RBAC then decides who may run sandboxes in which namespace, and the operator's own rights
never reach the model. Why the name is the run's, not random: an operator that restarted, or the
replica that took the run over, finds the same pod and its workspace again.

Why the isolation is not a field: a pod the model's commands run in gets no ServiceAccount token,
no Service environment, no privilege escalation, no capabilities, a read-only root, a non-root user
and the runtime's seccomp profile, whatever the run declares; it may choose its image, resources,
RuntimeClass, environment and where it may connect to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.loop.errors import ToolError
from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.api_requests import ApiRequests
from agentrun.tools.sandbox.commands import OOM_COUNTERS, STATE_DIR
from agentrun.tools.sandbox.idling import IdleMark, Idleness
from agentrun.tools.sandbox.manifests import (
    CONTAINER,
    LABEL_POOL,
    LABEL_RUN_UID,
    RunIdentity,
    claim_patch,
    network_policy_manifest,
    pod_manifest,
    pool_key,
    sandbox_pod_name,
    workspace_persists,
)
from agentrun.tools.sandbox.pod_exec import ExecError, ExecResult, exec_in_pod
from agentrun.tools.sandbox.pod_status import container_running, waiting_reason, why_not_started

__all__ = [
    "ApiRequests",
    "RunIdentity",
    "SandboxPod",
    "container_running",
    "network_policy_manifest",
    "pod_manifest",
    "sandbox_pod_name",
]

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5
_IMAGE_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_CONFIG_FAILURES = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")


class SandboxPod:
    """The run's sandbox as the tools use it (tools.Sandbox): started on the first command."""

    def __init__(
        self,
        spec: SandboxSpec,
        run: RunIdentity,
        connection: KubeConnection,
        *,
        user: str,
        resumed: bool = False,
        started: Callable[[float, str], None] = lambda seconds, reason: None,
        idle_deleted: Callable[[], None] = lambda: None,
        idle_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        idle_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``started`` is told each pod start (seconds, reason: first, replaced or idle) and
        ``idle_deleted`` each idle deletion, for metrics. ``idle_seconds`` replaces
        spec.sandbox.idleTimeoutSeconds when that is set (AGENTRUN_FAULT_SANDBOX_IDLE_SECONDS, tests
        only); ``idle_sleep`` is the idle timer's clock (a unit test moves it by hand)."""
        self.spec = spec
        self.run = run
        self.user = user
        # The pod's name: the run's own, or a warm pool pod's once this run claimed one.
        self.name = sandbox_pod_name(run.name, run.uid)
        self._api = ApiRequests(connection)
        self._connection = connection
        self._uid: str | None = None  # the pod this process uses
        self._resumed = resumed  # the run ran before: a missing pod means its workspace was lost
        self._lock = asyncio.Lock()
        self._started = started  # (seconds to start, why it started): for metrics
        self._clock = clock
        self._sleep = sleep
        self.started_seconds: float | None = None  # how long the pod took to start, when we started it
        self._idle = Idleness(  # spec.sandbox.idleTimeoutSeconds (idling.py)
            spec,
            self,
            IdleMark(self._api, run),
            self._lock,
            seconds=idle_seconds,
            resumed=resumed,
            deleted=idle_deleted,
            sleep=idle_sleep,
        )

    @property
    def working_dir(self) -> str:
        return self.spec.working_dir

    @property
    def command_timeout_seconds(self) -> int:
        return self.spec.command_timeout_seconds

    @property
    def output_limit_bytes(self) -> int:
        return self.spec.output_limit_bytes

    @property
    def state_dir(self) -> str:
        return STATE_DIR

    @property
    def oom_counters(self) -> tuple[str, ...]:
        return OOM_COUNTERS

    @property
    def memory_limit(self) -> str:
        return self.spec.resources.limits.memory

    @property
    def _pods(self) -> str:
        return f"/api/v1/namespaces/{quote(self.run.namespace, safe='')}/pods"

    async def ensure_running(self) -> None:
        """The pod this run uses, Running: started (or, once lost, started again) when it is not.
        Raises ToolError when it cannot be, or when a lost one was replaced (the model is told)."""
        async with self._lock:
            await self._ready()

    async def exec(self, argv: Sequence[str], *, timeout: float) -> ExecResult:
        self._idle.timer.call_began()
        try:
            await self.ensure_running()
            try:
                return await exec_in_pod(
                    self._connection,
                    user=self.user,
                    namespace=self.run.namespace,
                    pod=self.name,
                    container=CONTAINER,
                    argv=argv,
                    timeout=timeout,
                    output_limit=self.spec.output_limit_bytes + 4096,
                )
            except ExecError as exc:
                raise self._exec_error(exc) from None
        finally:
            self._idle.timer.call_ended()

    def _exec_error(self, exc: ExecError) -> ToolError:
        if exc.kind in ("gone", "not_running"):
            self._uid = self._uid or "lost"  # the next command finds out and says so
            return ToolError(
                "sandbox_lost",
                f"the sandbox pod {self.name} went away during the command ({exc.message}); "
                "its outcome is unknown",
                hint="the next command starts a new sandbox; check what the workspace still holds",
            )
        if exc.kind in ("forbidden", "impersonation_denied", "unauthorized"):
            return ToolError(
                exc.kind,
                f"{self.user} may not run commands in the sandbox: {exc.message}",
                hint="the run's ServiceAccount needs get and create on pods/exec in its namespace",
                recoverable=False,
            )
        if exc.kind == "timeout":
            return ToolError("timeout", f"the sandbox did not answer in time: {exc.message}")
        return ToolError("sandbox_unavailable", exc.message, hint="try again")

    async def _ready(self) -> None:
        """The pod this run uses, Running; started (or, once lost, started again) when it is not."""
        if self._idle.pod_deleted:
            return await self._start_after_idle()
        status, pod = await self._api.request("GET", f"{self._pods}/{self.name}", user=self.user)
        alive = status == 200 and pod.get("metadata", {}).get("deletionTimestamp") is None
        if status in (200, 404) and await self._idle.marked():
            if status == 404 and self.spec.warm_pool and await self._find_claimed():
                return await self._ready()  # its claimed pool pod, under the pool's name
            if not alive:
                return await self._start_after_idle()
            await self._idle.pod_runs()
        if alive:
            phase = pod.get("status", {}).get("phase")
            uid = pod.get("metadata", {}).get("uid")
            if phase in ("Succeeded", "Failed"):
                await self._delete_lost(uid)
                return await self._replace("it stopped (phase " + str(phase) + ")")
            if self._uid not in (None, uid):
                return await self._replace_reported("was replaced by another pod")
            if phase == "Running":
                self._uid = uid
                return None
            return await self._wait_running(uid)
        if status == 200:  # being deleted
            return await self._replace("it was being deleted")
        if status == 404 and self.spec.warm_pool and await self._find_claimed():
            return await self._ready()  # a pool pod this run claimed before (a restarted operator)
        if status == 404:
            if self._uid is not None or self._resumed:
                return await self._replace("it was deleted or evicted")
            return await self._create("first")
        raise self._api_error(status, pod, "read")

    async def _replace(self, why: str) -> None:
        if self.spec.on_pod_lost == "Fail":
            raise ToolError(
                "sandbox_lost",
                f"the sandbox pod {self.name} is gone: {why}; spec.sandbox.onPodLost is Fail",
                recoverable=False,
            )
        await self._create("replaced")
        await self._replace_reported(why)

    async def _start_after_idle(self) -> None:
        await self._create("idle")
        self._resumed = False
        raise await self._idle.started_again()

    async def idle_uid(self) -> str | None:
        if self.spec.warm_pool and self._uid is None:
            await self._find_claimed()  # a restarted operator knows a claimed pool pod by its label
        status, pod = await self._api.request("GET", f"{self._pods}/{self.name}", user=self.user)
        meta = pod.get("metadata") or {}
        if status == 404 or meta.get("deletionTimestamp") is not None:
            return None  # none started, or gone already: nothing to delete
        if status != 200:
            raise self._api_error(status, pod, "read")
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return None  # stopped: lost, not idle (the next call says so, and onPodLost applies)
        return str(meta.get("uid"))

    async def delete_idle(self, uid: str) -> None:
        body = {"preconditions": {"uid": uid}}
        path = f"{self._pods}/{self.name}"
        status, answer = await self._api.request("DELETE", path, user=self.user, body=body)
        if status not in (200, 202, 404):
            raise self._api_error(status, answer, "delete")
        await self._api.request("DELETE", self._policy_path, user=None)  # garbage collection else
        self._uid = None

    async def _replace_reported(self, why: str) -> None:
        self._resumed = False
        if workspace_persists(self.spec):
            # A PersistentVolumeClaim at workingDir: the files are there, the processes are not.
            raise ToolError(
                "sandbox_replaced",
                f"the sandbox pod was lost ({why}); a new one was started on the same workspace volume: "
                f"the files in {self.spec.working_dir} are kept (a command that was writing may have "
                "left them half done), running processes and everything outside it are gone. "
                "This command was not run.",
                hint="check the workspace, then repeat the command",
            )
        raise ToolError(
            "sandbox_replaced",
            f"the sandbox pod was lost ({why}); a new, empty one was started: everything in the "
            "workspace is gone. This command was not run.",
            hint="set up the workspace again, then repeat the command",
        )

    async def _delete_lost(self, uid: str | None) -> None:
        body = {"preconditions": {"uid": uid}} if uid else None
        await self._api.request("DELETE", f"{self._pods}/{self.name}", user=self.user, body=body)
        await self._wait_gone()

    async def _wait_gone(self) -> None:
        deadline = self._clock() + self.spec.start_timeout_seconds
        while self._clock() < deadline:
            status, _ = await self._api.request("GET", f"{self._pods}/{self.name}", user=self.user)
            if status == 404:
                return
            await self._sleep(POLL_SECONDS)
        raise ToolError("sandbox_unavailable", f"the old sandbox pod {self.name} did not go away in time")

    async def _create(self, reason: str) -> None:
        began = self._clock()
        await self._ensure_network_policy()
        if self.spec.warm_pool and await self._claim():
            return
        self.name = sandbox_pod_name(self.run.name, self.run.uid)
        status, answer = await self._api.request(
            "POST", self._pods, user=self.user, body=pod_manifest(self.spec, self.run)
        )
        if status == 409:  # being deleted still: wait, then create
            await self._wait_gone()
            status, answer = await self._api.request(
                "POST", self._pods, user=self.user, body=pod_manifest(self.spec, self.run)
            )
        if status not in (200, 201):
            raise self._api_error(status, answer, "create")
        logger.info("started the sandbox pod %s/%s", self.run.namespace, self.name)
        await self._wait_running(answer.get("metadata", {}).get("uid"))
        self.started_seconds = self._clock() - began
        self._started(self.started_seconds, reason)

    async def _list(self, selector: str) -> list[dict[str, Any]]:
        status, answer = await self._api.request(
            "GET", f"{self._pods}?labelSelector={quote(selector, safe='')}", user=self.user
        )
        if status != 200:
            raise self._api_error(status, answer, "list")
        return [item for item in answer.get("items") or [] if isinstance(item, dict)]

    async def _find_claimed(self) -> bool:
        """The pool pod this run claimed, found by its run-uid label (its name is the pool's): True
        and self.name set when there is one under another name than self.name. Why by label: a
        restarted operator knows only the run."""
        for pod in await self._list(f"{LABEL_RUN_UID}={self.run.uid}"):
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") is None and meta.get("name") not in (None, self.name):
                self.name = str(meta["name"])
                return True
        return False

    async def _claim(self) -> bool:
        """Takes a Running, unclaimed pod of the Agent's warm pool: True when this run has one now.

        The patch carries the pod's resourceVersion as a precondition, so of two runs claiming one
        pod the second gets 409 Conflict and tries the next; none left, the run starts its own pod.
        """
        key = pool_key(self.run.namespace, self.run.service_account, self.spec)
        for pod in await self._list(f"{LABEL_POOL}={key},!{LABEL_RUN_UID}"):
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") is not None or not container_running(pod):
                continue
            status, answer = await self._api.request(
                "PATCH",
                f"{self._pods}/{quote(str(meta.get('name')), safe='')}",
                user=self.user,
                body=claim_patch(self.run, str(meta.get("resourceVersion"))),
                content_type="application/merge-patch+json",
            )
            if status in (409, 404):
                continue  # another run took it, or it went: the next one
            if status != 200:
                raise self._api_error(status, answer, "claim a warm pool pod as")
            self.name = str(meta.get("name"))
            self._uid = str(meta.get("uid"))
            logger.info("claimed the warm sandbox pod %s/%s", self.run.namespace, self.name)
            return True
        return False

    async def _ensure_network_policy(self) -> None:
        path = f"/apis/networking.k8s.io/v1/namespaces/{quote(self.run.namespace, safe='')}/networkpolicies"
        # As the operator, not the run: the run's ServiceAccount must not be able to open its own egress.
        status, answer = await self._api.request(
            "POST", path, user=None, body=network_policy_manifest(self.spec, self.run)
        )
        if status not in (200, 201, 409):
            raise ToolError(
                "sandbox_unavailable",
                f"could not create the sandbox's NetworkPolicy: {answer.get('message') or status}",
                hint="the operator needs create on networkpolicies",
                recoverable=False,
            )

    async def _wait_running(self, uid: str | None) -> None:
        deadline = self._clock() + self.spec.start_timeout_seconds
        while True:
            status, pod = await self._api.request("GET", f"{self._pods}/{self.name}", user=self.user)
            if status != 200:
                raise self._api_error(status, pod, "read")
            phase = pod.get("status", {}).get("phase")
            if phase == "Running" and container_running(pod):
                self._uid = pod.get("metadata", {}).get("uid") or uid
                return
            if phase in ("Succeeded", "Failed"):
                raise ToolError(
                    "sandbox_failed", f"the sandbox pod {self.name} ended at start (phase {phase})"
                )
            waiting = waiting_reason(pod)
            if waiting is not None and waiting[0] in (*_IMAGE_FAILURES, *_CONFIG_FAILURES):
                raise ToolError(
                    "sandbox_failed",
                    f"the sandbox pod {self.name} cannot start: {waiting[0]}: {waiting[1]}",
                    hint="check spec.sandbox.image, its env Secrets and the pod's Events",
                    recoverable=False,
                )
            if self._clock() >= deadline:
                why = why_not_started(pod, self.spec)
                raise ToolError(
                    "sandbox_failed",
                    f"the sandbox pod {self.name} did not start within {self.spec.start_timeout_seconds} s "
                    f"(phase {phase}{', ' + waiting[0] if waiting else ''}){why}",
                    recoverable=False,
                )
            await self._sleep(POLL_SECONDS)

    def _api_error(self, status: int, answer: Mapping[str, Any], action: str) -> ToolError:
        message = str(answer.get("message") or f"HTTP {status}")
        if status == 403:
            return ToolError(
                "forbidden",
                f"{self.user} may not {action} the sandbox pod: {message}",
                hint="the run's ServiceAccount needs create, get and delete on pods; get and create on "
                "pods/exec"
                + ("; list and patch on pods for the Agent's warm pool" if self.spec.warm_pool else ""),
                recoverable=False,
            )
        if status == 422 or status == 400:
            return ToolError(
                "sandbox_refused", f"the API server refused the sandbox pod: {message}", recoverable=False
            )
        return ToolError("sandbox_unavailable", f"could not {action} the sandbox pod: {message}")

    @property
    def _policy_path(self) -> str:
        namespace = quote(self.run.namespace, safe="")
        policy = sandbox_pod_name(self.run.name, self.run.uid)
        return f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{policy}"

    async def stop_idling(self) -> None:
        """The run ended (or is no longer executed here): the idle timer never fires again."""
        await self._idle.timer.close()

    async def remove(self) -> None:
        """The run ended: its pod and NetworkPolicy go (garbage collection does it if this fails)."""
        await self.stop_idling()
        if self.spec.warm_pool:
            try:
                await self._find_claimed()
            except ToolError as exc:
                logger.warning("could not look for the run's claimed sandbox pod: %s", exc)
        for path, user in ((f"{self._pods}/{self.name}", self.user), (self._policy_path, None)):
            try:
                await self._api.request("DELETE", path, user=user)
            except ToolError as exc:
                logger.warning(
                    "could not delete %s (garbage collection removes it with the run): %s", path, exc
                )

    async def close(self) -> None:
        await self.stop_idling()
        await self._api.close()
