"""Log formatting: JSON for machines by default, text for humans (--log-format text)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        # Kopf's per-object loggers carry the object's identity in `k8s_ref`.
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            entry.update({k: v for k, v in ref.items() if k in ("namespace", "name", "uid")})
        for key, value in vars(record).items():
            if (
                key not in _STANDARD
                and key not in ("k8s_ref", "k8s_skip", "settings")
                and not key.startswith("_")
            ):
                entry.setdefault(key, value if isinstance(value, str | int | float | bool) else str(value))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(fmt: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
        handler.formatter.converter = __import__("time").gmtime  # type: ignore[union-attr]
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The SDK and HTTP clients are noisy at INFO and could echo request details.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "anthropic", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
