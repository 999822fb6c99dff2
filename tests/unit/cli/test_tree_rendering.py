"""`kubectl agentrun tree`'s table and JSON, from AgentRun objects as the API server serves them."""

from __future__ import annotations

import json
from typing import Any

from agentrun.cli.plugin_rendering import render_tree, run_tree, tree_json, tree_total


def run(
    name: str,
    uid: str,
    *,
    parent: str | None = None,
    created: str = "2026-11-24T10:00:00Z",
    agent: str | None = None,
    agent_ref: str | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    labels = {"agentrun.dev/parent-uid": parent} if parent else {}
    if agent:
        labels["agentrun.dev/agent"] = agent
    spec: dict[str, Any] = {"task": "t"}
    if agent_ref:
        spec["agentRef"] = {"name": agent_ref}
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid,
            "labels": labels,
            "creationTimestamp": created,
        },
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def finished(
    stop: str, iterations: int, tokens: int, cost: str | None, phase: str = "Succeeded"
) -> dict[str, Any]:
    usage: dict[str, Any] = {"totalTokens": tokens}
    if cost is not None:
        usage["costUSD"] = cost
    return {"phase": phase, "stopReason": stop, "iterations": iterations, "usage": usage}


def running(iterations: int, tokens: int, cost: str | None) -> dict[str, Any]:
    return {**finished("", iterations, tokens, cost, phase="Running"), "stopReason": None}


ROOT = run("fanout", "u-root", agent="planner", status=running(3, 5000, "0.05"))
# Listed in no particular order, as a LIST returns them; "other" belongs to another tree.
DESCENDANTS = [
    run(
        "fanout-b",
        "u-b",
        parent="u-root",
        created="2026-11-24T10:00:07Z",
        agent_ref="researcher",
        status=running(2, 800, "0.008"),
    ),
    run(
        "fanout-a",
        "u-a",
        parent="u-root",
        created="2026-11-24T10:00:05Z",
        agent="researcher",
        status=finished("EndTurn", 2, 1200, "0.012"),
    ),
    run("fanout-b-2", "u-b2", parent="u-b", created="2026-11-24T10:00:09Z", agent="searcher"),
    run(
        "fanout-b-1",
        "u-b1",
        parent="u-b",
        created="2026-11-24T10:00:09Z",
        agent="searcher",
        status=finished("TokenBudgetExceeded", 4, 300, "0.003", phase="Failed"),
    ),
    run("other", "u-other", parent="u-elsewhere", status=running(1, 99, "9")),
]


def cells(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("   ") if c.strip()] for line in text.splitlines() if line]


def test_a_tree_shows_each_descendant_under_its_parent_oldest_first_with_agent_phase_and_spend() -> None:
    text = render_tree(run_tree(ROOT, DESCENDANTS))
    assert text.splitlines()[:6] == [
        "NAME               AGENT        PHASE       STOP REASON           ITERATIONS   TOKENS   COST",
        "fanout             planner      Running     -                     3            5000     $0.0500",
        "├─ fanout-a        researcher   Succeeded   EndTurn               2            1200     $0.0120",
        "└─ fanout-b        researcher   Running     -                     2            800      $0.0080",
        "   ├─ fanout-b-1   searcher     Failed      TokenBudgetExceeded   4            300      $0.0030",
        "   └─ fanout-b-2   searcher     -           -                     0            0        -",
    ]
    assert "other" not in text


def test_the_total_counts_the_root_and_unfinished_runs_since_a_finished_childs_usage_is_in_its_parents() -> (
    None
):
    total = tree_total(run_tree(ROOT, DESCENDANTS))
    # fanout (5000, includes fanout-a) + fanout-b (800, includes fanout-b-1) + fanout-b-2 (nothing yet).
    assert total == {"runs": 5, "active": 3, "tokens": 5800, "costUSD": "0.058", "unpriced": []}
    assert render_tree(run_tree(ROOT, DESCENDANTS)).splitlines()[-2:] == [
        "",
        "Total: 5 runs (3 active), 5800 tokens, $0.0580",
    ]


def test_a_run_without_children_is_a_tree_of_one() -> None:
    alone = run("solo", "u-solo", status=finished("EndTurn", 1, 40, "0.0004"))
    assert cells(render_tree(run_tree(alone, [])))[1:] == [
        ["solo", "-", "Succeeded", "EndTurn", "1", "40", "$0.0004"],
        ["Total: 1 run (0 active), 40 tokens, $0.0004"],
    ]


def test_runs_with_tokens_but_no_price_are_named_in_the_total() -> None:
    root = run("r", "u-r", status=running(1, 100, "0.001"))
    child = run("r-c", "u-c", parent="u-r", status=running(1, 50, None))
    assert render_tree(run_tree(root, [child])).splitlines()[-1] == (
        "Total: 2 runs (2 active), 150 tokens, $0.0010 (without r-c: no price)"
    )
    nothing_priced = run("n", "u-n", status=running(1, 10, None))
    assert render_tree(run_tree(nothing_priced, [])).splitlines()[-1] == (
        "Total: 1 run (1 active), 10 tokens, no price (without n: no price)"
    )


def test_labels_that_loop_back_to_an_ancestor_show_each_run_once() -> None:
    root = run("a", "u-a", parent="u-b")
    child = run("b", "u-b", parent="u-a")
    tree = run_tree(root, [root, child])
    assert [row[0] for row in cells(render_tree(tree))[1:-1]] == ["a", "└─ b"]


def test_json_nests_children_under_their_parent_with_the_total() -> None:
    document = json.loads(json.dumps(tree_json(run_tree(ROOT, DESCENDANTS))))
    root = document["run"]
    assert {k: v for k, v in root.items() if k != "children"} == {
        "name": "fanout",
        "namespace": "team-a",
        "uid": "u-root",
        "agent": "planner",
        "phase": "Running",
        "stopReason": None,
        "iterations": 3,
        "tokens": 5000,
        "costUSD": "0.05",
    }
    assert [c["name"] for c in root["children"]] == ["fanout-a", "fanout-b"]
    assert [c["name"] for c in root["children"][1]["children"]] == ["fanout-b-1", "fanout-b-2"]
    assert root["children"][1]["agent"] == "researcher"  # from spec.agentRef when the label is absent
    assert root["children"][0]["children"] == []
    assert document["total"]["tokens"] == 5800
