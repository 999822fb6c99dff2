"""spec.sandbox.idleTimeoutSeconds: the timer that deletes an unused sandbox pod, and the mark the run
carries while its pod is gone for that reason.

Why a timer in memory, restarted from zero when a run resumes: a pod that lives a little longer after
an operator restart costs a little CPU and memory; a pod deleted early would cost the model its
workspace. The timer starts when the last sandbox call in flight ends and any call cancels it; once it
has fired, a call that begins waits for the deletion to finish (pods.py holds its lock) and then starts
a new pod, so no command ever runs in a pod being deleted.

Why a mark on the AgentRun (an annotation, written by the operator, which already patches runs): a
resumed run takes a missing pod for a lost one (spec.sandbox.onPodLost: Fail would end it), and the
in-memory "deleted for idleness" is gone after a crash or a handoff. The run is the one object every
replica reads and that lives exactly as long as the question matters; a Kubernetes Event expires (an
hour by default, shorter than an idle timeout may be), a status field would be one more field in the
run's schema for something that is only true between an idle deletion and the next call. The mark is
written before the pod is deleted and removed once the next pod runs; a resumed run that finds its pod
running removes a mark left over by a crash between the two.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import quote

from agentrun.api import API_VERSION, PLURAL
from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.loop.errors import ToolError
from agentrun.tools.sandbox.api_requests import ApiRequests
from agentrun.tools.sandbox.manifests import RunIdentity, workspace_persists

__all__ = ["IDLED_ANNOTATION", "IdleMark", "IdlePod", "IdleTimer", "Idleness"]

logger = logging.getLogger(__name__)

#: On an AgentRun whose sandbox pod was deleted after spec.sandbox.idleTimeoutSeconds without a call:
#: the name of that pod. Removed when the run's next pod runs.
IDLED_ANNOTATION = "agentrun.dev/sandbox-idled"


class IdleTimer:
    """Calls ``expire`` once no sandbox call began or ended for ``seconds`` (None: never).

    ``expire`` gets a check that is true while no call began since the timer fired: it holds the
    sandbox's lock before it looks, so a call that began meanwhile keeps the pod. ``sleep`` is the
    timer's clock (a test moves it by hand).
    """

    def __init__(
        self,
        seconds: float | None,
        expire: Callable[[Callable[[], bool]], Awaitable[None]],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.seconds = seconds
        self._expire = expire
        self._sleep = sleep
        self._calls = 0  # sandbox calls in flight
        self._activity = 0  # calls begun or ended so far: a fired timer expires only if it is unchanged
        self._waiting: asyncio.Task[None] | None = None  # the timer while it sleeps: any call cancels it
        self._expiring: set[asyncio.Task[None]] = set()  # fired: only close() stops it
        self._closed = False

    def call_began(self) -> None:
        self._calls += 1
        self._activity += 1
        self._cancel_waiting()

    def call_ended(self) -> None:
        self._calls -= 1
        self._activity += 1
        self.restart()

    def restart(self) -> None:
        """Counts from now (when no call is in flight): after each call, and when a run resumes."""
        if self.seconds is None or self._closed or self._calls:
            return
        self._cancel_waiting()
        self._waiting = asyncio.get_running_loop().create_task(
            self._run(self.seconds, self._activity), name="sandbox idle timer"
        )

    async def _run(self, seconds: float, activity: int) -> None:
        await self._sleep(seconds)
        task = asyncio.current_task()
        assert task is not None
        if self._waiting is task:
            self._waiting = None
        self._expiring.add(task)
        try:
            await self._expire(lambda: self._calls == 0 and self._activity == activity)
        finally:
            self._expiring.discard(task)

    def _cancel_waiting(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None

    async def close(self) -> None:
        """The run ended or is no longer executed here: no timer fires any more."""
        self._closed = True
        tasks = [*self._expiring, *([self._waiting] if self._waiting is not None else [])]
        self._waiting = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class IdleMark:
    """IDLED_ANNOTATION on the run, read and written as the operator."""

    def __init__(self, api: ApiRequests, run: RunIdentity) -> None:
        self._api = api
        self._run = run
        namespace = quote(run.namespace, safe="")
        self._path = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{quote(run.name, safe='')}"

    async def read(self) -> bool | None:
        """Whether the run carries the mark; None when the run could not be read."""
        status, answer = await self._api.request("GET", self._path, user=None)
        meta = answer.get("metadata") or {}
        if status != 200 or meta.get("uid") != self._run.uid:
            logger.warning(
                "could not read AgentRun %s/%s for its sandbox's idle mark (HTTP %s)",
                self._run.namespace,
                self._run.name,
                status,
            )
            return None
        return IDLED_ANNOTATION in (meta.get("annotations") or {})

    async def write(self, pod: str | None) -> bool:
        """Sets the mark to ``pod`` (None removes it); False when the run refused the patch."""
        status, answer = await self._api.request(
            "PATCH",
            self._path,
            user=None,
            body={"metadata": {"annotations": {IDLED_ANNOTATION: pod}}},
            content_type="application/merge-patch+json",
        )
        if status != 200:
            logger.warning(
                "could not %s the idle mark of AgentRun %s/%s: %s",
                "remove" if pod is None else "set",
                self._run.namespace,
                self._run.name,
                answer.get("message") or f"HTTP {status}",
            )
        return status == 200


class IdlePod(Protocol):
    """The sandbox pod (pods.SandboxPod) as its idle deletion needs it."""

    @property
    def name(self) -> str: ...

    async def idle_uid(self) -> str | None:
        """The uid of the run's pod when it exists and runs (not stopped, not being deleted)."""
        ...

    async def delete_idle(self, uid: str) -> None:
        """Deletes that pod (only that uid) and the run's NetworkPolicy; raises ToolError."""
        ...


class Idleness:
    """One run's sandbox idleness: the timer, the run's mark and whether this process deleted the pod."""

    def __init__(
        self,
        spec: SandboxSpec,
        pod: IdlePod,
        mark: IdleMark,
        lock: asyncio.Lock,
        *,
        seconds: float | None,
        resumed: bool,
        deleted: Callable[[], None],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        timeout = spec.idle_timeout_seconds
        self.timer = IdleTimer(
            seconds if timeout is not None and seconds is not None else timeout, self._expire, sleep=sleep
        )
        self._spec = spec
        self._pod = pod
        self._mark = mark
        self._lock = lock  # the pod's: a call and a deletion never overlap
        self._deleted = deleted
        self.pod_deleted = False  # this process deleted the pod: the next call starts a new one
        # Whether the run carries the mark; None: not read yet (a resumed run reads it once).
        self._marked: bool | None = None if resumed and timeout is not None else False
        if resumed:
            self.timer.restart()  # the idle clock starts again from the resume: never earlier

    async def marked(self) -> bool:
        """Whether the pod was deleted for idleness before now (by this process or, as the run's mark
        says, before a restart). Raises ToolError when the run cannot be read."""
        if self._marked is None:
            found = await self._mark.read()
            if found is None:
                raise ToolError(
                    "sandbox_unavailable",
                    "could not read the AgentRun to tell a sandbox pod deleted as idle from a lost one",
                    hint="try again",
                )
            self._marked = found
        return self._marked

    async def pod_runs(self) -> None:
        """The run's pod runs although the run is marked: a crash came between the mark and the
        deletion, or between the next start and the mark's removal. The mark goes."""
        self._marked = not await self._mark.write(None)

    async def started_again(self) -> ToolError:
        """A new pod runs after an idle deletion: the mark goes, and what the model is told.

        Why the command is not run in the new pod: a command written for the old workspace would run
        in one it does not expect, as after a lost pod (pods.py says the same then).
        """
        self.pod_deleted = False
        if self._marked:
            self._marked = not await self._mark.write(None)  # else a later resume removes it
        seconds = f"{self.timer.seconds:g}"
        said = (
            f"the sandbox pod was deleted after {seconds} s without a sandbox call "
            "(spec.sandbox.idleTimeoutSeconds)"
        )
        if workspace_persists(self._spec):
            return ToolError(
                "sandbox_idled",
                f"{said} and a new one was started on the same workspace volume: the files in "
                f"{self._spec.working_dir} are kept, running processes and everything outside it are "
                "gone. This command was not run.",
                hint="repeat the command",
            )
        return ToolError(
            "sandbox_idled",
            f"{said} and a new, empty one was started: this is a fresh workspace, nothing from before "
            "is in it. This command was not run.",
            hint="set up the workspace again, then repeat the command",
        )

    async def _expire(self, still_idle: Callable[[], bool]) -> None:
        """The timer fired: unless a call began meanwhile, the run is marked and the pod goes."""
        async with self._lock:
            if not still_idle() or self.pod_deleted:
                return
            try:
                uid = await self._pod.idle_uid()
                # The mark first: without it, a restart before the next call would take the pod for lost.
                if uid is None or not await self._mark.write(self._pod.name):
                    return
                self._marked = True
                try:
                    await self._pod.delete_idle(uid)
                except ToolError:
                    self._marked = not await self._mark.write(None)
                    raise
            except ToolError as exc:
                logger.warning("could not delete the idle sandbox pod %s (it stays): %s", self._pod.name, exc)
                return
            self.pod_deleted = True
            self._deleted()
            logger.info(
                "deleted the sandbox pod %s after %g s without a sandbox call",
                self._pod.name,
                self.timer.seconds,
            )

    async def close(self) -> None:
        await self.timer.close()
