"""Log formatting: JSON lines for machines by default, text for humans (--log-format text).

Every line logged while a run executes carries that run's namespace, name, uid and current
iteration, whichever module logs it (the loop, a tool, the SDK adapter): the run service binds a
`RunLogContext` in a context variable, which asyncio copies into every task the run spawns, and a
filter on the handler copies it onto each record. Kopf's per-object loggers add the same identity
through `k8s_ref`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_INTERNAL = {"k8s_ref", "k8s_skip", "settings", "runref"}
_NOT_EXTRA = frozenset(_STANDARD | _INTERNAL | {"run"})
RUN_FIELDS = ("namespace", "name", "uid", "iteration")


@dataclass
class RunLogContext:
    """Mutable on purpose: the iteration advances, and child tasks share this one object."""

    namespace: str
    name: str
    uid: str
    iteration: int = 0


_run: contextvars.ContextVar[RunLogContext | None] = contextvars.ContextVar("agentrun_run", default=None)


@contextlib.contextmanager
def bound_run(context: RunLogContext) -> Iterator[RunLogContext]:
    token = _run.set(context)
    try:
        yield context
    finally:
        _run.reset(token)


def current_run() -> RunLogContext | None:
    return _run.get()


class RunContextFilter(logging.Filter):
    """Puts the run's identity on each record as `record.run` (a snapshot: the iteration moves on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        run: dict[str, Any] = {}
        context = _run.get()
        if context is not None:
            run = {key: getattr(context, key) for key in RUN_FIELDS}
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            run.update({k: ref[k] for k in ("namespace", "name", "uid") if ref.get(k) is not None})
        explicit = record.__dict__.get("iteration")
        if isinstance(explicit, int) and run:
            run["iteration"] = explicit
        if run:
            record.run = run
        return True


class JSONFormatter(logging.Formatter):
    """One JSON object per line. A line per iteration per run is the operator's busiest output, so the
    time's seconds are formatted once per second and only a record's extra fields are walked."""

    converter = time.gmtime  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        cached, stamp = self._second
        if second != cached:
            stamp = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
            self._second = (second, stamp)
        entry: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = record.__dict__
        run = fields.get("run")
        if isinstance(run, dict):
            entry.update(run)
        if fields.keys() - _NOT_EXTRA:
            for key, value in fields.items():
                if key not in _NOT_EXTRA and not key.startswith("_"):
                    entry.setdefault(
                        key, value if isinstance(value, str | int | float | bool) else str(value)
                    )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """`time level logger [namespace/name #iteration] message`, for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(runref)s%(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's API)
        run = record.__dict__.get("run")
        runref = ""
        if isinstance(run, dict) and run.get("name"):
            runref = f"[{run.get('namespace')}/{run['name']}"
            runref += f" #{run['iteration']}] " if run.get("iteration") else "] "
        record.runref = runref
        return super().formatMessage(record)


def lean_records() -> None:
    """Records without the fields no line of ours shows: the caller's file, line and function (a walk up
    the stack per record), and the thread, process and multiprocessing names. About a quarter of a
    line's cost; for the operator process, which logs a line per iteration of every run."""
    logging._srcfile = None  # documented in the logging HOWTO's "Optimization"
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def configure(fmt: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RunContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The SDK and HTTP clients are noisy at INFO and could echo request details.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "anthropic", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Kopf's per-object INFO lines are one "Handler 'agentrun_event' succeeded." per watch event: a
    # line per run per status write, formatting CPU at scale and no news. DEBUG keeps them.
    quiet = root.level >= logging.INFO
    logging.getLogger("kopf.objects").setLevel(max(root.level, logging.WARNING) if quiet else logging.NOTSET)
