"""kstatus for custom resources: how Flux (and `kubectl wait`-style tooling built on cli-utils) reads health.

There is no Python port of sigs.k8s.io/cli-utils/pkg/kstatus, so this is its documented generic
computation for resources without a built-in rule (every custom resource), in its order:

1. `metadata.deletionTimestamp` set: Terminating;
2. `status.observedGeneration` present and different from `metadata.generation`: InProgress
   (reason LatestGenerationNotObserved);
3. a condition `Reconciling` with status "True": InProgress;
4. a condition `Stalled` with status "True": Failed;
5. otherwise: Current.

Flux's health checks on Kustomizations and HelmReleases wait for Current and give up on Failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["InProgress", "Failed", "Current", "Terminating"]


@dataclass(frozen=True)
class Result:
    status: Status
    message: str
    reason: str = ""


def compute(obj: Mapping[str, Any]) -> Result:
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if metadata.get("deletionTimestamp"):
        return Result("Terminating", "Resource scheduled for deletion")
    generation = metadata.get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        kind = obj.get("kind", "Resource")
        message = f"{kind} generation is {generation}, but latest observed generation is {observed}"
        return Result("InProgress", message, "LatestGenerationNotObserved")
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Reconciling" and condition.get("status") == "True":
            return Result("InProgress", condition.get("message", ""), condition.get("reason", ""))
        if condition.get("type") == "Stalled" and condition.get("status") == "True":
            return Result("Failed", condition.get("message", ""), condition.get("reason", ""))
    return Result("Current", "Resource is current")
