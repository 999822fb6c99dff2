"""The real-server scale benchmark's pure parts: how the proxy labels and reads the operator's requests.

The benchmark itself needs a real API server, so CI never runs it; what it counts is decided here.
"""

from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.real_server import ProxiedRequest, finished_run, request_kind

RUNS = "/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns"


@pytest.mark.parametrize(
    ("method", "path", "watch", "kind"),
    [
        ("PATCH", f"{RUNS}/run-1/status", False, "PATCH agentruns/status"),
        ("POST", "/api/v1/namespaces/ns/secrets", False, "POST secrets"),
        ("POST", "/apis/events.k8s.io/v1/namespaces/ns/events", False, "POST events"),
        ("GET", RUNS, True, "WATCH agentruns"),
        ("GET", RUNS, False, "LIST agentruns"),
        ("GET", f"{RUNS}/run-1", False, "GET agentruns"),
        ("GET", "/apis/agentrun.dev/v1alpha1/agentruns", True, "WATCH agentruns"),
        ("DELETE", "/api/v1/namespaces/ns", False, "DELETE namespaces"),
        ("GET", "/version", False, "GET /version"),
    ],
)
def test_a_request_is_labelled_by_verb_resource_and_subresource_like_the_emulators(
    method: str, path: str, watch: bool, kind: str
) -> None:
    assert request_kind(method, path, watch=watch) == kind


def test_only_writing_verbs_count_as_writes() -> None:
    verbs = ("GET", "POST", "PUT", "PATCH", "DELETE")
    writes = [v for v in verbs if ProxiedRequest(0.0, v, RUNS, watch=False, size=0).is_write]
    assert writes == ["POST", "PUT", "PATCH", "DELETE"]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_status_patch_to_a_terminal_phase_names_the_run_it_finishes(phase: str) -> None:
    body = json.dumps({"status": {"phase": phase, "iterations": 5}}).encode()
    assert finished_run("PATCH", f"{RUNS}/run-7/status", body) == "run-7"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", f"{RUNS}/run-7/status", {"status": {"phase": "Running"}}),
        ("PATCH", f"{RUNS}/run-7/status", {"status": {"iterations": 3}}),
        ("PATCH", f"{RUNS}/run-7", {"status": {"phase": "Succeeded"}}),
        ("PUT", f"{RUNS}/run-7/status", {"status": {"phase": "Succeeded"}}),
        ("PATCH", "/api/v1/namespaces/ns/secrets/run-7/status", {"status": {"phase": "Succeeded"}}),
        ("PATCH", f"{RUNS}/run-7/status", ["not", "a", "mapping"]),
    ],
)
def test_other_requests_finish_no_run(method: str, path: str, body: object) -> None:
    assert finished_run(method, path, json.dumps(body).encode()) is None


def test_a_body_that_is_not_json_finishes_no_run() -> None:
    assert finished_run("PATCH", f"{RUNS}/run-7/status", b"\x00not json") is None


def test_a_kubeconfig_for_a_benchmark_other_than_scale_or_replicas_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--only", "replicas,loop", "--kubeconfig", "/nonexistent/kubeconfig"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--kubeconfig needs --only scale and/or replicas" in err
