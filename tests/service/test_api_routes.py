"""The HTTP API without workers: submission, errors, tenancy, listing, cancel, probes, metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from harness import ThreadedServer, auth, submit, tiny_model

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def client(embedded_api: ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=embedded_api.base, timeout=30) as c:
        yield c


def assert_problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["code"] == code and body["status"] == status and body["type"] == f"/problems/{code}"
    assert body["title"] and body["detail"] and body["instance"]
    assert "Traceback" not in response.text
    return body


def test_submit_returns_202_with_location_and_job(client: httpx.Client) -> None:
    model = tiny_model(seed=101)
    r = submit(client, model, config={"cost_model": "latency"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/jobs/{job['id']}"
    assert job["status"] == "queued" and job["attempt"] == 0 and job["target"] == "cpu"
    assert job["config"] == {"cost_model": "latency"}
    assert job["model"]["size"] == len(model) and job["model"]["filename"] == "m.onnx"
    assert job["links"]["report"] == f"/jobs/{job['id']}/report"
    assert job["artifacts"] == {"model": None, "bundle": None, "kernels": None}
    # no worker serves cpu in this module: the job says it is waiting for one
    assert job["stage"] == "waiting_for_worker"
    got = client.get(f"/jobs/{job['id']}", headers=auth())
    assert got.status_code == 200 and got.json()["id"] == job["id"]
    assert int(got.headers["retry-after"]) >= 1


def test_duplicate_submission_returns_same_job(client: httpx.Client) -> None:
    model = tiny_model(seed=102)
    first = submit(client, model, config={"max_rounds": 4})
    # same config spelled differently (explicit default) is the same canonical config
    second = submit(client, model, config={"max_rounds": 4, "cost_model": "memory_bandwidth"})
    assert first.status_code == 202 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    other_config = submit(client, model, config={"max_rounds": 5})
    other_target = submit(client, model, config={"max_rounds": 4}, target="ascend910")
    assert len({first.json()["id"], other_config.json()["id"], other_target.json()["id"]}) == 3


def test_tenant_isolation(client: httpx.Client) -> None:
    job = submit(client, tiny_model(seed=103)).json()
    for path in ("", "/report", "/model", "/bundle"):
        assert_problem(client.get(f"/jobs/{job['id']}{path}", headers=auth("bob")), 404, "not_found")
    assert_problem(client.post(f"/jobs/{job['id']}/cancel", headers=auth("bob")), 404, "not_found")
    bob_ids = [j["id"] for j in client.get("/jobs", headers=auth("bob")).json()["items"]]
    assert job["id"] not in bob_ids
    digest = job["model"]["digest"]
    assert client.get(f"/artifacts/{digest}", headers=auth()).content == tiny_model(seed=103)
    assert_problem(client.get(f"/artifacts/{digest}", headers=auth("bob")), 404, "not_found")


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic YWxpY2U6eA=="}], ids=str
)
def test_missing_or_invalid_key_is_401(client: httpx.Client, headers: dict) -> None:
    for method, path in (("GET", "/jobs"), ("GET", "/jobs/x"), ("POST", "/fuse"), ("GET", "/targets")):
        r = client.request(method, path, headers=headers)
        assert_problem(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"


def test_unknown_job_is_404(client: httpx.Client) -> None:
    assert_problem(client.get("/jobs/0000000000000000", headers=auth()), 404, "not_found")
    assert_problem(client.get("/jobs/../../etc", headers=auth()), 404, "not_found")


def test_invalid_config_lists_pydantic_errors(client: httpx.Client) -> None:
    body = assert_problem(
        submit(client, tiny_model(), config={"max_fusion_size": -1, "bogus": 1}), 422, "invalid_config"
    )
    locs = sorted(tuple(e["loc"]) for e in body["errors"])
    assert locs == [("bogus",), ("max_fusion_size",)]
    r = client.post(
        "/fuse", files={"model": ("m.onnx", tiny_model())}, data={"config": "{nope"}, headers=auth()
    )
    assert_problem(r, 422, "invalid_config")
    r = client.post(
        "/fuse", files={"model": ("m.onnx", tiny_model())}, data={"config": "[1]"}, headers=auth()
    )
    assert_problem(r, 422, "invalid_config")


@pytest.mark.parametrize("payload", [b"", b"definitely not a protobuf \xff\xff\xff", b"\x08\x07"], ids=len)
def test_malformed_onnx_is_422_synchronously(client: httpx.Client, payload: bytes) -> None:
    body = assert_problem(submit(client, payload), 422, "not_onnx")
    assert "ONNX" in body["detail"] or "onnx" in body["detail"].lower()


def test_unknown_target_names_served_targets(client: httpx.Client) -> None:
    body = assert_problem(submit(client, tiny_model(), target="gpu9000"), 422, "unknown_target")
    assert body["served"] == [] and "cpu" in body["known"]


def test_missing_model_field_is_validation_error(client: httpx.Client) -> None:
    r = client.post("/fuse", data={"target": "cpu"}, files={"other": ("x", b"1")}, headers=auth())
    body = assert_problem(r, 422, "validation_error")
    assert any(e["loc"][-1] == "model" for e in body["errors"])
    assert_problem(client.get("/jobs?limit=0", headers=auth()), 422, "validation_error")


def test_upload_over_limit_is_413(client: httpx.Client) -> None:
    big = b"\0" * (2 * 1024 * 1024)
    r = client.post("/fuse", files={"model": ("m.onnx", big)}, headers=auth())
    assert_problem(r, 413, "payload_too_large")


def test_results_before_success_are_409(client: httpx.Client) -> None:
    job = submit(client, tiny_model(seed=104)).json()
    for path in ("report", "model", "bundle"):
        body = assert_problem(client.get(f"/jobs/{job['id']}/{path}", headers=auth()), 409, "job_not_ready")
        assert body["job_status"] == "queued"


def test_cancel_queued_job(client: httpx.Client) -> None:
    job = submit(client, tiny_model(seed=105)).json()
    r = client.post(f"/jobs/{job['id']}/cancel", headers=auth())
    assert r.status_code == 202 and r.json()["status"] == "cancelled" and r.json()["finished_at"]
    got = client.get(f"/jobs/{job['id']}", headers=auth())
    assert got.json()["status"] == "cancelled" and "retry-after" not in got.headers
    again = submit(client, tiny_model(seed=105))  # a cancelled job is not "the same job" any more
    assert again.status_code == 202 and again.json()["id"] != job["id"]


def test_list_jobs_pages_with_cursor(client: httpx.Client) -> None:
    mine = {submit(client, tiny_model(seed=200 + i), tenant="bob").json()["id"] for i in range(3)}
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/jobs", params=params, headers=auth("bob")).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert set(seen) == mine and seen == sorted(seen, reverse=True)


def test_targets_patterns_health(client: httpx.Client) -> None:
    assert client.get("/targets", headers=auth()).json() == {"targets": []}
    from graph_autofusion.plan.patterns import builtin_patterns

    patterns = client.get("/patterns", headers=auth()).json()["patterns"]
    assert [p["name"] for p in patterns] == [p.name for p in builtin_patterns()]
    assert all(p["description"] for p in patterns)
    assert client.get("/healthz").json()["status"] == "ok"
    body = assert_problem(client.get("/readyz"), 503, "not_ready")
    assert body["store"] is True and body["broker"] is True and body["workers"] == 0


def test_metrics_expose_jobs_and_queue_depth(client: httpx.Client) -> None:
    submit(client, tiny_model(seed=106))
    text = client.get("/metrics").text
    queued = next(line for line in text.splitlines() if line.startswith('autofusion_jobs{status="queued"}'))
    assert float(queued.split()[-1]) >= 1
    depth = next(
        line for line in text.splitlines() if line.startswith('autofusion_queue_depth{target="cpu"}')
    )
    assert float(depth.split()[-1]) >= 1


def test_unknown_route_and_method_are_problems(client: httpx.Client) -> None:
    assert_problem(client.get("/nope"), 404, "not_found")
    assert_problem(client.delete("/fuse", headers=auth()), 405, "method_not_allowed")


def test_openapi_documents_problems(tmp_path) -> None:
    from autofusion_service import Settings, create_app

    spec = create_app(Settings(data_dir=tmp_path)).openapi()
    for path, item in spec["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                if status.startswith(("4", "5")):
                    assert list(response["content"]) == [PROBLEM], (method, path, status)
    assert "HTTPValidationError" not in json.dumps(spec)
