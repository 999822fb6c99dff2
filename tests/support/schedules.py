"""AgentSchedules for scenarios: the CRD installed on either backend, Agents and schedules, their runs."""

from __future__ import annotations

from typing import Any

from tests.support.clusters import ROOT, RUNS_API, TestCluster
from tests.support.crds import install_crd

SCHEDULE_CRD = ROOT / "crds" / "agentschedules.agentrun.dev.yaml"
LABEL_SCHEDULE = "agentrun.dev/schedule"


async def install_schedule_crd(cluster: TestCluster) -> None:
    await install_crd(cluster, SCHEDULE_CRD)


def schedules_path(cluster: TestCluster, name: str = "") -> str:
    base = f"{RUNS_API}/namespaces/{cluster.namespace}/agentschedules"
    return f"{base}/{name}" if name else base


async def create_agent(cluster: TestCluster, name: str, **spec: Any) -> None:
    body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name}, "spec": spec}
    await cluster.request("POST", f"{RUNS_API}/namespaces/{cluster.namespace}/agents", json=body)


async def create_schedule(cluster: TestCluster, name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentSchedule",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": spec,
    }
    created: dict[str, Any] = await cluster.request("POST", schedules_path(cluster), json=body)
    return created


async def get_schedule(cluster: TestCluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await cluster.request("GET", schedules_path(cluster, name))
    return found


async def set_schedule_status(cluster: TestCluster, name: str, status: dict[str, Any]) -> None:
    """What a stopped operator leaves behind (or a backdated lastScheduleTime: an outage)."""
    await cluster.request(
        "PATCH",
        schedules_path(cluster, name) + "/status",
        json={"status": status},
        headers={"Content-Type": "application/merge-patch+json"},
    )


async def runs_of(cluster: TestCluster, schedule: str) -> list[dict[str, Any]]:
    listing = await cluster.request(
        "GET", cluster.runs_path, params={"labelSelector": f"{LABEL_SCHEDULE}={schedule}"}
    )
    return sorted(listing.get("items") or [], key=lambda r: r["metadata"]["name"])


async def events_of(cluster: TestCluster, schedule: str) -> list[dict[str, Any]]:
    listing = await cluster.request("GET", cluster.path("events"))
    return [
        e
        for e in listing.get("items") or []
        if (e.get("involvedObject") or {}).get("kind") == "AgentSchedule"
        and (e.get("involvedObject") or {}).get("name") == schedule
    ]
