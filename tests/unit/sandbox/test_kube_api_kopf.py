"""A real Kopf operator process against the emulator: daemon, status patches, finalizers, deletion."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import WIDGETS, widget
from tests.support.waiting import until

FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"

OPERATOR = textwrap.dedent(
    """
    import asyncio
    import os

    import kopf
    from kubernetes_asyncio import client, config


    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_):
        settings.watching.server_timeout = 1  # the emulator must end watches on time; Kopf resumes them


    @kopf.daemon("test.agentrun.dev", "v1", "widgets", cancellation_backoff=5.0)
    async def run(name, namespace, stopped, logger, **_):
        api = await config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
        async with api:
            widgets = client.CustomObjectsApi(api)

            async def status(**fields):
                await widgets.patch_namespaced_custom_object_status(
                    "test.agentrun.dev", "v1", namespace, "widgets", name, {"status": fields},
                    _content_type="application/merge-patch+json",
                )

            iterations = 0
            while not stopped:
                iterations += 1
                await status(phase="Running", iterations=iterations)
                await stopped.wait(0.1)
            await status(phase="Stopped", iterations=iterations)
            logger.info("daemon for %s stopped after %d iterations", name, iterations)
    """
)


@pytest.fixture
async def kopf_operator(kube: EmulatedCluster, tmp_path: Path) -> AsyncIterator[Path]:
    script = tmp_path / "operator.py"
    script.write_text(OPERATOR)
    log = tmp_path / "kopf.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(kube.kubeconfig_path)
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            "--all-namespaces",
            "--verbose",
            str(script),
            stdout=sink,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        try:
            yield log
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()


def kopf_log(log: Path) -> str:
    return log.read_text()


async def until_kopf(check: Callable[[], Awaitable[bool]], log: Path, what: str) -> None:
    """Until ``check`` holds; a failure shows Kopf's log."""
    await until(check, what, 30.0, explain=lambda _: f"Kopf log:\n{kopf_log(log)}")


async def test_a_kopf_daemon_runs_patches_status_and_releases_its_finalizer_on_deletion(
    kube: EmulatedCluster, kopf_operator: Path
) -> None:
    async with KubeClient(kube.url) as client:
        assert (await client.post(WIDGETS, widget("w1"))).status == 201

        async def running_with_finalizer() -> bool:
            body = (await client.get(f"{WIDGETS}/w1")).body
            held = FINALIZER in body["metadata"].get("finalizers", [])
            return held and body.get("status", {}).get("iterations", 0) >= 3

        await until_kopf(running_with_finalizer, kopf_operator, "the daemon to run")

        async def resumed_watch() -> bool:
            watches = [r for r in kube.emulator.request_log if r.verb == "watch" and r.resource == "widgets"]
            return any(r.query.get("resourceVersion") for r in watches[1:])

        await until_kopf(resumed_watch, kopf_operator, "Kopf to resume its watch")
        current = (await client.get(f"{WIDGETS}/w1")).body
        assert current["metadata"]["generation"] == 1  # status writes do not count as spec changes

        deleting = await client.delete(f"{WIDGETS}/w1")
        assert deleting.status == 200
        assert deleting.body["metadata"]["deletionTimestamp"]

        async def gone() -> bool:
            return (await client.get(f"{WIDGETS}/w1")).status == 404

        await until_kopf(gone, kopf_operator, "the deletion to finish")

    history = kube.emulator.objects["test.agentrun.dev/v1/widgets", "default", "w1"].history
    last_state = [version for version in history if version is not None][-1]
    assert last_state["status"]["phase"] == "Stopped"
    assert last_state["metadata"]["deletionTimestamp"]

    requests = kube.emulator.request_log
    status_patches = [r for r in requests if r.verb == "patch" and r.subresource == "status"]
    assert status_patches
    assert all(r.content_type == "application/merge-patch+json" and r.status == 200 for r in status_patches)
    finalizer_patches = [
        r for r in requests if r.verb == "patch" and r.content_type == "application/json-patch+json"
    ]
    assert len(finalizer_patches) >= 2  # added, then removed
    assert all(r.status in (200, 422) for r in finalizer_patches)
    assert finalizer_patches[-1].status == 200
    watches = [r for r in requests if r.verb == "watch" and r.resource == "widgets"]
    assert all(r.query["timeoutSeconds"] == "1" for r in watches)

    log = kopf_log(kopf_operator)
    assert "daemon for w1 stopped after" in log
    assert "[ERROR" not in log, log
    assert "Traceback" not in log, log
