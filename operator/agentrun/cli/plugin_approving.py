"""`kubectl agentrun approve` and `deny`: a decision on a pending tool call, appended to the run's
spec.approvals as the caller (docs/approval.md).

The operator reads the decision from the AgentRun like any spec change; the API server's admission
policy is the judge of who may decide, and its refusal is shown as it words it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from agentrun.cli.plugin_session import PluginError, Session, api_error, get_run
from agentrun.kube.calling import JSON_PATCH
from agentrun.kube.errors import APIStatusError
from agentrun.kube.failures import KubeFailure

__all__ = ["appending", "choose_call", "cmd_approve", "cmd_deny", "decide", "decision_entry", "whoami"]

CONFLICT_RETRIES = 5


def choose_call(run: dict[str, Any], tool_use_id: str | None) -> dict[str, Any]:
    """The pending call to decide on: the one named, or the only one."""
    name = run["metadata"]["name"]
    pending = [p for p in (run.get("status") or {}).get("pendingApprovals") or [] if isinstance(p, dict)]
    listing = ", ".join(f"{p.get('toolUseId')} ({p.get('toolName')})" for p in pending)
    if tool_use_id is None:
        if not pending:
            raise PluginError(f"agentrun {name} has no tool call awaiting approval")
        if len(pending) > 1:
            raise PluginError(
                f"agentrun {name} has {len(pending)} calls awaiting approval; name one of: {listing}"
            )
        return pending[0]
    for entry in pending:
        if entry.get("toolUseId") == tool_use_id:
            return entry
    decided = [a for a in (run.get("spec") or {}).get("approvals") or [] if a.get("toolUseId") == tool_use_id]
    if decided:
        raise PluginError(f"{tool_use_id} was already decided: {decided[0].get('decision')}")
    raise PluginError(
        f"{tool_use_id} is not awaiting approval in agentrun {name}"
        + (f" (awaiting: {listing})" if pending else " (nothing is awaiting approval)")
    )


async def whoami(session: Session) -> str:
    """The user name the API server authenticates us as, as `kubectl auth whoami` asks for it.

    Not the kubeconfig's user entry: that is only a local label, while the server's approval policy
    compares `by` with the authenticated name.
    """
    try:
        name = await session.kube.who_am_i()
    except APIStatusError as exc:
        # A KubeFailure: worded here, so the command's wrapper passes it on instead of rewording it.
        raise KubeFailure(
            f"cannot tell who you are: the API server answered a SelfSubjectReview with HTTP {exc.status} "
            "(Kubernetes 1.28 or later serves it); pass --by NAME"
        ) from exc
    if name is None:
        raise PluginError(
            "cannot tell who you are: the API server's SelfSubjectReview names nobody; pass --by NAME"
        )
    return name


_POLICY_DENIAL = re.compile(r"ValidatingAdmissionPolicy '(?P<policy>[^']+)'.* denied request: (?P<why>.*)$")


def _refused_decision(exc: APIStatusError, args: argparse.Namespace) -> KubeFailure | None:
    """A decision an admission policy refused (e.g. `by` not the caller): the server's reason, plainly."""
    if match := _POLICY_DENIAL.search(exc.message):
        hint = "; without --by the decision is recorded under your own user name" if args.by else ""
        return KubeFailure(
            f"the API server refused the decision: {match['why']} "
            f"(ValidatingAdmissionPolicy {match['policy']}){hint}"
        )
    return None


def decision_entry(tool_use_id: str, decision: str, by: str, reason: str | None) -> dict[str, Any]:
    """One entry of spec.approvals (the reason only when one is given)."""
    entry = {"toolUseId": tool_use_id, "decision": decision, "by": by}
    if reason:
        entry["reason"] = reason
    return entry


def appending(run: Mapping[str, Any], entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that appends ``entry`` to the run's spec.approvals, applied only to the version
    read (the test op): a decision made meanwhile by someone else is never overwritten."""
    approvals = [*((run.get("spec") or {}).get("approvals") or []), dict(entry)]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": run["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/spec/approvals", "value": approvals},
    ]


async def decide(session: Session, args: argparse.Namespace, decision: str) -> str:
    """Append to spec.approvals, guarded by resourceVersion so concurrent deciders never clobber.

    `by` is the caller's authenticated user name unless --by says otherwise; the API server is the
    judge of a different name (the chart's approval policy refuses it).
    """
    by = args.by or await whoami(session)
    for _ in range(CONFLICT_RETRIES):
        run = await get_run(session, args.name)
        call = choose_call(run, args.tool_use_id)
        patch = appending(run, decision_entry(call["toolUseId"], decision, by, args.reason))
        try:
            await session.kube.patch_run(session.namespace, args.name, patch, content_type=JSON_PATCH)
        except APIStatusError as exc:
            seen = run["metadata"]["resourceVersion"]
            if (
                exc.status in (409, 422)
                and (await get_run(session, args.name))["metadata"]["resourceVersion"] != seen
            ):
                continue  # someone else changed the run meanwhile (the test op failed): read it again
            refused = _refused_decision(exc, args) if exc.status in (403, 422) else None
            if refused is not None:
                raise refused from exc
            raise await api_error(session, exc, f"agentrun {session.namespace}/{args.name}") from exc
        verb = "approved" if decision == "approve" else "denied"
        what = f"{call.get('toolName')} ({call['toolUseId']})"
        return f"agentrun.agentrun.dev/{args.name}: {verb} {what} as {by}\n"
    raise PluginError(f"agentrun {args.name} kept changing; try again")


async def cmd_approve(session: Session, args: argparse.Namespace) -> str:
    return await decide(session, args, "approve")


async def cmd_deny(session: Session, args: argparse.Namespace) -> str:
    return await decide(session, args, "deny")
