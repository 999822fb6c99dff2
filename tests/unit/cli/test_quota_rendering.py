"""`kubectl agentrun quota`'s table and JSON, from AgentRunQuota objects as the API server serves them."""

from __future__ import annotations

import json
from typing import Any

from agentrun.cli.plugin_rendering import quota_row, render_quotas


def quota(
    name: str,
    namespace: str = "team-a",
    *,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRunQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec if spec is not None else {},
    }
    if status is not None:
        obj["status"] = status
    return obj


DAILY = quota(
    "daily",
    spec={"window": "Day", "hard": {"concurrentRuns": 5, "runs": 100, "tokens": 2000000, "costUSD": 50}},
    status={
        "windowStart": "2026-11-23T10:00:00Z",
        "used": {"concurrentRuns": 2, "runs": 10, "tokens": 12345, "costUSD": "0.123456"},
        "reserved": {"tokens": 8192, "costUSD": "0.05"},
        "lost": {"requests": 1, "tokens": 5000, "costUSD": "0.02"},
        "refused": {"runs": 3, "requests": 1},
    },
)


def lines(text: str) -> list[list[str]]:
    """Cells of each table line (cells are separated by at least three spaces)."""
    return [[cell for cell in line.split("   ") if cell.strip()] for line in text.splitlines() if line]


def test_a_quota_shows_used_against_hard_for_each_limit_reservations_lost_and_refusals() -> None:
    header, row = lines(render_quotas([DAILY], namespaces=False))
    cells = dict(zip([h.strip() for h in header], [c.strip() for c in row], strict=True))
    assert cells == {
        "NAME": "daily",
        "WINDOW": "Day",
        "CONCURRENT": "2/5",
        "RUNS": "10/100",
        "TOKENS": "12345/2000000",
        "COST": "$0.12/$50.00",
        "RESERVED TOKENS": "8192",
        "RESERVED COST": "$0.05",
        "LOST": "1",
        "REFUSED": "3 runs, 1 request",
    }


def test_a_limit_the_quota_does_not_set_shows_the_usage_alone() -> None:
    tokens_only = quota(
        "tokens",
        spec={"window": "Hour", "hard": {"tokens": 1000}},
        status={"used": {"concurrentRuns": 4, "runs": 7, "tokens": 900, "costUSD": "3.5"}},
    )
    _, row = lines(render_quotas([tokens_only], namespaces=False))
    assert [c.strip() for c in row[:6]] == ["tokens", "Hour", "4", "7", "900/1000", "$3.50"]


def test_all_namespaces_adds_a_namespace_column_and_sorts_by_namespace_then_name() -> None:
    seen = {"used": {"runs": 1}}
    quotas = [
        quota("b", "team-b", status=seen),
        quota("z", "team-a", status=seen),
        quota("a", "team-b", status=seen),
    ]
    table = lines(render_quotas(quotas, namespaces=True))
    assert table[0][:2] == ["NAMESPACE", "NAME"]
    assert [(r[0].strip(), r[1].strip()) for r in table[1:]] == [
        ("team-a", "z"),
        ("team-b", "a"),
        ("team-b", "b"),
    ]


def test_columns_line_up_like_kubectl_get() -> None:
    text = render_quotas([DAILY, quota("m", spec={"window": "Month"}, status={})], namespaces=False)
    header, *rows = text.split("\n\n")[0].splitlines()
    assert len(rows) == 2
    start = header.index("COST")
    assert all(row[start - 3 : start] == "   " for row in rows)


def test_a_quota_without_a_status_is_named_as_not_recorded_instead_of_passing_its_zeros_off_as_usage() -> (
    None
):
    text = render_quotas([DAILY, quota("fresh", spec={"hard": {"runs": 3}})], namespaces=False)
    rows = lines(text)
    assert [c.strip() for c in rows[2][:4]] == ["fresh", "Day", "0", "0/3"]
    assert text.rstrip().endswith(
        "no usage recorded yet for team-a/fresh: no operator has written its status"
    )
    assert "daily:" not in text and "team-a/daily" not in text


def test_dollars_are_shown_to_the_cent_and_tiny_amounts_are_not_rounded_to_nothing() -> None:
    cheap = quota("cheap", spec={"hard": {"costUSD": 0.5}}, status={"used": {"costUSD": "0.000031"}})
    odd = quota("odd", spec={}, status={"used": {"costUSD": "not money"}, "reserved": {"costUSD": 1}})
    rows = {r[0].strip(): r for r in lines(render_quotas([cheap, odd], namespaces=False))[1:]}
    assert rows["cheap"][5].strip() == "<$0.01/$0.50"
    assert rows["odd"][5].strip() == "?"
    assert rows["odd"][7].strip() == "$1.00"


def test_concurrent_runs_fall_back_to_the_admitted_list_when_used_does_not_count_them() -> None:
    admitted = [{"uid": "u1", "name": "r1", "at": "2026-11-23T10:00:00Z"}]
    obj = quota("c", spec={"hard": {"concurrentRuns": 2}}, status={"used": {"runs": 1}, "admitted": admitted})
    assert quota_row(obj)["used"]["concurrentRuns"] == 1
    assert lines(render_quotas([obj], namespaces=False))[1][2].strip() == "1/2"


def test_json_rows_carry_the_limits_and_the_ledger_counts_as_stored() -> None:
    row = quota_row(DAILY)
    assert json.loads(json.dumps(row)) == {
        "namespace": "team-a",
        "name": "daily",
        "window": "Day",
        "windowStart": "2026-11-23T10:00:00Z",
        "hard": {"concurrentRuns": 5, "runs": 100, "tokens": 2000000, "costUSD": 50},
        "used": {"concurrentRuns": 2, "runs": 10, "tokens": 12345, "costUSD": "0.123456"},
        "reserved": {"tokens": 8192, "costUSD": "0.05"},
        "lost": {"requests": 1, "tokens": 5000, "costUSD": "0.02"},
        "refused": {"runs": 3, "requests": 1},
        "recorded": True,
    }


def test_sandbox_columns_appear_when_a_quota_limits_or_counts_sandboxes() -> None:
    sandboxed = quota(
        "sandboxes",
        spec={"hard": {"concurrentSandboxes": 3, "sandboxMemory": "8Gi"}},
        status={"used": {"concurrentSandboxes": 1, "sandboxCPU": "1500m", "sandboxMemory": "512Mi"}},
    )
    header, daily, limited = lines(render_quotas([DAILY, sandboxed], namespaces=False))
    assert [h.strip() for h in header[-3:]] == ["SANDBOXES", "SANDBOX CPU", "SANDBOX MEMORY"]
    # A quota that neither limits nor counts sandboxes shows zeros there; the limited one used/hard.
    assert [c.strip() for c in daily[-3:]] == ["0", "0", "0"]
    assert [c.strip() for c in limited[-3:]] == ["1/3", "1500m", "512Mi/8Gi"]
    # Without such a quota the table keeps its usual columns.
    assert "SANDBOXES" not in render_quotas([DAILY], namespaces=False)
