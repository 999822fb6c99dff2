"""The chart's approval policy (deploy/approval-policy.yaml) in force for one test's namespace."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.waiting import until

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "approval-policy.yaml"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


async def create_namespaced_policy(cluster: TestCluster, path: Path, name: str) -> None:
    """A shipped ValidatingAdmissionPolicy and its binding, renamed ``name`` and bound to this test's
    namespace only (a real server is shared with other tests)."""
    policy, binding = _documents(path)
    policy["metadata"]["name"] = binding["metadata"]["name"] = binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": cluster.namespace}}
    }
    code, out = await cluster.kubectl("create", "-f", "-", stdin=yaml.safe_dump_all([policy, binding]))
    assert code == 0, out


@contextlib.asynccontextmanager
async def approval_policy_in_force(cluster: TestCluster) -> AsyncIterator[str]:
    """The shipped approval policy, in force in this test's namespace."""
    name = f"agentrun-approval-decider-{cluster.namespace}"
    await create_namespaced_policy(cluster, POLICY, name)
    try:
        await until_enforced(cluster)
        yield name
    finally:
        await cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name)


async def until_enforced(cluster: TestCluster, timeout: float = 30.0) -> None:
    """A real server takes a moment to load a new policy: probe with server-side dry runs until it denies."""
    probe = {"toolUseId": "probe", "decision": "deny", "by": "policy-probe"}
    stdin = json.dumps(agentrun("probe", "approve me", namespace=cluster.namespace, approvals=[probe]))
    await until(
        lambda: cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=stdin),
        "the approval policy to be enforced",
        timeout,
        done=lambda answer: answer[0] != 0 and "denied request" in answer[1],
        every=0.5,
    )
