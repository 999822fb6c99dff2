"""The scripted conversation every loop contender runs: N tool turns of K calls each, then an answer.

The fake Messages API picks the step from the number of assistant messages in the request, so one script
serves every framework, and each request of a conversation has the same size whoever sends it (up to the
frameworks' own tool descriptions). Tool inputs differ per turn so loop detection never fires.
"""

from __future__ import annotations

from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block

MODEL = "claude-haiku-4-5"
MAX_TOKENS = 1024
API_KEY = "sk-ant-bench-0000"
TOOL_NAMES = ("lookup", "convert", "check")
TOOL_DESCRIPTION = "Returns a short fact about the item named by q (benchmark tool, answers instantly)."


def task(marker: str) -> str:
    return f"{marker} For every step, look up, convert and check the items I name, then summarise."


def tool_answer(name: str, q: str) -> str:
    """What every framework's tool returns: deterministic, small and different per call."""
    return f"{name}({q}) = ok"


def tool_turns_script(
    marker: str,
    *,
    turns: int,
    calls: int,
    tool_names: tuple[str, ...] = TOOL_NAMES,
    text: str = "Working on it.",
) -> Script:
    """``turns`` replies with ``calls`` tool_use blocks each (tools taken round-robin), then an end_turn."""
    steps: list[Reply] = []
    for turn in range(turns):
        blocks = [text_block(text)]
        for call in range(calls):
            name = tool_names[call % len(tool_names)]
            blocks.append(tool_use_block(name, {"q": f"t{turn}-c{call}"}))
        steps.append(Reply(blocks, usage=ScriptUsage(400 + 60 * turn, 40)))
    steps.append(Reply([text_block("All items checked; everything is ok.")], usage=ScriptUsage(1000, 12)))
    return Script(marker, steps)
