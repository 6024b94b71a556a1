"""Engine refusals reach a job as its error, with the engine's code and details (never a crash):
activations over `max_activation_bytes`, and host ops under `allow_host_ops=False`."""

from __future__ import annotations

import numpy as np
import pytest
from harness import fast_settings
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import graph_autofusion as gaf
from autofusion_core.blobs import BlobStore
from autofusion_core.store import JobRecord
from autofusion_core.store.records import new_job_id
from autofusion_core.store.sqlite import SqliteJobStore
from autofusion_worker.pipeline import JobContext, run_job


@pytest.fixture
def ctx(tmp_path) -> JobContext:
    settings = fast_settings(tmp_path)
    return JobContext(settings, SqliteJobStore(tmp_path / "jobs.sqlite3"), BlobStore(settings.blob_dir))


def submit(ctx: JobContext, model: bytes, config: dict) -> str:
    digest, size = ctx.blobs.put(model)
    record = JobRecord(
        id=new_job_id(),
        tenant="t",
        job_key=f"{digest}{config}",
        target="cpu",
        config=config,
        model_digest=digest,
        model_size=size,
        model_filename="m.onnx",
        engine_version=gaf.__version__,
    )
    return ctx.store.submit(record)[0].id


def relu(rows: str | int) -> bytes:
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "relu",
        [h.make_tensor_value_info("x", T.FLOAT, [rows, 1000])],
        [h.make_tensor_value_info("y", T.FLOAT, [rows, 1000])],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()


def topk() -> bytes:
    graph = h.make_graph(
        [h.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1)],
        "topk",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 8])],
        [h.make_tensor_value_info("v", T.FLOAT, [3, 2]), h.make_tensor_value_info("i", T.INT64, [3, 2])],
        initializer=[numpy_helper.from_array(np.array([2], np.int64), "k")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_activations_over_the_limit_fail_the_job_as_model_too_large(ctx: JobContext) -> None:
    done = run_job(submit(ctx, relu("n"), {"input_shapes": {"x": [100_000_000, 1000]}}), ctx)
    assert done is not None and done.status == "failed"
    assert done.error["code"] == "model_too_large" and done.error["status"] == 422
    assert done.error["tensor"] == "x" and done.error["activation_bytes"] == 400_000_000_000


def test_host_op_refused_fails_the_job_listing_the_op(ctx: JobContext) -> None:
    done = run_job(submit(ctx, topk(), {"allow_host_ops": False}), ctx)
    assert done is not None and done.status == "failed"
    assert done.error["code"] == "host_op_refused" and done.error["status"] == 422
    (listed,) = done.error["host_ops"]
    assert listed["op_type"] == "TopK" and listed["code"] == "no_generator"


def test_host_ops_are_in_the_job_report(ctx: JobContext) -> None:
    import json

    done = run_job(submit(ctx, topk(), {}), ctx)
    assert done is not None and done.status == "succeeded", done and done.error
    report = json.loads(ctx.blobs.read(done.report_artifact.digest))
    (listed,) = report["host_ops"]
    assert listed["op_type"] == "TopK" and listed["code"] == "no_generator" and listed["reason"]
    assert report["verification"]["passed"] and report["verification"]["outputs"][0]["worst_ratio"] <= 1
