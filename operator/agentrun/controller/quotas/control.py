"""The quotas part of the operator in one object: the view, one writer per quota, the gate, GC."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from agentrun.controller.quotas import collecting
from agentrun.controller.quotas.admission import AdmissionGate
from agentrun.controller.quotas.allowance import RunAllowance, new_holder, operator_id
from agentrun.controller.quotas.watching import QuotaView
from agentrun.controller.quotas.writing import QuotaWriter
from agentrun.kube.calling import KubeClient
from agentrun.kube.retrying import DEFAULT_RETRY_POLICY, RetryPolicy
from agentrun.metrics.observing import Metrics
from agentrun.quotas.ledger import Ledger

T = TypeVar("T")


class Quotas:
    def __init__(
        self,
        kube: KubeClient,
        metrics: Metrics,
        *,
        retry: RetryPolicy = DEFAULT_RETRY_POLICY,
        operator: str | None = None,
        announce_interval: float = 10.0,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.retry = retry
        self.operator = operator or operator_id()
        self.view = QuotaView(kube)
        self.view.listeners.append(self._publish)
        self.gate = AdmissionGate(self.view, self.write, metrics, announce_interval=announce_interval)
        self._writers: dict[tuple[str, str], QuotaWriter] = {}

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of an AgentRunQuota (Kopf's handler, controller/handlers.py)."""
        self.view.observe(event_type, body)

    async def write(self, namespace: str, name: str, change: Callable[[Ledger, dt.datetime], T]) -> T:
        writer = self._writers.get((namespace, name))
        if writer is None:
            writer = QuotaWriter(
                self.kube,
                namespace,
                name,
                latest=lambda: self.view.get(namespace, name),
                written=self.view.update,
                retry=self.retry,
            )
            self._writers[(namespace, name)] = writer
        return await writer.apply(change)

    def allowance(self, namespace: str, name: str, uid: str) -> RunAllowance:
        """The Allowance of one new execution of a run (its own holder)."""
        return RunAllowance(
            self.view,
            self.write,
            self.metrics,
            namespace=namespace,
            name=name,
            uid=uid,
            holder=new_holder(self.operator),
        )

    async def collect(
        self, executing: Collection[str], owns: Callable[[str], bool] = lambda _uid: True
    ) -> int:
        return await collecting.collect(self.kube, self.view, self.write, executing=executing, owns=owns)

    async def keep_collecting(
        self, executing: Callable[[], Collection[str]], owns: Callable[[str], bool] = lambda _uid: True
    ) -> None:
        """``owns(quota uid)``: whether this replica cleans that quota (all of them when alone)."""
        await collecting.keep_collecting(self.kube, self.view, self.write, executing, owns)

    def _publish(self, namespace: str, name: str, obj: Mapping[str, Any] | None) -> None:
        if obj is None:
            self.metrics.forget_quota(namespace, name)
            self._writers.pop((namespace, name), None)
            return
        spec = obj.get("spec") or {}
        self.metrics.observe_quota(namespace, name, obj.get("status") or {}, hard=spec.get("hard") or {})
