"""A real Prometheus server for tests, and the scrape job the Prometheus Operator makes of a ServiceMonitor.

The chart's ServiceMonitor is only correct if what Prometheus stores from it is: label clashes between
the operator's own labels and the target labels the Prometheus Operator adds (namespace, service, pod,
container, endpoint, job) are decided by Prometheus at scrape time, so no rendering test can see them.

`service_monitor_job` translates a ServiceMonitor the way the Prometheus Operator's config generator
does for a ServiceMonitor endpoint (the relabelings of its generated `serviceMonitor/NS/NAME/N` jobs,
in their order), with one difference: the target comes from a static config carrying the
`__meta_kubernetes_*` labels Kubernetes service discovery (role `endpoints`) would attach to the
operator pod's endpoint, instead of from an API server. Everything after discovery (the keep rules
of the selector and port, the target labels, honor_labels) is Prometheus's own work.

`running_prometheus` starts the Debian package's server binary (`/usr/bin/prometheus`, installed by
scripts/install-tools.sh with promtool) on 127.0.0.1 with a temporary data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.kube_requests import until
from tests.support.ports import free_port

Manifest = dict[str, Any]


def sanitize(name: str) -> str:
    """A Kubernetes label name as service discovery spells it in a meta label (strutil.SanitizeLabelName)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


@dataclass(frozen=True)
class Endpoint:
    """The operator pod behind the metrics Service, as Kubernetes service discovery reports it."""

    address: str  # host:port Prometheus scrapes
    pod: str
    container: str
    port_name: str


def discovered_labels(service: Manifest, endpoint: Endpoint) -> dict[str, str]:
    """The meta labels of role `endpoints` discovery for one ready pod address of ``service``."""
    labels = {
        "__address__": endpoint.address,
        "__meta_kubernetes_namespace": service["metadata"]["namespace"],
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": endpoint.port_name,
        "__meta_kubernetes_endpoint_port_protocol": "TCP",
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": endpoint.pod,
        "__meta_kubernetes_pod_name": endpoint.pod,
        "__meta_kubernetes_pod_container_name": endpoint.container,
        "__meta_kubernetes_pod_container_port_name": endpoint.port_name,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
    }
    for key, value in (service["metadata"].get("labels") or {}).items():
        labels[f"__meta_kubernetes_service_label_{sanitize(key)}"] = str(value)
        labels[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
    return labels


def service_monitor_job(
    monitor: Manifest, service: Manifest, endpoint: Endpoint, index: int = 0
) -> dict[str, Any]:
    """The scrape job the Prometheus Operator generates for ``monitor``'s endpoint ``index``."""
    meta, spec = monitor["metadata"], monitor["spec"]
    ep = spec["endpoints"][index]
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted((spec.get("selector", {}).get("matchLabels") or {}).items()):
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{sanitize(key)}",
                    f"__meta_kubernetes_service_labelpresent_{sanitize(key)}",
                ],
                "regex": f"({re.escape(str(value))});true",
            }
        )
    relabel.append(
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"]}
    )
    for kind, label in (("Node", "node"), ("Pod", "pod")):
        relabel.append(
            {
                "source_labels": [
                    "__meta_kubernetes_endpoint_address_target_kind",
                    "__meta_kubernetes_endpoint_address_target_name",
                ],
                "separator": ";",
                "regex": f"{kind};(.*)",
                "replacement": "${1}",
                "target_label": label,
            }
        )
    # The target labels every ServiceMonitor target gets: these are what clash with a metric's own.
    for source, target in (
        ("__meta_kubernetes_namespace", "namespace"),
        ("__meta_kubernetes_service_name", "service"),
        ("__meta_kubernetes_pod_name", "pod"),
        ("__meta_kubernetes_pod_container_name", "container"),
    ):
        relabel.append({"source_labels": [source], "target_label": target})
    relabel.append(
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}
    )
    for key in spec.get("targetLabels") or []:
        relabel.append(
            {
                "source_labels": [f"__meta_kubernetes_service_label_{sanitize(key)}"],
                "target_label": sanitize(key),
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    relabel.append(
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}
    )
    if spec.get("jobLabel"):
        relabel.append(
            {
                "source_labels": [f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}"],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
    relabel.extend(ep.get("relabelings") or [])
    # Sharding with one shard: every target is kept (the operator substitutes $(SHARD) with 0).
    relabel += [
        {"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
        {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"},
    ]
    job: dict[str, Any] = {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "static_configs": [{"targets": [endpoint.address], "labels": discovered_labels(service, endpoint)}],
        "metrics_path": ep.get("path", "/metrics"),
        "relabel_configs": relabel,
    }
    if ep.get("interval"):
        job["scrape_interval"] = ep["interval"]
    if ep.get("scrapeTimeout"):
        job["scrape_timeout"] = ep["scrapeTimeout"]
    if ep.get("metricRelabelings"):
        job["metric_relabel_configs"] = ep["metricRelabelings"]
    return job


def prometheus_binary() -> Path:
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail(
            "`prometheus` (the server) was not found on PATH: run `make tools` (scripts/install-tools.sh "
            "installs the Debian package prometheus, which has it and promtool).",
            pytrace=False,
        )
    return Path(found)


@dataclass
class Prometheus:
    url: str
    log_path: Path

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now (`/api/v1/query`): a list of {metric, value}."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/api/v1/query", params={"query": expr}) as response,
        ):
            body = await response.json()
        assert body.get("status") == "success", body
        return list(body["data"]["result"])

    async def by_label(self, expr: str, label: str) -> dict[str, float]:
        """``expr``'s samples keyed by the value of ``label`` (each series must have a distinct one)."""
        result = await self.query(expr)
        values = {series["metric"].get(label, ""): float(series["value"][1]) for series in result}
        assert len(values) == len(result), result
        return values

    async def ready(self) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with aiohttp.ClientSession() as session, session.get(f"{self.url}/-/ready") as response:
                return response.status == 200
        return False

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _write_config(workdir: Path, scrape_configs: Sequence[Mapping[str, Any]], interval: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    settings = {"scrape_interval": interval, "evaluation_interval": interval}
    config.write_text(
        yaml.safe_dump(
            {"global": settings, "scrape_configs": [dict(c) for c in scrape_configs]}, sort_keys=False
        )
    )
    return config


@contextlib.asynccontextmanager
async def running_prometheus(
    workdir: Path, scrape_configs: Sequence[Mapping[str, Any]], *, interval: str = "1s"
) -> AsyncIterator[Prometheus]:
    """A Prometheus scraping ``scrape_configs`` every ``interval``, ready to query; stopped on exit."""
    config = _write_config(workdir, scrape_configs, interval)
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            str(prometheus_binary()),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", log_path)
    try:

        async def ready() -> bool:
            assert process.returncode is None, f"prometheus exited:\n{server.logs()}"
            return await server.ready()

        await until(ready, "prometheus to be ready", timeout=30)
        yield server
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
