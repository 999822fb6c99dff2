"""`kubectl agentrun operators`: reading the replicas' Leases and judging whether a namespace is served."""

from __future__ import annotations

import datetime as dt

import pytest

from agentrun.cli.plugin_operators import matches, render_operators, replicas_of, verdict

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def _lease(name: str, serves: str | None, renewed_seconds_ago: int, duration: int = 30) -> dict[str, object]:
    annotations = {"agentrun.dev/serves": serves} if serves is not None else {}
    renew = (NOW - dt.timedelta(seconds=renewed_seconds_ago)).isoformat().replace("+00:00", ".000000Z")
    return {
        "metadata": {
            "name": f"agentrun-{name}",
            "namespace": "agentrun-system",
            "labels": {"agentrun.dev/replica-group": "agentrun"},
            "annotations": annotations,
        },
        "spec": {"holderIdentity": name, "renewTime": renew, "leaseDurationSeconds": duration},
    }


@pytest.mark.parametrize(
    ("namespace", "entry", "expected"),
    [
        ("team-a", "*", True),
        ("team-a", "team-a", True),
        ("team-b", "team-a", False),
        ("team-b", "team-*", True),
        ("team-b", "team-*,!team-b", False),
        ("prod", "!team-*", True),
        ("team-a", "!team-*", False),
    ],
)
def test_a_namespace_matches_an_operators_namespace_entry_as_kopf_reads_it(
    namespace: str, entry: str, expected: bool
) -> None:
    assert matches(namespace, entry) is expected


def test_only_a_live_replica_serves_and_an_expired_one_is_shown_as_such() -> None:
    replicas = replicas_of([_lease("r1", "team-a,team-b", 5), _lease("r2", "*", 45)])
    assert verdict(replicas, "team-b", NOW) == (
        True,
        "namespace team-b: served by agentrun-system/agentrun (1 live replica)",
    )
    served, sentence = verdict(replicas, "prod", NOW)
    assert not served
    assert sentence == (
        "namespace prod: no live operator serves it; its runs get no phase until one does "
        "(the live ones serve: team-a, team-b)"
    )
    table = render_operators(replicas, "prod", NOW).splitlines()
    assert table[1].split() == ["agentrun-system", "agentrun", "r1", "team-a,", "team-b", "5s", "ago"]
    assert table[2].split() == [
        "agentrun-system",
        "agentrun",
        "r2",
        "all",
        "namespaces",
        "45s",
        "ago",
        "(expired)",
    ]


def test_without_any_published_lease_it_says_it_cannot_tell() -> None:
    assert verdict([], "team-a", NOW) == (
        False,
        "namespace team-a: no operator replica found; an operator publishes a Lease when it runs with "
        "AGENTRUN_LEASE_NAMESPACE (as the chart runs it): without one, this cannot tell",
    )
    older = replicas_of([_lease("old", None, 1)])
    assert verdict(older, "team-a", NOW) == (
        False,
        "namespace team-a: cannot tell whether it is served: live replicas of agentrun-system/agentrun do "
        "not publish what they serve (operators older than this plugin)",
    )
    assert "(not published)" in render_operators(older, "team-a", NOW)
