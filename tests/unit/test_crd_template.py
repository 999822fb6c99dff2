"""The SandboxTemplate CRD is generated from api/sandbox_spec.py: committed, with the chart's copy and the
reference page equal to the generator's output; it holds a sandbox's fields but templateRef and warmPool,
requires image and resources, and has no status (the operator only reads templates)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from agentrun.api.crd import all_crds_yaml, crd, template_crd, template_crd_yaml
from agentrun.api.reference import reference_markdown
from agentrun.api.sandbox_spec import SandboxTemplateSpec
from agentrun.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = "sandboxtemplates.agentrun.dev.yaml"
REFERENCE = ROOT / "docs" / "reference" / "sandboxtemplate.md"
RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}


def _root() -> dict[str, Any]:
    root: dict[str, Any] = template_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def test_the_committed_crd_and_the_charts_copy_are_what_the_generator_writes() -> None:
    assert (ROOT / "crds" / CRD_FILE).read_text() == template_crd_yaml()
    assert (ROOT / "charts" / "agentrun-operator" / "crds" / CRD_FILE).read_text() == template_crd_yaml()


def test_crd_command_prints_the_crd_and_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--kind", "SandboxTemplate"]) == 0
    names = yaml.safe_load(capsys.readouterr().out)["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "SandboxTemplate",
        "sandboxtemplates",
        ["sbt"],
    )
    assert main(["crd", "--kind", "SandboxTemplate", "--reference"]) == 0
    assert capsys.readouterr().out == REFERENCE.read_text() == reference_markdown(template_crd())


def test_crd_all_installs_the_template_crd_with_the_others() -> None:
    kinds = [d["spec"]["names"]["kind"] for d in yaml.safe_load_all(all_crds_yaml())]
    assert "SandboxTemplate" in kinds and len(kinds) == len(set(kinds)) == 5


def test_the_template_has_a_sandboxs_fields_but_template_ref_and_warm_pool() -> None:
    sandbox = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "sandbox"
    ]
    spec = _root()["properties"]["spec"]
    assert set(spec["properties"]) == set(sandbox["properties"]) - {"templateRef", "warmPool"}
    assert spec["required"] == ["image", "resources"]


def test_the_template_has_no_status_nor_status_subresource() -> None:
    version = template_crd()["spec"]["versions"][0]
    assert "subresources" not in version
    assert "status" not in _root()["properties"]


@pytest.mark.parametrize("missing", ["image", "resources"])
def test_a_template_without_image_or_resources_is_refused_by_the_model_too(missing: str) -> None:
    spec = {"image": "python:3.12", "resources": RESOURCES}
    del spec[missing]
    with pytest.raises(pydantic.ValidationError, match=missing):
        SandboxTemplateSpec.model_validate(spec)


def test_a_template_cannot_name_a_template_or_keep_a_pool() -> None:
    for extra in ({"templateRef": {"name": "other"}}, {"warmPool": 1}):
        with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
            SandboxTemplateSpec.model_validate({"image": "python:3.12", "resources": RESOURCES, **extra})
