"""Kopf's registry of the operator: which watch event goes to whom, and the login. Each handler is thin:
it hands its event to the kind's own handler. AgentRuns are watched by the operator's own watch
(controller/agentruns/watching.py); Kopf's handlers for them are registered only for namespace patterns.
"""

from __future__ import annotations

from typing import Any

import kopf

from agentrun.api import (
    AGENT_PLURAL,
    GROUP,
    LABEL_SCHEDULE,
    PLURAL,
    QUOTA_PLURAL,
    SCHEDULE_PLURAL,
    TEMPLATE_PLURAL,
    VERSION,
)
from agentrun.controller.agentruns.agent_resolving import AgentWaiters
from agentrun.controller.agentruns.handling import AgentRunHandler
from agentrun.controller.agentruns.watching import RunWatch
from agentrun.controller.agents.control import AgentValidator
from agentrun.controller.agents.templates import TemplateEvents
from agentrun.controller.quotas.control import Quotas
from agentrun.controller.schedules.control import ScheduleController
from agentrun.kube import kubeconfig_loading
from agentrun.kube.failures import KubeFailure
from agentrun.kube.kubeconfig_loading import ClusterAccess


def connection_info(access: ClusterAccess, *, trust_env: bool = False) -> kopf.ConnectionInfo:
    """Kopf's view of resolved credentials; an exec plugin's expiry makes Kopf log in again in time."""
    scheme, _, token = (access.authorization or "").partition(" ")
    return kopf.ConnectionInfo(
        server=access.server,
        ca_path=access.ca_path,
        insecure=access.insecure,
        certificate_path=access.certificate_path,
        private_key_path=access.private_key_path,
        scheme=scheme or None,
        token=token or None,
        default_namespace=access.namespace,
        proxy_url=access.proxy,
        trust_env=trust_env,
        expiration=access.expiration,
    )


def build_registry(
    agentruns: AgentRunHandler,
    quotas: Quotas | None = None,
    schedules: ScheduleController | None = None,
    agents: AgentValidator | None = None,
    *,
    agent_waiters: AgentWaiters | None = None,
    templates: TemplateEvents | None = None,
    run_watch: RunWatch | None = None,
) -> kopf.OperatorRegistry:
    """``run_watch``: the operator's own AgentRun watch (controller/agentruns/watching.py) serves the runs,
    and Kopf does not watch them; without it (namespace patterns), Kopf's handlers below do."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        """kubectl's resolution, shared with our own client: Kopf's kubeconfig login reads relative paths
        against the working directory and knows no tokenFile or exec plugin (kubeconfig_loading.py)."""
        try:
            access = await kubeconfig_loading.load()
        except KubeFailure as exc:  # e.g. an exec plugin failing at a re-login: retried, said in one line
            raise kopf.TemporaryError(str(exc), delay=10) from exc
        return connection_info(access, trust_env=settings.networking.trust_env)

    if run_watch is None:
        _register_runs(registry, agentruns, schedules)

    @kopf.on.event(GROUP, VERSION, AGENT_PLURAL, registry=registry)
    async def agent_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        """Runs waiting for this Agent look again (they also look every secret retry interval); the
        Agent's owner replica writes its verdict (status.conditions Ready) when the spec changed."""
        if agent_waiters is not None:
            agent_waiters.changed(body.metadata.namespace or "", body.metadata.name or "")
        if agents is not None:
            await agents.observe(event.get("type"), body)

    @kopf.on.event(GROUP, VERSION, TEMPLATE_PLURAL, registry=registry)
    async def sandboxtemplate_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        await (templates or TemplateEvents()).observe(event.get("type"), body)

    if quotas is not None:
        # Without the AgentRunQuota CRD, Kopf logs once that it cannot serve the resource and serves
        # the rest; the quotas' own listing (controller/quotas/watching.py) finds none.
        @kopf.on.event(GROUP, VERSION, QUOTA_PLURAL, registry=registry)
        async def agentrunquota_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
            quotas.observe(event.get("type"), body)

    if schedules is not None:
        # Like the quotas: without the AgentSchedule CRD, Kopf logs once and serves the rest.
        @kopf.on.event(GROUP, VERSION, SCHEDULE_PLURAL, registry=registry)
        async def agentschedule_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
            schedules.observe(event.get("type"), body)

    @kopf.on.cleanup(registry=registry)
    async def stop_agentruns(**_: Any) -> None:
        if run_watch is not None:  # no run event after this: the runs are closing
            await run_watch.stop()
        await agentruns.close()

    return registry


def _register_runs(
    registry: kopf.OperatorRegistry, agentruns: AgentRunHandler, schedules: ScheduleController | None
) -> None:
    """Kopf's handlers of AgentRun events, for namespace patterns (else the operator's own watch)."""

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def agentrun_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        await agentruns.observe(event.get("type"), body)

    if schedules is not None:

        @kopf.on.event(GROUP, VERSION, PLURAL, labels={LABEL_SCHEDULE: kopf.PRESENT}, registry=registry)
        async def scheduled_run_event(body: kopf.Body, **_: Any) -> None:
            schedules.run_changed(body)
