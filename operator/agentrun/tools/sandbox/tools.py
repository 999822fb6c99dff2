"""The Messages API's own `bash` and text editor tools, acting in the run's sandbox pod.

Why the API's tool types rather than look-alikes: the models are trained on them (their schema is
the API's, not ours), so the request carries only the type and name. The operator checks the input
itself, because nothing else does.

Every `bash` command starts a new shell in the workspace (commands.py records it in the pod so a
crash never runs it twice); what lasts between calls is the workspace's files, not the shell's
variables or directory, which the result says when the model asks for a restart. Files for the text
editor cross in the exec's argv as base64, in chunks below the kernel's limit for one argument, so
the sandbox image needs only sh and coreutils.
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.tools.sandbox.commands import (
    CommandOutcome,
    ScriptFailed,
    command_argv,
    parse_outcome,
    record_dir,
)
from agentrun.tools.sandbox.pod_exec import ExecResult

__all__ = ["BashTool", "Sandbox", "TextEditorTool", "sandbox_tools"]

BASH_TYPE = "bash_20250124"
EDITOR_TYPE = "text_editor_20250728"
EDITOR_NAME = "str_replace_based_edit_tool"
# The input tokens the API adds per request for each tool, as its documentation states them.
BASH_PROMPT_TOKENS = 245
EDITOR_PROMPT_TOKENS = 700
ARG_CHUNK = 96 * 1024  # base64 characters per argument: below Linux's 128 KiB for one argv string
MAX_FILE_BYTES = 4 * 1024 * 1024  # what the editor reads or writes at most
EXEC_MARGIN_SECONDS = 30.0  # beyond a command's own limit, for the exec round trip


class Sandbox(Protocol):
    """The run's sandbox pod as the tools use it (pods.py): created on first use."""

    @property
    def working_dir(self) -> str: ...

    @property
    def command_timeout_seconds(self) -> int: ...

    @property
    def output_limit_bytes(self) -> int: ...

    @property
    def state_dir(self) -> str:
        """Where the pod keeps the calls' records (commands.STATE_DIR in the sandbox pod)."""
        ...

    @property
    def oom_counters(self) -> tuple[str, ...]:
        """Files that may hold the container's OOM kill count (commands.OOM_COUNTERS in a pod)."""
        ...

    @property
    def memory_limit(self) -> str:
        """The sandbox's memory limit as declared (a quantity), for the model's OOM message."""
        ...

    async def exec(self, argv: Sequence[str], *, timeout: float) -> ExecResult:
        """Runs argv in the sandbox container; raises ToolError when the pod cannot be reached."""
        ...


def sandbox_tools(sandbox: Sandbox) -> list[BashTool | TextEditorTool]:
    return [BashTool(sandbox), TextEditorTool(sandbox)]


def _text(raw: bytes, total: int, limit: int, stream: str) -> str:
    if b"\0" in raw:
        return f"[{stream}: {total} bytes of binary output, not shown; write it to a file and inspect it]"
    text = raw.decode("utf-8", "replace")
    if total > len(raw):
        text += f"\n[{stream} cut: {total - len(raw)} more bytes; at most {limit} are shown]"
    return text


class BashTool:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self.definition = ToolDefinition(
            name="bash",
            description="Runs a shell command in the run's sandbox pod.",
            input_schema={
                "type": "object",
                "properties": {"command": {"type": "string"}, "restart": {"type": "boolean"}},
            },
            api_type=BASH_TYPE,
            api_prompt_tokens=BASH_PROMPT_TOKENS,
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        if call.input.get("restart") is True:
            return ToolOutput(
                "The shell was restarted. (Each command runs in a new shell in the workspace; files "
                "persist between commands, variables and the current directory do not.)"
            )
        command = call.input.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("invalid_input", "bash needs a non-empty string `command` (or `restart: true`)")
        sandbox = self._sandbox
        started = time.monotonic()
        argv = command_argv(
            command,
            idempotency_key=call.idempotency_key,
            timeout_seconds=sandbox.command_timeout_seconds,
            output_limit=sandbox.output_limit_bytes,
            working_dir=sandbox.working_dir,
            state_dir=sandbox.state_dir,
            oom_counters=sandbox.oom_counters,
        )
        result = await sandbox.exec(argv, timeout=sandbox.command_timeout_seconds + EXEC_MARGIN_SECONDS)
        try:
            outcome = parse_outcome(result)
        except ScriptFailed as exc:
            raise ToolError("sandbox_failed", str(exc), hint=exc.hint) from None
        return self._output(outcome, time.monotonic() - started)

    def _output(self, outcome: CommandOutcome, seconds: float) -> ToolOutput:
        limit = self._sandbox.output_limit_bytes
        structured: dict[str, Any] = {"exitCode": outcome.exit_code, "seconds": round(seconds, 3)}
        if outcome.exit_code is None:
            return ToolOutput(
                "Outcome unknown: this command was already started before the operator restarted, and "
                "its process ended without recording an exit status. It was not run again; check its "
                "effects (files, processes) before running it again.",
                is_error=True,
                structured={**structured, "outcome": "unknown"},
            )
        parts = []
        if outcome.stdout_bytes:
            parts.append(_text(outcome.stdout, outcome.stdout_bytes, limit, "stdout"))
        if outcome.stderr_bytes:
            parts.append("[stderr]\n" + _text(outcome.stderr, outcome.stderr_bytes, limit, "stderr"))
        oom = (
            f"the kernel's OOM killer killed {outcome.oom_kills} process(es) of the sandbox while this "
            f"command ran: the sandbox's memory limit is {self._sandbox.memory_limit}"
        )
        if outcome.timed_out:
            parts.append(
                f"[killed after {self._sandbox.command_timeout_seconds} s, the command's time limit, "
                "with every process it started]"
            )
            if outcome.oom_kills:
                parts.append(f"[{oom}]")
        elif outcome.oom_kills:
            parts.append(f"[exit code {outcome.exit_code}: {oom}]" if outcome.exit_code else f"[{oom}]")
        elif outcome.killed:
            parts.append(
                "[exit code 137: killed by SIGKILL before its time limit, most likely for using more "
                "memory than the sandbox's limit]"
            )
        elif outcome.exit_code:
            parts.append(f"[exit code {outcome.exit_code}]")
        if outcome.resumed:
            parts.append("[this result was recorded before the operator restarted; the command ran once]")
        # Counted as agentrun_tool_calls_total{outcome="timeout"} and {outcome="oom_killed"}.
        if outcome.timed_out:
            structured |= {
                "code": "timeout",
                "message": f"killed after {self._sandbox.command_timeout_seconds} s",
            }
        elif outcome.oom_kills:
            structured |= {"code": "oom_killed", "message": oom}
        return ToolOutput(
            "\n".join(parts) or "(no output)",
            is_error=outcome.timed_out or outcome.oom_kills > 0,
            structured={
                **structured,
                "timedOut": outcome.timed_out,
                "oomKills": outcome.oom_kills,
                "resumed": outcome.resumed,
            },
        )


class TextEditorTool:
    """view, create, str_replace and insert (the 2025-07-28 version has no undo_edit)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self.definition = ToolDefinition(
            name=EDITOR_NAME,
            description="Views, creates and edits files in the run's sandbox pod.",
            input_schema={
                "type": "object",
                "properties": {"command": {"type": "string"}, "path": {"type": "string"}},
                "required": ["command", "path"],
            },
            api_type=EDITOR_TYPE,
            api_prompt_tokens=EDITOR_PROMPT_TOKENS,
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        command, path = call.input.get("command"), call.input.get("path")
        if not isinstance(path, str) or not path:
            raise ToolError("invalid_input", "`path` must be a non-empty string")
        path = posixpath.normpath(posixpath.join(self._sandbox.working_dir, path))
        if command == "view":
            return await self._view(path, call.input)
        if command == "create":
            text = _string(call.input, "file_text")
            await self._write(path, text)
            return ToolOutput(f"Created {path} ({len(text.encode())} bytes).")
        if command == "str_replace":
            return await self._replace(
                call.idempotency_key, path, _string(call.input, "old_str"), _string(call.input, "new_str", "")
            )
        if command == "insert":
            return await self._insert(call.idempotency_key, path, call.input)
        raise ToolError(
            "invalid_input", f"unknown command {command!r}: use view, create, str_replace or insert"
        )

    async def _run(self, script: str, *args: str) -> ExecResult:
        result = await self._sandbox.exec(["sh", "-c", script, "agentrun-editor", *args], timeout=60)
        if result.exit_code != 0:
            said = result.stderr.decode("utf-8", "replace").strip()[:500]
            raise ToolError("file_error", said or f"the sandbox answered exit code {result.exit_code}")
        return result

    async def _read(self, path: str) -> str:
        script = 'if [ -d "$1" ]; then echo "$1 is a directory" >&2; exit 2; fi; head -c "$2" -- "$1"'
        raw = (await self._run(script, path, str(MAX_FILE_BYTES + 1))).stdout
        if len(raw) > MAX_FILE_BYTES:
            raise ToolError("file_too_large", f"{path} is larger than {MAX_FILE_BYTES} bytes: use bash")
        if b"\0" in raw:
            raise ToolError("binary_file", f"{path} is a binary file: the editor shows text only")
        return raw.decode("utf-8", "replace")

    async def _write(self, path: str, text: str) -> None:
        encoded = base64.b64encode(text.encode()).decode("ascii")
        if len(encoded) > MAX_FILE_BYTES * 4 // 3 + 4:
            raise ToolError("file_too_large", f"at most {MAX_FILE_BYTES} bytes per file: use bash")
        chunks = [encoded[i : i + ARG_CHUNK] for i in range(0, len(encoded), ARG_CHUNK)] or [""]
        temporary = f"{path}.agentrun-tmp"
        for index, chunk in enumerate(chunks):
            redirect = ">" if index == 0 else ">>"
            script = f'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" | base64 -d {redirect} "$1"'
            await self._run(script, temporary, chunk)
        # An edited file keeps its mode (a script stays executable).
        await self._run(
            'if [ -e "$2" ]; then chmod --reference="$2" -- "$1"; fi; mv -f -- "$1" "$2"', temporary, path
        )

    async def _view(self, path: str, given: Mapping[str, Any]) -> ToolOutput:
        listing = await self._sandbox.exec(
            [
                "sh",
                "-c",
                '[ -d "$1" ] && find "$1" -maxdepth 2 -not -path "*/.*" | sort | head -n 1000',
                "x",
                path,
            ],
            timeout=60,
        )
        if listing.exit_code == 0 and listing.stdout:
            return ToolOutput(listing.stdout.decode("utf-8", "replace"))
        lines = (await self._read(path)).split("\n")
        first, last = 1, len(lines)
        view_range = given.get("view_range")
        if view_range is not None:
            if not (
                isinstance(view_range, list)
                and len(view_range) == 2
                and all(isinstance(n, int) for n in view_range)
            ):
                raise ToolError(
                    "invalid_input", "view_range must be [first, last] line numbers (last -1: to the end)"
                )
            first, last = view_range[0], len(lines) if view_range[1] == -1 else view_range[1]
            if not 1 <= first <= max(last, 1) or last > len(lines):
                raise ToolError(
                    "invalid_input", f"view_range {view_range} is outside the file's {len(lines)} lines"
                )
        text = "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(first, last + 1))
        limit = given.get("max_characters")
        if isinstance(limit, int) and limit > 0 and len(text) > limit:
            text = text[:limit] + f"\n[cut at {limit} characters]"
        return ToolOutput(text)

    async def _replace(self, key: str, path: str, old: str, new: str) -> ToolOutput:
        if not old:
            raise ToolError("invalid_input", "old_str must not be empty")
        text = await self._read(path)
        done = await self._done_before(key, path, text)
        if done is not None:
            return done
        found = text.count(old)
        if found != 1:
            where = "no" if found == 0 else f"{found}"
            raise ToolError(
                "no_unique_match",
                f"{where} occurrences of old_str in {path}; it must match exactly one place "
                "(add context lines)",
            )
        line = text[: text.index(old)].count("\n") + 1
        said = f"Replaced one occurrence in {path} at line {line}."
        await self._edit(key, path, text, text.replace(old, new, 1), said)
        return ToolOutput(said)

    async def _insert(self, key: str, path: str, given: Mapping[str, Any]) -> ToolOutput:
        at = given.get("insert_line")
        inserted = given.get("insert_text", given.get("new_str"))
        if not isinstance(at, int) or not isinstance(inserted, str):
            raise ToolError("invalid_input", "insert needs insert_line (a number) and insert_text (a string)")
        text = await self._read(path)
        done = await self._done_before(key, path, text)
        if done is not None:
            return done
        lines = text.split("\n")
        if not 0 <= at <= len(lines):
            raise ToolError("invalid_input", f"insert_line {at} is outside the file's {len(lines)} lines")
        lines[at:at] = inserted.split("\n")
        said = f"Inserted {inserted.count(chr(10)) + 1} line(s) after line {at} of {path}."
        await self._edit(key, path, text, "\n".join(lines), said)
        return ToolOutput(said)

    # An edit asked again after an operator crash must not be applied twice (an insert would add its
    # lines again): before writing, the pod records the file's digest before and after the edit under
    # the call's key. Asked again, the file's digest says whether the first attempt wrote it.

    def _edit_record(self, key: str) -> str:
        return f"{record_dir(key, self._sandbox.state_dir)}/edit"

    async def _done_before(self, key: str, path: str, text: str) -> ToolOutput | None:
        """None when this call has to make its edit; its recorded answer when it made it already."""
        record = (await self._run('cat -- "$1" 2>/dev/null || :', self._edit_record(key))).stdout
        if not record:
            return None
        digests, _, said = record.decode("utf-8", "replace").partition("\n")
        before, _, after = digests.partition(" ")
        now = _digest(text)
        if now == after:
            return ToolOutput(f"{said}\n[this edit was made before the operator restarted; it was made once]")
        if now == before:
            return None  # recorded, then the operator stopped before writing the file
        raise ToolError(
            "outcome_unknown",
            f"this edit of {path} was begun before the operator restarted, and the file has changed "
            "since in another way: it was not applied again",
            hint="view the file and edit it again if needed",
        )

    async def _edit(self, key: str, path: str, before: str, after: str, said: str) -> None:
        record = self._edit_record(key)
        await self._run(
            'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" >"$1.tmp" && mv -f -- "$1.tmp" "$1"',
            record,
            f"{_digest(before)} {_digest(after)}\n{said}",
        )
        await self._write(path, after)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _string(given: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = given.get(key, default)
    if not isinstance(value, str):
        raise ToolError("invalid_input", f"`{key}` must be a string")
    return value
