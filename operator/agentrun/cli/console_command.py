"""`agentrun console`: the web console (agentrun/console/), locally against a kubeconfig or in the
chart's Deployment."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os

from agentrun.cli.service_running import run_service, start_logging, url_host
from agentrun.console.identities import AUTH_MODES
from agentrun.console.serving import Console, ConsoleConfig, serving
from agentrun.kube import kubeconfig_loading

logger = logging.getLogger(__name__)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    con = sub.add_parser(
        "console",
        help="serve the web console: runs, live transcripts and approvals, as the person looking",
    )
    con.add_argument(
        "--kubeconfig", help="kubeconfig to use (default: KUBECONFIG, in-cluster, ~/.kube/config)"
    )
    con.add_argument("--context", help="kubeconfig context")
    con.add_argument(
        "--auth",
        choices=AUTH_MODES,
        default="kubeconfig",
        help="who the API server sees: the kubeconfig's identity (local use, the default), each person's "
        "own token (token), or the person an authenticating proxy names, impersonated (proxy)",
    )
    con.add_argument("--bind-address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    con.add_argument("--port", type=int, default=8090, help="port to listen on (default 8090)")
    con.add_argument("--namespace", "-n", default="", help="namespace the runs page opens on (default: all)")
    con.add_argument(
        "--secure-cookies",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mark the session cookie Secure (default: on, but for --auth kubeconfig on a loopback address)",
    )
    con.add_argument(
        "--database-url",
        default=os.environ.get("AGENTRUN_DATABASE_URL") or None,
        help="the PostgreSQL transcript store's DSN (default: AGENTRUN_DATABASE_URL): shows transcripts kept "
        "there to whoever may list the run's namespace's Secrets",
    )
    con.add_argument(
        "--user-header", default="X-Forwarded-User", help="--auth proxy: the header naming the user"
    )
    con.add_argument(
        "--groups-header", default="X-Forwarded-Groups", help="--auth proxy: the header listing the groups"
    )


def _loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def config_of(args: argparse.Namespace) -> ConsoleConfig:
    local = _loopback(args.bind_address)
    if args.auth == "kubeconfig" and not local:
        raise SystemExit(
            "error: --auth kubeconfig serves everyone who reaches it as the kubeconfig's identity: bind it "
            "to a loopback address, or use --auth token or --auth proxy"
        )
    secure = (
        args.secure_cookies if args.secure_cookies is not None else not (args.auth == "kubeconfig" and local)
    )
    return ConsoleConfig(
        auth=args.auth,
        secure_cookies=secure,
        allowed_hosts=("127.0.0.1", "localhost", "[::1]") if args.auth == "kubeconfig" else (),
        user_header=args.user_header,
        groups_header=args.groups_header,
        namespace=args.namespace,
        database_url=args.database_url,
    )


async def serve(args: argparse.Namespace, config: ConsoleConfig) -> None:
    access = await kubeconfig_loading.load(args.kubeconfig, args.context)
    async with serving(Console.of(access, config), args.bind_address, args.port):
        host = url_host(args.bind_address)
        print(
            f"agentrun console: http://{host}:{args.port}/ (API server {access.server}, auth {config.auth})",
            flush=True,
        )
        await asyncio.Event().wait()


def main(args: argparse.Namespace) -> int:
    start_logging()
    config = config_of(args)
    return run_service(serve(args, config))
