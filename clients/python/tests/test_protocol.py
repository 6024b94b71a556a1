import httpx
from graph_autofusion_client._protocol import etag_digest, problem_from_response


def _response(status: int, **kwargs) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "http://x/jobs/1"), **kwargs)


def test_problem_from_problem_json_keeps_extensions() -> None:
    body = {
        "type": "/problems/not_onnx",
        "title": "T",
        "status": 422,
        "detail": "d",
        "code": "not_onnx",
        "x": 1,
    }
    problem = problem_from_response(_response(422, json=body))
    assert (problem.code, problem.detail, problem.model_extra) == ("not_onnx", "d", {"x": 1})


def test_problem_from_a_proxy_error_page() -> None:
    problem = problem_from_response(_response(502, text="<html>Bad gateway</html>"))
    assert (problem.status, problem.title, problem.code) == (502, "Bad Gateway", None)
    assert problem.detail == "<html>Bad gateway</html>"


def test_problem_from_a_raw_framework_validation_error() -> None:
    problem = problem_from_response(_response(422, json={"detail": [{"loc": ["body", "model"]}]}))
    assert problem.code == "validation_error"
    assert problem.model_extra == {"errors": [{"loc": ["body", "model"]}]}


def test_etag_forms() -> None:
    digest = "ab" * 32
    for header in (f'"{digest}"', f'W/"{digest}"', digest, f'"{digest.upper()}"'):
        assert etag_digest(_response(200, headers={"ETag": header})) == digest
    assert etag_digest(_response(200)) is None
