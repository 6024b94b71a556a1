from graph_autofusion_client import JobState, JobStatus, Report

from ._fakes import job_json


def test_job_state_parses_contract_and_keeps_unknown_fields() -> None:
    state = JobState.model_validate(
        job_json(status="running", stage="compile", progress={"done": 3, "total": 4}, shiny="new")
    )
    assert state.status is JobStatus.RUNNING
    assert not state.is_terminal
    assert state.progress is not None and state.progress.fraction == 0.75
    assert state.links.self_ == "/jobs/job-1"
    assert state.model_extra == {"shiny": "new"}
    assert state.model_dump(by_alias=True)["links"]["self"] == "/jobs/job-1"


def test_terminal_statuses() -> None:
    assert {s for s in JobStatus if s.is_terminal} == {"succeeded", "failed", "cancelled"}


def test_report_is_typed_but_permissive() -> None:
    report = Report.model_validate(
        {
            "operators": {"original": 12, "canonical": 10},
            "kernels": {"before": 9, "after": 4},
            "fusions": 3,
            "groups": [{"name": "g0", "pattern": "pointwise", "members": ["a", "b"], "flops": 3}],
            "refused": [
                {"code": "NF002", "reason": "would create a cycle", "groups": [["a"], ["c"]]},
                {"code": "NF002", "reason": "would create a cycle"},
                {"code": "NF008", "source": "strategy:latency"},
            ],
            "estimates": {"profile": "cpu", "latency_us": {"before": 30.0, "after": 12.0}},
            "verification": {"passed": True},
        }
    )
    assert report.groups[0].members == ["a", "b"]
    assert report.refused[0].groups == [["a"], ["c"]]
    assert report.refusals() == {"NF002": 2, "NF008": 1}
    assert report.kernels.ratio == 9 / 4
    assert report.estimates.speedup == 2.5
    assert report.model_extra == {"verification": {"passed": True}}
    assert Report.model_validate({}).estimates.speedup is None  # an empty report still parses
