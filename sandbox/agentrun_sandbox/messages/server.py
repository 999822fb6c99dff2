"""The fake Messages API as a child process: prints ``READY <url>`` once it listens, serves until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script_files import load_scripts

__all__ = ["main"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun_sandbox.messages.server",
        description="Serve the scripted fake Anthropic Messages API until SIGTERM; prints 'READY <url>'.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument(
        "--script", action="append", default=[], metavar="FILE", help="YAML/JSON script file; repeatable"
    )
    parser.add_argument(
        "--latency", type=float, default=0.0, metavar="SECONDS", help="delay before every reply"
    )
    parser.add_argument("--require-api-key", default=None, metavar="KEY", help="answer 401 to any other key")
    parser.add_argument("--no-demo-brain", action="store_true", help="answer 400 when no script matches")
    parser.add_argument("--access-log", action="store_true", help="log every request to stderr")
    parser.add_argument(
        "--prompt-cache", action="store_true", help="keep prompt caching as the real API does"
    )
    return parser.parse_args(argv)


async def _serve_until_signalled(api: FakeMessagesAPI, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with api.running(host, port):
        print(f"READY {api.url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        scripts = [script for path in args.script for script in load_scripts(path)]
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.access_log:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    api = FakeMessagesAPI(
        scripts,
        require_api_key=args.require_api_key,
        latency_seconds=args.latency,
        demo_brain=not args.no_demo_brain,
        access_log=args.access_log,
        prompt_cache=args.prompt_cache,
    )
    asyncio.run(_serve_until_signalled(api, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
