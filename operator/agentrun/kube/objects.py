"""An object's metadata as a model: what the controllers read of every object a watch or a listing shows.

Why a model: metadata comes in camelCase dicts (or Kopf's live views of them), and reading it field by
field with ``.get("creationTimestamp")`` at every use scattered the object's shape over the controller.
It is parsed here once, where an object arrives; the rest reads attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["ObjectMeta", "OwnerReference"]


class _Kube(BaseModel):
    """The API server's shape: camelCase, and fields this operator does not read are ignored."""

    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True, frozen=True)


class OwnerReference(_Kube):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ObjectMeta(_Kube):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    generation: int | None = None
    resource_version: str = ""
    creation_timestamp: str = ""
    deletion_timestamp: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[OwnerReference] = Field(default_factory=list)

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ObjectMeta:
        """The metadata of ``body`` (a dict from the API, or Kopf's view of one)."""
        metadata = body.get("metadata") or {}
        return cls.model_validate(dict(metadata))

    def owned_by(self, uid: str) -> bool:
        return any(ref.uid == uid for ref in self.owner_references)
