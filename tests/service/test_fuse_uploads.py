"""`POST /fuse` bodies: the model streamed into the blob store, and resubmission by digest.

A resubmission names a model the tenant uploaded before by its sha256 (`model_digest`) instead of
sending it again; a digest the tenant never uploaded is refused the same way whether or not another
tenant has that model, so digests reveal nothing across tenants.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import ThreadedServer, auth, submit, tiny_model

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def client(embedded_api: ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=embedded_api.base, timeout=30) as c:
        yield c


@pytest.fixture
def staging(embedded_api: ThreadedServer) -> Path:
    return embedded_api.settings.blob_dir / "tmp"


def by_digest(
    client: httpx.Client, digest: str, tenant: str = "alice", multipart: bool = True, **fields: str
) -> httpx.Response:
    data = {"model_digest": digest, **fields}
    if multipart:  # a multipart body without a file part
        files = {k: (None, v) for k, v in data.items()}
        return client.post("/fuse", files=files, headers=auth(tenant))
    return client.post("/fuse", data=data, headers=auth(tenant))


def problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["code"] == code, body
    return body


@pytest.mark.parametrize("multipart", [True, False], ids=["multipart", "urlencoded"])
def test_resubmission_by_digest_finds_the_same_job(client: httpx.Client, multipart: bool) -> None:
    model = tiny_model(seed=301 + multipart)
    digest = hashlib.sha256(model).hexdigest()
    first = submit(client, model, config={"max_rounds": 3})
    assert first.status_code == 202, first.text
    again = by_digest(client, digest, multipart=multipart, config=json.dumps({"max_rounds": 3}))
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == f"/jobs/{first.json()['id']}"
    # another config on the same stored model is a new job, without an upload
    other = by_digest(client, digest, multipart=multipart, config="{}", model_filename="net.onnx")
    assert other.status_code == 202, other.text
    job = other.json()
    assert job["id"] != first.json()["id"]
    assert job["model"] == {"digest": digest, "size": len(model), "filename": "net.onnx"}


def test_a_digest_never_reveals_another_tenants_model(client: httpx.Client) -> None:
    model = tiny_model(seed=310)
    digest = hashlib.sha256(model).hexdigest()
    assert submit(client, model, tenant="alice").status_code == 202
    theirs = problem(by_digest(client, digest, tenant="bob"), 422, "unknown_model_digest")
    unknown = problem(by_digest(client, "0" * 64, tenant="bob"), 422, "unknown_model_digest")
    # the same answer whether or not some other tenant uploaded it
    assert theirs["detail"] == unknown["detail"] and theirs.keys() == unknown.keys()
    # once bob uploads it himself, his digest works
    assert submit(client, model, tenant="bob").status_code == 202
    assert by_digest(client, digest, tenant="bob").status_code == 200


def test_bad_digest_fields(client: httpx.Client) -> None:
    problem(by_digest(client, "not-a-digest"), 422, "unknown_model_digest")
    model = tiny_model(seed=320)
    r = client.post(
        "/fuse",
        files={"model": ("m.onnx", model), "model_digest": (None, "1" * 64)},
        headers=auth(),
    )
    body = problem(r, 422, "validation_error")
    assert body["errors"][0]["loc"] == ["body", "model_digest"]
    body = problem(client.post("/fuse", data={"target": "cpu"}, headers=auth()), 422, "validation_error")
    assert body["errors"][0]["loc"][-1] == "model"
    r = client.post("/fuse", content=b"{}", headers={**auth(), "Content-Type": "application/json"})
    problem(r, 422, "validation_error")
    # a form over the field limit is one more malformed body, not a bare 400
    crowded = {**{f"f{i}": "x" for i in range(40)}, "model_digest": "1" * 64}
    body = problem(client.post("/fuse", data=crowded, headers=auth()), 422, "validation_error")
    assert "fields" in body["detail"]


@pytest.mark.parametrize(
    "body",
    [
        b'--b\r\nContent-Disposition: form-data; name="model"; filename="m"\r\n\r\nabc',  # cut off
        b"no multipart here",
    ],
    ids=["truncated", "garbage"],
)
def test_malformed_multipart_is_422(client: httpx.Client, staging: Path, body: bytes) -> None:
    headers = {**auth(), "Content-Type": "multipart/form-data; boundary=b"}
    problem(client.post("/fuse", content=body, headers=headers), 422, "validation_error")
    assert list(staging.iterdir()) == []


def test_uploads_leave_no_staged_files(client: httpx.Client, staging: Path, embedded_api) -> None:
    """Accepted, duplicate, refused and oversized uploads: nothing is left in the staging folder,
    and an accepted model is stored under its digest."""
    model = tiny_model(seed=330)
    assert submit(client, model).status_code == 202
    assert submit(client, model).status_code == 200
    problem(submit(client, b"\x00garbage"), 422, "not_onnx")
    big = b"\x00" * (embedded_api.settings.max_upload_bytes + 1)
    problem(submit(client, big), 413, "payload_too_large")
    assert list(staging.iterdir()) == []
    stored = embedded_api.settings.blob_dir / hashlib.sha256(model).hexdigest()[:2]
    assert (stored / hashlib.sha256(model).hexdigest()).read_bytes() == model


def test_openapi_documents_both_ways_to_submit(client: httpx.Client) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/fuse"]["post"]
    content = operation["requestBody"]["content"]
    multipart = content["multipart/form-data"]["schema"]["properties"]
    assert multipart["model"]["format"] == "binary" and "pattern" in multipart["model_digest"]
    assert content["application/x-www-form-urlencoded"]["schema"]["required"] == ["model_digest"]
    assert "unknown_model_digest" in operation["responses"]["422"]["description"]


def test_engine_refusals_at_submit_keep_their_code_and_details(client: httpx.Client) -> None:
    """Any `FusionError` of the engine's load guard is a 422 with the engine's own code and details."""
    answer = submit(client, tiny_model(seed=331), config={"max_nodes": 1})
    body = problem(answer, 422, "too_many_nodes")
    assert body["detail"] and body["code"] != "internal_error"


def test_the_same_model_is_checked_for_each_tenant(client: httpx.Client) -> None:
    """The load guard runs for a tenant's first upload even when another tenant stored the same bytes,
    so the answer (and its timing) does not depend on what others uploaded."""
    model = tiny_model(seed=332)
    assert submit(client, model, tenant="bob").status_code == 202
    problem(submit(client, model, config={"max_nodes": 1}), 422, "too_many_nodes")


def test_a_model_whose_inputs_exceed_the_activation_limit_is_refused_at_submit(client: httpx.Client) -> None:
    """An input declared [1000000, 1000000] (3.6 TiB of fp32) is refused before any job exists,
    with the engine's code and the tensor it names; no worker ever tries to plan it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000000, 1000000])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000000, 1000000])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    before = client.get("/jobs", headers=auth("alice")).json()
    body = problem(submit(client, model.SerializeToString()), 422, "model_too_large")
    assert body["tensor"] == "x" and body["tensor_shape"] == [1000000, 1000000]
    assert client.get("/jobs", headers=auth("alice")).json() == before
