"""The replica benchmark's pure parts: who sent what, and what its failover and repeat figures count.

Both the emulator mode and the real-server mode reduce what they recorded to these records, so a figure
means the same in both; the benchmark itself needs many operator processes, so CI only smoke-runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrun.controller.replicas.ring import owner, view_id
from agentrun_sandbox.messages.recording import RecordedRequest
from bench import replica_scale
from bench.cli import main
from bench.figures import Section
from bench.real_server import ProxiedRequest, run_written
from bench.replica_figures import (
    UNKNOWN,
    Kill,
    ModelRequest,
    Observed,
    OperatorRequest,
    QuotaPeak,
    Rescale,
    attribute,
    concurrent_runs,
    failover,
    figures,
    model_request,
    repeats,
)
from bench.replica_scale import APPLIED_VIEW, GROUP_LABEL, proxied, report, settled_view

RUNS = "/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns"
TOKENS = {"Bearer t0": "replica-0", "Bearer t1": "replica-1"}


def test_a_credential_names_its_replica_and_a_foreign_one_names_none() -> None:
    assert attribute("Bearer t1", TOKENS) == "replica-1"
    assert attribute("Bearer admin", TOKENS) == UNKNOWN
    assert attribute(None, TOKENS) == UNKNOWN


def test_a_proxied_request_is_attributed_to_the_replica_whose_token_it_carried() -> None:
    request = ProxiedRequest(5.0, "PATCH", f"{RUNS}/run-3/status", False, 10, client="Bearer t1", status=409)
    assert proxied(request, TOKENS) == OperatorRequest(
        at=5.0, replica="replica-1", kind="PATCH agentruns/status", is_write=True, status=409, run="run-3"
    )


@pytest.mark.parametrize(
    ("method", "path", "run"),
    [
        ("PATCH", f"{RUNS}/run-3/status", "run-3"),
        ("PATCH", f"{RUNS}/run-3", "run-3"),
        ("DELETE", f"{RUNS}/run-3", "run-3"),
        ("GET", f"{RUNS}/run-3", None),
        ("POST", RUNS, None),
        ("POST", "/api/v1/namespaces/ns/secrets", None),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/run-3", None),
        ("PATCH", "/apis/agentrun.dev/v1alpha1/namespaces/ns/agentrunquotas/q/status", None),
    ],
)
def test_only_writes_to_an_agentrun_name_the_run_they_write(method: str, path: str, run: str | None) -> None:
    assert run_written(method, path) == run


def _recorded(text: str, *, step: int | None, key: str, outcome: str = "reply") -> RecordedRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return RecordedRequest(
        arrived_at=7.0,
        method="POST",
        path="/v1/messages",
        headers={"x-api-key": key},
        body=body,
        request_id="req_1",
        script="s",
        step=step,
        outcome=outcome,
    )


def test_a_model_request_names_its_run_its_replica_by_api_key_and_its_iteration() -> None:
    recorded = _recorded("[bench:scale] run-00042: compute", step=3, key="k1")
    assert model_request(recorded, {"k0": "replica-0", "k1": "replica-1"}, "replicas") == ModelRequest(
        at=7.0, run="replicas-00042", replica="replica-1", step=3
    )


@pytest.mark.parametrize(
    "recorded",
    [
        _recorded("[bench:scale] run-00042: compute", step=3, key="k1", outcome="http_error"),
        _recorded("[bench:scale] run-00042: compute", step=None, key="k1"),
        _recorded("no run named here", step=0, key="k1"),
    ],
)
def test_faults_and_foreign_conversations_are_no_model_requests_of_a_run(recorded: RecordedRequest) -> None:
    assert model_request(recorded, {"k1": "replica-1"}, "replicas") is None


def _requests(run: str, *sent: tuple[float, str, int]) -> list[ModelRequest]:
    return [ModelRequest(at, run, replica, step) for at, replica, step in sent]


def test_a_run_that_never_repeats_an_iteration_has_no_repeats() -> None:
    found = repeats(_requests("a", (0, "r0", 0), (1, "r0", 1), (2, "r0", 2)))
    assert (found.in_flight, found.checkpointed) == (0, 0)


def test_the_last_iteration_asked_again_after_a_kill_is_a_repeat_in_flight() -> None:
    found = repeats(_requests("a", (0, "r1", 0), (1, "r1", 1), (30, "r0", 1), (31, "r0", 2)))
    assert (found.in_flight, found.checkpointed, found.total) == (1, 0, 1)


def test_an_iteration_asked_again_after_the_next_one_was_asked_is_a_checkpointed_repeat() -> None:
    found = repeats(_requests("a", (0, "r1", 0), (1, "r1", 1), (2, "r1", 2), (30, "r0", 1), (31, "r0", 2)))
    assert (found.in_flight, found.checkpointed) == (1, 1)


def test_repeats_are_counted_per_run_not_across_runs() -> None:
    found = repeats(_requests("a", (0, "r0", 0), (1, "r0", 1)) + _requests("b", (0.5, "r1", 0)))
    assert found.total == 0


def test_two_replicas_with_requests_in_flight_together_executed_a_run_at_once() -> None:
    overlapping = _requests("a", (0.0, "r1", 0), (1.0, "r1", 1), (1.5, "r0", 1))
    assert concurrent_runs(overlapping, latency=1.0) == 1


def test_a_run_handed_over_after_the_old_owners_last_answer_was_not_executed_twice() -> None:
    handed_over = _requests("a", (0.0, "r1", 0), (1.0, "r1", 1), (2.5, "r0", 2))
    assert concurrent_runs(handed_over, latency=1.0) == 0


def test_a_killed_replicas_request_is_not_in_flight_after_the_kill() -> None:
    sent = _requests("a", (0.0, "r1", 0), (0.5, "r0", 0))
    assert concurrent_runs(sent, latency=1.0) == 1
    assert concurrent_runs(sent, latency=1.0, kill=Kill("r1", 0.4, ("r0", "r1"))) == 0


def _uids_owned_by(member: str, members: Sequence[str], count: int) -> list[str]:
    uids = (f"uid-{i}" for i in range(1000))
    return [uid for uid in uids if owner(uid, members) == member][:count]


MEMBERS = ("replica-0", "replica-1", "replica-2")


def test_failover_counts_the_killed_replicas_unfinished_runs_and_times_their_resumption() -> None:
    mine = _uids_owned_by("replica-1", MEMBERS, 3)
    theirs = _uids_owned_by("replica-0", MEMBERS, 1)
    uids = {"done-before": mine[0], "moved-1": mine[1], "moved-2": mine[2], "other": theirs[0]}
    kill = Kill("replica-1", 10.0, MEMBERS, regrouped=30.5)
    requests = [
        ModelRequest(9.0, "moved-1", "replica-1", 2),
        ModelRequest(41.0, "moved-1", "replica-0", 2),
        ModelRequest(44.0, "moved-1", "replica-0", 3),
        ModelRequest(12.0, "other", "replica-0", 1),
    ]
    finished_at = {"done-before": 8.0, "moved-1": 46.0, "moved-2": 43.0, "other": 13.0}
    finished_by = {"done-before": "replica-1", "moved-1": "replica-0", "moved-2": "replica-2"}
    found = failover(kill, uids, requests, finished_at, finished_by)
    assert found.killed == "replica-1"
    assert found.moved == 2  # done-before finished before the kill; other was never replica-1's
    assert found.moved_finished == 2
    assert found.regrouped == 30.5
    # moved-1: its first request from a survivor; moved-2 needed none, only its terminal status
    assert sorted(found.resume_delays) == [31.0, 33.0]


def test_a_moved_run_that_never_resumed_has_no_resumption_time() -> None:
    uids = {"stuck": _uids_owned_by("replica-1", MEMBERS, 1)[0]}
    found = failover(Kill("replica-1", 10.0, MEMBERS), uids, [], {}, {})
    assert (found.moved, found.moved_finished, found.resume_delays) == (1, 0, [])


def _run(name: str, uid: str, phase: str, iterations: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid}, "status": {"phase": phase, "iterations": iterations}}


def _observed(**changes: Any) -> Observed:
    fields: dict[str, Any] = {
        "replicas": ("replica-0", "replica-1"),
        "runs": 2,
        "objects": [_run("a", "u-a", "Succeeded", 2), _run("b", "u-b", "Succeeded", 2)],
        "requests": [
            OperatorRequest(1.0, "replica-0", "PATCH agentruns/status", True, 200, "a"),
            OperatorRequest(1.1, "replica-1", "PATCH agentruns/status", True, 200, "b"),
            OperatorRequest(1.2, "replica-1", "PUT leases", True, 409, None),
            OperatorRequest(1.3, "replica-1", "GET agentruns", False, 200, None),
            OperatorRequest(99.0, "replica-0", "POST events", True, 201, "a"),
        ],
        "model_requests": _requests("a", (0.5, "replica-0", 0), (1.5, "replica-0", 1))
        + _requests("b", (0.7, "replica-1", 0), (1.7, "replica-1", 1)),
        "created": {"a": 0.1, "b": 0.2},
        "finished_at": {"a": 3.0, "b": 4.0},
        "finished_by": {"a": "replica-0", "b": "replica-1"},
        "started": 0.0,
        "wall": 5.0,
        "cpu": {"replica-0": 0.02, "replica-1": 0.04},
        "peak_rss": {"replica-0": 2**20, "replica-1": 2**21},
        "bench_cpu": 0.1,
        "latency": 1.0,
        "settle_seconds": 0.3,
        "fences": 0,
        "stored": {"agentruns": (2, 100)},
        "load": (1.0, 1.5),
    }
    return Observed(**{**fields, **changes})


def test_figures_attribute_runs_writes_conflicts_and_cpu_to_each_replica() -> None:
    result = figures(_observed())
    assert result.makespan == 4.0
    assert [(p.name, p.runs, p.iterations, p.writes, p.conflicts) for p in result.per_replica] == [
        ("replica-0", 1, 2, 1, 0),
        ("replica-1", 1, 2, 2, 1),
    ]
    assert result.per_replica[1].cpu_ms_per_iteration == pytest.approx(20.0)
    assert result.writes == 3  # the Event after the last run finished is outside the window
    assert result.conflicts == 1
    assert result.first_request_latencies == pytest.approx([0.4, 0.5])
    assert (result.written_by_two, result.concurrent, result.repeats.total) == (0, 0, 0)
    assert result.failover is None


def test_a_run_both_replicas_wrote_counts_as_written_by_two() -> None:
    extra = OperatorRequest(2.0, "replica-1", "PATCH agentruns/status", True, 200, "a")
    result = figures(_observed(requests=[*_observed().requests, extra]))
    assert result.written_by_two == 1


def test_unfinished_runs_are_counted_by_phase_and_time_runs_to_giving_up() -> None:
    result = figures(_observed(finished_at={"a": 3.0}, finished_by={"a": "replica-0"}))
    assert result.unfinished == {"Succeeded": 1}
    assert result.makespan == 5.0
    assert result.finished == 1


def test_figures_of_a_repeat_with_a_kill_carry_its_failover() -> None:
    members = ("replica-0", "replica-1")
    survivors, victims = _uids_owned_by("replica-0", members, 1), _uids_owned_by("replica-1", members, 1)
    kill = Kill("replica-1", 1.0, members)
    result = figures(
        _observed(
            objects=[_run("a", survivors[0], "Succeeded", 2), _run("b", victims[0], "Succeeded", 2)],
            model_requests=_requests(
                "b", (0.5, "replica-1", 0), (31.0, "replica-0", 0), (32.0, "replica-0", 1)
            ),
            finished_at={"a": 3.0, "b": 33.0},
            finished_by={"a": "replica-0", "b": "replica-0"},
            kill=kill,
        )
    )
    assert result.failover is not None
    assert (result.failover.moved, result.failover.resume_delays) == (1, [30.0])
    assert (result.repeats.in_flight, result.concurrent) == (1, 0)


def test_a_rescaled_repeat_reports_its_scaling_and_holds_in_flight_repeats_to_zero() -> None:
    """A graceful handoff lets a run reach its checkpoint first: a repeat there is a failure."""
    members = ("replica-0", "replica-1")
    [uid] = _uids_owned_by("replica-1", members, 1)
    result = figures(
        _observed(
            objects=[_run("b", uid, "Succeeded", 2)],
            model_requests=_requests(
                "b", (0.5, "replica-1", 0), (5.0, "replica-0", 0), (6.0, "replica-0", 1)
            ),
            finished_at={"b": 7.0},
            finished_by={"b": "replica-0"},
            rescale=Rescale(1.0, 4.0, joined=2.5, left=1.5, regrouped=2.0),
        )
    )
    section = Section("replicas", "t", "m")
    report(section, [result], ideal=5.0, lease=30, server_side="proxy")
    by_name = {f.name.split(": ", 1)[1]: f for f in section.figures}
    assert by_name["model requests repeated, iteration in flight"].passed is False
    assert by_name["scale-up: started → every replica applied the view of all"].value == 2.5
    assert by_name["scale-down: SIGTERM → the leaving replicas exited"].value == 1.5
    assert by_name["scale-down: SIGTERM → the first replica alone applied its view"].value == 2.0


def _lease(holder: str, applied: str | None, group: str = "bench-g") -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {GROUP_LABEL: group},
            "annotations": {APPLIED_VIEW: applied} if applied else {},
        },
        "spec": {"holderIdentity": holder},
    }


def test_membership_has_settled_when_every_lease_of_the_group_shows_the_view_of_all_of_them() -> None:
    view = view_id(["replica-0", "replica-1"])
    stranger = _lease("other", "x", group="someone-else")
    assert settled_view([_lease("replica-0", view), _lease("replica-1", view), stranger], "bench-g", 2)
    assert not settled_view([_lease("replica-0", view), _lease("replica-1", None)], "bench-g", 2)
    assert not settled_view([_lease("replica-0", view_id(["replica-0"]))], "bench-g", 2)


def test_a_replica_kill_needs_two_replicas_in_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "replicas", "--replica-counts", "1,3", "--replica-kill", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--replica-kill needs at least 2 replicas" in err


@pytest.mark.parametrize("seconds", ["-1", "soon", "inf"])
def test_a_replica_kill_time_that_is_not_a_finite_number_of_seconds_is_refused(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "replicas", "--replica-kill", seconds])
    assert exit_.value.code == 2
    assert "--replica-kill" in capsys.readouterr().err


def test_the_replica_benchmark_takes_a_kubeconfig_and_a_kill_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real-server mode and the kill reach the replica benchmark (its run is replaced by a recorder:
    the benchmark itself needs a real server)."""
    calls: list[dict[str, Any]] = []

    async def measure(section: Any, workdir: Path, **options: Any) -> None:
        calls.append({"title": section.title, **options})

    monkeypatch.setattr(replica_scale, "measure", measure)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    results = tmp_path / "RESULTS.md"
    argv = ["--only", "replicas", "--kubeconfig", str(kubeconfig), "--replica-counts", "3"]
    assert main([*argv, "--replica-kill", "3", "--results", str(results), "--workdir", str(tmp_path)]) == 0
    [call] = calls
    assert call["kubeconfig"] == kubeconfig
    assert call["kill_after"] == 3.0
    assert call["counts"] == [3]
    assert "real API server" in call["title"] and "SIGKILLed 3 s" in call["title"]
    assert call["title"] in results.read_text()


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["--replica-counts", "1,3"], "--replica-counts 1,3"),
        (["--replica-counts", "3", "--replica-kill", "3"], "--replica-kill 3"),
    ],
)
def test_a_replica_rescale_needs_two_replicas_everywhere_and_no_kill(
    extra: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--only", "replicas", "--replica-rescale", "3,12", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--replica-rescale needs at least 2 replicas" in err and why in err


@pytest.mark.parametrize("times", ["12,3", "3,3", "3", "soon,12", "-1,12"])
def test_a_replica_rescale_whose_times_are_not_up_then_down_is_refused(
    times: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "replicas", "--replica-rescale", times])
    assert exit_.value.code == 2
    assert "--replica-rescale" in capsys.readouterr().err


def test_the_replica_benchmark_takes_a_rescale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    async def measure(section: Any, workdir: Path, **options: Any) -> None:
        calls.append({"title": section.title, **options})

    monkeypatch.setattr(replica_scale, "measure", measure)
    results = tmp_path / "RESULTS.md"
    argv = ["--only", "replicas", "--replica-counts", "3", "--replica-rescale", "3,12.5"]
    assert main([*argv, "--results", str(results), "--workdir", str(tmp_path)]) == 0
    [call] = calls
    assert call["rescale"] == (3.0, 12.5) and call["kill_after"] is None
    assert "scaled 1 → N → 1" in call["title"]


def test_after_a_kill_membership_has_settled_when_the_survivors_show_their_view_beside_the_dead_lease() -> (
    None
):
    survivors = view_id(["replica-0", "replica-2"])
    before = view_id(["replica-0", "replica-1", "replica-2"])
    leases = [_lease("replica-0", survivors), _lease("replica-1", before), _lease("replica-2", survivors)]
    assert settled_view(leases, "bench-g", 2, without="replica-1")
    assert not settled_view(leases, "bench-g", 2)
    lagging = [_lease("replica-0", survivors), _lease("replica-1", before), _lease("replica-2", before)]
    assert not settled_view(lagging, "bench-g", 2, without="replica-1")


def test_a_repeat_with_a_quota_reports_its_largest_ledger_and_the_runs_one_object_holds() -> None:
    peak = QuotaPeak(size=1800 + 500 * 100, admitted=500, reservations=300)
    result = figures(_observed(quota_peak=QuotaPeak(3000, 10, 0).bigger(peak)))
    section = Section("replicas", "t", "m")
    report(section, [result], ideal=5.0, lease=30, server_side="proxy")
    by_name = {f.name.split(": ", 1)[1]: f for f in section.figures}
    assert by_name["quota object at its largest"].value == pytest.approx(51800 / 1024)
    holds = by_name["running runs one quota object can hold (1.5 MiB ÷ bytes per admitted run at the peak)"]
    assert holds.value == pytest.approx(1.5 * 2**20 / 100)


def test_a_repeat_without_a_quota_reports_no_ledger_size() -> None:
    section = Section("replicas", "t", "m")
    report(section, [figures(_observed())], ideal=5.0, lease=30, server_side="proxy")
    assert not [f for f in section.figures if "quota" in f.name]
