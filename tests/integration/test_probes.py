"""The probes the chart wires: alive while waiting for the CRDs, ready only once the operator serves them.

The chart's livenessProbe asks Kopf's GET /healthz (health port), its readinessProbe GET /readyz on the
metrics port (templates/deployment.yaml). A pod whose operator waits for its CRDs must not be restarted
(the CRDs often arrive after it in a GitOps sync) and must not count as ready either: a rolling update
would otherwise retire the old pod for one that cannot work.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.clusters import ROOT, cluster_for
from tests.support.kube_requests import until
from tests.support.operator_process import OperatorProcess


async def status_of(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status


@pytest.mark.emulator_only("needs a server without the CRDs: a shared real server's CRDs cannot be removed")
async def test_an_operator_waiting_for_its_crds_is_alive_but_not_ready_until_they_are_served(
    tmp_path: Path,
) -> None:
    async with EmulatedCluster.running() as bare:  # no agentrun.dev CRD yet
        operator = OperatorProcess(kubeconfig=Path(bare.kubeconfig_path), log_path=tmp_path / "operator.log")
        await operator.start()  # returns once GET /healthz answers 200
        ready_url = operator.metrics_url.replace("/metrics", "/readyz")
        try:
            await until(lambda: "not installed" in operator.logs(), "the operator to find no CRD", timeout=30)
            assert await status_of(operator.health_url) == 200
            assert await status_of(ready_url) == 503
            proc = await asyncio.create_subprocess_exec(
                "kubectl",
                "--kubeconfig",
                bare.kubeconfig_path,
                "apply",
                "-f",
                str(ROOT / "crds"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, out.decode()

            async def ready() -> bool:
                return await status_of(ready_url) == 200

            await until(ready, "GET /readyz to answer 200 once the CRDs are served", timeout=60)
            assert await status_of(operator.health_url) == 200
        finally:
            await operator.stop()
    assert "Traceback" not in operator.logs()


async def test_a_serving_operator_is_ready_and_alive(tmp_path: Path, real_kubeconfig: Path | None) -> None:
    async with (
        cluster_for(real_kubeconfig) as cluster,
        cluster.operator(tmp_path / "operator.log", {}) as operator,
    ):
        ready_url = operator.metrics_url.replace("/metrics", "/readyz")

        async def ready() -> bool:
            return await status_of(ready_url) == 200

        await until(ready, "GET /readyz to answer 200", timeout=60)
        assert await status_of(operator.health_url) == 200
