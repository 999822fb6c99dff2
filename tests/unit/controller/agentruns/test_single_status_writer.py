"""Nothing but the status writer writes an AgentRun's status, and it sends only typed patches."""

from __future__ import annotations

import ast
from pathlib import Path

import agentrun

PRODUCT = Path(agentrun.__file__).resolve().parent
WRITER = PRODUCT / "controller" / "agentruns" / "status_writing.py"
CLIENT = PRODUCT / "kube" / "calling.py"


def _status_patch_calls() -> dict[Path, int]:
    found: dict[Path, int] = {}
    for path in sorted(PRODUCT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in {"patch_run_status", "_patch_status", "patch_namespaced_custom_object_status"}:
                    found[path] = found.get(path, 0) + 1
    return found


def test_only_the_status_writer_and_the_client_layer_patch_the_status_subresource() -> None:
    calls = _status_patch_calls()
    assert set(calls) == {WRITER, CLIENT}, sorted(str(p.relative_to(PRODUCT)) for p in calls)


def test_the_status_writer_sends_bodies_built_from_status_patches_only() -> None:
    tree = ast.parse(WRITER.read_text())
    sent = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "patch_run_status"
    ]
    assert sent, "the writer must send status patches"
    assignments = {
        target.id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for call in sent:
        body = call.args[-1]
        # StatusPatch.body(), directly or through a name bound to it; never a dict shaped by hand.
        if isinstance(body, ast.Name):
            body = assignments.get(body.id, body)
        assert ast.unparse(body).endswith(".body()"), ast.unparse(call)
