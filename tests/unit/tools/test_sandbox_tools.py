"""`bash` and the text editor as the model uses them, with the real in-pod script run by a real `sh`.

The sandbox here is a directory of this machine instead of a pod: the argv the tools send is
exactly what the pod's exec would run (tools/sandbox/commands.py), so the records that keep a
command from running twice after a crash, the time limit that kills a process group, the output
caps and the editor's base64 chunks are all exercised for real. What needs a kubelet (the pod, the
exec API, the limits) is proven on the real node (tests/node/test_sandbox.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall
from agentrun.tools.sandbox.commands import record_dir
from agentrun.tools.sandbox.pod_exec import ExecResult
from agentrun.tools.sandbox.tools import BashTool, TextEditorTool, sandbox_tools
from tests.unit.tools.environment import LocalSandbox


@pytest.fixture
def sandbox(tmp_path: Path) -> LocalSandbox:
    (tmp_path / "workspace").mkdir()
    return LocalSandbox(tmp_path)


#: A sleep's duration no other process on the machine has (pgrep looks at every process).
UNIQUE = f"30.{secrets.randbelow(10**6):06d}"


def crashed_call(record: Path) -> None:
    """A call's record as the operator left it when it died mid-command: a pid, no exit status."""
    record.mkdir(parents=True)
    (record / "pid").write_text("999999\n")


def call(name: str, key: str = "run:toolu_1", **given: Any) -> ToolCall:
    return ToolCall(key.split(":")[-1], name, given, key, 1)


def test_the_tools_are_the_apis_own_types_sent_by_type_and_name_only(sandbox: LocalSandbox) -> None:
    definitions = [tool.definition.as_api() for tool in sandbox_tools(sandbox)]
    assert definitions == [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]


async def test_a_command_runs_in_the_workspace_with_its_output_and_exit_code(sandbox: LocalSandbox) -> None:
    output = await BashTool(sandbox).call(call("bash", command="pwd; echo oops >&2; exit 3"))
    assert output.content == f"{sandbox.working_dir}\n\n[stderr]\noops\n\n[exit code 3]"
    assert not output.is_error and output.structured["exitCode"] == 3


async def test_a_command_asked_again_with_the_same_key_is_not_run_twice(sandbox: LocalSandbox) -> None:
    bash = BashTool(sandbox)
    first = await bash.call(call("bash", command="echo ran >> count; wc -l < count"))
    again = await bash.call(call("bash", command="echo ran >> count; wc -l < count"))
    assert first.content == "1\n" and again.content.startswith("1\n")
    assert "recorded before the operator restarted" in again.content and again.structured["resumed"]
    assert (Path(sandbox.working_dir) / "count").read_text() == "ran\n"
    other = await bash.call(call("bash", key="run:toolu_2", command="wc -l < count"))
    assert other.content == "1\n"


async def test_a_command_still_running_when_asked_again_is_waited_for_not_started_again(
    sandbox: LocalSandbox,
) -> None:
    bash = BashTool(sandbox)
    command = "sleep 0.5; echo once >> marks; echo done"
    first = asyncio.create_task(bash.call(call("bash", command=command)))
    record = Path(record_dir("run:toolu_1", sandbox.state_dir))
    for _ in range(200):  # until the first run recorded its pid
        if (record / "pid").exists():
            break
        await asyncio.sleep(0.01)
    again = await bash.call(call("bash", command=command))
    assert again.content.startswith("done\n") and again.structured["resumed"]
    assert (await first).content == "done\n"
    assert (Path(sandbox.working_dir) / "marks").read_text() == "once\n"


async def test_a_command_whose_process_ended_without_a_status_is_reported_unknown(
    sandbox: LocalSandbox,
) -> None:
    crashed_call(Path(record_dir("run:toolu_1", sandbox.state_dir)))
    output = await BashTool(sandbox).call(call("bash", command="rm -rf important"))
    assert output.is_error and output.structured["outcome"] == "unknown"
    assert "was not run again" in output.content


async def test_a_command_past_its_time_limit_is_killed_with_the_processes_it_started(
    sandbox: LocalSandbox,
) -> None:
    sandbox.command_timeout_seconds = 1
    output = await BashTool(sandbox).call(
        call("bash", command=f"(sleep {UNIQUE}; echo late > child) & echo started; sleep {UNIQUE}")
    )
    assert output.is_error and output.structured["timedOut"] and output.structured["code"] == "timeout"
    assert output.content.startswith("started\n") and "killed after 1 s" in output.content
    pgrep = await asyncio.create_subprocess_exec(
        "pgrep", "-fx", f"sleep {re.escape(UNIQUE)}", stdout=asyncio.subprocess.PIPE
    )
    survivors, _ = await pgrep.communicate()
    assert survivors.split() == [], "a child of the timed-out command survived"


async def test_long_output_is_cut_and_marked_and_binary_output_is_refused(sandbox: LocalSandbox) -> None:
    bash = BashTool(sandbox)
    long = await bash.call(call("bash", command="head -c 5000 /dev/zero | tr '\\0' a"))
    assert long.content.startswith("a" * 2048 + "\n[stdout cut: 2952 more bytes")
    binary = await bash.call(call("bash", key="run:toolu_2", command="printf 'a\\0b'"))
    assert binary.content.startswith("[stdout: 3 bytes of binary output, not shown")


async def test_an_empty_command_is_a_clear_error_and_restart_says_what_persists(
    sandbox: LocalSandbox,
) -> None:
    with pytest.raises(ToolError, match="non-empty string `command`"):
        await BashTool(sandbox).call(call("bash", command="  "))
    restarted = await BashTool(sandbox).call(call("bash", restart=True))
    assert "files persist between commands" in restarted.content and sandbox.calls == []


async def test_the_editor_creates_views_replaces_and_inserts(sandbox: LocalSandbox) -> None:
    editor = TextEditorTool(sandbox)
    created = await editor.call(
        call(editor.definition.name, command="create", path="src/a.py", file_text="x = 1\ny = 2\n")
    )
    assert created.content.startswith(f"Created {sandbox.working_dir}/src/a.py")
    viewed = await editor.call(
        call(editor.definition.name, command="view", path="src/a.py", view_range=[2, 2])
    )
    assert viewed.content == "     2\ty = 2"
    await editor.call(
        call(
            editor.definition.name,
            key="run:toolu_2",
            command="str_replace",
            path="src/a.py",
            old_str="y = 2",
            new_str="y = 3",
        )
    )
    await editor.call(
        call(
            editor.definition.name,
            key="run:toolu_3",
            command="insert",
            path="src/a.py",
            insert_line=0,
            insert_text="# top",
        )
    )
    assert (Path(sandbox.working_dir) / "src/a.py").read_text() == "# top\nx = 1\ny = 3\n"
    listing = await editor.call(call(editor.definition.name, command="view", path="."))
    assert f"{sandbox.working_dir}/src/a.py" in listing.content


async def test_an_edit_asked_again_after_a_crash_is_made_once_or_said_unknown(sandbox: LocalSandbox) -> None:
    editor = TextEditorTool(sandbox)
    name = editor.definition.name
    notes = Path(sandbox.working_dir) / "notes.txt"
    await editor.call(call(name, key="run:toolu_c", command="create", path="notes.txt", file_text="a\nb\n"))
    insert = call(
        name, key="run:toolu_i", command="insert", path="notes.txt", insert_line=0, insert_text="top"
    )
    first = await editor.call(insert)
    again = await editor.call(insert)  # the resumed run asks the same call again: no second line
    assert notes.read_text() == "top\na\nb\n"
    assert (
        again.content
        == first.content + "\n[this edit was made before the operator restarted; it was made once]"
    )
    replace = call(name, key="run:toolu_r", command="str_replace", path="notes.txt", old_str="b", new_str="c")
    await editor.call(replace)
    assert (await editor.call(replace)).content.startswith("Replaced one occurrence")  # not "no occurrences"
    assert notes.read_text() == "top\na\nc\n"
    # Recorded, then the operator stopped before the file was written: asked again, it is made.
    record = Path(record_dir("run:toolu_x", sandbox.state_dir)) / "edit"
    before, after = notes.read_text(), "top\na\nc\nend\n"
    record.parent.mkdir(parents=True)
    record.write_text(f"{_sha(before)} {_sha(after)}\nInserted 1 line(s) after line 3 of {notes}.")
    late = call(name, key="run:toolu_x", command="insert", path="notes.txt", insert_line=3, insert_text="end")
    assert (await editor.call(late)).content.startswith("Inserted 1 line(s)") and notes.read_text() == after
    # The file changed in another way since the first attempt: not applied again, said so.
    notes.write_text("rewritten by a command\n")
    with pytest.raises(ToolError) as unknown:
        await editor.call(late)
    assert unknown.value.code == "outcome_unknown" and notes.read_text() == "rewritten by a command\n"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_a_file_larger_than_one_argument_crosses_in_chunks_unchanged(sandbox: LocalSandbox) -> None:
    editor = TextEditorTool(sandbox)
    text = "".join(f"line {n} ünïcode\n" for n in range(30000))  # about 600 KB: several chunks
    await editor.call(call(editor.definition.name, command="create", path="big.txt", file_text=text))
    assert (Path(sandbox.working_dir) / "big.txt").read_text() == text
    assert not (Path(sandbox.working_dir) / "big.txt.agentrun-tmp").exists()


async def test_a_replacement_that_is_not_unique_or_a_binary_file_is_a_clear_error(
    sandbox: LocalSandbox,
) -> None:
    editor = TextEditorTool(sandbox)
    (Path(sandbox.working_dir) / "twice.txt").write_text("a\na\n")
    with pytest.raises(ToolError, match="2 occurrences of old_str"):
        await editor.call(
            call(editor.definition.name, command="str_replace", path="twice.txt", old_str="a", new_str="b")
        )
    (Path(sandbox.working_dir) / "blob").write_bytes(b"\0\1\2")
    with pytest.raises(ToolError, match="binary file"):
        await editor.call(call(editor.definition.name, command="view", path="blob"))
    with pytest.raises(ToolError, match="No such file"):
        await editor.call(call(editor.definition.name, command="view", path="missing.txt"))
    with pytest.raises(ToolError, match="unknown command 'undo_edit'"):
        await editor.call(call(editor.definition.name, command="undo_edit", path="twice.txt"))


async def test_a_command_killed_before_its_time_limit_is_told_apart_from_a_timeout(
    sandbox: LocalSandbox,
) -> None:
    output = await BashTool(sandbox).call(call("bash", command="echo big; kill -9 $$"))
    assert not output.is_error and not output.structured["timedOut"]
    assert output.content.startswith("big\n")
    assert output.content.endswith(
        "[exit code 137: killed by SIGKILL before its time limit, most likely for using more memory "
        "than the sandbox's limit]"
    )


async def test_a_command_during_which_the_kernel_killed_for_memory_says_so_with_the_limit(
    sandbox: LocalSandbox,
) -> None:
    counter = sandbox.root / "memory.events"
    counter.write_text("oom 0\noom_kill 3\n")
    bomb = f"echo hog; printf 'oom 2\\noom_kill 5\\n' >{counter}; kill -9 $$"
    output = await BashTool(sandbox).call(call("bash", command=bomb))
    assert output.is_error and output.structured["code"] == "oom_killed"
    assert output.structured["oomKills"] == 2 and output.structured["exitCode"] == 137
    assert output.content == (
        "hog\n\n[exit code 137: the kernel's OOM killer killed 2 process(es) of the sandbox while this "
        "command ran: the sandbox's memory limit is 64Mi]"
    )
    # A child killed while the command itself went on and exited 0 is reported too.
    child = f"printf 'oom_kill 6\\n' >{counter}; echo done"
    survived = await BashTool(sandbox).call(call("bash", key="run:toolu_2", command=child))
    assert survived.is_error and survived.structured["oomKills"] == 1 and survived.structured["exitCode"] == 0
    assert survived.content.endswith(
        "[the kernel's OOM killer killed 1 process(es) of the sandbox while "
        "this command ran: the sandbox's memory limit is 64Mi]"
    )
    asked_again = await BashTool(sandbox).call(call("bash", command=bomb))
    assert asked_again.structured["oomKills"] == 2 and asked_again.structured["resumed"]


async def test_an_edited_script_stays_executable(sandbox: LocalSandbox) -> None:
    editor = TextEditorTool(sandbox)
    script = Path(sandbox.working_dir) / "run.sh"
    await editor.call(call(editor.definition.name, command="create", path="run.sh", file_text="echo one\n"))
    await BashTool(sandbox).call(call("bash", command="chmod 750 run.sh"))
    await editor.call(
        call(editor.definition.name, command="str_replace", path="run.sh", old_str="one", new_str="two")
    )
    ran = await BashTool(sandbox).call(call("bash", key="run:toolu_2", command="./run.sh"))
    assert ran.content == "two\n" and oct(script.stat().st_mode & 0o777) == "0o750"


async def test_a_command_killed_early_takes_what_it_left_running_and_goes_first_when_memory_runs_out(
    sandbox: LocalSandbox,
) -> None:
    bash = BashTool(sandbox)
    score = await bash.call(call("bash", command="cat /proc/self/oom_score_adj"))
    assert score.content == "1000\n"  # the OOM killer takes the command, not the shells that record it
    killed = await bash.call(
        call("bash", key="run:toolu_2", command=f"sleep {UNIQUE}1 & echo left; kill -9 $$")
    )
    assert killed.content.startswith("left\n") and killed.structured["exitCode"] == 137
    pgrep = await asyncio.create_subprocess_exec(
        "pgrep", "-fx", f"sleep {re.escape(UNIQUE)}1", stdout=asyncio.subprocess.PIPE
    )
    survivors, _ = await pgrep.communicate()
    assert survivors.split() == [], "a process the killed command started survived it"


class KilledShellSandbox(LocalSandbox):
    """A pod whose exec shell the OOM killer took: exit 137, not a byte of the script's answer."""

    async def exec(self, argv: Sequence[str], *, timeout: float) -> ExecResult:
        return ExecResult(b"", b"", 137)


async def test_a_sandbox_shell_killed_mid_command_says_the_outcome_is_unknown_not_that_the_image_is_wrong(
    tmp_path: Path,
) -> None:
    with pytest.raises(ToolError) as raised:
        await BashTool(KilledShellSandbox(tmp_path)).call(call("bash", command="make"))
    assert raised.value.code == "sandbox_failed"
    assert "exit 137" in raised.value.message and "outcome is unknown" in raised.value.hint
    assert "needs sh and coreutils" not in raised.value.hint
