"""The chart's operator in pods on a real node (`make e2e-node`): releases, pods and the model they reach.

The operator runs as users run it: the image built from the project's Dockerfile, installed by `helm
install` of charts/agentrun-operator into a namespace of the test's own (labelled for the restricted Pod
Security Standard), watching that namespace only, so scenarios on the same API server never share runs.
The fake Messages API listens on the address pods reach this host at (the node's bridge), and the
operator is pointed at it through the chart's ``operator.anthropicBaseURL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.chart.tooling import CHART, find_tool
from tests.support.clusters import TestCluster
from tests.support.kube_requests import until

#: The image `make e2e-node` builds and imports into the node (repository:tag).
IMAGE = os.environ.get("AGENTRUN_E2E_IMAGE", "localhost/agentrun-operator:dev")
#: Where pods reach this host: the real node's bridge (../shared/tools/real-node/README.md).
HOST_ADDRESS = os.environ.get("AGENTRUN_E2E_HOST_ADDRESS", "10.88.0.1")
RELEASE = "agentrun-operator"
API_KEY_SECRET = "anthropic"
#: The restricted Pod Security Standard, enforced on every namespace the tier installs into.
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def image_values(image: str = IMAGE) -> dict[str, Any]:
    repository, _, tag = image.rpartition(":")
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}}


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, nested mappings merged key by key (as helm merges --values files)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Helm:
    """The real helm against the node's API server, its own state kept out of $HOME."""

    kubeconfig: Path
    home: Path

    async def run(self, *args: str, check: bool = True, timeout: float = 360) -> tuple[int, str]:
        helm = find_tool("helm")
        assert helm is not None, "helm is needed: run `make tools`"
        env = {
            **os.environ,
            **{f"HELM_{k}_HOME": str(self.home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")},
        }
        proc = await asyncio.create_subprocess_exec(
            str(helm),
            "--kubeconfig",
            str(self.kubeconfig),
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        code = proc.returncode or 0
        if check and code != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({code}):\n{out.decode()}")
        return code, out.decode()

    def values_file(self, values: Mapping[str, Any]) -> Path:
        path = self.home / f"values-{secrets.token_hex(4)}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return path


@dataclass
class Release:
    """One `helm install` of the chart in the scenario's namespace, serving that namespace only."""

    cluster: TestCluster
    helm: Helm
    values: dict[str, Any]
    name: str = RELEASE
    chart: Path = CHART
    extra_args: tuple[str, ...] = ("--skip-crds",)

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    @property
    def deployment(self) -> str:
        return self.name  # the chart's full name: the release name when it holds the chart's name

    async def install(self, *, wait: bool = True, timeout: str = "4m") -> str:
        args = ["install", self.name, str(self.chart), "--namespace", self.namespace]
        args += ["--values", str(self.helm.values_file(self.values)), *self.extra_args]
        if wait:
            args += ["--wait", "--timeout", timeout]
        return (await self.helm.run(*args))[1]

    async def upgrade(
        self, values: Mapping[str, Any], *, chart: Path | None = None, timeout: str = "6m"
    ) -> str:
        self.values = merged(self.values, values)
        if chart is not None:
            self.chart = chart
        args = [
            "upgrade",
            self.name,
            str(self.chart),
            "--namespace",
            self.namespace,
            "--wait",
            "--timeout",
            timeout,
        ]
        return (await self.helm.run(*args, "--values", str(self.helm.values_file(self.values))))[1]

    async def uninstall(self) -> None:
        await self.helm.run(
            "uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout", "3m"
        )

    async def pods(self) -> list[dict[str, Any]]:
        """The operator's pods, oldest first (terminating ones included)."""
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=operator"
        found = await self.cluster.request("GET", self.cluster.path("pods") + f"?labelSelector={selector}")
        return sorted(found["items"], key=lambda p: p["metadata"]["creationTimestamp"])

    async def ready_pods(self) -> list[dict[str, Any]]:
        return [p for p in await self.pods() if is_ready(p) and not p["metadata"].get("deletionTimestamp")]

    async def wait_ready(self, count: int, timeout: float = 240) -> list[dict[str, Any]]:
        """Until exactly ``count`` pods are Ready and none is terminating or waiting to start."""
        pods: list[dict[str, Any]] = []

        async def settled() -> bool:
            nonlocal pods
            everything = await self.pods()
            pods = [p for p in everything if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
            return len(pods) == count == len(everything)

        await until(settled, f"{count} Ready operator pods of {self.name}", timeout)
        return pods

    async def logs(self) -> str:
        _, out = await self.cluster.kubectl(
            "logs", "-n", self.namespace, f"deployment/{self.deployment}", "--all-containers", "--tail=200"
        )
        return out


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restarts(pod: Mapping[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", []))


async def label_restricted(cluster: TestCluster) -> None:
    """The scenario's namespace enforces the restricted Pod Security Standard."""
    patch = {"metadata": {"labels": RESTRICTED}}
    await cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{cluster.namespace}",
        data=json.dumps(patch),
        headers={"Content-Type": "application/merge-patch+json"},
    )


async def create_api_key_secret(cluster: TestCluster, key: str) -> None:
    await cluster.request(
        "POST",
        cluster.path("secrets"),
        json={"metadata": {"name": API_KEY_SECRET}, "stringData": {"api-key": key}},
    )


def release_values(cluster: TestCluster, model_url: str, **extra: Any) -> dict[str, Any]:
    """What every scenario installs with: the built image, this namespace only, the host's fake model."""
    base: dict[str, Any] = {
        **image_values(),
        "rbac": {"scope": "namespaces"},
        "watchNamespaces": [cluster.namespace],
        "apiKey": {"existingSecret": API_KEY_SECRET},
        "operator": {"anthropicBaseURL": model_url, "logFormat": "text"},
    }
    return merged(base, extra)


@contextlib.asynccontextmanager
async def helm_home() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="agentrun-node-helm-") as home:
        yield Path(home)


@dataclass
class PodExits:
    """When each terminating pod was asked to stop and when it was gone: the grace period actually used."""

    asked: dict[str, float] = field(default_factory=dict)
    gone: dict[str, float] = field(default_factory=dict)

    async def watch(self, release: Release, stop: asyncio.Event) -> None:
        """Polls until ``stop``, and once more after it: a pod gone just before is still counted."""
        known: set[str] = set()
        while True:
            last = stop.is_set()
            now = time.monotonic()
            pods = {p["metadata"]["name"]: p for p in await release.pods()}
            for name, pod in pods.items():
                known.add(name)
                if pod["metadata"].get("deletionTimestamp") and name not in self.asked:
                    self.asked[name] = now
            for name in known - set(pods):
                self.gone.setdefault(name, now)
            if last:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    def durations(self) -> dict[str, float]:
        return {name: self.gone[name] - self.asked[name] for name in self.asked if name in self.gone}
