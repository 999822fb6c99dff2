"""A real Prometheus server for tests, and the scrape job the Prometheus Operator makes of a ServiceMonitor.

The chart's ServiceMonitor is only correct if what Prometheus stores from it is: label clashes between
the operator's own labels and the target labels the Prometheus Operator adds (namespace, service, pod,
container, endpoint, job) are decided by Prometheus at scrape time, so no rendering test can see them.

`service_monitor_job` translates a ServiceMonitor the way the Prometheus Operator's config generator
does for a ServiceMonitor endpoint (the relabelings of its generated `serviceMonitor/NS/NAME/N` jobs,
in their order). Its targets come from Kubernetes service discovery of role `endpoints` in the
namespaces of the ServiceMonitor's namespaceSelector: either from a real API server's Endpoints
(`EndpointsDiscovery`, served over HTTP service discovery because Debian's build has no Kubernetes
one), or, where there is no node behind the API server, from a static config carrying the
`__meta_kubernetes_*` labels that discovery would attach to the operator pod's endpoint (`Endpoint`).
Everything after discovery (the keep rules of the selector and port, the target labels, honor_labels)
is Prometheus's own work.

`running_prometheus` starts the Debian package's server binary (`/usr/bin/prometheus`, installed by
scripts/install-tools.sh with promtool) on 127.0.0.1 with a temporary data directory, optionally
with rule files it evaluates every interval.
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
from aiohttp import web

from tests.support.clusters import TestCluster
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


def _meta_of(kind: str, obj: Manifest) -> dict[str, str]:
    """The label and annotation meta labels of one object (`__meta_kubernetes_<kind>_label_<name>` ...)."""
    labels = {}
    for what, found in (
        ("label", obj["metadata"].get("labels")),
        ("annotation", obj["metadata"].get("annotations")),
    ):
        for key, value in (found or {}).items():
            labels[f"__meta_kubernetes_{kind}_{what}_{sanitize(key)}"] = str(value)
            labels[f"__meta_kubernetes_{kind}_{what}present_{sanitize(key)}"] = "true"
    return labels


def _pod_labels(pod: Manifest) -> dict[str, str]:
    conditions = pod.get("status", {}).get("conditions") or []
    ready = next((c["status"].lower() for c in conditions if c["type"] == "Ready"), "unknown")
    labels = {
        "__meta_kubernetes_pod_name": pod["metadata"]["name"],
        "__meta_kubernetes_pod_ip": pod.get("status", {}).get("podIP", ""),
        "__meta_kubernetes_pod_ready": ready,
        "__meta_kubernetes_pod_phase": pod.get("status", {}).get("phase", ""),
        "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": pod.get("status", {}).get("hostIP", ""),
        "__meta_kubernetes_pod_uid": pod["metadata"].get("uid", ""),
    }
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            labels["__meta_kubernetes_pod_controller_kind"] = owner.get("kind", "")
            labels["__meta_kubernetes_pod_controller_name"] = owner.get("name", "")
    return {**labels, **_meta_of("pod", pod)}


def _container_labels(container: Manifest, port: Manifest, protocol: str) -> dict[str, str]:
    return {
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
        "__meta_kubernetes_pod_container_port_protocol": protocol,
    }


def endpoints_targets(
    endpoints: Manifest, service: Manifest | None, pods: Mapping[str, Manifest]
) -> list[dict[str, Any]]:
    """What Prometheus's Kubernetes service discovery (role endpoints) makes of one Endpoints object, as
    http_sd target groups (one per target): an address per subset port and address, ready or not, with
    its Service's and pod's meta labels and the container port it hits; then one target per container
    port of those pods that no endpoint port covers (without endpoint labels, so a ServiceMonitor's
    port rule drops them)."""
    group = {
        "__meta_kubernetes_namespace": endpoints["metadata"]["namespace"],
        "__meta_kubernetes_endpoints_name": endpoints["metadata"]["name"],
        **_meta_of("endpoints", endpoints),
    }
    if service is not None:
        group["__meta_kubernetes_service_name"] = service["metadata"]["name"]
        group.update(_meta_of("service", service))
    targets: list[dict[str, str]] = []
    covered: dict[str, set[int]] = {}
    seen: dict[str, Manifest] = {}
    for subset in endpoints.get("subsets") or []:
        for port in subset.get("ports") or []:
            for addresses, ready in (
                (subset.get("addresses"), "true"),
                (subset.get("notReadyAddresses"), "false"),
            ):
                for address in addresses or []:
                    target = {
                        "__address__": f"{address['ip']}:{port['port']}",
                        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                        "__meta_kubernetes_endpoint_ready": ready,
                    }
                    ref = address.get("targetRef") or {}
                    if ref:
                        target["__meta_kubernetes_endpoint_address_target_kind"] = ref.get("kind", "")
                        target["__meta_kubernetes_endpoint_address_target_name"] = ref.get("name", "")
                    if address.get("nodeName"):
                        target["__meta_kubernetes_endpoint_node_name"] = address["nodeName"]
                    if address.get("hostname"):
                        target["__meta_kubernetes_endpoint_hostname"] = address["hostname"]
                    pod = pods.get(ref.get("name", "")) if ref.get("kind") == "Pod" else None
                    if pod is not None:
                        seen[pod["metadata"]["name"]] = pod
                        covered.setdefault(pod["metadata"]["name"], set()).add(port["port"])
                        target.update(_pod_labels(pod))
                        matches = (
                            (c, cp)
                            for c in pod["spec"]["containers"]
                            for cp in c.get("ports") or []
                            if cp["containerPort"] == port["port"]
                        )
                        for container, container_port in matches:
                            protocol = port.get("protocol", "TCP")
                            target.update(_container_labels(container, container_port, protocol))
                            break
                    targets.append(target)
    for name, pod in seen.items():
        for container in pod["spec"]["containers"]:
            for container_port in container.get("ports") or []:
                if container_port["containerPort"] not in covered[name]:
                    address = f"{pod['status']['podIP']}:{container_port['containerPort']}"
                    protocol = container_port.get("protocol", "TCP")
                    targets.append(
                        {
                            "__address__": address,
                            **_pod_labels(pod),
                            **_container_labels(container, container_port, protocol),
                        }
                    )
    return [
        {
            "targets": [t["__address__"]],
            "labels": {**group, **{k: v for k, v in t.items() if k != "__address__"}},
        }
        for t in targets
    ]


class EndpointsDiscovery:
    """Kubernetes service discovery of role endpoints against a real API server, served to Prometheus
    over HTTP service discovery.

    Debian's prometheus is built without `kubernetes_sd_configs` (its Kubernetes client libraries are
    not packaged: the config is refused with "field kubernetes_sd_configs not found"), so this lists what
    that discovery watches (Endpoints, Services and Pods of the namespaces asked for) on every refresh
    and answers the target groups it would produce, with the same meta labels (`endpoints_targets`).
    The targets are the real Endpoints the cluster's endpoints controller keeps for the metrics Service:
    a Service selecting no pod, or a port name nothing matches, leaves Prometheus nothing to scrape.
    """

    def __init__(self, cluster: TestCluster, refresh: str = "1s") -> None:
        self.cluster = cluster
        self.refresh = refresh
        self.url = ""
        self.requests = 0

    async def target_groups(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = []
        for namespace in namespaces:
            listed = {}
            for resource in ("endpoints", "services", "pods"):
                found = await self.cluster.request("GET", f"/api/v1/namespaces/{namespace}/{resource}")
                listed[resource] = {item["metadata"]["name"]: item for item in found["items"]}
            for name, endpoints in sorted(listed["endpoints"].items()):
                groups += endpoints_targets(endpoints, listed["services"].get(name), listed["pods"])
        return groups

    async def _serve(self, request: web.Request) -> web.Response:
        self.requests += 1
        namespaces = [n for n in request.query.get("namespaces", "").split(",") if n]
        return web.json_response(await self.target_groups(namespaces))

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[EndpointsDiscovery]:
        app = web.Application()
        app.router.add_get("/targets", self._serve)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/targets"
        try:
            yield self
        finally:
            await runner.cleanup()

    def sd_config(self, namespaces: Sequence[str] | None) -> dict[str, Any]:
        """The `http_sd_configs` entry standing for `kubernetes_sd_configs: [{role: endpoints, namespaces:
        {names: namespaces}}]`."""
        assert self.url, "EndpointsDiscovery.serving() first"
        assert namespaces is not None, "discovery in all namespaces is not needed by any test"
        return {"url": f"{self.url}?namespaces={','.join(namespaces)}", "refresh_interval": self.refresh}


def monitored_namespaces(monitor: Manifest) -> list[str] | None:
    """The namespaces a ServiceMonitor's targets are discovered in (None: all), as the operator reads
    its namespaceSelector: `any: true`, else matchNames, else the ServiceMonitor's own namespace."""
    selector = monitor["spec"].get("namespaceSelector") or {}
    if selector.get("any"):
        return None
    return list(selector.get("matchNames") or [monitor["metadata"]["namespace"]])


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
    monitor: Manifest, service: Manifest, target: Endpoint | EndpointsDiscovery, index: int = 0
) -> dict[str, Any]:
    """The scrape job the Prometheus Operator generates for ``monitor``'s endpoint ``index``: its targets
    discovered through ``target``'s API server, or the one static ``target`` as discovery would label it
    (``service`` gives the labels then)."""
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
    for source, label in (
        ("__meta_kubernetes_namespace", "namespace"),
        ("__meta_kubernetes_service_name", "service"),
        ("__meta_kubernetes_pod_name", "pod"),
        ("__meta_kubernetes_pod_container_name", "container"),
    ):
        relabel.append({"source_labels": [source], "target_label": label})
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
        "metrics_path": ep.get("path", "/metrics"),
        "relabel_configs": relabel,
    }
    if isinstance(target, EndpointsDiscovery):
        job["http_sd_configs"] = [target.sd_config(monitored_namespaces(monitor))]
    else:
        job["static_configs"] = [{"targets": [target.address], "labels": discovered_labels(service, target)}]
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

    async def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """``expr`` evaluated every ``step`` seconds from ``start`` to ``end`` (`/api/v1/query_range`), as a
        dashboard's time series panel asks: a list of {metric, values}."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        body = await self._get("/api/v1/query_range", params)
        return list(body["data"]["result"])

    async def alerting_rules(self) -> dict[str, dict[str, Any]]:
        """Every loaded alerting rule by name (`/api/v1/rules?type=alert`): its state (inactive,
        pending, firing), health and active alerts."""
        body = await self._get("/api/v1/rules", {"type": "alert"})
        rules = [rule for group in body["data"]["groups"] for rule in group["rules"]]
        by_name = {rule["name"]: rule for rule in rules}
        assert len(by_name) == len(rules), [rule["name"] for rule in rules]
        return by_name

    async def rule_groups(self) -> list[dict[str, Any]]:
        return list((await self._get("/api/v1/rules", {}))["data"]["groups"])

    async def _get(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}{path}", params=params) as response,
        ):
            body: dict[str, Any] = await response.json()
        assert body.get("status") == "success", body
        return body

    async def ready(self) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with aiohttp.ClientSession() as session, session.get(f"{self.url}/-/ready") as response:
                return response.status == 200
        return False

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _write_config(
    workdir: Path, scrape_configs: Sequence[Mapping[str, Any]], interval: str, rule_files: Sequence[Path]
) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    settings = {"scrape_interval": interval, "evaluation_interval": interval}
    document: dict[str, Any] = {"global": settings, "scrape_configs": [dict(c) for c in scrape_configs]}
    if rule_files:
        document["rule_files"] = [str(path) for path in rule_files]
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    return config


@contextlib.asynccontextmanager
async def running_prometheus(
    workdir: Path,
    scrape_configs: Sequence[Mapping[str, Any]],
    *,
    interval: str = "1s",
    rule_files: Sequence[Path] = (),
) -> AsyncIterator[Prometheus]:
    """A Prometheus scraping ``scrape_configs`` and evaluating ``rule_files`` every ``interval``, ready to
    query; stopped on exit."""
    config = _write_config(workdir, scrape_configs, interval, rule_files)
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
