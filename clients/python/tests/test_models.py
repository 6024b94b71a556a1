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
            "operators": 12,
            "kernels": 5,
            "fusions": 7,
            "groups": [{"name": "g0", "pattern": "pointwise", "members": ["a", "b"], "flops": 3}],
            "refused": [{"code": "NF002", "reason": "cycle"}, {"code": "NF002"}, {"code": "NF008"}],
            "estimates": {"speedup": 1.7},
            "peak_memory": 1024,
        }
    )
    assert report.groups[0].members == ["a", "b"]
    assert report.refused_by_code() == {"NF002": 2, "NF008": 1}
    assert report.model_extra == {"peak_memory": 1024}
