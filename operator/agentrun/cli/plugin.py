"""`kubectl agentrun`: read a run's transcript and trace, cancel it, approve or deny its tool calls;
show a run's tree of child runs; show a namespace's AgentRunQuotas; say which operators serve which
namespaces.

kubectl finds the `kubectl-agentrun` executable on PATH. It acts as the kubeconfig user, with that
user's RBAC: reading transcripts needs `get`/`list` on the chunk Secrets (or ConfigMaps; for runs in the
PostgreSQL store, the database's DSN: plugin_rows.py), deciding
and cancelling need `patch` on agentruns, `tree` needs `get`/`list` on agentruns, `operators` needs `list` on
leases (coordination.k8s.io) where the operator keeps them, `quota` needs
`list` on agentrunquotas. Nothing here talks to the operator directly; everything goes through the
AgentRun (or AgentRunQuota) object, so the plugin works whichever operator replica runs the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from agentrun.api import INSTALL_CRDS, LABEL_PARENT_UID, LABEL_REPLICA_GROUP
from agentrun.api.transcripts import (
    POSTGRES_KIND,
    StorageKind,
    Transcript,
    TranscriptError,
    chunk_selector,
    decode_objects,
    object_kind,
    storage_of,
)
from agentrun.cli.plugin_approving import cmd_approve, cmd_deny
from agentrun.cli.plugin_operators import Replica, render_operators, replicas_of, verdict
from agentrun.cli.plugin_rendering import (
    quota_row,
    render_quotas,
    render_trace,
    render_transcript,
    render_tree,
    run_tree,
    tree_json,
)
from agentrun.cli.plugin_rows import read_rows_transcript
from agentrun.cli.plugin_session import NO_RUN_CRD, PluginError, Session, api_error, connect, get_run
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIStatusError
from agentrun.kube.failures import KubeFailure, explain, explained

NO_QUOTA_CRD = (
    "the AgentRunQuota CRD (agentrunquotas.agentrun.dev) is not installed; "
    f"install the CRDs with `{INSTALL_CRDS}`"
)


async def list_chunk_objects(
    kube: KubeClient,
    namespace: str,
    *,
    run_name: str | None = None,
    uid: str | None = None,
    storage: StorageKind = "secret",
) -> list[dict[str, Any]]:
    """A run's chunk objects as JSON, by run uid (exact) or by run name, read as the caller: one
    label-selected listing of Secrets or ConfigMaps (the operator reads them by name instead)."""
    selector = chunk_selector(run_name=run_name, uid=uid)
    items = await kube.list_objects(storage, namespace, label_selector=selector)
    kind = object_kind(storage)
    return [{**item, "kind": kind} for item in items]


async def read_transcript(session: Session, name: str) -> Transcript:
    return (await read_run_transcript(session, name))[1]


async def read_run_transcript(
    session: Session, name: str, *, database_url: str | None = None
) -> tuple[dict[str, Any], Transcript]:
    run = await get_run(session, name)
    ref = (run.get("status") or {}).get("transcript") or {}
    if ref.get("kind") == POSTGRES_KIND:
        try:
            return run, await read_rows_transcript(run["metadata"]["uid"], database_url)
        except TranscriptError as exc:
            raise PluginError(f"transcript of agentrun {session.namespace}/{name}: {exc}") from exc
    try:
        chunks = await list_chunk_objects(
            session.kube,
            session.namespace,
            run_name=name,
            uid=run["metadata"].get("uid"),
            storage=storage_of(ref.get("kind")),
        )
        return run, decode_objects(chunks)
    except APIStatusError as exc:
        raise await api_error(session, exc, f"transcript of agentrun {session.namespace}/{name}") from exc
    except TranscriptError as exc:
        raise PluginError(f"transcript of agentrun {session.namespace}/{name}: {exc}") from exc


async def cmd_transcript(session: Session, args: argparse.Namespace) -> str:
    run, transcript = await read_run_transcript(session, args.name, database_url=args.database_url)
    if args.output == "json":
        return json.dumps(transcript.messages, indent=2, ensure_ascii=False) + "\n"
    if transcript.empty:
        note = await _unserved_note(session, run)
        return f"agentrun {session.namespace}/{args.name} has no stored transcript yet\n{note}"
    text = render_transcript(transcript.messages)
    if transcript.outcome is not None:
        text += f"\nfinished: {transcript.outcome.stop_reason.value}: {transcript.outcome.message}\n"
    return text


async def cmd_trace(session: Session, args: argparse.Namespace) -> str:
    run, transcript = await read_run_transcript(session, args.name, database_url=args.database_url)
    if args.output == "json":
        return json.dumps([row.as_dict() for row in transcript.trace_rows], indent=2) + "\n"
    if not transcript.trace_rows:
        note = await _unserved_note(session, run)
        return f"agentrun {session.namespace}/{args.name} has no iterations recorded yet\n{note}"
    context = transcript.state.get("context") or {}
    return render_trace(transcript.trace_rows, context.get("log") or ())


async def cmd_tree(session: Session, args: argparse.Namespace) -> str:
    """Children live in their parent's namespace: one LIST of every run that has a parent, whatever the
    depth, instead of one request per node."""
    root = await get_run(session, args.name)
    try:
        listing = await session.kube.list_runs(session.namespace, label_selector=LABEL_PARENT_UID)
    except APIStatusError as exc:
        where = f"agentruns in namespace {session.namespace}"
        message = explain(exc, "list", where, missing=NO_RUN_CRD)  # a listing's 404: no CRD
        raise PluginError(message or f"cannot list {where}: {exc}") from exc
    tree = run_tree(root, list(listing.get("items") or []))
    if args.output == "json":
        return json.dumps(tree_json(tree), indent=2) + "\n"
    return render_tree(tree)


async def cmd_cancel(session: Session, args: argparse.Namespace) -> str:
    try:
        await session.kube.patch_run(session.namespace, args.name, {"spec": {"cancel": True}})
    except APIStatusError as exc:
        raise await api_error(session, exc, f"agentrun {session.namespace}/{args.name}") from exc
    return f"agentrun.agentrun.dev/{args.name} cancel requested\n"


def _quota_scope(session: Session, args: argparse.Namespace) -> str:
    return "in all namespaces" if args.all_namespaces else f"in namespace {session.namespace}"


async def cmd_quota(session: Session, args: argparse.Namespace) -> str:
    """Reads the quotas' own status: the ledger the operator keeps, the same for every replica."""
    where = _quota_scope(session, args)
    try:
        quotas = await session.kube.list_quotas(None if args.all_namespaces else session.namespace)
    except APIStatusError as exc:
        message = explain(exc, "list", f"agentrunquotas {where}", missing=NO_QUOTA_CRD)
        raise PluginError(message or f"cannot list agentrunquotas {where}: {exc}") from exc
    if args.output == "json":
        return json.dumps([quota_row(quota) for quota in quotas], indent=2) + "\n"
    if not quotas:
        return f"No AgentRunQuotas found {where}.\n"
    return render_quotas(quotas, namespaces=args.all_namespaces)


def _leases_scope(args: argparse.Namespace) -> str:
    where = args.operator_namespace
    return f"in namespace {where}" if where else "in all namespaces"


async def list_replicas(session: Session, operator_namespace: str | None) -> list[Replica]:
    leases = await session.kube.list_leases(operator_namespace, label_selector=LABEL_REPLICA_GROUP)
    return replicas_of(leases)


async def cmd_operators(session: Session, args: argparse.Namespace) -> str:
    """The replicas' own Leases: who is alive, what each serves, and whether this namespace is served."""
    where = _leases_scope(args)
    try:
        replicas = await list_replicas(session, args.operator_namespace)
    except APIStatusError as exc:
        hint = (
            "; the operator's Leases are in its own namespace: pass --operator-namespace NS"
            if exc.status == 403 and not args.operator_namespace
            else ""
        )
        message = explain(exc, "list", f"leases {where}")
        raise PluginError((message or f"cannot list leases {where}: {exc}") + hint) from exc
    now = dt.datetime.now(dt.UTC)
    if args.output == "json":
        served, sentence = verdict(replicas, session.namespace, now)
        document = {
            "replicas": [replica.as_json(now) for replica in replicas],
            "namespace": session.namespace,
            "served": served,
            "verdict": sentence,
        }
        return json.dumps(document, indent=2) + "\n"
    return render_operators(replicas, session.namespace, now)


async def _unserved_note(session: Session, run: dict[str, Any]) -> str:
    """For a run nobody has written a status for: whether any live operator serves its namespace."""
    if (run.get("status") or {}).get("phase"):
        return ""
    try:
        replicas = await list_replicas(session, None)
    except APIStatusError:
        return ""  # the user may not read Leases: say nothing rather than guess
    served, sentence = verdict(replicas, session.namespace, dt.datetime.now(dt.UTC))
    return "" if served or not replicas else f"{sentence} (kubectl agentrun operators)\n"


def _connection_options(default: Any) -> argparse.ArgumentParser:
    """Accepted before and after the command; `default` SUPPRESS keeps a subcommand from resetting them."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("-n", "--namespace", default=default, help="namespace (default: the context's)")
    options.add_argument(
        "--kubeconfig", default=default, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)"
    )
    options.add_argument("--context", default=default, help="kubeconfig context to use")
    return options


def parser() -> argparse.ArgumentParser:
    common = _connection_options(argparse.SUPPRESS)
    top = argparse.ArgumentParser(
        prog="kubectl agentrun",
        description=(
            "Inspect and steer AgentRuns: transcript, trace, tree, cancel, approve, deny; quota usage."
        ),
        parents=[_connection_options(None)],
    )
    sub = top.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("transcript", "print the run's conversation: turns, tool calls with input, results, errors"),
        ("trace", "print one line per iteration: stop reason, tokens, tools with ok and duration"),
        ("tree", "print the run and its child runs, recursively: agent, phase, stop reason, tokens, cost"),
    ):
        command = sub.add_parser(name, help=help_text, parents=[common])
        command.add_argument("name", help="AgentRun name")
        command.add_argument("-o", "--output", choices=("text", "json"), default="text")
        if name != "tree":
            command.add_argument(
                "--database-url",
                default=None,
                help="PostgreSQL DSN of the transcript store, for runs kept there "
                "(default: AGENTRUN_DATABASE_URL)",
            )
    cancel = sub.add_parser("cancel", help="set spec.cancel: the run stops within seconds", parents=[common])
    cancel.add_argument("name", help="AgentRun name")
    for name, help_text in (
        ("approve", "approve a tool call awaiting approval (the only one when no id is given)"),
        ("deny", "deny a tool call awaiting approval; the model sees the reason as a tool error"),
    ):
        command = sub.add_parser(name, help=help_text, parents=[common])
        command.add_argument("name", help="AgentRun name")
        command.add_argument("tool_use_id", nargs="?", help="tool_use id from status.pendingApprovals")
        command.add_argument("--reason", help="why; the model sees it")
        command.add_argument(
            "--by",
            help="record the decision under this name (default: your user name as the API server "
            "knows it, like `kubectl auth whoami`; with the approval policy only that name is accepted)",
        )
    quota = sub.add_parser(
        "quota",
        help="per AgentRunQuota: window, used/hard of each limit, reservations in flight, lost, refused",
        parents=[common],
    )
    quota.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the quotas of every namespace (ignores -n)"
    )
    quota.add_argument("-o", "--output", choices=("text", "json"), default="text")
    operators = sub.add_parser(
        "operators",
        help="the operator replicas (their Leases), what each serves, whether the namespace is served",
        parents=[common],
    )
    operators.add_argument(
        "--operator-namespace", help="read the Leases of this namespace only (default: every namespace)"
    )
    operators.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return top


COMMANDS = {
    "transcript": cmd_transcript,
    "trace": cmd_trace,
    "tree": cmd_tree,
    "cancel": cmd_cancel,
    "approve": cmd_approve,
    "deny": cmd_deny,
    "quota": cmd_quota,
    "operators": cmd_operators,
}


async def run(args: argparse.Namespace) -> str:
    session = await connect(args.kubeconfig, args.context, args.namespace)
    try:
        # API answers are worded where they happen; this words what never got an answer (no server, TLS).
        action = {
            "transcript": "read the transcript of",
            "trace": "read the trace of",
            "tree": "read the tree of",
        }.get(args.command, args.command)
        if args.command == "quota":
            action, subject = "list", f"agentrunquotas {_quota_scope(session, args)}"
        elif args.command == "operators":
            action, subject = "list", f"leases {_leases_scope(args)}"
        else:
            subject = f"agentrun {session.namespace}/{args.name}"
        with explained(action, subject, access=session.access):
            return await COMMANDS[args.command](session, args)
    finally:
        await session.kube.close()


def main(argv: Sequence[str] | None = None) -> int:
    """As the `kubectl-agentrun` program (no ``argv``), it leaves without the interpreter's teardown."""
    args = parser().parse_args(argv)
    try:
        output = asyncio.run(run(args))
    except KubeFailure as exc:  # PluginError included
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    else:
        sys.stdout.write(output)
        code = 0
    if argv is None:
        leave(code)
    if code:
        raise SystemExit(code)
    return 0


def leave(code: int) -> NoReturn:
    """Exit once the output is written, skipping the interpreter's teardown.

    Why: tearing down the Kubernetes client's modules (kubernetes_asyncio defines about 800 model
    classes) took about 140 ms of every call, a quarter of its time (docs/kubectl-plugin.md). Nothing
    is left to clean up: the client session is closed and the output flushed here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
