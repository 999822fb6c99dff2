"""What a run's transcript store wrote, read back the way `kubectl agentrun transcript` reads it: one
label-selected listing (the operator itself reads chunks by name and has no right to list them)."""

from __future__ import annotations

from typing import Any

from agentrun.api.transcripts import StorageKind, Transcript, chunk_selector, decode_objects, object_kind
from agentrun.kube.calling import KubeClient


async def list_chunk_objects(
    kube: KubeClient,
    namespace: str,
    *,
    run_name: str | None = None,
    uid: str | None = None,
    storage: StorageKind = "secret",
) -> list[dict[str, Any]]:
    """The raw chunk objects of one run, by run uid (exact) or by run name."""
    selector = chunk_selector(run_name=run_name, uid=uid)
    items = await kube.list_objects(storage, namespace, label_selector=selector)
    return [{"kind": object_kind(storage), **item} for item in items]


async def load(
    kube: KubeClient,
    namespace: str,
    run_name: str,
    *,
    uid: str | None = None,
    storage: StorageKind = "secret",
) -> Transcript:
    """One run's transcript (``uid`` leaves out an older run's leftovers)."""
    return decode_objects(
        await list_chunk_objects(kube, namespace, run_name=run_name, uid=uid, storage=storage)
    )
