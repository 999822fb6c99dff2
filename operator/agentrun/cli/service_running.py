"""What `agentrun console` and `agentrun a2a` share as long-running HTTP services: log lines, the URL
they print, and one way to end (Ctrl-C is a clean exit; an unreachable cluster or a taken port is one
line on stderr and exit 1, never a traceback)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from agentrun.kube.failures import KubeFailure


def start_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def url_host(bind_address: str) -> str:
    """The bind address as a URL's host: an IPv6 address in brackets."""
    return f"[{bind_address}]" if ":" in bind_address else bind_address


def run_service(service: Coroutine[Any, Any, None]) -> int:
    try:
        asyncio.run(service)
    except KeyboardInterrupt:
        return 0
    except (KubeFailure, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
