"""Shared bits of the emulator tests: the test CRD and short paths."""

from __future__ import annotations

from pathlib import Path

WIDGETS_CRD = Path(__file__).parents[1] / "unit" / "sandbox" / "kube_widgets_crd.yaml"
GROUP = "test.agentrun.dev"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/default/widgets"
ALL_WIDGETS = f"/apis/{GROUP}/v1/widgets"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def widget(name: str | None = None, generate_name: str | None = None, **spec: object) -> dict[str, object]:
    metadata: dict[str, object] = {}
    if name:
        metadata["name"] = name
    if generate_name:
        metadata["generateName"] = generate_name
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": metadata,
        "spec": {"task": "build", **spec},
    }
