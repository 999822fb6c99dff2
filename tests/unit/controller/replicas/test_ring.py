"""The ring: every replica derives the same owner from the same members, and few runs move on a change."""

from __future__ import annotations

import re
from collections import Counter

from agentrun.controller.replicas.ring import lease_name, owner, view_id

UIDS = [f"0b6c{i:04x}-5f1e-4c2a-9d3b-{i:012x}" for i in range(3000)]
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def owners(members: list[str]) -> dict[str, str | None]:
    return {uid: owner(uid, members) for uid in UIDS}


def test_the_owner_does_not_depend_on_the_order_of_the_members() -> None:
    assert owners(["a", "b", "c"]) == owners(["c", "a", "b"])


def test_runs_spread_about_evenly_over_the_members() -> None:
    counts = Counter(owners(["op-0", "op-1", "op-2"]).values())
    assert set(counts) == {"op-0", "op-1", "op-2"}
    assert all(800 <= count <= 1200 for count in counts.values()), counts


def test_a_joining_member_takes_only_its_share_and_nothing_moves_between_the_others() -> None:
    before, after = owners(["op-0", "op-1", "op-2"]), owners(["op-0", "op-1", "op-2", "op-3"])
    moved = [uid for uid in UIDS if before[uid] != after[uid]]
    assert all(after[uid] == "op-3" for uid in moved)
    assert 600 <= len(moved) <= 900  # about a quarter of 3000


def test_a_leaving_member_hands_over_only_its_own_runs() -> None:
    before, after = owners(["op-0", "op-1", "op-2"]), owners(["op-0", "op-2"])
    moved = {uid for uid in UIDS if before[uid] != after[uid]}
    assert moved == {uid for uid in UIDS if before[uid] == "op-1"}


def test_no_members_own_nothing() -> None:
    assert owner(UIDS[0], []) is None


def test_the_view_id_is_twelve_hex_digits_of_the_sorted_members() -> None:
    assert view_id(["b", "a"]) == view_id(["a", "b"])
    assert re.fullmatch(r"[0-9a-f]{12}", view_id(["a", "b"]))
    assert view_id(["a", "b"]) != view_id(["a", "b", "c"])


def test_a_short_lease_name_is_the_group_and_replica_name() -> None:
    assert (
        lease_name("agentrun", "agentrun-operator-7d9f-x2") == "agentrun-agentrun-agentrun-operator-7d9f-x2"
    )


def test_long_or_unsafe_replica_names_give_distinct_valid_lease_names() -> None:
    long_a, long_b = "op-" + "x" * 200 + "-a", "op-" + "x" * 200 + "-b"
    names = {lease_name("agentrun", name) for name in (long_a, long_b, "node.example.com-12", "Op_1")}
    assert len(names) == 4
    assert all(DNS_LABEL.fullmatch(name) for name in names), names
