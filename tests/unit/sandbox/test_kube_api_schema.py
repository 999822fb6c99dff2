"""CRD schema defaulting, pruning and validation with the real server's messages."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.support.kube_client import Answer, KubeClient
from tests.support.kube_testing import WIDGETS, widget

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GADGETS = "/apis/test.agentrun.dev/v1/gadgets"


def gadgets_crd(spec_schema: dict[str, Any]) -> dict[str, Any]:
    """A cluster-scoped CRD created through the API in a test."""
    schema = {"type": "object", "properties": {"spec": spec_schema}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.test.agentrun.dev"},
        "spec": {
            "group": "test.agentrun.dev",
            "scope": "Cluster",
            "names": {"plural": "gadgets", "kind": "Gadget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }


#: A blocking schema error (wrong type, required, enum, too long, too many) keeps CEL rules from running.
NOT_CHECKED = {
    "reason": "FieldValueInvalid",
    "message": "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation",
    "field": "<nil>",
}


def causes(answer: Answer) -> list[dict[str, str]]:
    assert answer.status == 422, answer.body
    assert answer.body["reason"] == "Invalid"
    result: list[dict[str, str]] = answer.body["details"]["causes"]
    return result


async def test_invalid_values_are_rejected_with_the_servers_422_message(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1", size=0))
    assert causes(answer) == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0: spec.size in body should be greater than or equal to 1",
            "field": "spec.size",
        }
    ]
    assert answer.body["message"] == (
        'Widget.test.agentrun.dev "w1" is invalid: '
        "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
    )
    assert answer.body["details"]["kind"] == "Widget"
    assert answer.body["details"]["group"] == "test.agentrun.dev"


async def test_several_problems_are_listed_in_one_message(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1", size=11, mode="turbo"))
    # The server lists sibling properties in Go's random map order; the emulator in the body's order.
    assert [c["field"] for c in causes(answer)] == ["spec.size", "spec.mode", "<nil>"]
    assert answer.body["message"] == (
        'Widget.test.agentrun.dev "w1" is invalid: ['
        "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10, "
        'spec.mode: Unsupported value: "turbo": supported values: "fast", "slow", '
        "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; "
        "correct the existing errors to complete validation]"
    )


async def test_a_missing_required_field_is_reported_as_required(client: KubeClient) -> None:
    body = widget("w1")
    del body["spec"]["task"]  # type: ignore[attr-defined]
    answer = await client.post(WIDGETS, body)
    assert causes(answer) == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.task"},
        NOT_CHECKED,
    ]


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            {"size": "big"},
            "spec.size",
            'Invalid value: "string": spec.size in body must be of type integer: "string"',
        ),
        ({"task": ""}, "spec.task", 'Invalid value: "": spec.task in body should be at least 1 chars long'),
        ({"task": "x" * 41}, "spec.task", "Too long: may not be more than 40 bytes"),
        (
            {"label": "ABC"},
            "spec.label",
            "Invalid value: \"ABC\": spec.label in body should match '^[a-z]+$'",
        ),
        ({"ratio": 0}, "spec.ratio", "Invalid value: 0: spec.ratio in body should be greater than 0"),
        ({"tags": ["a", "b", "c", "d"]}, "spec.tags", "Too many: 4: must have at most 3 items"),
        ({"tags": ["a", "a"]}, "spec.tags[1]", 'Duplicate value: "a"'),
        ({"env": {"A": "1", "B": "2", "C": "3"}}, "spec.env", "Too many: 3: must have at most 2 items"),
        (
            {"env": {"A": 1}},
            "spec.env.A",
            'Invalid value: "integer": spec.env.A in body must be of type string: "integer"',
        ),
        (
            {"port": True},
            "spec.port",
            'Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean"',
        ),
        # A failed rule omits an object's value (kube-apiserver v1.36 answers exactly this).
        ({"size": 5, "limit": 2}, "spec", "Invalid value: limit must not be below size"),
    ],
)
async def test_schema_keywords_are_enforced(
    client: KubeClient, spec: dict[str, Any], field: str, message: str
) -> None:
    answer = await client.post(WIDGETS, widget("w1", **spec))
    assert {"field": field, "message": message} in [
        {k: c[k] for k in ("field", "message")} for c in causes(answer)
    ]


@pytest.mark.parametrize("port", [8080, "http"])
async def test_int_or_string_fields_accept_both(client: KubeClient, port: object) -> None:
    assert (await client.post(WIDGETS, widget("w1", port=port))).status == 201


async def test_integers_written_as_whole_floats_are_integers(client: KubeClient) -> None:
    assert (await client.post(WIDGETS, widget("w1", size=4.0))).status == 201


async def test_defaults_are_applied_on_create_including_nested_ones(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1"))
    spec = answer.body["spec"]
    assert spec["size"] == 3
    assert spec["mode"] == "fast"
    assert spec["options"] == {"retries": 2}


async def test_defaults_are_applied_on_update_when_a_field_is_removed(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1", size=7))
    answer = await client.patch(f"{WIDGETS}/w1", {"spec": {"size": None}})
    assert answer.body["spec"]["size"] == 3


async def test_null_for_a_non_nullable_field_is_dropped_then_defaulted(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1", mode=None))
    assert answer.body["spec"]["mode"] == "fast"


async def test_null_for_a_nullable_field_is_kept(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1", note=None))
    assert answer.body["spec"]["note"] is None


async def test_unknown_fields_are_pruned_with_a_warning_header(client: KubeClient) -> None:
    body = widget("w1", colour="red")
    body["topLevel"] = 1
    body["metadata"]["unknownMeta"] = "x"  # type: ignore[index]
    answer = await client.post(WIDGETS, body)
    assert answer.status == 201
    assert "colour" not in answer.body["spec"]
    assert "topLevel" not in answer.body
    assert "unknownMeta" not in answer.body["metadata"]
    assert sorted(answer.warnings) == sorted(
        [
            '299 - "unknown field \\"metadata.unknownMeta\\""',
            '299 - "unknown field \\"spec.colour\\""',
            '299 - "unknown field \\"topLevel\\""',
        ]
    )


async def test_undeclared_status_fields_are_pruned_silently_on_status_writes(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    answer = await client.patch(
        f"{WIDGETS}/w1/status", {"status": {"phase": "Running", "kopf": {"progress": {}}}}
    )
    assert answer.status == 200
    assert answer.body["status"] == {"phase": "Running"}
    assert answer.warnings == ['299 - "unknown field \\"status.kopf\\""']


async def test_preserve_unknown_fields_keeps_anything_below_it(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1", extra={"any": {"nested": [1, {"deep": True}]}}))
    assert answer.body["spec"]["extra"] == {"any": {"nested": [1, {"deep": True}]}}
    status = await client.patch(f"{WIDGETS}/w1/status", {"status": {"details": {"free": "form"}}})
    assert status.body["status"]["details"] == {"free": "form"}


async def test_status_is_validated_against_the_status_schema(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    answer = await client.patch(f"{WIDGETS}/w1/status", {"status": {"conditions": [{"type": "Ready"}]}})
    assert causes(answer) == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "status.conditions[0].status"},
        NOT_CHECKED,
    ]


async def test_strict_field_validation_turns_unknown_fields_into_a_bad_request(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1", colour="red"), params={"fieldValidation": "Strict"})
    assert answer.status == 400
    assert 'unknown field "spec.colour"' in answer.body["message"]


async def test_cel_immutability_rules_reject_changes_of_the_field(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    answer = await client.patch(f"{WIDGETS}/w1", {"spec": {"task": "other"}})
    assert causes(answer) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "other": task is immutable',  # a scalar's value, as v1.36 shows it
            "field": "spec.task",
        }
    ]
    assert (await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 4}})).status == 200


async def test_cel_rules_outside_the_supported_subset_are_ignored_with_one_log_line(
    client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    rule = "self.items.existsOne(i, v, v == 'only-in-this-test')"  # outside the emulator's subset
    crd = gadgets_crd(
        {
            "type": "object",
            "x-kubernetes-validations": [{"rule": rule}],
            "properties": {"items": {"type": "array", "items": {"type": "string"}}},
        }
    )
    assert (await client.post(CRDS, crd)).status == 201
    with caplog.at_level(logging.WARNING, logger="agentrun_sandbox.kube.schema"):
        for name in ("g1", "g2"):
            answer = await client.post(GADGETS, {"metadata": {"name": name}, "spec": {"items": []}})
            assert answer.status == 201  # a real server would refuse: exists_one() finds nothing
    assert len([r for r in caplog.records if rule in r.getMessage()]) == 1


async def test_a_crd_created_through_the_api_is_served_and_validated(client: KubeClient) -> None:
    created = await client.post(
        CRDS, gadgets_crd({"type": "object", "properties": {"n": {"type": "integer"}}})
    )
    assert created.status == 201
    conditions = {c["type"]: c["status"] for c in created.body["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert (await client.post(GADGETS, {"metadata": {"name": "g1"}, "spec": {"n": "x"}})).status == 422
    assert (await client.post(GADGETS, {"metadata": {"name": "g1"}, "spec": {"n": 1}})).status == 201
    assert [i["metadata"]["name"] for i in (await client.get(GADGETS)).body["items"]] == ["g1"]


async def test_a_crd_whose_name_does_not_match_its_names_is_rejected(client: KubeClient) -> None:
    crd = {
        "metadata": {"name": "wrong.test.agentrun.dev"},
        "spec": {
            "group": "test.agentrun.dev",
            "scope": "Namespaced",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    answer = await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert answer.status == 422
    assert answer.body["details"]["causes"][0]["field"] == "metadata.name"


@pytest.mark.parametrize(
    "metadata_schema",
    [
        {"type": "object", "description": "Standard object metadata."},
        {"type": "object", "properties": {"labels": {"type": "object"}}},
        {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    ],
)
async def test_a_crd_that_says_anything_about_metadata_but_its_type_is_refused_like_a_real_server(
    client: KubeClient, metadata_schema: dict[str, Any]
) -> None:
    crd = gadgets_crd({"type": "object"})
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"] = metadata_schema
    [cause] = causes(await client.post(CRDS, crd))
    # One version (or several sharing a schema): the server names its internal top-level schema.
    assert cause["field"] == "spec.validation.openAPIV3Schema.properties[metadata]"
    assert "must not specify anything other than name and generateName" in cause["message"]


async def test_a_crd_may_restrict_metadata_name(client: KubeClient) -> None:
    crd = gadgets_crd({"type": "object"})
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"] = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}},
    }
    assert (await client.post(CRDS, crd)).status == 201


# The expectations below are kube-apiserver v1.36's answers to the same requests.


async def test_cel_rules_still_run_after_errors_that_do_not_block_them(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("w1", size=11, limit=2))
    assert causes(answer) == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 11: spec.size in body should be less than or equal to 10",
            "field": "spec.size",
        },
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: limit must not be below size",
            "field": "spec",
        },
    ]


async def test_a_blocking_error_keeps_every_cel_rule_from_running(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    # The immutability rule on spec.task would fail too; the wrong type of spec.size stops all rules.
    answer = await client.patch(f"{WIDGETS}/w1", {"spec": {"task": "other", "size": "x"}})
    assert causes(answer) == [
        {
            "reason": "FieldValueTypeInvalid",
            "message": 'Invalid value: "string": spec.size in body must be of type integer: "string"',
            "field": "spec.size",
        },
        NOT_CHECKED,
    ]


async def test_missing_required_fields_are_listed_after_the_properties_errors(client: KubeClient) -> None:
    body = widget("w1", size=0)
    del body["spec"]["task"]  # type: ignore[attr-defined]
    answer = await client.post(WIDGETS, body)
    assert [c["field"] for c in causes(answer)] == ["spec.size", "spec.task", "<nil>"]


async def test_a_string_reports_only_the_first_of_its_length_and_pattern_failures(client: KubeClient) -> None:
    crd = gadgets_crd(
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
                "flag": {"type": "string", "maxLength": 1},
            },
        }
    )
    assert (await client.post(CRDS, crd)).status == 201
    answer = await client.post(GADGETS, {"metadata": {"name": "g1"}, "spec": {"code": "ABCDE", "flag": "ab"}})
    assert causes(answer) == [
        {
            "reason": "FieldValueTooLong",
            "message": "Too long: may not be more than 3 bytes",
            "field": "spec.code",
        },
        {
            "reason": "FieldValueTooLong",
            "message": "Too long: may not be more than 1 byte",
            "field": "spec.flag",
        },
    ]


async def test_strict_field_validation_names_every_unknown_field_sorted_like_the_server(
    client: KubeClient,
) -> None:
    body = widget("w1", zeta=1, alpha=2)
    body["metadata"].update({"zz": 1, "aa": 2})  # type: ignore[attr-defined]
    body["top"] = 1
    answer = await client.post(WIDGETS, body, params={"fieldValidation": "Strict"})
    assert answer.status == 400
    assert answer.body["message"] == (
        'Widget in version "v1" cannot be handled as a Widget: strict decoding error: '
        'unknown field "metadata.aa", unknown field "metadata.zz", unknown field "spec.alpha", '
        'unknown field "spec.zeta", unknown field "top"'
    )
    assert answer.body["reason"] == "BadRequest" and "details" not in answer.body


async def test_an_invalid_name_is_refused_with_the_rule_and_the_regex(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget("a" * 252 + "_b"))
    assert [c["message"].rpartition('": ')[2] for c in causes(answer)] == [
        "must be no more than 253 characters",
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
        "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
    ]
