"""One `bash` command in the sandbox, recorded in the pod so that no crash runs it twice.

Why a record per call: the operator may die (SIGKILL, a lost Lease) while a command runs. Whoever
resumes the run asks for the same tool_use again, with the same idempotency key. The pod keeps, per
key, the command's pid, its output and (once it ended) its exit status, under a directory of the
pod's own (`STATE_DIR`, an emptyDir the commands do not start in). Asked again, the script does not
run the command again: it waits for the earlier process if it is still running, then reports what
it recorded, or says the outcome is unknown when the process is gone without a status.

Why `timeout -s KILL`: GNU timeout runs the command in a process group of its own and signals the
whole group, so a command past its limit takes its children with it.

Why the command's processes get an OOM score of 1000, and its group is killed after any SIGKILL:
on a real node a command past the memory limit is killed by the kernel inside the pod, which picks
the process with the highest score. Without that, a fork bomb of small processes had the OOM killer
take the exec's own shell or this script (the call then ended with no record) and leave the bomb's
processes holding the memory, so every later command was killed at once. The score makes the
command's processes go first (a process may raise its own score without privileges); the group kill
then removes what a killed command left running, so the memory is free for the next command.

Why the container's own OOM counter is read before and after: an exit 137 before the time limit is
only a guess at an OOM kill (a command may `kill -9` itself), and a fork bomb's killed children do not
show in the command's exit status at all. The kernel counts the OOM kills of the container's memory
cgroup (`oom_kill` in memory.events under cgroup v2, memory.oom_control under v1, both readable
without privileges in the container), so a rise during the command says it was the memory limit.
Commands running at the same time in the same sandbox share the counter: a kill is then reported by
each of them (the dispatcher runs a turn's calls concurrently).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from agentrun.tools.sandbox.pod_exec import ExecResult

__all__ = ["OOM_COUNTERS", "STATE_DIR", "CommandOutcome", "command_argv", "parse_outcome"]

STATE_DIR = "/agentrun"
#: Where a container reads its memory cgroup's count of OOM kills (cgroup v2, then v1); the first
#: readable one is used, and none readable (gVisor, an old kernel) means no count.
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
KILLED = 137  # 128 + SIGKILL: the time limit's kill, or the OOM killer's

# $1 record dir, $2 seconds, $3 output limit (bytes), $4 working dir, $5 the command, $6... the files
# that may hold the container's OOM kill count.
_SCRIPT = r"""
d=$1; t=$2; lim=$3; cwd=$4; cmd=$5; shift 5
ooms() {
  for f in "$@"; do
    [ -r "$f" ] || continue
    while read -r k v; do [ "$k" = oom_kill ] && { echo "$v"; return; }; done <"$f"
  done
}
mkdir -p "${d%/*}" || exit 90
if mkdir "$d" 2>/dev/null; then
  mode=ran
  (
    cd "$cwd" || exit 91
    start=$(date +%s)
    before=$(ooms "$@")
    timeout -s KILL "$t" sh -c 'echo 1000 >/proc/self/oom_score_adj 2>/dev/null; exec sh -c "$1"' sh "$cmd" \
      >"$d/out" 2>"$d/err" </dev/null &
    group=$!
    wait "$group"
    rc=$?
    if [ "$rc" = 137 ]; then
      kill -s KILL -- "-$group" 2>/dev/null
      [ $(($(date +%s) - start)) -ge "$t" ] && : >"$d/timedout"
    fi
    after=$(ooms "$@")
    if [ -n "$before" ] && [ -n "$after" ] && [ "$after" -gt "$before" ]; then
      echo $((after - before)) >"$d/oom"
    fi
    echo "$rc" >"$d/exit.tmp" && mv "$d/exit.tmp" "$d/exit"
  ) &
  echo $! >"$d/pid"
  wait
else
  mode=resumed
  pid=$(cat "$d/pid" 2>/dev/null)
  while [ ! -f "$d/exit" ] && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
fi
if [ ! -f "$d/exit" ]; then echo "agentrun $mode unknown"; exit 0; fi
how=exited; [ -f "$d/timedout" ] && how=timedout
oom=0; [ -f "$d/oom" ] && oom=$(cat "$d/oom")
echo "agentrun $mode $(cat "$d/exit") $(wc -c <"$d/out") $(wc -c <"$d/err") $how $oom"
head -c "$lim" "$d/out"
head -c "$lim" "$d/err" >&2
"""


def record_dir(idempotency_key: str, state_dir: str = STATE_DIR) -> str:
    """The call's record directory: the key hashed, so any key is a safe file name."""
    return f"{state_dir}/calls/{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]}"


def command_argv(
    command: str,
    *,
    idempotency_key: str,
    timeout_seconds: int,
    output_limit: int,
    working_dir: str,
    state_dir: str = STATE_DIR,
    oom_counters: tuple[str, ...] = OOM_COUNTERS,
) -> list[str]:
    return [
        "sh",
        "-c",
        _SCRIPT,
        "agentrun-command",
        record_dir(idempotency_key, state_dir),
        str(timeout_seconds),
        str(output_limit),
        working_dir,
        command,
        *oom_counters,
    ]


@dataclass(frozen=True)
class CommandOutcome:
    """What the pod recorded of one command."""

    resumed: bool  # asked again after a crash: the status comes from the first run's record
    exit_code: int | None  # None: the outcome is unknown (the process ended without a status)
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_bytes: int = 0  # the whole output's size; more than len(stdout) when it was cut
    stderr_bytes: int = 0
    timed_out: bool = False  # killed at its time limit (an OOM kill also exits 137, but early)
    oom_kills: int = 0  # processes the kernel's OOM killer took in the container while it ran

    @property
    def killed(self) -> bool:
        """Ended by SIGKILL before its time limit: in a sandbox, most likely the OOM killer."""
        return self.exit_code == KILLED and not self.timed_out


class ScriptFailed(Exception):
    """The pod did not run the script as expected (no sh, no coreutils, a full disk, the OOM killer)."""

    def __init__(self, message: str, hint: str = "the sandbox image needs sh and coreutils") -> None:
        super().__init__(message)
        self.hint = hint


def parse_outcome(result: ExecResult) -> CommandOutcome:
    header, _, stdout = result.stdout.partition(b"\n")
    words = header.decode("ascii", "replace").split()
    if len(words) < 3 or words[0] != "agentrun" or words[1] not in ("ran", "resumed"):
        said = (result.stderr or result.stdout)[:500].decode("utf-8", "replace").strip()
        message = f"the sandbox could not run the command (exit {result.exit_code}): {said or 'no output'}"
        if result.exit_code == KILLED:
            raise ScriptFailed(
                message,
                hint="the shell that runs commands in the sandbox was killed, most likely for lack of "
                "memory: the command's outcome is unknown; check what it did before running it again",
            )
        raise ScriptFailed(message)
    resumed = words[1] == "resumed"
    if words[2] == "unknown":
        return CommandOutcome(resumed=resumed, exit_code=None)
    try:
        code, out_bytes, err_bytes = (int(w) for w in words[2:5])
    except ValueError as exc:
        raise ScriptFailed(f"the sandbox answered an unreadable status line: {header[:200]!r}") from exc
    timed_out = len(words) > 5 and words[5] == "timedout"
    oom_kills = int(words[6]) if len(words) > 6 and words[6].isdigit() else 0
    return CommandOutcome(resumed, code, stdout, result.stderr, out_bytes, err_bytes, timed_out, oom_kills)
