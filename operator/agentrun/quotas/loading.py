"""Reading a ledger back from a status written by another process (or an older version of this one).

Why conservative and never strict: the status is the only memory of what was spent. A field that
cannot be read is not a reason to stop enforcing the quota, nor to forget usage. Entries that can be
read are taken as they are; the totals written with them (status.used, status.reserved) then say
whether anything was lost, and what was lost is booked again:

* admissions without a uid, or missing from the list, become placeholders ("unaccounted-…") that
  count against concurrentRuns until the quota reconciler releases them (no run has such a uid);
  sandboxes missing from the admissions (status.used.concurrentSandboxes, sandboxCPU and
  sandboxMemory say more than the entries hold) go to such placeholders the same way;
* reservations that cannot be read become one placeholder reservation, charged in full when the
  reconciler collects it;
* window usage the buckets lost goes into the bucket of the previous write, so it expires no
  earlier than the usage it stands for.

When the total itself is unreadable too, the limit is taken as used up: blocked for a window is
recoverable, a passed limit is not.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Container, Mapping
from decimal import Decimal
from typing import Any

from agentrun.api.times import parse_time
from agentrun.quotas.definitions import Hard, QuotaDefinition
from agentrun.quotas.formats import parse_count, parse_decimal, to_second, utc
from agentrun.quotas.quantities import QuantityError, parse_quantity
from agentrun.quotas.records import (
    ZERO,
    AdmittedRun,
    LedgerState,
    Lost,
    Refused,
    Reservation,
    SandboxUse,
    Tally,
)
from agentrun.quotas.windows import Window, bucket_start, counts, written_at

UNACCOUNTED = "unaccounted"


def load_state(
    definition: QuotaDefinition, status: Mapping[str, Any] | None, now: dt.datetime
) -> LedgerState:
    now = utc(now)
    state = LedgerState()
    if not isinstance(status, Mapping):
        return state
    used = _mapping(status.get("used"))
    recorded_start = parse_time(status.get("windowStart"))
    compare_at, place_at = written_at(definition.window, recorded_start) if recorded_start else (now, now)
    compare_at, place_at = min(compare_at, now), min(place_at, now)
    _load_admitted(state, status.get("admitted"), used, definition.hard, now)
    _load_reservations(
        state, status.get("reservations"), _mapping(status.get("reserved")), definition.hard, now
    )
    _load_buckets(state, status.get("buckets"), used, definition, compare_at, place_at)
    lost, refused = _mapping(status.get("lost")), _mapping(status.get("refused"))
    state.lost = Lost(
        requests=parse_count(lost.get("requests")) or 0,
        tokens=parse_count(lost.get("tokens")) or 0,
        cost_usd=parse_decimal(lost.get("costUSD")) or ZERO,
    )
    state.refused = Refused(
        runs=parse_count(refused.get("runs")) or 0,
        requests=parse_count(refused.get("requests")) or 0,
    )
    return state


def _mapping(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _entries(raw: object) -> tuple[list[Mapping[str, Any]], bool]:
    """The list's entries that are objects, and whether anything was not (absent is not damage)."""
    if raw is None:
        return [], False
    if not isinstance(raw, list):
        return [], True
    entries = [item for item in raw if isinstance(item, Mapping)]
    return entries, len(entries) != len(raw)


def _text(raw: object) -> str | None:
    return raw if isinstance(raw, str) and raw else None


def _free_key(taken: Container[str], prefix: str) -> str:
    index = 0
    while f"{prefix}-{index}" in taken:
        index += 1
    return f"{prefix}-{index}"


def _target(recorded: int | None, damaged: bool, hard: int | None) -> int | None:
    """What a total must at least be: as recorded; when unreadable after damage, the limit itself."""
    if recorded is not None:
        return recorded
    return hard if damaged else None


def _load_admitted(
    state: LedgerState, raw: object, used: Mapping[str, Any], hard: Hard, now: dt.datetime
) -> None:
    entries, damaged = _entries(raw)
    sandboxes_damaged = damaged
    for item in entries:
        uid = _text(item.get("uid"))
        if uid is None:
            damaged = True
            uid = _free_key(state.admitted, f"{UNACCOUNTED}-admission")
        if uid in state.admitted:
            continue
        at = parse_time(item.get("at")) or now
        sandbox, unreadable = _sandbox(item.get("sandbox"))
        sandboxes_damaged |= unreadable
        state.admitted[uid] = AdmittedRun(
            uid=uid, name=_text(item.get("name")) or "", at=to_second(at), sandbox=sandbox
        )
    target = _target(parse_count(used.get("concurrentRuns")), damaged, hard.concurrent_runs)
    while target is not None and len(state.admitted) < target:
        uid = _free_key(state.admitted, f"{UNACCOUNTED}-admission")
        state.admitted[uid] = AdmittedRun(uid=uid, name="", at=to_second(now))
    _load_sandboxes(state, used, damaged or sandboxes_damaged, hard, now)


def _sandbox(raw: object) -> tuple[SandboxUse | None, bool]:
    """An admission's sandbox, and whether any of it was unreadable (then counted as 0 here, and made
    up from the recorded totals)."""
    if raw is None:
        return None, False
    entry = _mapping(raw)
    cpu, memory = _quantity(entry.get("cpu")), _quantity(entry.get("memory"))
    return SandboxUse(cpu=cpu or ZERO, memory=memory or ZERO), cpu is None or memory is None


def _quantity(raw: object) -> Decimal | None:
    try:
        return parse_quantity(raw)
    except QuantityError:
        return None


def _load_sandboxes(
    state: LedgerState, used: Mapping[str, Any], damaged: bool, hard: Hard, now: dt.datetime
) -> None:
    """Sandboxes the recorded totals count and the admissions do not hold go to placeholders: first
    to those that stand for lost admissions, then to new ones."""
    held = [a.sandbox for a in state.admitted.values() if a.sandbox is not None]
    want_count = _target(parse_count(used.get("concurrentSandboxes")), damaged, hard.concurrent_sandboxes)
    want_cpu = _quantity(used.get("sandboxCPU"))
    want_memory = _quantity(used.get("sandboxMemory"))
    if damaged:
        want_cpu = hard.sandbox_cpu if want_cpu is None else want_cpu
        want_memory = hard.sandbox_memory if want_memory is None else want_memory
    missing_count = max(0, (want_count or 0) - len(held))
    missing = SandboxUse(
        cpu=max(ZERO, (want_cpu or ZERO) - sum((s.cpu for s in held), ZERO)),
        memory=max(ZERO, (want_memory or ZERO) - sum((s.memory for s in held), ZERO)),
    )
    if not missing_count and not missing.cpu and not missing.memory:
        return
    spare = [
        uid
        for uid, admitted in state.admitted.items()
        if uid.startswith(f"{UNACCOUNTED}-admission") and admitted.sandbox is None
    ]
    for index in range(max(missing_count, 1)):
        uid = spare[index] if index < len(spare) else _free_key(state.admitted, f"{UNACCOUNTED}-admission")
        before = state.admitted.get(uid)
        state.admitted[uid] = AdmittedRun(
            uid=uid,
            name="",
            at=before.at if before is not None else to_second(now),
            sandbox=missing if index == 0 else SandboxUse(),
        )


def _load_reservations(
    state: LedgerState, raw: object, recorded: Mapping[str, Any], hard: Hard, now: dt.datetime
) -> None:
    entries, damaged = _entries(raw)
    damaged_tokens = damaged_cost = damaged
    for item in entries:
        tokens, cost = parse_count(item.get("tokens")), parse_decimal(item.get("costUSD"))
        damaged_tokens |= tokens is None
        damaged_cost |= cost is None
        uid = _text(item.get("uid")) or _free_key({u for u, _ in state.reservations}, f"{UNACCOUNTED}-run")
        request_id = _text(item.get("id")) or _free_key({i for _, i in state.reservations}, UNACCOUNTED)
        if (uid, request_id) in state.reservations:
            continue  # a duplicate: its amount comes back through the recorded total, if it counted
        state.reservations[(uid, request_id)] = Reservation(
            uid=uid,
            name=_text(item.get("name")) or "",
            id=request_id,
            holder=_text(item.get("holder")) or "",
            tokens=tokens or 0,
            cost_usd=cost or ZERO,
            at=to_second(parse_time(item.get("at")) or now),
        )
    held_tokens = sum(r.tokens for r in state.reservations.values())
    held_cost = sum((r.cost_usd for r in state.reservations.values()), ZERO)
    want_tokens = _target(parse_count(recorded.get("tokens")), damaged_tokens, hard.tokens)
    want_cost = parse_decimal(recorded.get("costUSD"))
    if want_cost is None and damaged_cost:
        want_cost = hard.cost_usd
    missing_tokens = max(0, (want_tokens or 0) - held_tokens)
    missing_cost = max(ZERO, (want_cost or ZERO) - held_cost)
    if missing_tokens or missing_cost:
        request_id = _free_key({i for _, i in state.reservations}, UNACCOUNTED)
        state.reservations[(UNACCOUNTED, request_id)] = Reservation(
            uid=UNACCOUNTED,
            name="",
            id=request_id,
            holder="",
            tokens=missing_tokens,
            cost_usd=missing_cost,
            at=to_second(now),
        )


def _load_buckets(
    state: LedgerState,
    raw: object,
    recorded: Mapping[str, Any],
    definition: QuotaDefinition,
    compare_at: dt.datetime,
    place_at: dt.datetime,
) -> None:
    window: Window = definition.window
    entries, damaged = _entries(raw)
    damaged_runs = damaged_tokens = damaged_cost = damaged
    for item in entries:
        runs, tokens = parse_count(item.get("runs")), parse_count(item.get("tokens"))
        cost = parse_decimal(item.get("costUSD"))
        damaged_runs |= runs is None
        damaged_tokens |= tokens is None
        damaged_cost |= cost is None
        # A bucket whose start cannot be read keeps its usage in the newest bucket it can have been.
        start = parse_time(item.get("start")) or bucket_start(window, place_at)
        state.buckets[start] = state.buckets.get(start, Tally()) + Tally(runs or 0, tokens or 0, cost or ZERO)
    counted = sum((u for s, u in state.buckets.items() if counts(window, s, compare_at)), Tally())
    hard = definition.hard
    want_runs = _target(parse_count(recorded.get("runs")), damaged_runs, hard.runs)
    want_tokens = _target(parse_count(recorded.get("tokens")), damaged_tokens, hard.tokens)
    want_cost = parse_decimal(recorded.get("costUSD"))
    if want_cost is None and damaged_cost:
        want_cost = hard.cost_usd
    missing = Tally(
        runs=max(0, (want_runs or 0) - counted.runs),
        tokens=max(0, (want_tokens or 0) - counted.tokens),
        cost_usd=max(ZERO, (want_cost or ZERO) - counted.cost_usd),
    )
    if not missing.empty:
        start = bucket_start(window, place_at)
        state.buckets[start] = state.buckets.get(start, Tally()) + missing
