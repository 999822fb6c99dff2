"""`kubectl agentrun tree` as users run it: the installed executable against the scenario's API server
(the emulator, or a real one with `--real-cluster`).

No operator runs here: the runs of a fan-out are created by hand with the labels and ownerReferences
the agent tool gives its children, and their status is written through the status subresource, as the
operator writes it, so the plugin is checked against exactly what the server stores.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.commands import run_command

BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-agentrun"


async def plugin(cluster: TestCluster, *args: str) -> tuple[int, str, str]:
    """The plugin as a user runs it whose kubeconfig context names the test namespace."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))},
        "KUBECONFIG": str(cluster.kubeconfig_in_namespace()),
    }
    code, out, err = await run_command(PLUGIN, *args, env=env, timeout=60)
    assert "Traceback" not in out + err, err
    return code, out, err


async def create_run(
    cluster: TestCluster,
    name: str,
    *,
    parent: dict[str, Any] | None = None,
    agent: str,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A run as the operator creates one from an Agent: a child carries its parent's labels and is owned
    by it. Its status, if any, is written through the status subresource."""
    body = agentrun(name, f"part of the fan-out: {name}", namespace=cluster.namespace)
    labels = {"agentrun.dev/agent": agent}
    if parent is not None:
        meta = parent["metadata"]
        depth = int(meta.get("labels", {}).get("agentrun.dev/depth", "0")) + 1
        labels |= {
            "agentrun.dev/parent": meta["name"],
            "agentrun.dev/parent-uid": meta["uid"],
            "agentrun.dev/tool-use-id": f"toolu_{name.replace('-', '_')}",
            "agentrun.dev/depth": str(depth),
        }
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "agentrun.dev/v1alpha1",
                "kind": "AgentRun",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    body["metadata"]["labels"] = labels
    created: dict[str, Any] = await cluster.request("POST", cluster.runs_path, json=body)
    if status is not None:
        await cluster.request(
            "PATCH",
            f"{cluster.runs_path}/{name}/status",
            data=json.dumps({"status": status}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
    return created


def status(phase: str, stop: str | None, iterations: int, tokens: int, cost: str) -> dict[str, Any]:
    return {
        "phase": phase,
        "stopReason": stop,
        "iterations": iterations,
        "usage": {"totalTokens": tokens, "costUSD": cost},
    }


def table(out: str) -> list[list[str]]:
    """Cells of each table row (`kubectl get` layout: cells at least three spaces apart)."""
    rows = out.split("\n\n")[0].splitlines()
    return [[cell.strip() for cell in row.split("   ") if cell.strip()] for row in rows]


async def fan_out(cluster: TestCluster) -> None:
    """planner → (researcher-late created first, researcher-early a second later → 2 grandchildren), plus a
    run of another tree that must not show."""
    root = await create_run(
        cluster, "fanout", agent="planner", status=status("Running", None, 3, 5000, "0.05")
    )
    first = await create_run(
        cluster,
        "fanout-zz",
        parent=root,
        agent="researcher",
        status=status("Succeeded", "EndTurn", 2, 1200, "0.012"),
    )
    # Names sort the other way round: the tree orders children by creationTimestamp (whole seconds).
    await asyncio.sleep(1.1)
    second = await create_run(
        cluster, "fanout-aa", parent=root, agent="researcher", status=status("Running", None, 2, 800, "0.008")
    )
    assert first["metadata"]["creationTimestamp"] < second["metadata"]["creationTimestamp"]
    await create_run(
        cluster,
        "fanout-aa-1",
        parent=second,
        agent="searcher",
        status=status("Failed", "TokenBudgetExceeded", 4, 300, "0.003"),
    )
    await create_run(cluster, "fanout-aa-2", parent=second, agent="searcher")
    stranger = await create_run(cluster, "elsewhere", agent="planner")
    await create_run(
        cluster, "elsewhere-1", parent=stranger, agent="searcher", status=status("Running", None, 1, 9, "9")
    )


async def test_tree_shows_the_run_and_every_descendant_with_agent_phase_stop_reason_and_spend_and_a_total(
    cluster: TestCluster,
) -> None:
    await fan_out(cluster)
    code, out, err = await plugin(cluster, "tree", "fanout")
    assert (code, err) == (0, ""), err
    assert table(out) == [
        ["NAME", "AGENT", "PHASE", "STOP REASON", "ITERATIONS", "TOKENS", "COST"],
        ["fanout", "planner", "Running", "-", "3", "5000", "$0.0500"],
        ["├─ fanout-zz", "researcher", "Succeeded", "EndTurn", "2", "1200", "$0.0120"],
        ["└─ fanout-aa", "researcher", "Running", "-", "2", "800", "$0.0080"],
        ["├─ fanout-aa-1", "searcher", "Failed", "TokenBudgetExceeded", "4", "300", "$0.0030"],
        ["└─ fanout-aa-2", "searcher", "-", "-", "0", "0", "-"],
    ]
    # Grandchildren hang under their own parent, drawn one level deeper.
    assert "\n   ├─ fanout-aa-1 " in out
    # The finished child's usage is in its parent's: the root, plus the runs still going.
    assert out.endswith("\n\nTotal: 5 runs (3 active), 5800 tokens, $0.0580\n")

    # A subtree is a tree too: -n names the namespace.
    code, out, err = await plugin(cluster, "tree", "fanout-aa", "-n", cluster.namespace)
    assert (code, err) == (0, ""), err
    assert [row[0] for row in table(out)[1:]] == ["fanout-aa", "├─ fanout-aa-1", "└─ fanout-aa-2"]


async def test_tree_as_json_nests_each_run_under_its_parent_with_the_total(cluster: TestCluster) -> None:
    await fan_out(cluster)
    code, out, err = await plugin(cluster, "tree", "fanout", "-o", "json")
    assert (code, err) == (0, ""), err
    document = json.loads(out)
    root = document["run"]
    assert (root["name"], root["namespace"], root["agent"], root["phase"], root["tokens"]) == (
        "fanout",
        cluster.namespace,
        "planner",
        "Running",
        5000,
    )
    assert [child["name"] for child in root["children"]] == ["fanout-zz", "fanout-aa"]
    late = root["children"][1]
    assert [(c["name"], c["stopReason"], c["costUSD"]) for c in late["children"]] == [
        ("fanout-aa-1", "TokenBudgetExceeded", "0.003"),
        ("fanout-aa-2", None, None),
    ]
    assert root["children"][0]["children"] == []
    assert document["total"] == {"runs": 5, "active": 3, "tokens": 5800, "costUSD": "0.058", "unpriced": []}


async def test_tree_of_a_missing_run_says_so_in_one_line(cluster: TestCluster) -> None:
    code, out, err = await plugin(cluster, "tree", "no-such-run")
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"error: agentrun {cluster.namespace}/no-such-run not found"]
