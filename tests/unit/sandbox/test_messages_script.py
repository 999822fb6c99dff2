"""Script model and file format of the fake Messages API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from agentrun_sandbox.messages.script import (
    ConnectionReset,
    HttpError,
    Reply,
    Script,
    ScriptUsage,
    SlowResponse,
    StreamError,
    TruncatedStream,
    text_block,
    tool_use_block,
)
from agentrun_sandbox.messages.script_files import load_scripts, parse_scripts, scripts_to_data


def test_stop_reason_is_inferred_from_the_content_unless_given() -> None:
    assert Reply([text_block("hi")]).effective_stop_reason == "end_turn"
    assert Reply([tool_use_block("t", {})]).effective_stop_reason == "tool_use"
    assert Reply([text_block("hi")], stop_sequence="###").effective_stop_reason == "stop_sequence"
    assert Reply([text_block("hi")], stop_reason="pause_turn").effective_stop_reason == "pause_turn"


def test_http_error_status_defaults_from_the_error_type() -> None:
    assert HttpError(error_type="overloaded_error").status_code == 529
    assert HttpError.rate_limit(retry_after=2.5).headers == {"retry-after": "2.5"}
    assert HttpError(error_type="weird_error", status=418).status_code == 418
    with pytest.raises(ValueError, match="give a status"):
        HttpError(error_type="weird_error")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Reply([{"type": "image", "source": {}}]), "only 'text', 'tool_use', 'thinking'"),
        (lambda: Reply([tool_use_block("bad name", {})]), "must match"),
        (lambda: Reply([text_block("x")], stop_reason=cast(Any, "done")), "unknown stop_reason"),
        (lambda: Script(None, []), "match"),
        (lambda: HttpError(times=0), "times"),
        (lambda: TruncatedStream(keep=1.0), "keep"),
        (lambda: ScriptUsage(input_tokens=-1), "non-negative"),
    ],
)
def test_mistakes_in_python_scripts_fail_at_construction(build: Callable[[], object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_scripted_content_is_copied_so_later_mutation_cannot_change_the_script() -> None:
    content = {"namespace": "default"}
    reply = Reply([tool_use_block("t", content)])
    content["namespace"] = "changed"

    assert reply.content[0]["input"] == {"namespace": "default"}


def test_python_scripts_round_trip_through_the_file_format(tmp_path: Path) -> None:
    scripts = [
        Script(
            "[scenario:all-faults]",
            [
                Reply(
                    [text_block("hi"), tool_use_block("t", {"a": [1, 2]}, id="toolu_01X")],
                    stop_details={"type": "refusal", "category": None, "explanation": None},
                    usage=ScriptUsage(input_tokens=3, cache_read_input_tokens=2),
                    delay_seconds=0.5,
                    chunk_delay_seconds=0.01,
                    headers={"anthropic-ratelimit-requests-remaining": "3"},
                    faults=[
                        HttpError.rate_limit(retry_after=1, times=2),
                        StreamError(),
                        ConnectionReset(during="body"),
                        SlowResponse(seconds=3),
                        TruncatedStream(mode="cut", keep=0.25),
                    ],
                ),
                HttpError(error_type="authentication_error"),
            ],
            name="everything",
        ),
        Script(None, [Reply()], model="m"),
    ]
    path = tmp_path / "scripts.yaml"
    path.write_text(yaml.safe_dump(scripts_to_data(scripts)))

    assert load_scripts(path) == scripts


def test_a_file_may_hold_a_single_script_or_a_bare_list_and_json_works_too(tmp_path: Path) -> None:
    single = {"match": "x", "steps": [{"reply": {"content": [{"type": "text", "text": "a"}]}}]}
    path = tmp_path / "one.json"
    path.write_text('{"match": "x", "steps": [{"reply": {"content": [{"type": "text", "text": "a"}]}}]}')

    assert parse_scripts(single) == parse_scripts([single]) == load_scripts(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"scripts": [{"match": "x", "stepz": []}]}, r"scripts\.0: unknown keys \['stepz'\]"),
        (
            {"scripts": [{"match": "x", "steps": [{"reply": {"contnet": []}}]}]},
            r"steps\.0\.reply: unknown keys",
        ),
        (
            {"scripts": [{"match": "x", "steps": [{"fault": {"kind": "meteor"}}]}]},
            "unknown fault kind 'meteor'",
        ),
        (
            {"scripts": [{"match": "x", "steps": [{"fault": {"kind": "slow_response", "secs": 1}}]}]},
            "unknown keys",
        ),
        ({"scripts": [{"match": "x", "steps": [{}]}]}, "needs `reply`"),
        ({"scripts": [{"steps": []}]}, "match"),
    ],
)
def test_mistakes_in_script_files_are_reported_with_their_location(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_scripts(data)


def test_a_broken_file_names_itself_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("scripts: [ {match: x, steps: [")

    with pytest.raises(ValueError, match=r"broken\.yaml"):
        load_scripts(path)


def test_scripts_match_on_the_first_user_text_and_or_the_model() -> None:
    by_text = Script("[s:a]", [])
    by_model = Script(None, [], model="m1")
    by_both = Script("[s:a]", [], model="m1")

    assert by_text.matches("do it [s:a]", "anything")
    assert not by_text.matches("do it", "anything")
    assert by_model.matches("whatever", "m1")
    assert not by_model.matches("whatever", "m2")
    assert by_both.matches("[s:a]", "m1")
    assert not by_both.matches("[s:a]", "m2")
    assert [by_text.key, by_model.key, Script("x", [], name="n").key] == ["[s:a]", "m1", "n"]
