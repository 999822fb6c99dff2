"""What a run's transcript store wrote, read back the way `kubectl agentrun transcript` reads it: one
label-selected listing (the operator itself reads chunks by name and has no right to list them)."""

from __future__ import annotations

from agentrun.api.transcripts import StorageKind, Transcript, decode_objects
from agentrun.cli.plugin import list_chunk_objects
from agentrun.kube.calling import KubeClient

__all__ = ["list_chunk_objects", "load"]


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
