"""The Dockerfile's structure (no Docker engine runs here, so the image itself is not built)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

import pytest

from tests.chart.tooling import REPO

OCI_LABELS = {"title", "description", "version", "revision", "created", "licenses", "source"}
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3?-dev|libc6?-dev|apt-get|apk)\b")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    parsed = []
    for line in logical:
        name, _, args = line.strip().partition(" ")
        parsed.append((name.upper(), args.strip()))
    return parsed


def stages() -> list[Stage]:
    result: list[Stage] = []
    for name, args in instructions((REPO / "Dockerfile").read_text()):
        if name == "FROM":
            words = args.split()
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(words[0], alias))
        elif result:
            result[-1].instructions.append((name, args))
    return result


def final() -> Stage:
    return stages()[-1]


def labels(stage: Stage) -> dict[str, str]:
    found: dict[str, str] = {}
    for args in stage.all("LABEL"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            found[key] = value
    return found


def test_dockerfile_has_a_named_builder_stage_and_a_final_stage_on_python_3_11_slim() -> None:
    found = stages()
    assert len(found) >= 2, "a multi-stage build"
    assert found[0].name == "builder"
    dockerfile = instructions((REPO / "Dockerfile").read_text())
    args = dict(arg.split("=", 1) for name, arg in dockerfile if name == "ARG" and "=" in arg)
    for stage in (found[0], found[-1]):
        base = args.get(stage.base.strip("${}"), stage.base)
        assert base == "python:3.11-slim", f"{stage.name or 'final'} stage is based on {base}"


def test_builder_makes_a_wheel_and_installs_it_into_a_virtualenv() -> None:
    runs = " ".join(stages()[0].all("RUN"))
    assert "pip wheel" in runs
    assert "venv" in runs


def test_final_stage_copies_only_the_virtualenv_from_the_builder() -> None:
    copies = final().all("COPY")
    assert copies == ["--from=builder /opt/agentrun /opt/agentrun"]
    assert not final().all("ADD")


def test_final_stage_installs_no_compilers_or_build_tools() -> None:
    for run in final().all("RUN"):
        assert not BUILD_TOOLS.search(run), f"final stage runs build tooling: {run}"


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    users = final().all("USER")
    assert users, "the final stage sets USER"
    user, _, group = users[-1].partition(":")
    assert user.isdigit(), "a numeric UID, so Kubernetes can enforce runAsNonRoot"
    assert int(user) == 65532
    assert not group or (group.isdigit() and int(group) != 0)
    # Nothing after USER switches back to root.
    last_user_index = max(i for i, (name, _) in enumerate(final().instructions) if name == "USER")
    assert not [name for name, _ in final().instructions[last_user_index:] if name == "RUN"]


def test_entrypoint_is_agentrun_operator_in_exec_form() -> None:
    [entrypoint] = final().all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["agentrun", "operator"]
    assert not final().all("CMD"), "flags come from the chart's args, not from a CMD"


@pytest.mark.parametrize("label", sorted(OCI_LABELS))
def test_image_carries_the_oci_label(label: str) -> None:
    found = labels(final())
    assert found.get(f"org.opencontainers.image.{label}"), f"org.opencontainers.image.{label} is missing"


def test_build_context_is_limited_to_what_the_wheel_is_built_from() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list: everything is excluded first"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "operator"}
    copied = {
        word.rstrip("/")
        for stage in stages()
        for args in stage.all("COPY")
        if not args.startswith("--from")
        for word in args.split()[:-1]
    }
    assert copied <= allowed, f"COPY of files the .dockerignore excludes: {copied - allowed}"


def test_the_fake_messages_api_has_an_image_of_its_own_built_from_the_sandbox_folder() -> None:
    sandbox = REPO / "sandbox"
    entry = [
        args for name, args in instructions((sandbox / "Dockerfile").read_text()) if name == "ENTRYPOINT"
    ]
    assert [json.loads(args) for args in entry] == [["python", "-m", "agentrun_sandbox.messages.server"]]
    ignored = [line for line in (sandbox / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    assert ignored == ["!agentrun_sandbox/__init__.py", "!agentrun_sandbox/messages/"]
