"""A worker checks its targets' toolchain and device before it takes a job: what is missing is said
in one line and the worker exits 3. This host has no GPU and no NPU, so the real `autofusion
worker --targets cuda` and `--targets ascend910` (without `--interpret`) meet a real missing
device; with `--interpret` only triton and torch are needed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO, subprocess_env

from autofusion_core.targets import TARGETS, get_target
from autofusion_worker.toolchain import (
    ASCEND_COMPILER,
    CANN_DEFAULT,
    EXIT_TOOLCHAIN,
    ToolchainMissing,
    cann_home,
    check_target,
    check_targets,
    probe_device,
)

HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("triton") is not None


def _cuda_visible() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _worker(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = subprocess_env(AUTOFUSION_DATA_DIR=str(tmp_path), **env)
    environment.pop("AUTOFUSION_TRITON_INTERPRET", None)  # the device checks are what is tested
    environment.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, "-m", "autofusion_worker", *args],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_catalogue_says_both_triton_targets_compile() -> None:
    for name in ("cuda", "ascend910"):
        target = TARGETS[name]
        assert target.compiles and target.backend == "triton" and target.interpretable
        assert target.toolchain and target.device
    assert TARGETS["cpu"].backend == "c"


@pytest.mark.skipif(_cuda_visible(), reason="a GPU is visible here: the cuda check passes")
def test_a_cuda_worker_without_a_gpu_refuses_to_start(tmp_path: Path) -> None:
    done = _worker(tmp_path, "--targets", "cuda")
    assert done.returncode == EXIT_TOOLCHAIN, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("autofusion worker: target cuda: "), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    expected = "torch.cuda.is_available() is False" if HAS_TORCH else "does not import"
    assert expected in lines[-1] and ("--interpret" in lines[-1] or not HAS_TORCH)


@pytest.mark.skipif(cann_home() is not None, reason="CANN is installed here")
def test_an_ascend_worker_without_cann_refuses_to_start(tmp_path: Path) -> None:
    # mixed targets: the cpu one is fine, the ascend910 one stops the whole worker
    done = _worker(tmp_path, "--targets", "cpu,ascend910", ASCEND_TOOLKIT_HOME="", ASCEND_HOME_PATH="")
    assert done.returncode == EXIT_TOOLCHAIN, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("autofusion worker: target ascend910: needs CANN"), done.stderr[-2000:]
    assert str(CANN_DEFAULT) in last and "Traceback" not in done.stderr


def test_cann_without_its_compiler_on_path_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A toolkit folder named by CANN's variable, but a PATH without BiSheng's compiler: the check
    # finds the toolkit and says what is missing from it.
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert cann_home() == tmp_path
    with pytest.raises(ToolchainMissing) as caught:
        check_target(get_target("ascend910"), interpret=False)
    message = str(caught.value)
    assert message.startswith("target ascend910: ") and ASCEND_COMPILER in message and "\n" not in message


@pytest.mark.skipif(not HAS_TORCH, reason="interpreting needs triton and torch (dev extra)")
def test_interpreting_needs_only_triton_and_torch() -> None:
    found = check_targets(["cpu", "cuda", "ascend910"], interpret=True)
    assert found["cpu"] == {}
    for name in ("cuda", "ascend910"):
        assert found[name]["mode"] == "interpret"
        assert found[name]["triton"] and found[name]["torch"]


def test_an_unknown_target_is_refused_by_the_check() -> None:
    with pytest.raises(ToolchainMissing, match="not a registered target"):
        check_targets(["tpu"], interpret=True)


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here")
def test_the_device_is_probed_in_a_process_of_its_own() -> None:
    # The worker never touches the device itself (a process that initialized CUDA or the NPU cannot
    # fork job processes that use it): a child process answers, and its answer is the message.
    with pytest.raises(ToolchainMissing) as caught:
        probe_device(get_target("ascend910"))
    assert str(caught.value) == (
        "target ascend910: needs CANN, torch_npu and triton-ascend (torch_npu does not import: "
        "No module named 'torch_npu')"
    )
    assert "torch_npu" not in sys.modules
