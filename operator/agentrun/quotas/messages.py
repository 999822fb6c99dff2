"""The sentences a held-back run or a refused request shows, in its condition and its stop message.

Why one module: the Pending message, the QuotaExceeded stop and the InvalidSpec refusal are read by
the same people (a namespace's owner wondering why nothing runs), so they name things the same way:
the quota as "<namespace>/<name>", the limit by its spec.hard or spec.perRun name, amounts as
written in the status.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from agentrun.api.times import rfc3339
from agentrun.quotas.formats import decimal_text
from agentrun.quotas.windows import Window, describe

NEVER = "only when the quota is raised"


def amount_text(value: int | float | Decimal) -> str:
    if isinstance(value, int):
        return str(value)
    return decimal_text(Decimal(str(value)) if isinstance(value, float) else value)


def _when(room_at: dt.datetime | None, otherwise: str = NEVER) -> str:
    return f"at {rfc3339(room_at)}" if room_at is not None else otherwise


def concurrent_runs_full(label: str, running: int, hard: int) -> str:
    if hard == 0:
        return f"quota {label}: concurrentRuns limit is 0; room expected {NEVER}"
    return (
        f"quota {label}: concurrentRuns limit {hard} reached ({running} running); "
        f"room expected when one of the {running} running runs ends"
    )


def concurrent_sandboxes_full(label: str, holding: int, hard: int) -> str:
    if hard == 0:
        return f"quota {label}: concurrentSandboxes limit is 0 (no run with a sandbox); room expected {NEVER}"
    return (
        f"quota {label}: concurrentSandboxes limit {hard} reached ({_sandboxes(holding)} running); "
        f"room expected when one of the {_runs_with_sandbox(holding)} ends"
    )


def sandbox_share_full(label: str, limit: str, used: str, holding: int, hard: str, need: str) -> str:
    """sandboxCPU or sandboxMemory: the sandboxes admitted leave less than this run's sandbox needs."""
    return (
        f"quota {label}: {limit} limit {hard} has room for less than this run's sandbox ({need}): "
        f"{used} held by {_sandboxes(holding)} running; room expected when one of the "
        f"{_runs_with_sandbox(holding)} ends"
    )


def sandbox_too_big(label: str, limit: str, hard: str, need: str) -> str:
    """A sandbox whose limit alone passes the quota's: it can never be admitted."""
    return (
        f"quota {label}: {limit} limit {hard} is less than this run's sandbox limit ({need}) "
        f"alone; room expected {NEVER}"
    )


def _sandboxes(count: int) -> str:
    return f"{count} sandbox" + ("" if count == 1 else "es")


def _runs_with_sandbox(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'} with a sandbox"


def runs_full(label: str, window: Window, used: int, hard: int, room_at: dt.datetime | None) -> str:
    return (
        f"quota {label}: runs limit {hard} reached ({used} started in {describe(window)}); "
        f"room expected {_when(room_at)}"
    )


def spend_full(
    label: str,
    limit: str,
    window: Window,
    used: int | Decimal,
    reserved: int | Decimal,
    hard: int | Decimal,
    room_at: dt.datetime | None,
    *,
    need: int | Decimal = 0,
) -> str:
    """tokens or costUSD, at admission: used and reserved leave nothing (or less than the run's
    first request needs) for another run."""
    usage = f"{amount_text(used)} used"
    if reserved:
        usage += f" + {amount_text(reserved)} reserved by requests in flight"
    otherwise = "when requests in flight settle" if reserved else NEVER
    if need and used + reserved < hard:
        return (
            f"quota {label}: {limit} limit {amount_text(hard)} has {amount_text(hard - used - reserved)} "
            f"left ({usage} in {describe(window)}), less than the run's first request needs "
            f"({amount_text(need)}); room expected {_when(room_at, otherwise)}"
        )
    return (
        f"quota {label}: {limit} limit {amount_text(hard)} reached ({usage} in {describe(window)}); "
        f"room expected {_when(room_at, otherwise)}"
    )


def request_too_big(
    label: str,
    limit: str,
    window: Window,
    amount: int | Decimal,
    used: int | Decimal,
    hard: int | Decimal,
    room_at: dt.datetime | None,
) -> str:
    """A request that would pass the limit even if nothing else were in flight."""
    if amount > hard:
        return (
            f"quota {label}: {limit} limit {amount_text(hard)}: this model request may use up to "
            f"{amount_text(amount)}, more than the whole limit; room expected {NEVER}"
        )
    return (
        f"quota {label}: {limit} limit {amount_text(hard)}: this model request may use up to "
        f"{amount_text(amount)} but {amount_text(used)} are used in {describe(window)}; "
        f"room expected {_when(room_at)}"
    )


def request_waits(
    label: str,
    limit: str,
    amount: int | Decimal,
    used: int | Decimal,
    reserved: int | Decimal,
    hard: int | Decimal,
) -> str:
    return (
        f"quota {label}: {limit} limit {amount_text(hard)}: this model request may use up to "
        f"{amount_text(amount)}; {amount_text(used)} are used and {amount_text(reserved)} reserved by "
        f"requests in flight; room expected when they settle"
    )


def unpriced(label: str, hard: Decimal) -> str:
    return (
        f"quota {label}: costUSD limit {amount_text(hard)} cannot be kept for this model: it has no price "
        "in the operator's price table (add one with AGENTRUN_PRICE_FILE)"
    )


def per_run_above(label: str, field: str, value: int | float | Decimal, maximum: int | Decimal) -> str:
    return (
        f"quota {label}: spec.limits.{field} {amount_text(value)} is above "
        f"perRun.{field}.max {amount_text(maximum)}"
    )
