"""Installing one of this repo's CRDs for a scenario, on either backend."""

from __future__ import annotations

from pathlib import Path

from tests.support.clusters import TestCluster


async def install_crd(cluster: TestCluster, path: Path) -> None:
    """Served before the operator starts (Kopf resolves its resources then).

    On a real server it is applied, not deleted afterwards: the CRD is shared by every test there,
    and deleting it would delete other tests' objects of its kind.
    """
    if cluster.emulator is not None:
        cluster.emulator.load_crd(path)
        return
    code, out = await cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    assert code == 0, out
    # crds/<plural>.<group>.yaml: the file is named after the CRD.
    code, out = await cluster.kubectl(
        "wait", "--for=condition=Established", f"crd/{path.name.removesuffix('.yaml')}", "--timeout=60s"
    )
    assert code == 0, out
