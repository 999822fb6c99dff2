"""The ways CRDs reach a cluster before or beside the chart, each followed as docs/install.md writes it.

Helm 4 applies a chart's crds/ server-side on install (and never on upgrade). CRDs someone applied
before with kubectl are fine when they are the chart's own; when they differ, helm install stops with a
field-manager conflict, and the documented recovery is to apply the chart's CRDs with kubectl and
install with --skip-crds. After an upgrade to a chart whose CRDs changed, the CRDs are applied with the
documented kubectl command.

These scenarios change the cluster-wide CRDs (always back to the chart's own): run them where no other
test session uses the same API server at the time.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.tooling import CHART
from tests.support.clusters import ROOT, TestCluster
from tests.support.node import Helm, Release, create_api_key_secret, release_values

CHART_CRDS = CHART / "crds"
RUNS_CRD = "agentruns.agentrun.dev"
#: kubectl's two ways to apply: client-side (the default) and server-side.
APPLIES = [("apply",), ("apply", "--server-side", "--force-conflicts")]


def chart_crd(name: str = RUNS_CRD, crds: Path = CHART_CRDS) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((crds / f"{name}.yaml").read_text())
    return loaded


async def served_versions(cluster: TestCluster, name: str = RUNS_CRD) -> Any:
    crd = await cluster.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return crd["spec"]["versions"]


async def kubectl_ok(cluster: TestCluster, *args: str, stdin: str | None = None) -> str:
    code, out = await cluster.kubectl(*args, stdin=stdin)
    assert code == 0, f"kubectl {' '.join(args)}:\n{out}"
    return out


async def restore_the_charts_crds(cluster: TestCluster) -> None:
    """What docs/install.md says to run: the chart's CRDs, applied server-side, taking their fields."""
    await kubectl_ok(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(CHART_CRDS))


@pytest.fixture
async def release(cluster: TestCluster, helm: Helm) -> AsyncIterator[Release]:
    await create_api_key_secret(cluster, "sk-ant-unused")
    chosen = Release(
        cluster,
        helm,
        release_values(cluster, "http://127.0.0.1:9"),
        name="agentrun-operator-crds",
        extra_args=(),
    )
    try:
        yield chosen
    finally:
        _, listed = await helm.run("list", "--namespace", cluster.namespace, "-q", check=False)
        if chosen.name in listed.split():
            await chosen.uninstall()
        await restore_the_charts_crds(cluster)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("apply", APPLIES, ids=["client", "server"])
async def test_the_charts_own_crds_applied_with_kubectl_first_then_helm_install_works(
    cluster: TestCluster, release: Release, apply: tuple[str, ...]
) -> None:
    await kubectl_ok(cluster, *apply, "-f", str(CHART_CRDS))
    out = await release.install()
    assert "STATUS: deployed" in out
    await release.wait_ready(1)
    assert await served_versions(cluster) == chart_crd()["spec"]["versions"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("apply", APPLIES, ids=["client", "server"])
async def test_crds_that_differ_from_the_charts_stop_helm_install_and_the_documented_commands_recover(
    cluster: TestCluster, release: Release, apply: tuple[str, ...]
) -> None:
    other = chart_crd()
    other["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "applied from another version"
    await kubectl_ok(cluster, *apply, "-f", "-", stdin=yaml.safe_dump(other))
    code, out = await release.helm.run(
        "install",
        release.name,
        str(CHART),
        "--namespace",
        cluster.namespace,
        "--values",
        str(release.helm.values_file(release.values)),
        check=False,
    )
    assert code != 0 and "conflict" in out, out
    # docs/install.md: apply the chart's CRDs with kubectl, then install without them.
    await restore_the_charts_crds(cluster)
    release.extra_args = ("--skip-crds",)
    assert "STATUS: deployed" in await release.install()
    await release.wait_ready(1)
    assert await served_versions(cluster) == chart_crd()["spec"]["versions"]


@pytest.fixture
def older_chart() -> Iterator[Path]:
    """The chart as it was before its CRDs last changed (git history), unpacked into a folder."""
    changed = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-n1", "--format=%H", "--", "charts/agentrun-operator/crds"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="agentrun-older-chart-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", f"{changed}~1", "charts/agentrun-operator"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp) / "charts" / "agentrun-operator"


@pytest.mark.timeout(420)
async def test_helm_upgrade_from_a_chart_with_older_crds_keeps_them_until_the_documented_apply(
    cluster: TestCluster, release: Release, older_chart: Path
) -> None:
    old_crds = older_chart / "crds"
    differing = [
        path.name
        for path in sorted(CHART_CRDS.glob("*.yaml"))
        if path.read_text() != (old_crds / path.name).read_text()
    ]
    assert differing, "the older chart's CRDs are the same as this one's"
    await kubectl_ok(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(old_crds))
    release.chart, release.extra_args = older_chart, ("--skip-crds",)
    await release.install()
    await release.wait_ready(1)

    await release.upgrade({}, chart=CHART)
    await release.wait_ready(1)
    name = differing[0].removesuffix(".yaml")
    # Helm never upgrades crds/: the older CRD is still served.
    assert await served_versions(cluster, name) == chart_crd(name, old_crds)["spec"]["versions"]
    await restore_the_charts_crds(cluster)
    for path in differing:
        crd = path.removesuffix(".yaml")
        assert await served_versions(cluster, crd) == chart_crd(crd)["spec"]["versions"]
