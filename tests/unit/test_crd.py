"""The CRD is generated from the models; these tests keep it structural, explained and committed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from agentrun.api.crd import crd, crd_yaml
from agentrun.api.spec import AgentRunSpec

ROOT = Path(__file__).resolve().parents[2]


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, prop in schema.get("properties", {}).items():
        found += _walk(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += _walk(schema["items"], f"{path}[]")
    return found


def _openapi() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crd_equals_generated_output() -> None:
    committed = (ROOT / "crds" / "agentruns.agentrun.dev.yaml").read_text()
    assert committed == crd_yaml(), "crds/ is stale: run `make crds`"


def test_chart_crd_copy_equals_generated_output() -> None:
    copy = (ROOT / "charts" / "agentrun-operator" / "crds" / "agentruns.agentrun.dev.yaml").read_text()
    assert copy == crd_yaml(), "the chart's CRD copy is stale: run `make crds`"


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    missing = [path for path, node in _walk(_openapi()) if path and not node.get("description")]
    items = [p for p in missing if p.endswith("[]")]  # array items are described by their array
    # The API server describes `metadata` itself (ObjectMeta) and refuses a description of ours.
    assert sorted(set(missing) - set(items)) == [".metadata"]


def test_schema_is_structural() -> None:
    for path, node in _walk(_openapi()):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if "properties" in node:
            assert "additionalProperties" not in node, path


def test_kopf_bookkeeping_in_status_survives_pruning() -> None:
    kopf_field = _openapi()["properties"]["status"]["properties"]["kopf"]
    assert kopf_field["x-kubernetes-preserve-unknown-fields"] is True


def test_names_printer_columns_and_status_subresource() -> None:
    spec = crd()["spec"]
    assert spec["names"]["shortNames"] == ["ar"]
    assert spec["names"]["categories"] == ["agents"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Stop Reason", "Iterations", "Tokens", "Cost", "Age", "Agent"]
    agent = version["additionalPrinterColumns"][-1]
    assert (agent["jsonPath"], agent["priority"]) == (".spec.agentRef.name", 1)


def test_the_api_server_stores_no_spec_default_so_what_a_run_leaves_out_stays_out() -> None:
    spec = _openapi()["properties"]["spec"]

    def defaults(node: Any, path: str) -> Iterator[str]:
        if isinstance(node, dict):
            if "default" in node:
                yield path
            for key, value in node.items():
                yield from defaults(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from defaults(value, f"{path}[{index}]")

    assert list(defaults(spec, "spec")) == []
    limits = spec["properties"]["limits"]
    assert limits["properties"]["toolConcurrency"]["description"].endswith("Default 8.")
    assert spec["properties"]["model"]["properties"]["maxTokens"]["description"].endswith("Default 4096.")
    # The models fill them in when the operator reads a run.
    assert AgentRunSpec.model_validate({"task": "x"}).limits.tool_concurrency == 8


def test_limits_a_quota_may_default_are_left_to_the_operator_so_a_run_declaring_none_shows() -> None:
    limits = _openapi()["properties"]["spec"]["properties"]["limits"]["properties"]
    for name, default in (("maxIterations", 20), ("timeoutSeconds", 1800)):
        assert "default" not in limits[name]
        assert f"Default {default}, or the smallest perRun.{name}.default" in limits[name]["description"]
    # The models still fill them in when the operator reads a run.
    limits_model = AgentRunSpec.model_validate({"task": "x"}).limits
    assert (limits_model.max_iterations, limits_model.timeout_seconds) == (20, 1800)


def test_priority_is_a_bounded_integer_that_can_change_while_a_run_waits() -> None:
    spec = _openapi()["properties"]["spec"]
    priority = spec["properties"]["priority"]
    assert (priority["type"], priority["minimum"], priority["maximum"]) == ("integer", -1000, 1000)
    assert priority["description"].endswith("Default 0.")
    assert "x-kubernetes-validations" not in priority
    assert all("priority" not in rule["rule"] for rule in spec["x-kubernetes-validations"])
    with pytest.raises(pydantic.ValidationError, match="priority"):
        AgentRunSpec.model_validate({"task": "x", "priority": 1001})


def test_spec_fields_except_cancel_and_approvals_are_immutable() -> None:
    props = _openapi()["properties"]["spec"]["properties"]
    immutable = {
        name
        for name, p in props.items()
        if any(v["rule"] == "self == oldSelf" for v in p.get("x-kubernetes-validations", []))
    }
    assert {"cancel", "approvals", "ttlSecondsAfterFinished"}.isdisjoint(immutable)
    assert {"task", "model", "tools", "limits"} <= immutable
    # Decisions may be added while the run waits, never taken back, changed or moved (prefix equality,
    # linear: a two-variable comprehension, API servers 1.33+), and the list stays once it has any.
    assert [v["rule"] for v in props["approvals"]["x-kubernetes-validations"]] == [
        "size(self) >= size(oldSelf) && oldSelf.all(i, recorded, self[i] == recorded)"
    ]
    spec_rules = [v["rule"] for v in _openapi()["properties"]["spec"]["x-kubernetes-validations"]]
    assert "!has(oldSelf.approvals) || size(oldSelf.approvals) == 0 || has(self.approvals)" in spec_rules


def test_generated_yaml_parses_back_to_the_same_object() -> None:
    text = crd_yaml()
    assert yaml.safe_load(text) == crd()


def test_models_reject_unknown_fields_with_the_field_named() -> None:
    with pytest.raises(pydantic.ValidationError, match="maxIteration"):
        AgentRunSpec.model_validate({"task": "x", "limits": {"maxIteration": 3}})


def test_tool_entry_needs_exactly_one_kind() -> None:
    with pytest.raises(pydantic.ValidationError, match="exactly one of builtin, http, mcp"):
        AgentRunSpec.model_validate({"task": "x", "tools": [{}]})


def test_defaults_match_the_documented_ones() -> None:
    spec = AgentRunSpec.model_validate({"task": "x"})
    assert spec.limits.max_iterations == 20
    assert spec.limits.tool_concurrency == 8


def test_root_metadata_carries_only_its_type_as_real_api_servers_require() -> None:
    assert _openapi()["properties"]["metadata"] == {"type": "object"}
