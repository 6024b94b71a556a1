"""The Triton targets through the service: real `autofusion worker --targets cuda --interpret` and
`--targets ascend910` (AUTOFUSION_TRITON_INTERPRET=1) processes on a private redis-server take a
model submitted over HTTP, compile it to Triton kernels, verify them against onnxruntime in Triton's
CPU interpreter (this host has no accelerator), and store the kernels: in the bundle, and each file
as a blob the tenant downloads from `/artifacts/{digest}`."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from harness import (
    API_KEYS,
    Proc,
    RedisServer,
    auth,
    finished,
    free_port,
    poll,
    start_api,
    start_worker,
    submit,
    subprocess_env,
    tiny_model,
    wait_for_workers,
)

pytest.importorskip("torch", reason="the Triton targets run on torch tensors (dev extra)")
pytest.importorskip("triton", reason="the Triton targets need triton (dev extra)")
pytestmark = pytest.mark.integration


@dataclass
class Cluster:
    client: httpx.Client
    procs: list[Proc]

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-4000:]}" for p in self.procs)


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("triton-cluster")
    env = subprocess_env(
        AUTOFUSION_REDIS_URL=redis_server.url(29),
        AUTOFUSION_DATA_DIR=str(tmp / "data"),
        AUTOFUSION_API_KEYS=API_KEYS,
    )
    api, base = start_api(env, tmp / "api.log", free_port())
    flag_only = {k: v for k, v in env.items() if k != "AUTOFUSION_TRITON_INTERPRET"}
    procs = [
        api,
        start_worker(flag_only, tmp / "worker-cuda.log", "cuda", "--interpret"),  # the flag
        start_worker(env, tmp / "worker-ascend910.log", "ascend910"),  # the variable
    ]
    c = Cluster(httpx.Client(base_url=base, timeout=30), procs)
    try:
        for target in ("cuda", "ascend910"):
            wait_for_workers(c.client, target, timeout=120)
        yield c
    finally:
        c.client.close()
        for p in procs:
            p.stop()


def test_targets_reports_both_triton_targets_as_compiling(cluster: Cluster) -> None:
    listed = {t["name"]: t for t in cluster.client.get("/targets", headers=auth()).json()["targets"]}
    for name in ("cuda", "ascend910"):
        assert listed[name]["compiles"] is True and listed[name]["backend"] == "triton"
        assert listed[name]["workers"] == 1 and listed[name]["toolchain"] and listed[name]["device"]
        assert listed[name]["modes"] == {"interpret": 1}  # CI's workers say they interpret


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("target", ["cuda", "ascend910"])
def test_a_triton_job_is_verified_and_its_kernels_are_downloadable(cluster: Cluster, target: str) -> None:
    c = cluster.client
    job = submit(c, tiny_model(width=24, seed=40 if target == "cuda" else 41), target=target).json()
    done = poll(c, job["id"], finished, timeout=180)
    assert done["status"] == "succeeded", (done, cluster.logs())

    report = c.get(f"/jobs/{job['id']}/report", headers=auth()).json()
    assert report["verification"]["passed"] is True
    assert report["compile"]["target"] == target and report["compile"]["mode"] == "interpret"
    assert report["compile"]["kernels"] >= 1 and report["compile"]["host_ops"] == []

    # the kernel manifest: launch metadata, and each kernel file by the digest it is served under
    kernels_ref = done["artifacts"]["kernels"]
    assert kernels_ref is not None and report["kernels_manifest"] == kernels_ref["digest"]
    manifest = c.get(f"/artifacts/{kernels_ref['digest']}", headers=auth()).json()
    assert manifest["target"] == target and manifest["mode"] == "interpret"
    assert manifest["kernels"] and all(k["launches"] for k in manifest["kernels"])
    assert {k["source"] for k in manifest["kernels"]} == set(manifest["files"])
    for name, entry in manifest["files"].items():
        r = c.get(f"/artifacts/{entry['sha256']}", headers=auth())
        assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == entry["sha256"]
        assert len(r.content) == entry["size"] and b"@triton.jit" in r.content, name
        other = c.get(f"/artifacts/{entry['sha256']}", headers=auth("bob"))
        assert other.status_code == 404  # another tenant's kernels are not reachable

    # the bundle carries the same files, their manifest and the report
    bundle = c.get(f"/jobs/{job['id']}/bundle", headers=auth())
    assert bundle.status_code == 200
    files = _members(bundle.content)
    assert {"model.onnx", "manifest.json", "report.json", *manifest["files"]} == set(files)
    assert json.loads(files["manifest.json"]) == manifest
    for name, entry in manifest["files"].items():
        assert hashlib.sha256(files[name]).hexdigest() == entry["sha256"]


def test_the_interpreting_worker_says_so_in_its_log(cluster: Cluster, tmp_path: Path) -> None:
    cuda = next(p for p in cluster.procs if p.log.name == "worker-cuda.log")
    assert "target cuda: triton " in cuda.output() and "mode interpret" in cuda.output()
