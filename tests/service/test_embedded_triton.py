"""`autofusion serve --targets cuda` on one machine (embedded: SQLite store, file broker): with
`--interpret` its worker runs the Triton kernels in the interpreter and a job succeeds with its
kernels stored; without it, on a host with no GPU, the worker refuses once (exit 3) and `serve`
keeps the API up instead of restarting the worker every two seconds."""

from __future__ import annotations

import time

import httpx
import pytest
from harness import API_KEYS, auth, finished, free_port, start_api, subprocess_env, tiny_model, wait_for

torch = pytest.importorskip("torch", reason="the Triton targets run on torch tensors (dev extra)")
pytest.importorskip("triton", reason="the Triton targets need triton (dev extra)")
pytestmark = pytest.mark.integration


def test_embedded_serve_runs_a_cuda_job_in_the_interpreter(tmp_path) -> None:
    env = subprocess_env(AUTOFUSION_DATA_DIR=str(tmp_path / "data"), AUTOFUSION_API_KEYS=API_KEYS)
    env.pop("AUTOFUSION_TRITON_INTERPRET")  # the flag says it
    api, base = start_api(env, tmp_path / "serve.log", free_port(), "--targets", "cuda", "--interpret")
    try:
        c = httpx.Client(base_url=base, headers=auth(), timeout=30)
        wait_for(lambda: c.get("/targets").json()["targets"], 90, 0.1, what="the embedded cuda worker")
        (target,) = c.get("/targets").json()["targets"]
        assert target["name"] == "cuda" and target["compiles"] and target["modes"] == {"interpret": 1}
        job = c.post(
            "/fuse", files={"model": ("m.onnx", tiny_model(seed=43))}, data={"target": "cuda"}
        ).json()
        done = wait_for(lambda: (j := c.get(f"/jobs/{job['id']}").json()) and finished(j) and j, 120, 0.1)
        assert done["status"] == "succeeded", api.output()[-3000:]
        manifest = c.get(f"/artifacts/{done['artifacts']['kernels']['digest']}").json()
        assert manifest["target"] == "cuda" and manifest["files"]
    finally:
        api.stop()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the worker would start")
def test_a_worker_that_cannot_start_is_not_restarted_in_a_loop(tmp_path) -> None:
    env = subprocess_env(AUTOFUSION_DATA_DIR=str(tmp_path / "data"), AUTOFUSION_API_KEYS=API_KEYS)
    env.pop("AUTOFUSION_TRITON_INTERPRET")
    env.pop("TRITON_INTERPRET", None)
    api, base = start_api(env, tmp_path / "serve.log", free_port(), "--targets", "cuda")
    try:
        wait_for(lambda: "not restarting" in api.output(), 90, 0.1, what="serve giving up on its worker")
        time.sleep(3)  # a restart loop would have started it again by now
        log = api.output()
        assert log.count("autofusion worker: target cuda: needs an NVIDIA GPU") == 1, log[-3000:]
        assert "restarting" not in log.replace("not restarting", "")
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        job = httpx.post(
            f"{base}/fuse",
            headers=auth(),
            files={"model": ("m.onnx", tiny_model(seed=44))},
            data={"target": "cuda"},
        ).json()
        assert job["status"] == "queued" and job["stage"] == "waiting_for_worker"
    finally:
        api.stop()
