"""The AgentRunQuota CRD is generated from api/quota.py; these tests keep it structural, explained,
committed, and able to hold the whole ledger the operator writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from agentrun.api.crd import quota_crd, quota_crd_yaml
from agentrun.api.quota import HARD_FIELDS, PER_RUN_FIELDS, AgentRunQuotaSpec, AgentRunQuotaStatus
from agentrun.api.reference import reference_markdown
from agentrun.api.sandbox_spec import QUANTITY_PATTERN
from agentrun.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = "agentrunquotas.agentrun.dev.yaml"
REFERENCE = ROOT / "docs" / "reference" / "agentrunquota.md"
#: The status of the contract (issue #18), as the ledger writer stores it.
LEDGER: dict[str, Any] = {
    "observedGeneration": 3,
    "windowStart": "2026-11-01T00:00:00Z",
    "used": {"concurrentRuns": 2, "runs": 10, "tokens": 12345, "costUSD": "0.123456"},
    "reserved": {"tokens": 8192, "costUSD": "0.05"},
    "summary": {"concurrentRuns": "2/5", "runs": "10/100", "tokens": "12345/2000000", "costUSD": "0.12/50"},
    "admitted": [{"uid": "u1", "name": "r1", "at": "2026-11-24T09:00:00Z"}],
    "reservations": [
        {
            "uid": "u1",
            "name": "r1",
            "id": "req-1",
            "holder": "op-1/exec-1",
            "tokens": 8192,
            "costUSD": "0.05",
            "at": "2026-11-24T09:00:01Z",
        }
    ],
    "buckets": [{"start": "2026-11-24T09:00:00Z", "runs": 1, "tokens": 12345, "costUSD": "0.123456"}],
    "lost": {"requests": 1, "tokens": 5000, "costUSD": "0.02"},
    "refused": {"runs": 3, "requests": 1},
}


def _openapi() -> dict[str, Any]:
    schema: dict[str, Any] = quota_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, prop in schema.get("properties", {}).items():
        found += _walk(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += _walk(schema["items"], f"{path}[]")
    return found


def _undeclared(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Paths of ``value`` the schema would prune (what a real API server drops silently from status)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        missing = [f"{path}.{k}" for k in value if k not in props]
        return missing + [
            p for k, v in value.items() if k in props for p in _undeclared(v, props[k], f"{path}.{k}")
        ]
    if isinstance(value, list):
        return [p for v in value for p in _undeclared(v, schema.get("items", {}), f"{path}[]")]
    return []


@pytest.mark.parametrize("where", [("crds",), ("charts", "agentrun-operator", "crds")])
def test_committed_quota_crd_and_the_charts_copy_equal_generated_output(where: tuple[str, ...]) -> None:
    assert ROOT.joinpath(*where, CRD_FILE).read_text() == quota_crd_yaml(), "stale: run `make crds`"


def test_committed_quota_reference_equals_generated_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert REFERENCE.read_text() == reference_markdown(quota_crd()), "stale: run `make docs` (or `make crds`)"
    assert main(["crd", "--kind", "AgentRunQuota", "--reference"]) == 0
    assert capsys.readouterr().out == REFERENCE.read_text()
    assert main(["crd", "--kind", "AgentRunQuota"]) == 0
    assert capsys.readouterr().out == quota_crd_yaml()


def test_every_quota_field_has_a_description_for_kubectl_explain() -> None:
    missing = [path for path, node in _walk(_openapi()) if path and not node.get("description")]
    items = [p for p in missing if p.endswith("[]")]  # array items are described by their array
    assert sorted(set(missing) - set(items)) == [".metadata"]


def test_quota_schema_is_structural() -> None:
    for path, node in _walk(_openapi()):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node, path
        if "properties" in node:
            assert "additionalProperties" not in node, path


def test_names_printer_columns_and_status_subresource_follow_the_contract() -> None:
    spec = quota_crd()["spec"]
    assert spec["group"] == "agentrun.dev" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "AgentRunQuota",
        "listKind": "AgentRunQuotaList",
        "plural": "agentrunquotas",
        "singular": "agentrunquota",
        "shortNames": ["arq"],
        "categories": ["agents"],
    }
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Window", ".spec.window"),
        ("Concurrent", ".status.summary.concurrentRuns"),
        ("Runs", ".status.summary.runs"),
        ("Tokens", ".status.summary.tokens"),
        ("Cost", ".status.summary.costUSD"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_the_spec_holds_the_contracts_limits_with_their_bounds() -> None:
    spec = _openapi()["properties"]["spec"]["properties"]
    assert spec["window"]["enum"] == ["Hour", "Day", "Month"] and spec["window"]["default"] == "Day"
    hard = spec["hard"]["properties"]
    assert list(hard) == list(HARD_FIELDS)
    assert [hard[name]["type"] for name in HARD_FIELDS] == [
        "integer",
        "integer",
        "integer",
        "number",
        "integer",
        "string",
        "string",
    ]
    numbers = [name for name in HARD_FIELDS if hard[name]["type"] != "string"]
    assert all(hard[name]["minimum"] == 0 for name in numbers)
    # Quantities: the API server refuses what the quota could not count (a sign, "1.2.3", "5mk").
    assert hard["sandboxCPU"]["pattern"] == hard["sandboxMemory"]["pattern"] == QUANTITY_PATTERN
    per_run = spec["perRun"]["properties"]
    assert list(per_run) == list(PER_RUN_FIELDS)
    assert per_run["costBudgetUSD"]["properties"]["max"]["exclusiveMinimum"] is True
    assert per_run["tokenBudget"]["properties"]["default"]["minimum"] == 1


def test_every_per_run_entry_keeps_its_default_at_most_its_max_in_cel_and_in_the_model() -> None:
    per_run = _openapi()["properties"]["spec"]["properties"]["perRun"]["properties"]
    for name in PER_RUN_FIELDS:
        assert per_run[name]["x-kubernetes-validations"] == [
            {
                "rule": "!has(self.max) || !has(self.default) || self.default <= self.max",
                "message": "default must not be above max",
            }
        ]
        with pytest.raises(pydantic.ValidationError, match=r"default 3(\.0)? must not be above max 2"):
            AgentRunQuotaSpec.model_validate({"perRun": {name: {"max": 2, "default": 3}}})
        AgentRunQuotaSpec.model_validate({"perRun": {name: {"max": 2, "default": 2}}})


def test_a_limit_left_out_means_unlimited_and_null_is_not_another_spelling_of_it() -> None:
    spec = _openapi()["properties"]["spec"]
    assert not [path for path, node in _walk(spec) if "nullable" in node]
    # hard defaults to {} (nothing limited); perRun stays absent.
    assert spec["properties"]["hard"]["default"] == {}
    assert "default" not in spec["properties"]["perRun"]


def test_the_status_schema_declares_the_whole_ledger_so_nothing_is_pruned() -> None:
    status = _openapi()["properties"]["status"]
    assert _undeclared(LEDGER, status, "status") == []
    assert AgentRunQuotaStatus.model_validate(LEDGER).model_dump(by_alias=True, exclude_none=True) == LEDGER


def test_quota_models_reject_unknown_fields_with_the_field_named() -> None:
    with pytest.raises(pydantic.ValidationError, match="concurrentRun"):
        AgentRunQuotaSpec.model_validate({"hard": {"concurrentRun": 3}})


def test_generated_quota_yaml_parses_back_to_the_same_object() -> None:
    assert yaml.safe_load(quota_crd_yaml()) == quota_crd()
